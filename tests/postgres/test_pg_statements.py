"""What one remember and one recall cost the PostgreSQL server, counted by the server itself
(``pg_stat_statements`` on a cluster of the test's own, started with it preloaded): each
statement is a round trip or rides one, and on a loaded machine every round trip costs
milliseconds, so the counts are bounded. The engine is the real one (real embedder, real
Kiwi) on the real repository, as a daemon runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_cluster import OWNER, PgCluster

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder
from keymem_daemon.store.opening import open_postgres

KEYS = ["deploy freeze", "배포 동결", "Mina", "release train"]
# One remember of a new memory whose four keys the store holds already: BEGIN, the two SET
# LOCALs, its twin looked up, the memory, its links (one statement), its key texts, its index
# row, COMMIT. Before: one statement per link, its keys' state read before and after, and a
# read unit (BEGIN, the keys read back, COMMIT) for the write hints -- 16.
REMEMBER_STATEMENTS = 9
# One recall of a query that finds a key: four read units (the query's token statistics;
# its lexical candidates, their rows, tokens and links; the key's members, their rows,
# tokens and links; the Top-1's links) of BEGIN ... COMMIT. Before: a fifth, empty unit for
# the counts the in-memory index holds, and the candidates' links read twice -- 21.
RECALL_STATEMENTS = 19


@pytest.fixture
def counted_cluster(own_pg_cluster: PgCluster) -> PgCluster:
    """The test's own cluster, restarted with pg_stat_statements loaded and created in keymem."""
    with (own_pg_cluster.data_dir / "postgresql.conf").open("a") as conf:
        conf.write("\nshared_preload_libraries = 'pg_stat_statements'\n")
    own_pg_cluster.stop_server()
    own_pg_cluster.start_server()
    with psycopg.connect(_superuser_on_keymem(own_pg_cluster), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
    return own_pg_cluster


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


def _statements(cluster: PgCluster, action: Any) -> list[tuple[int, str]]:
    """The top-level statements the owner role ran on keymem during ``action()``."""
    where = "dbid = (SELECT oid FROM pg_database WHERE datname = 'keymem') AND userid = %s::regrole"
    with psycopg.connect(_superuser_on_keymem(cluster), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        action()
        rows = conn.execute(f"SELECT calls, query FROM pg_stat_statements WHERE {where} ORDER BY calls DESC",
                            (OWNER,)).fetchall()
    return [(int(calls), str(query)) for calls, query in rows]


def _remember(graph: MemoryGraph, content: str) -> Any:
    return graph.remember(graph.prepare(content=content, keys=KEYS, key_types={"Mina": "name"}, namespace="proj"))


def test_one_remember_of_known_keys_is_nine_statements(graph: MemoryGraph, counted_cluster: PgCluster) -> None:
    _remember(graph, "Mina moved the deploy freeze to Thursday for the release train")
    rounds = 5
    done: list[Any] = []
    statements = _statements(counted_cluster, lambda: done.extend(
        _remember(graph, f"release train {i}: Mina keeps the deploy freeze until the {i}th") for i in range(rounds)))
    assert all(result.saved and not result.deduplicated for result in done)
    total = sum(calls for calls, _ in statements)
    print(f"{total / rounds:.1f} statements per remember")
    assert total <= REMEMBER_STATEMENTS * rounds, statements
    links = [calls for calls, query in statements if query.startswith("INSERT INTO links")]
    assert links == [rounds], statements  # the four links of each in one statement


def test_one_recall_is_at_most_nineteen_statements(graph: MemoryGraph, counted_cluster: PgCluster) -> None:
    for i in range(6):
        _remember(graph, f"release train {i}: Mina keeps the deploy freeze until the {i}th")
    rounds = 5
    found: list[Any] = []
    statements = _statements(counted_cluster, lambda: found.extend(
        recall(graph, "when does the deploy freeze end?") for _ in range(rounds)))
    assert all(result.status == "found" for result in found)
    total = sum(calls for calls, _ in statements)
    print(f"{total / rounds:.1f} statements per recall")
    assert total <= RECALL_STATEMENTS * rounds, statements
