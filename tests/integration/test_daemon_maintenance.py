"""The scheduler inside a real daemon: TTL cleanup, WAL checkpoints and backups."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from daemon_helpers import DaemonFactory, wait_for

pytestmark = pytest.mark.timeout(120)


def _backups(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "backups").glob("keymem-2*.db"))


def test_expired_memories_are_cleaned_up_on_schedule(daemons: DaemonFactory) -> None:
    daemon = daemons.start(KEYMEM_CLEANUP_INTERVAL="1", KEYMEM_TOOLS="full")
    keep = daemon.remember("This memory has no expiry", ["permanent", "fact"])
    gone = daemon.remember("This memory expires at once", ["transient", "fact"], ttl_seconds=1)
    client = daemon.client()

    def physically_deleted() -> bool:
        ids = {m["id"] for m in daemon.export()["memories"]}
        return gone not in ids

    wait_for(physically_deleted, 30, interval=0.2, message="the scheduled cleanup to delete the memory")
    ids = {m["id"] for m in daemon.export()["memories"]}
    assert keep in ids
    assert client.get("/v1/stats").json()["expired_pending_cleanup"] == 0


def test_an_expired_memory_is_gone_after_a_restart(daemons: DaemonFactory) -> None:
    """Cleanup also runs at start (with the default hourly interval)."""
    daemon = daemons.start()
    gone = daemon.remember("Expires before the restart", ["expiring", "note"], ttl_seconds=1)
    daemons.stop(daemon)
    wait_for(lambda: _expired(daemons.data_dir, gone), 10, interval=0.1, message="the TTL to pass")
    restarted = daemons.start()
    wait_for(
        lambda: gone not in {m["id"] for m in restarted.export()["memories"]},
        20,
        interval=0.1,
        message="the start-up cleanup",
    )


def _expired(data_dir: Path, memory_id: str) -> bool:
    conn = sqlite3.connect(data_dir / "keymem.db")
    try:
        row = conn.execute("SELECT expires_at FROM memories WHERE id = ?", (memory_id,)).fetchone()
    finally:
        conn.close()
    return row is not None and row[0] is not None and row[0] < time.time()


def test_backups_are_taken_checked_and_rotated(daemons: DaemonFactory) -> None:
    daemon = daemons.start(KEYMEM_BACKUP_INTERVAL="1", KEYMEM_BACKUP_KEEP="2")
    daemon.remember("Backed up memory", ["backup", "memory"])
    # The first backup is taken at once (none existed), then one a second, two kept.
    wait_for(lambda: len(_backups(daemons.data_dir)) == 2, 30, interval=0.1, message="two backups")
    first = _backups(daemons.data_dir)
    wait_for(lambda: _backups(daemons.data_dir) != first, 30, interval=0.1, message="a rotation")
    assert len(_backups(daemons.data_dir)) <= 2
    newest = _backups(daemons.data_dir)[-1]
    conn = sqlite3.connect(newest)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert not list((daemons.data_dir / "backups").glob("*.partial"))
