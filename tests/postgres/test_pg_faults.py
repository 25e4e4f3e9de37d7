"""The PostgreSQL server goes away under a repository and comes back: units fail with an
error naming the server (never its password, never a hang past the pool's timeout), nothing
half-written stays, and the repository uses the server again by itself once it is back; in
front of it, the failover repository reads from the local replica and refuses writes at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_helpers import wait_for
from pg_cluster import PgCluster

from keymem_daemon.engine.ports import MemoryRow, Writer
from keymem_daemon.errors import StoreError, StoreUnavailable
from keymem_daemon.store.postgres import repository as repository_module
from keymem_daemon.store.postgres.offline import FailoverRepository, Replica
from keymem_daemon.store.postgres.repository import PostgresRepository

KILL_TIMEOUT = 30.0
"""Seconds for a SIGKILLed process to be reaped."""
RECOVERY_TIMEOUT = 60.0
"""Seconds for the repository to reach a restarted server (it reconnects in about 1 s)."""


def _memory(memory_id: str) -> MemoryRow:
    return MemoryRow(id=memory_id, content=f"note {memory_id}", dedup_hash=memory_id, namespace="proj", at=1.0,
                     observed_at=None, decay_profile="standard", source={}, expires_at=None, vector=b"\0" * 8)


def _save(memory_id: str) -> Callable[[Writer], None]:
    def fn(w: Writer) -> None:
        w.insert_memory(_memory(memory_id))
    return fn


def test_a_stopped_server_fails_units_clearly_and_a_restarted_one_is_used_again(own_pg_cluster: PgCluster) -> None:
    repo = PostgresRepository.open(own_pg_cluster.url)
    try:
        repo.write(_save("m-before"))
        own_pg_cluster.stop_server()
        started = time.monotonic()
        with pytest.raises(StoreError) as refused:
            repo.write(_save("m-during"))
        took = time.monotonic() - started
        with pytest.raises(StoreError) as unread:
            repo.read(lambda r: r.memory("m-before"))
        for error in (refused.value, unread.value):
            assert f"postgresql 127.0.0.1:{own_pg_cluster.port}/keymem as keymem_owner" in error.message
            assert all(secret not in error.message for secret in own_pg_cluster.passwords.values())
        assert "nothing was written" in refused.value.message
        # The pool's timeout bounds the wait (plus a loaded machine's scheduling).
        assert took < repository_module.POOL_TIMEOUT + 30
        own_pg_cluster.start_server()

        def saved() -> bool:
            try:
                repo.write(_save("m-after"))
            except StoreError:
                return False
            return True

        wait_for(saved, RECOVERY_TIMEOUT, interval=0.2, message="the repository to use the restarted server")
        found = repo.read(lambda r: sorted(r.memories(["m-before", "m-during", "m-after"])))
    finally:
        repo.close()
    assert found == ["m-after", "m-before"]


def test_an_unreachable_server_is_named_when_the_store_opens(own_pg_cluster: PgCluster) -> None:
    own_pg_cluster.stop_server()
    with pytest.raises(StoreError, match=f"cannot reach the store at postgresql 127.0.0.1:{own_pg_cluster.port}/"):
        PostgresRepository.open(own_pg_cluster.url)


_KILLED_WRITER = """
import sys, threading
from keymem_daemon.engine.ports import MemoryRow, Writer
from keymem_daemon.store.postgres.repository import PostgresRepository

repo = PostgresRepository.open(sys.argv[1])

def half_written(w):
    for i in range(3):
        w.insert_memory(MemoryRow(id=f"m-killed-{i}", content="x", dedup_hash=f"k{i}", namespace="proj", at=1.0,
                                  observed_at=None, decay_profile="standard", source={}, expires_at=None,
                                  vector=b"\\0" * 8))
    print("inserted", flush=True)
    threading.Event().wait()  # SIGKILLed here, before COMMIT

repo.write(half_written)
"""


def test_a_daemon_killed_mid_write_leaves_no_rows_and_no_locks(pg_database: str) -> None:
    repo = PostgresRepository.open(pg_database)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, pg_database], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "inserted"
        child.send_signal(signal.SIGKILL)
        child.wait(KILL_TIMEOUT)
        # The same rows again: this waits for the killed transaction's row locks, which the
        # server drops as soon as it sees the client gone -- then nothing of it is left.
        repo.write(_save("m-killed-0"))
        found = repo.read(lambda r: sorted(r.memories([f"m-killed-{i}" for i in range(3)])))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(KILL_TIMEOUT)
        if child.stdout is not None:
            child.stdout.close()
        repo.close()
    assert found == ["m-killed-0"]


def test_once_a_unit_finds_the_server_gone_reads_come_from_the_replica_and_writes_are_refused_at_once(
        own_pg_cluster: PgCluster, tmp_path: Path) -> None:
    server = PostgresRepository.open(own_pg_cluster.url)
    store = FailoverRepository(server, Replica.create(tmp_path / "replica.db", server))
    try:
        store.write(_save("m-kept"))
        store.write(_save("m-gone"))
        store.write(lambda w: w.delete_memory("m-gone"))
        store.replica.fill_in_background().join()
        assert store.replica.ready
        own_pg_cluster.stop_server()
        # The first unit finds out (within the pool's timeout); the next ones do not wait.
        assert sorted(store.read(lambda r: r.memories(["m-kept", "m-gone"]))) == ["m-kept"]
        assert store.offline() is not None
        started = time.monotonic()
        assert store.read(lambda r: r.memory_content("m-kept")) == "note m-kept"
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{own_pg_cluster.port}.*nothing was written"):
            store.write(_save("m-during"))
        took = time.monotonic() - started
    finally:
        store.close()
    assert took < repository_module.POOL_TIMEOUT, took
