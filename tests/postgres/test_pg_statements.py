"""What one remember and one recall cost the PostgreSQL server: the round trips (each time the
client waits for the server, counted on the wire by a TCP proxy between them), the units of
work (each a transaction) and the statements in them, counted by the server itself
(``pg_stat_statements`` on a cluster of the test's own, started with it preloaded; it does not
count every BEGIN, SET and COMMIT sent in pipeline mode, so those are left out). On a loaded
machine every round trip costs milliseconds, so all are bounded. The engine is the real one
(real embedder, real Kiwi) on the real repository, as a daemon runs it."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_cluster import OWNER, PgCluster, own_cluster
from tcp_proxy import TcpProxy

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.records import IdempotencyKey, RememberResult, Replayed
from keymem_daemon.engine.text import normalize
from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder
from keymem_daemon.store.opening import open_postgres
from keymem_daemon.store.postgres import repository

KEYS = ["deploy freeze", "배포 동결", "Mina", "release train"]
# One remember of a new memory whose four keys the store holds already is one unit of five
# statements: its twin (asserted absent), the memory, its links (one statement), its key texts
# (asserted as the index holds them), its index row. Before: two units (the second read the
# keys back for the write hints) of eleven -- one statement per link, and the memory's keys'
# state read before and after.
REMEMBER_STATEMENTS = 5
# Its round trips: one. The twin, and a key of a text the store might hold, are not looked up
# but asserted absent, the key texts asserted as the index holds them, by statements that go
# out with everything else and COMMIT (store/postgres/speculation.py). Before: the twin looked
# up, the key texts (the memory and its links went out with them), COMMIT -- 3 -- and a key the
# store did not hold added a lookup (4); before that, 4 of known keys and 6 with one new key.
REMEMBER_ROUND_TRIPS = 1
REMEMBER_NEW_KEY_ROUND_TRIPS = 1
# One recall of a query that finds a key: one read unit of nine statements in six round trips:
# the query's token statistics; its lexical candidates; their rows, with their tokens and links
# (three statements whose answers come back together: store/postgres/repository.py, ReadAhead);
# the key's members; their rows, tokens and links, the same way (the Top-1's links among them);
# COMMIT. Before: the rows, the tokens and the links one round trip each, and the Top-1's links
# read again (10 statements, 11 round trips); before that four units (main: 14 round trips).
RECALL_UNITS = 1
RECALL_STATEMENTS = 9
RECALL_ROUND_TRIPS = 6
# A daemon following that remember from the change log: the memory's vector, keys and state
# in one statement, its four keys' rows in one, their member counts, COMMIT. Before: the
# memory's vector, whether it is current, its keys and its state, then each key's vector and
# its row, one round trip each (main: 14).
FOLLOW_ROUND_TRIPS = 4
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
def proxy(counted_cluster: PgCluster) -> Iterator[TcpProxy]:
    made = TcpProxy(counted_cluster.port)
    yield made
    made.close()


@pytest.fixture
def graph(counted_cluster: PgCluster, proxy: TcpProxy, tmp_path: Path) -> Iterator[MemoryGraph]:
    url = proxy.url_through(counted_cluster.url_for(OWNER), counted_cluster.port)
    g = MemoryGraph.over(open_postgres(url), CachedEmbedder(UseEmbedder()), Settings(data_dir=tmp_path))
    try:
        yield g
    finally:
        g.close()


def _round_trips(proxy: TcpProxy, action: Callable[[], object]) -> int:
    """The round trips the graph's connections made during ``action()``."""
    before = proxy.round_trips
    action()
    return proxy.round_trips - before


def _typical(trips: list[int]) -> int:
    """The round trips of most runs of one action. The proxy counts a trip whenever the client
    sends after the server answered, so on a loaded machine a pipelined message the client
    wrote in two pieces, the server answering the first before the second arrived, counts one
    more (seen once in 2,000 tests at load 6: [4, 4, 4, 4, 5]); timing only ever adds trips, so
    the median of five runs is the count the code makes, and an extra trip in the code shows in
    every run."""
    return int(statistics.median_low(trips))


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
        depth = [0]

        def unit(fn: Callable[[Any], Any]) -> Any:
            if depth[0] == 0:  # a read inside a read is no unit of its own (engine/ports.py)
                units.append(kind)
            depth[0] += 1
            try:
                return run(fn)
            finally:
                depth[0] -= 1
        return unit

    for kind in ("read", "write"):
        monkeypatch.setattr(graph.store, kind, counted(kind))
    return units


def _remember(graph: MemoryGraph, content: str, keys: list[str] = KEYS) -> Any:
    return graph.remember(graph.prepare(content=content, keys=keys, key_types={"Mina": "name"}, namespace="proj"))


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


def test_one_remember_is_one_round_trip_with_a_new_key_too(
        graph: MemoryGraph, proxy: TcpProxy) -> None:
    _remember(graph, "Mina moved the deploy freeze to Thursday for the release train")
    rounds = 5
    known = [_round_trips(proxy, lambda i=i: _remember(graph, f"release train {i}: Mina keeps the deploy freeze"))
             for i in range(rounds)]
    assert _typical(known) == REMEMBER_ROUND_TRIPS, known
    fresh = [_round_trips(proxy, lambda i=i: _remember(graph, f"the {i}th canary of the release train",
                                                        [*KEYS, f"canary wave {i}"])) for i in range(rounds)]
    assert _typical(fresh) == REMEMBER_NEW_KEY_ROUND_TRIPS, fresh
    # The keys made there are the index's, with their one link each, as if read back.
    wave = graph.keys.get(graph.keys.by_norm("canary wave 0") or "")
    assert wave is not None and wave.link_count == 1 and wave.concept == "canary wave 0"


def test_a_remember_that_assumed_wrong_runs_again_reading_and_saves_what_reading_saves(
        graph: MemoryGraph, counted_cluster: PgCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _remember(graph, "Mina moved the deploy freeze to Thursday for the release train")
    freeze = graph.keys.by_norm(normalize("deploy freeze"))
    caplog.set_level(logging.DEBUG, logger=repository.__name__)

    def assumed_wrong(action: Callable[[], Any]) -> Any:
        """``action()``'s result, after checking that one of its writes assumed wrong (and ran again)."""
        caplog.clear()
        result = action()
        assert [r.message for r in caplog.records if "assumed wrong" in r.message][:1], caplog.records
        return result

    with psycopg.connect(counted_cluster.url_for(OWNER), autocommit=True) as teammate:
        # Another daemon's write this daemon has not followed yet: an alias of a key it holds.
        teammate.execute("INSERT INTO aliases(key_id, alias, norm, compact, learned, added_at) "
                         "VALUES (%s, 'code freeze window', 'code freeze window', 'codefreezewindow', 0, 1)",
                         (freeze,))
        assumed_wrong(lambda: _remember(graph, "release train 9: Mina keeps the deploy freeze"))
        tokens = teammate.execute("SELECT f.key_tokens FROM memory_fts f JOIN links l ON l.memory_id = f.memory_id "
                                  "WHERE l.key_id = %s ORDER BY f.memory_id", (freeze,)).fetchall()
    # Its index row has the alias's tokens, as one read from the store; the older one's not.
    assert sorted("window" in row[0].split() for row in tokens) == [False, True], tokens

    # An identical memory: folded into it, as ever.
    again = assumed_wrong(lambda: _remember(graph, "Mina moved the deploy freeze to Thursday for the release train"))
    assert again.deduplicated

    # A key another daemon made a moment ago, which this daemon's index does not hold: one key.
    other = MemoryGraph.over(open_postgres(counted_cluster.url_for(OWNER)), CachedEmbedder(UseEmbedder()),
                             Settings(data_dir=tmp_path / "other"))
    try:
        _remember(other, "the canary wave of the release train goes out on Monday", ["canary wave"])
    finally:
        other.close()
    assumed_wrong(lambda: _remember(graph, "the canary wave waits for the deploy freeze",
                                    ["canary wave", "deploy freeze"]))
    with psycopg.connect(counted_cluster.url_for(OWNER)) as conn:
        canary = conn.execute("SELECT id, (SELECT COUNT(*) FROM links WHERE key_id = id) FROM keys "
                              "WHERE norm = 'canary wave'").fetchall()
    assert [count for _, count in canary] == [2], canary

    # A retried request with its Idempotency-Key: its first answer.
    key = IdempotencyKey("retry-1", "fingerprint-1")
    first = graph.remember(graph.prepare(content="the freeze lifts at noon", keys=KEYS), idempotency_key=key)
    replay = assumed_wrong(lambda: graph.remember(graph.prepare(content="the freeze lifts at noon", keys=KEYS),
                                                  idempotency_key=key))
    assert isinstance(first, RememberResult) and isinstance(replay, Replayed)
    assert replay.result["saved"] == first.saved


def test_one_recall_is_one_unit_of_at_most_nine_statements_and_six_round_trips(
        graph: MemoryGraph, counted_cluster: PgCluster, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch) -> None:
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
    trips = [_round_trips(proxy, lambda: recall(graph, "when does the deploy freeze end?")) for _ in range(rounds)]
    assert _typical(trips) <= RECALL_ROUND_TRIPS, trips


def test_following_another_daemons_remember_reads_its_memory_and_its_keys_in_one_round_trip_each(
        graph: MemoryGraph, proxy: TcpProxy) -> None:
    saved = _remember(graph, "Mina moved the deploy freeze to Thursday for the release train").saved
    keys = [graph.keys.by_norm(normalize(k)) for k in KEYS]
    assert all(keys)
    # What the change log of that remember names: the memory (its links) and nothing else.
    trips = _round_trips(proxy, lambda: graph.follow_changes([saved], [], removals=False))
    assert trips == FOLLOW_ROUND_TRIPS
    assert [graph.keys.get(k).link_count for k in keys if k] == [1, 1, 1, 1]  # type: ignore[union-attr]


def test_a_hubs_links_among_and_strongest_and_several_keys_members_take_one_round_trip(
        graph: MemoryGraph, proxy: TcpProxy) -> None:
    saved = [_remember(graph, f"release train {i}: Mina keeps the deploy freeze until the {i}th").saved
             for i in range(3)]
    keys = [k for k in (graph.keys.by_norm(normalize(k)) for k in KEYS) if k]
    assert len(keys) == len(KEYS)
    now = graph.clock()
    found: list[Any] = []
    # A very large hub's candidates (engine/reads/recall.py): its links to the query's lexical
    # candidates and its strongest ones, one round trip (and COMMIT); before, one each.
    links = [_round_trips(proxy, lambda: found.append(graph.store.read(
        lambda r: r.key_links(keys[0], among=saved[:2], strongest=2)))) for _ in range(5)]
    assert _typical(links) == 2, links
    assert len(found[0]) == 4 and {m for m, _ in found[0][:2]} == set(saved[:2])
    # The push path's key channel asks for several keys' members at once: one round trip for
    # all (and COMMIT); before, one per key.
    members = [_round_trips(proxy, lambda: found.append(graph.store.read(
        lambda r: r.key_members(keys, None, now, 5)))) for _ in range(5)]
    assert _typical(members) == 2, members
    assert {k: sorted(m for m, _ in v) for k, v in found[-1].items()} == {k: sorted(saved) for k in keys}
