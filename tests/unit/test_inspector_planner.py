"""The inspector's speed at 10k memories rests on SQLite's planner statistics: without them
a namespace filter makes every key's member query scan the namespace. The store refreshes
them after an import and at each cleanup (scripts/bench_ui.py measures the effect)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from engine_helpers import FakeClock

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.service import Service

pytestmark = pytest.mark.timeout(60)


def _analysed_tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        if conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone()[0] == 0:
            return set()
        return {row[0] for row in conn.execute("SELECT tbl FROM sqlite_stat1")}
    finally:
        conn.close()


@pytest.mark.sqlite_only("SQLite's planner statistics (sqlite_stat1, ANALYZE); PostgreSQL's autovacuum keeps its own")
def test_an_import_and_the_cleanup_leave_planner_statistics_for_memories_and_links(
        graph: MemoryGraph, clock: FakeClock, tmp_path: Path) -> None:
    service = Service(Settings(data_dir=tmp_path), clock=clock)
    service.graph = graph
    for i in range(3):
        service.call_tool("remember", {"content": f"Service {i} deploys from the release branch on Fridays.",
                                       "keys": ["deployment", f"service {i}"]}, Host())
    exported = service.export()
    assert _analysed_tables(graph.store.path) == set()
    service.import_(exported)
    assert {"memories", "links"} <= _analysed_tables(graph.store.path)

    conn = sqlite3.connect(graph.store.path)
    conn.execute("DELETE FROM sqlite_stat1")
    conn.commit()
    conn.close()
    service.cleanup()
    assert {"memories", "links"} <= _analysed_tables(graph.store.path)
