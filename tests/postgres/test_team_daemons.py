"""Real daemons serving from one PostgreSQL database (issue 22): each ``keymemd run`` with its
own data directory and ``KEYMEM_STORE_URL`` pointing at the same database. A memory saved
through one is recalled through the other once its change log reached it; the same key made
by both at once is one key; a forget through one is gone from the other; a role without a
grant gets nothing; a stopped server fails writes clearly and loses nothing acknowledged."""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from daemon_helpers import READY_TIMEOUT, DaemonFactory, DaemonProcess, isolated_env, wait_for
from pg_cluster import PgCluster, start_on

PROPAGATION_TIMEOUT = 30.0
"""Seconds a write through one daemon may take to be recallable through the other on a loaded
machine (it takes well under a second: NOTIFY wakes the follower at once)."""
RECOVERY_TIMEOUT = 90.0
"""Seconds for a daemon to write again after its server restarted (the pool reconnects with
backoff from 1 s)."""
PROPAGATION_ROUNDS = 5
CONCURRENT_ROUNDS = 6
"""Rounds of two daemons creating one new key at the same moment (a race: each round may miss it)."""
Cli = Callable[..., subprocess.CompletedProcess[str]]


def _recalls(daemon: DaemonProcess, query: str, memory_id: str) -> bool:
    return memory_id in json.dumps(daemon.call("recall", {"query": query})["result"])


def test_two_daemons_see_each_others_writes_and_forgets(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    a = start_on(factories, tmp_path, "a", pg_database)
    b = start_on(factories, tmp_path, "b", pg_database)
    stats = b.client().get("/v1/stats").json()
    assert stats["store"].startswith("postgresql "), stats
    assert "stale" not in stats, stats
    delays = []
    for i, (writer, reader) in enumerate([(a, b), (b, a)] * PROPAGATION_ROUNDS):
        content = f"the staging deploy of service number {i} needs the blue-green switch flipped by hand"
        started = time.monotonic()
        memory_id = writer.remember(content, [f"deploy service {i}"])
        wait_for(lambda: _recalls(reader, f"staging deploy service number {i} blue-green", memory_id),  # noqa: B023
                 PROPAGATION_TIMEOUT, message=f"memory {memory_id} to be recalled through the other daemon")
        delays.append(time.monotonic() - started)
    print(f"propagation (remember on one daemon to recall on the other, over HTTP): "
          f"p50 {statistics.median(delays) * 1000:.0f} ms, max {max(delays) * 1000:.0f} ms")
    # What one forgets the other stops serving.
    forgotten = a.remember("the release train leaves on thursdays at noon sharp", ["release train"])
    wait_for(lambda: _recalls(b, "release train thursdays noon", forgotten), PROPAGATION_TIMEOUT,
             message="the memory to reach b")
    done = a.call("forget", {"memory_id": forgotten})
    assert not done["is_error"], done
    wait_for(lambda: not _recalls(b, "release train thursdays noon", forgotten), PROPAGATION_TIMEOUT,
             message="the forgotten memory to disappear from b")
    # A correction through b supersedes: a serves the new version, not the old one.
    old = a.remember("the on-call phone number lives in the vault under ops/phone", ["on-call phone"])
    wait_for(lambda: _recalls(b, "on-call phone number vault", old), PROPAGATION_TIMEOUT, message="old to reach b")
    corrected = b.call("correct", {"memory_id": old, "content": "the on-call phone number lives in the wiki now"})
    assert not corrected["is_error"], corrected
    new = str(corrected["result"].get("new_id") or corrected["result"].get("saved"))

    def only_new() -> bool:
        found = json.dumps(a.call("recall", {"query": "on-call phone number"})["result"])
        return new in found and old not in found

    wait_for(only_new, PROPAGATION_TIMEOUT, message="a to serve the correction instead of the old memory")


def test_the_same_key_made_through_both_daemons_at_once_is_one_key(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    a = start_on(factories, tmp_path, "a", pg_database)
    b = start_on(factories, tmp_path, "b", pg_database)
    for round_ in range(CONCURRENT_ROUNDS):
        key = f"kubernetes ingress controller {round_}"
        barrier = threading.Barrier(2)
        saved: list[str] = []

        def save(daemon: DaemonProcess, key: str = key, barrier: threading.Barrier = barrier,
                 saved: list[str] = saved) -> None:
            barrier.wait()
            saved.append(daemon.remember(f"the ingress needs a restart after rotating certs ({daemon.pid})", [key]))

        threads = [threading.Thread(target=save, args=(d,)) for d in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(saved) == 2
        with psycopg.connect(pg_database) as conn:
            keys = conn.execute("SELECT id FROM keys WHERE norm = %s", (key,)).fetchall()
            linked = conn.execute("SELECT COUNT(DISTINCT memory_id) FROM links WHERE key_id = %s",
                                  (keys[0][0],)).fetchone() if keys else None
        assert len(keys) == 1, (round_, keys)
        assert linked is not None and linked[0] == 2


def test_a_role_gets_through_keymem_only_the_namespaces_granted_to_it(
        factories: list[DaemonFactory], tmp_path: Path, cli: Cli, pg_cluster: PgCluster, pg_database: str) -> None:
    owner = start_on(factories, tmp_path, "owner", pg_database)
    private = owner.remember("the payroll export runs from the finance box at midnight", ["payroll export"])
    shared = owner.remember("the deploy freeze starts every friday at three", ["deploy freeze"], namespace="team-docs")
    database = pg_database.rsplit("/", 1)[1]
    reader_role, stranger_role = pg_cluster.create_role("reader"), pg_cluster.create_role("stranger")
    granted = cli("team", "grant", "team-docs", reader_role, env=isolated_env(tmp_path, KEYMEM_STORE_URL=pg_database))
    assert granted.returncode == 0, granted.stderr
    # A role with no grant at all (but allowed to connect, so that row-level security is what
    # stops it): its daemon refuses to serve, saying why, and shows nothing.
    pg_cluster.admin(f'GRANT CONNECT ON DATABASE "{database}" TO "{stranger_role}"')
    (tmp_path / "stranger").mkdir()
    stranger = DaemonFactory(tmp_path / "stranger")
    process, output = stranger.spawn(KEYMEM_STORE_URL=pg_cluster.url_for(stranger_role, database))
    assert process.wait(timeout=READY_TIMEOUT * 2) == 1
    said = output.read_text(errors="replace") + (stranger.data_dir / "logs" / "daemon.log").read_text(errors="replace")
    assert f"as {stranger_role} refused" in said and "row-level security" in said, said
    assert "payroll" not in said and all(p not in said for p in pg_cluster.passwords.values())
    # A role granted one namespace to read: that namespace, nothing else, and no writes.
    reader = start_on(factories, tmp_path, "reader", pg_cluster.url_for(reader_role, database))
    assert _recalls(reader, "deploy freeze friday", shared)
    assert not _recalls(reader, "payroll export finance box midnight", private)
    assert private not in json.dumps(reader.call("recall", {"query": "payroll export", "namespace": "default"}))
    refused = reader.call("remember", {"content": "a note the reader may not write", "keys": ["note"],
                                       "namespace": "team-docs"})
    assert f"as {reader_role} refused the write" in refused["result"].get("error", ""), refused


def _remember_raw(client: httpx.Client, i: int) -> tuple[int, Any]:
    try:
        response = client.post("/v1/tools/remember", json={"arguments": {
            "content": f"burst note {i}: the cache warmer must run before the traffic switch", "keys": ["burst"]}})
    except httpx.HTTPError as exc:
        return -1, str(exc)
    return response.status_code, response.json()


def test_stopping_postgresql_mid_burst_loses_no_acknowledged_write(
        factories: list[DaemonFactory], tmp_path: Path, own_pg_cluster: PgCluster) -> None:
    a = start_on(factories, tmp_path, "a", own_pg_cluster.url)
    client = a.client(timeout=120.0)
    acknowledged: list[str] = []
    errors: list[str] = []
    i = 0
    for _ in range(20):
        status, body = _remember_raw(client, i)
        i += 1
        assert status == 200 and not body["is_error"], body
        acknowledged.append(body["result"]["saved"])
    own_pg_cluster.stop_server()
    # Writes now fail, each within the pool's timeout, naming the server.
    for _ in range(3):
        started = time.monotonic()
        status, body = _remember_raw(client, i)
        i += 1
        took = time.monotonic() - started
        assert took < 60, took
        if status == 200 and not body.get("is_error"):
            acknowledged.append(body["result"]["saved"])
            continue
        text = json.dumps(body)
        errors.append(text)
        assert f"127.0.0.1:{own_pg_cluster.port}" in text, text
        assert all(p not in text for p in own_pg_cluster.passwords.values())
    assert errors, "no write failed while the server was down"
    # The daemon says it may be stale, and still answers /v1/stats.
    stats = wait_for(lambda: (s := client.get("/v1/stats").json()).get("stale") and s, PROPAGATION_TIMEOUT,
                     message="/v1/stats to say possibly stale")
    assert "possibly stale" in stats["stale"] and f"127.0.0.1:{own_pg_cluster.port}" in stats["stale"]
    own_pg_cluster.start_server()

    def writes_again() -> str | None:
        status, body = _remember_raw(client, 10_000)
        return body["result"]["saved"] if status == 200 and not body.get("is_error") else None

    acknowledged.append(wait_for(writes_again, RECOVERY_TIMEOUT, interval=0.5, message="writes to work again"))
    wait_for(lambda: "stale" not in client.get("/v1/stats").json(), RECOVERY_TIMEOUT,
             message="the daemon to follow the change log again")
    with psycopg.connect(own_pg_cluster.url) as conn:
        stored = {r[0] for r in conn.execute("SELECT id FROM memories")}
    assert set(acknowledged) <= stored, set(acknowledged) - stored


def test_restore_says_it_does_not_apply_to_a_postgresql_store(cli: Cli, tmp_path: Path) -> None:
    url = "postgresql://alice:hunter2@db.example:5432/keymem"
    done = cli("restore", env=isolated_env(tmp_path, KEYMEM_STORE_URL=url))
    assert done.returncode == 1
    assert "SQLite backups only" in done.stderr and "db.example:5432/keymem" in done.stderr, done.stderr
    assert "hunter2" not in done.stderr + done.stdout
