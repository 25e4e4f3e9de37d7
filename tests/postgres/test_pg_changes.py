"""Following the change log (store/postgres/changes.py ChangeFollower) between two
repositories on one database, as two daemons would: a write through one reaches the other's
follower, woken by NOTIFY; a follower that was away resumes from its cursor and misses
nothing, deletions included."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest
from daemon_helpers import wait_for

from keymem_daemon.engine.ports import MemoryRow
from keymem_daemon.store.postgres import changes
from keymem_daemon.store.postgres.repository import PgWriter, PostgresRepository

ARRIVAL_TIMEOUT = 30.0
"""Seconds a change may take to reach a follower on a loaded machine (it takes milliseconds;
the follower looks at least every changes.WAKE_INTERVAL even without a NOTIFY)."""


class Seen:
    """What a follower handed over, safe to read from the test's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[tuple[str, str, str]] = []

    def __call__(self, batch: list[changes.Change]) -> None:
        with self._lock:
            self.items.extend((c.kind, c.id, c.op) for c in batch)

    def has(self, item: tuple[str, str, str]) -> bool:
        with self._lock:
            return item in self.items

    def arrived(self, item: tuple[str, str, str]) -> Callable[[], bool]:
        return lambda: self.has(item)


@pytest.fixture
def repositories(pg_database: str) -> Iterator[tuple[PostgresRepository, PostgresRepository]]:
    first, second = PostgresRepository.open(pg_database), PostgresRepository.open(pg_database)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _save(memory_id: str) -> Callable[[PgWriter], None]:
    def fn(w: PgWriter) -> None:
        w.insert_memory(MemoryRow(id=memory_id, content=f"note {memory_id}", dedup_hash=memory_id, namespace="proj",
                                  at=1.0, observed_at=None, decay_profile="standard", source={}, expires_at=None,
                                  vector=b"\0" * 8))
    return fn


def _cursor(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return changes.horizon(conn)


def test_a_write_through_one_daemon_reaches_the_others_follower(
        repositories: tuple[PostgresRepository, PostgresRepository], pg_database: str) -> None:
    writer, _ = repositories
    seen = Seen()
    follower = changes.ChangeFollower(pg_database, _cursor(pg_database), seen)
    follower.start()
    try:
        for i in range(10):
            writer.write(_save(f"m{i}"))
            wait_for(seen.arrived(("memory", f"m{i}", "insert")), ARRIVAL_TIMEOUT, message=f"m{i} to arrive")
    finally:
        follower.stop()
    assert [item for item in seen.items if item[0] == "memory"] == [("memory", f"m{i}", "insert") for i in range(10)]


def test_a_follower_that_was_away_resumes_from_its_cursor(
        repositories: tuple[PostgresRepository, PostgresRepository], pg_database: str) -> None:
    writer, _ = repositories
    seen = Seen()
    follower = changes.ChangeFollower(pg_database, _cursor(pg_database), seen)
    follower.start()
    writer.write(_save("m-early"))
    wait_for(lambda: seen.has(("memory", "m-early", "insert")), ARRIVAL_TIMEOUT, message="m-early")
    follower.stop()
    # While it is away: one memory saved, one deleted.
    writer.write(_save("m-away"))
    writer.write(lambda w: w.delete_memory("m-early"))
    resumed_seen = Seen()
    resumed = changes.ChangeFollower(pg_database, follower.cursor, resumed_seen)
    resumed.start()
    try:
        wait_for(lambda: resumed_seen.has(("memory", "m-early", "delete")), ARRIVAL_TIMEOUT,
                 message="the deletion made while the follower was away")
    finally:
        resumed.stop()
    assert resumed_seen.items == [("memory", "m-away", "insert"), ("memory", "m-early", "delete")]
