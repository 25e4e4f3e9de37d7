"""A daemon on a shared PostgreSQL store that starts while the server is down (issue 22,
Faults): it starts anyway -- on the local replica its last run kept (reads answer, marked
possibly stale), or on nothing, saying so -- refuses writes at once naming the server, finds the
server by itself once it is back, and then serves what the server holds and stops saying
stale. With team namespaces apart, the personal half keeps working fully meanwhile. A replica
whose fill the outage cut answers with what it holds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Final

import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, wait_for
from pg_cluster import PgCluster

from keymem_daemon.engine.ports import MemoryRow
from keymem_daemon.errors import StoreUnavailable
from keymem_daemon.store.postgres.offline import FailoverRepository, Replica
from keymem_daemon.store.postgres.repository import POOL_TIMEOUT, PostgresRepository

pytestmark = pytest.mark.timeout(600)

REPLICA_TIMEOUT: Final = 120.0
"""Seconds for a daemon's local replica to be filled (a few memories: well under one)."""
RECOVERY_TIMEOUT: Final = 120.0
"""Seconds for a daemon to find the restarted server (its tries back off to 10 s)."""
ANSWER_LIMIT: Final = POOL_TIMEOUT
"""What no answer may take while the server is down (the pool's timeout: what a write waited
before to fail)."""

KEPT = "the staging database password rotates every ninety days through the vault"
LATER = "the staging database freeze starts on the first of june"


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.monotonic()
    value = fn()
    return value, time.monotonic() - started


def _refused_write(daemon: DaemonProcess, cluster: PgCluster, **extra: str) -> None:
    """A remember is refused at once, naming the server, without its password."""
    response, took = _timed(lambda: daemon.client().post("/v1/tools/remember", json={"arguments": {
        "content": "the staging database moves again next week", "keys": ["staging move"], **extra}}))
    body = response.json()
    assert response.status_code >= 500 and body["error"]["code"] == "store_unavailable", body
    message = body["error"]["message"]
    assert f"127.0.0.1:{cluster.port}" in message and "nothing was written" in message, message
    assert all(secret not in message for secret in cluster.passwords.values()), message
    assert took < ANSWER_LIMIT, took


def _stale(daemon: DaemonProcess) -> str:
    stats = daemon.client().get("/v1/stats").json()
    stale = stats.get("stale")
    assert stale and "possibly stale" in stale, stats
    health = daemon.client().get("/health").json()
    assert health["status"] == "ready" and any("possibly stale" in w for w in health.get("warnings", [])), health
    return str(stale)


def _wait_followed(daemon: DaemonProcess) -> None:
    wait_for(lambda: "stale" not in daemon.client().get("/v1/stats").json(), RECOVERY_TIMEOUT,
             message=lambda: f"the daemon to follow the server\n{daemon.log()}")


def _recall(daemon: DaemonProcess, query: str, **extra: str) -> dict[str, Any]:
    body = daemon.call("recall", {"query": query, **extra})
    assert not body["is_error"], body
    return body


def _factory(tmp_path: Path, factories: list[DaemonFactory], name: str) -> DaemonFactory:
    (tmp_path / name).mkdir()
    factory = DaemonFactory(tmp_path / name)
    factories.append(factory)
    return factory


def test_a_daemon_started_while_the_server_is_down_serves_what_it_kept_and_follows_the_server_once_back(
        own_pg_cluster: PgCluster, tmp_path: Path, factories: list[DaemonFactory]) -> None:
    cluster = own_pg_cluster
    kept_factory = _factory(tmp_path, factories, "kept")
    first = kept_factory.start(KEYMEM_STORE_URL=cluster.url)
    kept = first.remember(KEPT, ["staging database password"])
    wait_for(lambda: str(first.client().get("/v1/stats").json().get("replica", "")).startswith("ready"),
             REPLICA_TIMEOUT, message=lambda: f"the replica to be filled\n{first.log()}")
    kept_factory.stop(first)
    cluster.stop_server()

    # Started again while the server is down: reads answer from the replica it kept.
    again = kept_factory.start(KEYMEM_STORE_URL=cluster.url)
    stale = _stale(again)
    assert f"127.0.0.1:{cluster.port}" in stale and "kept from its last run" in stale, stale
    recalled, took = _timed(lambda: _recall(again, "staging database password vault"))
    assert kept in json.dumps(recalled["result"]) and "possibly stale" in recalled["result"]["stale"], recalled
    assert took < ANSWER_LIMIT, took
    got = again.call("read_memory", {"memory_id": kept})
    assert not got["is_error"] and got["result"]["memory"]["content"] == KEPT, got
    # The push path (what the hook calls) answers from it too, at once.
    injected, took = _timed(lambda: again.client().post("/v1/inject", json={
        "prompt": "how often does the staging database password rotate in the vault?"}).json())
    assert kept in json.dumps(injected["memories"]) and "possibly stale" in injected["stale"], injected
    assert took < ANSWER_LIMIT, took
    _refused_write(again, cluster)

    # A daemon that never saw the server starts too, on nothing, and says so.
    fresh = _factory(tmp_path, factories, "fresh").start(KEYMEM_STORE_URL=cluster.url)
    stale = _stale(fresh)
    assert "holds no copy" in stale, stale
    assert kept not in json.dumps(_recall(fresh, "staging database password vault")), "nothing to find"
    _refused_write(fresh, cluster)

    # The server comes back: both find it by themselves and serve what it holds.
    cluster.start_server()
    for daemon in (again, fresh):
        _wait_followed(daemon)
    assert kept in json.dumps(_recall(fresh, "staging database password vault")), "loaded from the server"
    later = again.remember(LATER, ["staging freeze"])
    wait_for(lambda: later in json.dumps(_recall(fresh, "staging database freeze june")), RECOVERY_TIMEOUT,
             message="the restarted daemons to follow each other")
    assert "stale" not in json.dumps(fresh.call("read_memory", {"memory_id": later}))
    wait_for(lambda: str(fresh.client().get("/v1/stats").json().get("replica", "")).startswith("ready"),
             REPLICA_TIMEOUT, message="the fresh daemon's replica to be filled")


def test_with_team_namespaces_apart_a_start_without_the_server_keeps_the_personal_half_whole(
        own_pg_cluster: PgCluster, tmp_path: Path, factories: list[DaemonFactory]) -> None:
    factory = _factory(tmp_path, factories, "f")
    own_pg_cluster.stop_server()
    daemon = factory.start(KEYMEM_STORE_URL=own_pg_cluster.url, KEYMEM_TEAM_NAMESPACES="team-*")
    assert "holds no copy" in _stale(daemon)
    personal = daemon.remember("my editor theme is solarized dark on every machine", ["editor theme"])
    recalled = _recall(daemon, "editor theme solarized")
    assert personal in json.dumps(recalled["result"]), recalled
    _refused_write(daemon, own_pg_cluster, namespace="team-payments")
    own_pg_cluster.start_server()
    _wait_followed(daemon)
    team = daemon.remember("the team deploys the payments service only on tuesdays", ["payments deploy"],
                           namespace="team-payments")
    both = json.dumps(_recall(daemon, "payments service deploy tuesdays")["result"])
    assert team in both, both
    assert personal in json.dumps(_recall(daemon, "editor theme solarized")["result"]), "the local half"


def test_a_replica_whose_fill_the_outage_cut_answers_with_what_it_holds_instead_of_failing(
        own_pg_cluster: PgCluster, tmp_path: Path) -> None:
    server = PostgresRepository.open(own_pg_cluster.url)
    store = FailoverRepository(server, Replica.create(tmp_path / "replica.db", server))
    try:
        store.write(lambda w: w.insert_memory(MemoryRow(
            id="m-kept", content="note m-kept", dedup_hash="m-kept", namespace="proj", at=1.0, observed_at=None,
            decay_profile="standard", source={}, expires_at=None, vector=b"\0" * 8)))
        own_pg_cluster.stop_server()
        store.replica.fill_in_background().join()
        # The first unit finds the server gone; then reads answer from what the copy holds.
        assert store.read(lambda r: sorted(r.memories(["m-kept"]))) == []
        assert store.offline() is not None
        assert store.replica.describe().startswith("partial"), store.replica.describe()
        started = time.monotonic()
        assert store.read(lambda r: r.memory_content("m-kept")) is None
        with pytest.raises(StoreUnavailable, match="nothing was written"):
            store.write(lambda w: w.delete_memory("m-kept"))
        took = time.monotonic() - started
        assert not Path(f"{tmp_path / 'replica.db'}.filled").exists(), "a cut fill is not kept for the next start"
    finally:
        store.close()
    assert took < ANSWER_LIMIT, took
