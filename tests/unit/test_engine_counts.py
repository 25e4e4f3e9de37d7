"""The in-memory key member counts always equal what SQLite says.

``recall``/``read_memory`` read a key's ``memory_count`` from ``ActiveCounts`` instead of
counting links in SQLite; every write path reports its change. This drives a random mix of
writes (remember, duplicates, TTLs, corrections, forgets, expiry, cleanup, alias learning)
and compares the counts with a direct SQL count after each step and after reopening.
"""

from __future__ import annotations

import random
from pathlib import Path

from engine_helpers import FakeClock, db_read, remember

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.inference.embedders import Embedder
from keymem_daemon.store.opening import open_sqlite
from keymem_daemon.store.sqlite.memories import ACTIVE

WORDS = ["deploy", "database", "editor", "coffee", "배포", "데이터베이스", "에디터", "커피", "review", "리뷰"]
NAMESPACES = ["default", "atlas"]


def sql_counts(graph: MemoryGraph, namespace: str | None) -> dict[str, int]:
    now = graph.clock()
    sql = (f"SELECT l.key_id, COUNT(*) FROM links l JOIN memories m ON m.id = l.memory_id WHERE {ACTIVE}"
           + (" AND m.namespace = ?" if namespace else "") + " GROUP BY l.key_id")
    params = [now, namespace] if namespace else [now]
    return dict(db_read(graph.store, lambda c: c.execute(sql, params).fetchall()))


def assert_counts_match(graph: MemoryGraph) -> None:
    key_ids = [k.id for k in graph.keys.all()]
    for namespace in [None, *NAMESPACES]:
        expected = sql_counts(graph, namespace)
        got = graph.key_counts(key_ids, namespace, graph.clock()).counts
        assert {k: v for k, v in got.items() if v} == expected, namespace


def test_key_counts_follow_every_write_path_and_survive_a_reopen(
        tmp_path: Path, embedder: Embedder, clock: FakeClock, settings: Settings) -> None:  # noqa: F811
    rng = random.Random(3)
    graph = MemoryGraph.over(open_sqlite(settings, tmp_path / "keymem.db"), embedder, settings, clock=clock)
    live: list[str] = []
    try:
        for step in range(60):
            action = rng.choice(["remember", "remember", "duplicate", "ttl", "correct", "forget", "time"])
            if action in ("remember", "ttl") or not live:
                keys = rng.sample(WORDS, 3)
                mid = remember(graph, f"fact {step} about {' and '.join(keys)}", keys,
                               namespace=rng.choice(NAMESPACES),
                               ttl_seconds=rng.choice([30.0, 3600.0]) if action == "ttl" else None)
                live.append(mid)
            elif action == "duplicate":
                row = db_read(graph.store, lambda c: c.execute(
                    "SELECT content, namespace FROM memories WHERE id = ?", (live[-1],)).fetchone())
                if row is not None:
                    remember(graph, row[0], [rng.choice(WORDS), "extra key"], namespace=row[1])
            elif action == "correct":
                target = rng.choice(live)
                active = db_read(graph.store, lambda c, target=target: c.execute(
                    f"SELECT 1 FROM memories m WHERE m.id = ? AND {ACTIVE}", (target, clock())).fetchone())
                request = graph.prepare(content=f"corrected {step}", keys=None, require_keys=False)
                result = graph.correct(target, request, keys_given=False, related_given=False,
                                       ttl_given=False, decay_given=False) if active else None
                if result is not None:
                    live.append(result.new_id)  # type: ignore[union-attr]
            elif action == "forget":
                graph.forget(live.pop(rng.randrange(len(live))))
            else:
                clock.advance(rng.choice([10.0, 60.0, 4000.0]))
                if rng.random() < 0.5:
                    graph.cleanup_expired()
            assert_counts_match(graph)
        graph.close()
        graph = MemoryGraph.over(open_sqlite(settings, tmp_path / "keymem.db"), embedder, settings, clock=clock)
        assert_counts_match(graph)
    finally:
        graph.close()
