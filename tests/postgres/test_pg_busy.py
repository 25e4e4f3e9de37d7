"""A daemon with more requests than connections to a server that answers (issue 22, Faults):
its pool of ``POOL_SIZE`` connections is all in use, and a request waits for one. That is a
busy daemon, not a server that does not answer: the requests queue and are answered, and the
daemon never calls its store possibly stale for it. Here the connections stay busy because
another session (an administrator's, through plain SQL) holds a lock keymem's writes wait
for; a real daemon takes sixteen concurrent clients over HTTP."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest
from daemon_helpers import DaemonFactory, scaled
from pg_cluster import PgCluster, start_on

from keymem_daemon.errors import StoreBusy
from keymem_daemon.store.postgres.repository import BUSY_WAIT, POOL_SIZE, POOL_TIMEOUT, PostgresRepository

pytestmark = pytest.mark.timeout(600)

CLIENTS: Final = 4 * POOL_SIZE
LOCK_TIMEOUT: Final = 3.0
"""The daemon's ``KEYMEM_STORE_LOCK_TIMEOUT``: each write holds its connection this long
while the lock is held, so the fourth group of waiting clients waits longer than
``POOL_TIMEOUT`` for a connection."""
HELD: Final = 2 * LOCK_TIMEOUT + 1.0
"""Seconds the lock is held: past two rounds of lock timeouts, within the writes' 10 s budget."""


def test_requests_queue_for_a_connection_while_the_server_answers_and_the_store_is_never_stale(
        pg_cluster: PgCluster, pg_database: str, factories: list[DaemonFactory], tmp_path: Path) -> None:
    assert (CLIENTS // POOL_SIZE - 1) * LOCK_TIMEOUT > POOL_TIMEOUT  # the test waits past the pool's timeout
    daemon = start_on(factories, tmp_path, "d", pg_database, KEYMEM_STORE_LOCK_TIMEOUT=str(LOCK_TIMEOUT))
    daemon.remember("the nightly export runs from the reporting replica", ["nightly export"])
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(pg_database) as admin:
            admin.execute("LOCK TABLE memories IN EXCLUSIVE MODE")  # reads go on; writes wait
            locked.set()
            release.wait()

    def remember(n: int) -> tuple[int, Any]:
        with daemon.client(timeout=scaled(120.0)) as client:
            response = client.post("/v1/tools/remember", json={"arguments": {
                "content": f"client {n}: the canary for shard {n} stays below {n} errors",
                "keys": [f"shard {n}", "canary rollout"]}})
            return response.status_code, response.json()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert locked.wait(scaled(30.0))
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = [pool.submit(remember, n) for n in range(CLIENTS)]
            time.sleep(HELD)  # how long the other session holds its lock: the scenario, not a race
            release.set()
            results = [answer.result() for answer in answers]
    finally:
        release.set()
        holder.join()
    with daemon.client() as client:
        health = client.get("/health").json()
        stats = client.get("/v1/stats").json()
    assert not any("stale" in warning for warning in health.get("warnings", [])), health
    assert stats.get("stale") is None, stats
    # Not even for a moment (it would have sent reads to the replica, marked stale, and
    # refused writes at once until the change follower caught up again).
    log = (daemon.data_dir / "logs" / "daemon.log").read_text()
    assert "does not answer" not in log, log[-3000:]
    failed = [(status, body) for status, body in results if status != 200 or body.get("is_error")]
    assert not failed, failed
    saved = [body["result"]["saved"] for _, body in results]
    assert len(set(saved)) == CLIENTS
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (CLIENTS + 1,)
    assert all(daemon.call("read_memory", {"memory_id": memory_id})["result"]["memory"] for memory_id in saved)


def test_a_pool_busy_past_its_wait_says_the_daemon_is_busy_not_that_the_server_is_gone(
        pg_cluster: PgCluster, pg_database: str) -> None:
    """In process: one connection, held by a long unit the server keeps answering; a second
    unit waits for the connection past ``BUSY_WAIT`` and is told the daemon is busy (503, try
    again), naming the server, with nothing written."""
    store = PostgresRepository.open(pg_database, pool_size=1, idle_timeout=3600)
    started, release = threading.Event(), threading.Event()
    try:
        def occupy(conn: psycopg.Connection[Any]) -> None:
            started.set()
            while not release.wait(0.2):  # a long unit, such as the replica's fill, talking to the server
                conn.execute("SELECT 1")

        holder = threading.Thread(target=lambda: store.snapshot(occupy))
        holder.start()
        try:
            assert started.wait(scaled(30.0))
            t0 = time.monotonic()
            with pytest.raises(StoreBusy) as refused:
                store.read(lambda reader: reader.key_count())
            waited = time.monotonic() - t0
        finally:
            release.set()
            holder.join()
        assert refused.value.status == 503
        assert "busy" in refused.value.message and store.where in refused.value.message
        assert "does not answer" not in refused.value.message
        assert waited >= BUSY_WAIT - 0.5
        assert store.read(lambda reader: reader.key_count()) == 0
    finally:
        store.close()
