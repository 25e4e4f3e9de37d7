"""A session that hangs mid-transaction holding row locks (issue 22, Faults): a daemon whose
network to the server froze (``tests/tcp_proxy.py``, frozen) after its write changed a memory's
row and before its COMMIT got through. The server keeps such a session, and its locks, until
its own TCP keepalive gives up -- hours. Another daemon's write to the same row must not wait
on it without bound nor take the server for gone: keymem's sessions carry
``idle_in_transaction_session_timeout`` (the server ends the hung one) and ``lock_timeout``
(the waiting write is run again), so the second daemon's correction is acknowledged within
the two timeouts, and it is on the server afterwards; the hung write is never acknowledged."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Final

import pytest
from daemon_helpers import DaemonFactory, scaled, wait_for
from pg_cluster import PgCluster, start_on
from tcp_proxy import TcpProxy

from keymem_daemon.config import STORE_IDLE_TIMEOUT, STORE_LOCK_TIMEOUT
from keymem_daemon.engine.ports import Writer
from keymem_daemon.errors import StoreError
from keymem_daemon.store.postgres.repository import PostgresRepository

pytestmark = pytest.mark.timeout(600)

WRITE_BOUND: Final = STORE_IDLE_TIMEOUT + 2 * STORE_LOCK_TIMEOUT
"""The most the second daemon's write may take on a quiet machine: the server ends the hung
session once it sat idle ``STORE_IDLE_TIMEOUT`` s (counted from before the write began), and
the write waits out at most one more lock timeout before its next run gets the row; the
test allows ``scaled`` of it."""
HANG_TIMEOUT: Final = 60.0
"""Seconds for the hung write's first statements to reach the server."""

OLD = "the billing export runs every night at two from the reporting replica"
NEW = "the billing export runs every night at three from the reporting replica"


def test_a_session_hung_mid_write_never_blocks_another_daemons_write_to_the_same_row_for_long(
        pg_cluster: PgCluster, pg_database: str, pg_proxy: TcpProxy, factories: list[DaemonFactory],
        tmp_path: Path) -> None:
    b = start_on(factories, tmp_path, "b", pg_database)
    old = b.remember(OLD, ["billing export"])
    hung = PostgresRepository.open(pg_proxy.url_through(pg_database, pg_cluster.port), pool_size=1)
    holding, release = threading.Event(), threading.Event()
    outcome: list[BaseException | str] = []

    def hang(writer: Writer) -> str:
        writer.count_access(old, time.time())  # locks old's row
        writer.memory_content(old)  # its answer: the UPDATE reached the server
        holding.set()
        release.wait()
        return "committed"

    def run() -> None:
        try:
            outcome.append(hung.write(hang))
        except BaseException as exc:  # noqa: BLE001 - what the hung write ended with is the point
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert holding.wait(scaled(HANG_TIMEOUT)), "the hung write's UPDATE reached the server"
        pg_proxy.freeze()  # its COMMIT never will
        started = time.monotonic()
        response = b.client().post("/v1/tools/correct", json={"arguments": {"memory_id": old, "content": NEW}})
        took = time.monotonic() - started
        assert response.status_code == 200 and not response.json()["is_error"], response.text
        assert took < scaled(WRITE_BOUND), took
        assert "stale" not in b.client().get("/v1/stats").json(), "b never took the server for gone"
    finally:
        release.set()
        thread.join()
        pg_proxy.thaw()
        hung.close()
    # The hung write was never acknowledged: its session was ended under it.
    assert isinstance(outcome[0], StoreError), outcome
    new = str(response.json()["result"].get("new_id") or response.json()["result"].get("saved"))

    # Nothing acknowledged is lost: the correction is on the server, for a daemon that loads anew.
    fresh = PostgresRepository.open(pg_database)
    try:
        memory = fresh.read(lambda reader: reader.memory(old))
        assert memory is not None and memory.superseded_by == new, memory
        assert fresh.read(lambda reader: reader.memory_content(new)) == NEW
    finally:
        fresh.close()
    got = wait_for(lambda: b.call("read_memory", {"memory_id": new}), 30.0, message="b to read the correction")
    assert got["result"]["memory"]["content"] == NEW, got
