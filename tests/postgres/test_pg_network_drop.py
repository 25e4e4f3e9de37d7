"""A daemon on a shared PostgreSQL store whose network to the server drops (issue 22, Faults):
not a clean stop -- the sockets stay open and nothing answers, as behind a proxy, a pooler or a
VPN box that hung (``tests/tcp_proxy.py`` between the daemon and a real server, frozen). Reads
keep answering from what the daemon holds within a bound; writes fail with a clear error within
a bound instead of hanging; after the network is back the daemon follows the server again; and
no write it acknowledged is lost (read back through a second daemon with its own way in)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, scaled, wait_for
from pg_cluster import PgCluster, start_on
from tcp_proxy import TcpProxy

from keymem_daemon.store.postgres.liveness import SILENCE_TIMEOUT
from keymem_daemon.store.postgres.repository import POOL_TIMEOUT

pytestmark = pytest.mark.timeout(600)

REPLICA_TIMEOUT: Final = 120.0
RECOVERY_TIMEOUT: Final = 120.0
"""Seconds for the daemon to follow the server again once the network is back (its tries back
off to 10 s)."""
ANSWER_BOUND: Final = SILENCE_TIMEOUT + POOL_TIMEOUT
"""The most one request may take once the network dropped: the silence after which a request
to the server is given up, and the wait for a pooled connection that others hold meanwhile
(on a quiet machine; the test allows ``scaled`` of it)."""
BURST_WRITERS: Final = 3
"""Clients remembering through the daemon while the network drops."""

KEPT = "the staging database password rotates every ninety days through the vault"


@pytest.fixture
def proxy(own_pg_cluster: PgCluster) -> Iterator[TcpProxy]:
    made = TcpProxy(own_pg_cluster.port)
    yield made
    made.close()


def _timed_post(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = client.post(path, json=body)
    return response, time.monotonic() - started


class Burst:
    """Clients remembering numbered notes through one daemon until stopped; what was
    acknowledged, and every error that came back."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.acknowledged: dict[str, str] = {}
        self.errors: list[tuple[int, str, float]] = []
        self._daemon = daemon
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(n,)) for n in range(BURST_WRITERS)]
        for thread in self._threads:
            thread.start()

    def _run(self, writer: int) -> None:
        client = self._daemon.client()
        n = 0
        while not self._stop.is_set():
            n += 1
            content = f"burst note {writer}-{n}: the deploy window for service {writer * 1000 + n} is friday"
            response, took = _timed_post(client, "/v1/tools/remember", {"arguments": {
                "content": content, "keys": [f"burst service {writer * 1000 + n}"]}})
            with self._lock:
                if response.status_code == 200 and not response.json()["is_error"]:
                    self.acknowledged[response.json()["result"]["saved"]] = content
                else:
                    self.errors.append((response.status_code, response.text, took))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def test_a_dropped_network_leaves_reads_answering_writes_failing_clearly_and_loses_nothing_acknowledged(
        own_pg_cluster: PgCluster, proxy: TcpProxy, factories: list[DaemonFactory], tmp_path: Path) -> None:
    through = proxy.url_through(own_pg_cluster.url, own_pg_cluster.port)
    a = start_on(factories, tmp_path, "a", through)
    b = start_on(factories, tmp_path, "b", own_pg_cluster.url)
    kept = a.remember(KEPT, ["staging database password"])
    client = a.client()
    wait_for(lambda: str(client.get("/v1/stats").json().get("replica", "")).startswith("ready"),
             REPLICA_TIMEOUT, message=lambda: f"a's replica to be filled\n{a.log()}")

    burst = Burst(a)
    wait_for(lambda: len(burst.acknowledged) >= BURST_WRITERS, REPLICA_TIMEOUT, message="the burst to be going")
    proxy.freeze()
    try:
        # Reads answer from what the daemon holds, within the bound, from the first one on.
        response, took = _timed_post(client, "/v1/tools/recall", {"arguments": {
            "query": "staging database password vault"}})
        assert response.status_code == 200 and kept in response.text, response.text
        assert took < scaled(ANSWER_BOUND), took
        stale = wait_for(lambda: client.get("/v1/stats").json().get("stale"), ANSWER_BOUND * 2,
                         message=lambda: f"a to say it is possibly stale\n{a.log()}")
        assert "possibly stale" in stale and f"127.0.0.1:{proxy.port}" in stale, stale
        wait_for(lambda: len(burst.errors) >= BURST_WRITERS, ANSWER_BOUND * 2,
                 message="the burst's writes to fail")
        injected, took = _timed_post(client, "/v1/inject", {
            "prompt": "how often does the staging database password rotate in the vault?"})
        assert kept in json.dumps(injected.json()["memories"]) and "possibly stale" in injected.json()["stale"]
        assert took < scaled(ANSWER_BOUND), took
    finally:
        burst.stop()
        proxy.thaw()

    # Every write failed clearly, within the bound, naming the server.
    assert burst.errors, "writes during the drop failed"
    for status, text, took in burst.errors:
        error = json.loads(text)["error"]
        assert status >= 500 and error["code"] == "store_unavailable", text
        assert f"127.0.0.1:{proxy.port}" in error["message"], text
        assert took < scaled(ANSWER_BOUND), (took, text)

    # Once the network is back the daemon follows the server again and writes through it.
    wait_for(lambda: "stale" not in client.get("/v1/stats").json(), RECOVERY_TIMEOUT,
             message=lambda: f"a to follow the server again\n{a.log()}")
    after = a.remember("the staging database freeze starts on the first of june", ["staging freeze"])
    wait_for(lambda: after in json.dumps(b.call("recall", {"query": "staging database freeze june"})),
             RECOVERY_TIMEOUT, message="b to recall what a wrote after the drop")

    # Nothing acknowledged was lost: every note a acknowledged is on the server.
    assert burst.acknowledged
    for memory_id, content in burst.acknowledged.items():
        got = b.call("read_memory", {"memory_id": memory_id})
        assert not got["is_error"] and got["result"]["memory"]["content"] == content, got
