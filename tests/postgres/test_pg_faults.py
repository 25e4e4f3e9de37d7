"""The PostgreSQL server goes away under a repository and comes back: units fail with an
error naming the server (never its password, never a hang past the pool's timeout), nothing
half-written stays, and the repository uses the server again by itself once it is back."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from daemon_helpers import wait_for
from pg_cluster import PgCluster

from keymem_daemon.engine.ports import MemoryRow
from keymem_daemon.errors import StoreError
from keymem_daemon.store.postgres import repository as repository_module
from keymem_daemon.store.postgres.repository import PgWriter, PostgresRepository

RECOVERY_TIMEOUT = 60.0
"""Seconds for the repository to reach a restarted server (it reconnects in about 1 s)."""


def _memory(memory_id: str) -> MemoryRow:
    return MemoryRow(id=memory_id, content=f"note {memory_id}", dedup_hash=memory_id, namespace="proj", at=1.0,
                     observed_at=None, decay_profile="standard", source={}, expires_at=None, vector=b"\0" * 8)


def _save(memory_id: str) -> Callable[[PgWriter], None]:
    def fn(w: PgWriter) -> None:
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
