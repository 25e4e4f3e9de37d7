"""What one remember and one recall cost the PostgreSQL server: the units of work (each a
transaction: BEGIN and COMMIT at least one round trip) and the statements in them, counted by
the server itself (``pg_stat_statements`` on a cluster of the test's own, started with it
preloaded; it does not count every BEGIN, SET and COMMIT sent in pipeline mode, so those are
left out). On a loaded machine every round trip costs milliseconds, so both are bounded. The
engine is the real one (real embedder, real Kiwi) on the real repository, as a daemon runs it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_cluster import OWNER, PgCluster, own_cluster

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder
from keymem_daemon.store.opening import open_postgres

KEYS = ["deploy freeze", "배포 동결", "Mina", "release train"]
# One remember of a new memory whose four keys the store holds already is one unit of five
# statements: its twin looked up, the memory, its links (one statement), its key texts, its
# index row. Before: two units (the second read the keys back for the write hints) of eleven
# -- one statement per link, and the memory's keys' state read before and after.
REMEMBER_STATEMENTS = 5
# One recall of a query that finds a key: four read units (the query's token statistics;
# its lexical candidates, their rows, tokens and links; the key's members, their rows,
# tokens and links; the Top-1's links). Before: a fifth, empty one for the counts the
# in-memory index holds, and the candidates' links read a second time (11 statements).
RECALL_UNITS = 4
RECALL_STATEMENTS = 10
# Leaves out what pg_stat_statements counts only now and then (the module's doc).
_COUNTED = "query !~ '^(BEGIN|COMMIT|ROLLBACK|SET|SAVEPOINT|RELEASE)'"


@pytest.fixture
def counted_cluster(pg_template: Path) -> Iterator[PgCluster]:
    """A cluster of the test's own, started with pg_stat_statements loaded (set before its
    first start: no restart) and created in keymem."""
    with own_cluster(pg_template, "shared_preload_libraries = 'pg_stat_statements'") as cluster:
        with psycopg.connect(_superuser_on_keymem(cluster), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        yield cluster


def _superuser_on_keymem(cluster: PgCluster) -> str:
    return cluster.superuser_url.rsplit("/", 1)[0] + "/keymem"


@pytest.fixture
def graph(counted_cluster: PgCluster, tmp_path: Path) -> Iterator[MemoryGraph]:
    g = MemoryGraph.over(open_postgres(counted_cluster.url_for(OWNER)), CachedEmbedder(UseEmbedder()),
                         Settings(data_dir=tmp_path))
    try:
        yield g
    finally:
        g.close()


def _statements(cluster: PgCluster, action: Callable[[], object]) -> list[tuple[int, str]]:
    """The top-level statements the owner role ran on keymem during ``action()``."""
    where = f"dbid = (SELECT oid FROM pg_database WHERE datname = 'keymem') AND userid = %s::regrole AND {_COUNTED}"
    with psycopg.connect(_superuser_on_keymem(cluster), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        action()
        rows = conn.execute(f"SELECT calls, query FROM pg_stat_statements WHERE {where} ORDER BY calls DESC",
                            (OWNER,)).fetchall()
    return [(int(calls), str(query)) for calls, query in rows]


def _units(graph: MemoryGraph, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each unit of work the graph's repository runs from now on, by kind."""
    units: list[str] = []

    def counted(kind: str) -> Callable[[Callable[[Any], Any]], Any]:
        run = getattr(graph.store, kind)

        def unit(fn: Callable[[Any], Any]) -> Any:
            units.append(kind)
            return run(fn)
        return unit

    for kind in ("read", "write"):
        monkeypatch.setattr(graph.store, kind, counted(kind))
    return units


def _remember(graph: MemoryGraph, content: str) -> Any:
    return graph.remember(graph.prepare(content=content, keys=KEYS, key_types={"Mina": "name"}, namespace="proj"))


def test_one_remember_of_known_keys_is_one_unit_of_five_statements(
        graph: MemoryGraph, counted_cluster: PgCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    _remember(graph, "Mina moved the deploy freeze to Thursday for the release train")
    rounds = 5
    done: list[Any] = []
    units = _units(graph, monkeypatch)
    statements = _statements(counted_cluster, lambda: done.extend(
        _remember(graph, f"release train {i}: Mina keeps the deploy freeze until the {i}th") for i in range(rounds)))
    assert all(result.saved and not result.deduplicated for result in done)
    assert units == ["write"] * rounds
    total = sum(calls for calls, _ in statements)
    assert total <= REMEMBER_STATEMENTS * rounds, statements
    links = [calls for calls, query in statements if query.startswith("INSERT INTO links")]
    assert links == [rounds], statements  # the four links of each in one statement


def test_one_recall_is_four_units_of_at_most_ten_statements(
        graph: MemoryGraph, counted_cluster: PgCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(6):
        _remember(graph, f"release train {i}: Mina keeps the deploy freeze until the {i}th")
    recall(graph, "when does the deploy freeze end?")  # counts the index's statistics the writes renewed
    rounds = 5
    found: list[Any] = []
    units = _units(graph, monkeypatch)
    statements = _statements(counted_cluster, lambda: found.extend(
        recall(graph, "when does the deploy freeze end?") for _ in range(rounds)))
    assert all(result.status == "found" for result in found)
    assert units == ["read"] * RECALL_UNITS * rounds
    total = sum(calls for calls, _ in statements)
    assert total <= RECALL_STATEMENTS * rounds, statements
