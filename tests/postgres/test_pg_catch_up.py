"""A daemon that was cut off from the server catches up, and never serves what was deleted or
superseded meanwhile as current (issue 22, Staying in step): B's network to the server freezes
(``tests/tcp_proxy.py``), A forgets one memory and corrects another and writes a few hundred
more, the network comes back, and B reads the change log from its cursor while clients keep
recalling through it. An answer B gives from its local replica (which lags until the catch-up
has copied the changes) is marked possibly stale; every answer it does not mark -- however its
reads and the catch-up interleave -- holds neither the forgotten nor the superseded memory."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Final

import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, wait_for
from pg_cluster import PgCluster, start_on
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(900)

PROPAGATION_TIMEOUT: Final = 30.0
REPLICA_TIMEOUT: Final = 120.0
NOTICE_TIMEOUT: Final = 60.0
"""Seconds for B to notice the frozen network (its change-log connection's silence watch: 5 s)."""
RECOVERY_TIMEOUT: Final = 120.0
"""Seconds for B to follow the server again once the network is back (its tries back off to 10 s)."""
READERS: Final = 4
"""Clients recalling through B while it catches up."""
AFTER_CATCH_UP: Final = 3
"""Answers each reader gets after B stopped saying stale, before the readers stop."""
FILLER_BATCHES: Final = 3
"""remember_batch calls of filler notes through A while B is away (100 each): a longer
catch-up, so the readers' requests overlap it."""

FORGOTTEN = "the staging database is backed up nightly to the old tape robot"
OLD = "the staging database lives on host db-old in the basement rack"
NEW = "the staging database lives on host db-new in the cloud region"
QUERIES: Final = ("staging database backup tape robot", "staging database host basement rack")


def _recall(daemon: DaemonProcess, query: str) -> dict[str, Any]:
    body = daemon.call("recall", {"query": query})
    assert not body["is_error"], body
    result: dict[str, Any] = body["result"]
    return result


class Readers:
    """Clients recalling through one daemon until stopped; every answer, with whether it was
    marked possibly stale."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.answers: list[tuple[bool, str]] = []
        self.problems: list[str] = []
        self._daemon = daemon
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(n,)) for n in range(READERS)]
        for thread in self._threads:
            thread.start()

    def _run(self, reader: int) -> None:
        client = self._daemon.client()
        n = reader
        while not self._stop.is_set():
            n += 1
            if n % 3 == 0:
                response = client.post("/v1/inject", json={"prompt": f"where does the {QUERIES[n % 2]} live?"})
                body = response.json() if response.status_code == 200 else None
                answer = (bool(body.get("stale")), json.dumps(body["memories"])) if body else None
            else:
                response = client.post("/v1/tools/recall", json={"arguments": {"query": QUERIES[n % 2]}})
                body = response.json() if response.status_code == 200 else None
                answer = (bool(body["result"].get("stale")), json.dumps(body["result"])) \
                    if body and not body["is_error"] else None
            with self._lock:
                if answer is None:
                    self.problems.append(response.text)
                else:
                    self.answers.append(answer)

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def test_a_daemon_catching_up_after_a_drop_never_serves_a_forgotten_or_superseded_memory_as_current(
        pg_cluster: PgCluster, pg_database: str, pg_proxy: TcpProxy, factories: list[DaemonFactory],
        tmp_path: Path) -> None:
    a = start_on(factories, tmp_path, "a", pg_database)
    b = start_on(factories, tmp_path, "b", pg_proxy.url_through(pg_database, pg_cluster.port))
    forgotten = a.remember(FORGOTTEN, ["staging database backup"])
    old = a.remember(OLD, ["staging database host"])
    client = b.client()

    def b_follows() -> bool:
        text = json.dumps([_recall(b, q) for q in QUERIES])
        return forgotten in text and old in text and str(client.get("/v1/stats").json().get("replica", "")
                                                         ).startswith("ready")
    wait_for(b_follows, REPLICA_TIMEOUT, message=lambda: f"b to follow a and fill its replica\n{b.log()}")

    pg_proxy.freeze()
    wait_for(lambda: client.get("/v1/stats").json().get("stale"), NOTICE_TIMEOUT,
             message=lambda: f"b to notice the frozen network\n{b.log()}")
    assert not a.call("forget", {"memory_id": forgotten})["is_error"]
    corrected = a.call("correct", {"memory_id": old, "content": NEW})
    assert not corrected["is_error"], corrected
    new = str(corrected["result"].get("new_id") or corrected["result"].get("saved"))
    for batch in range(FILLER_BATCHES):
        filled = a.call("remember_batch", {"items": [
            {"content": f"filler note {batch}-{n}: the build agent {batch * 100 + n} runs on rack {n % 7}",
             "keys": [f"build agent {batch * 100 + n}"]} for n in range(100)]})
        assert not filled["is_error"], filled
    # While away, B answers from what it holds, marked possibly stale.
    assert _recall(b, QUERIES[0]).get("stale"), "b says it may be stale"

    readers = Readers(b)
    try:
        wait_for(lambda: readers.count() >= READERS, PROPAGATION_TIMEOUT, message="the readers to be going")
        pg_proxy.thaw()
        wait_for(lambda: "stale" not in client.get("/v1/stats").json(), RECOVERY_TIMEOUT,
                 message=lambda: f"b to follow the server again\n{b.log()}")
        caught_up = readers.count()
        wait_for(lambda: readers.count() >= caught_up + READERS * AFTER_CATCH_UP, PROPAGATION_TIMEOUT,
                 message="the readers to get answers after the catch-up")
    finally:
        readers.stop()

    assert not readers.problems, readers.problems
    current = [text for stale, text in readers.answers if not stale]
    assert current, "answers after the catch-up are not marked stale"
    for text in current:
        assert forgotten not in text, f"the forgotten memory served as current: {text}"
        assert old not in text, f"the superseded memory served as current: {text}"
    assert any(new in text for text in current), "the correction is served once b caught up"
    assert any(stale for stale, _ in readers.answers), "answers during the catch-up came from the replica"
