"""A server that answers and refuses the daemon (issue 22, Faults): a wrong password, a role or
a database that does not exist, a role without CONNECT on the database. Trying again cannot
cure any of them, so the daemon does not retry them with backoff as if the server were down:
``keymemd start`` fails at once with a message naming the server and the role (never the
password), and the log shows one refusal, not a loop of tries. (A server that is down is
tried again until it is back: test_pg_offline_start.py.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest
from daemon_helpers import DaemonFactory, isolated_env, scaled, wait_for
from pg_cluster import OWNER, PgCluster

from keymem_daemon.errors import StoreError, StoreUnavailable
from keymem_daemon.store.postgres.repository import POOL_TIMEOUT, PostgresRepository

pytestmark = pytest.mark.timeout(600)

REFUSAL_BOUND: Final = POOL_TIMEOUT
"""What a refusal may take to be reported, on a quiet machine: less than the pool's timeout,
which is how long a refused connection was retried before (and then retried for ever)."""
START_BOUND: Final = 30.0
"""``keymemd start`` until it reports the refusal (the daemon's imports and its embedder load
come first; a quiet machine takes a few seconds)."""

RECOVERY_TIMEOUT: Final = 120.0
"""Seconds for a daemon started while the server was down to find it (its tries back off to 10 s)."""

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _refused(url: str) -> tuple[StoreError, float]:
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        PostgresRepository.open(url).close()
    return caught.value, time.monotonic() - started


def test_a_wrong_password_fails_keymemd_start_at_once_naming_the_server_and_role_without_retrying(
        pg_cluster: PgCluster, tmp_path: Path, cli: Cli) -> None:
    wrong = "not-the-owners-password-4711"
    env = isolated_env(tmp_path, KEYMEM_STORE_URL=pg_cluster.url_for(OWNER, password=wrong))
    server_log = pg_cluster.log_file.stat().st_size
    started = time.monotonic()
    result = cli("start", env=env)
    took = time.monotonic() - started
    try:
        assert result.returncode != 0, result.stdout
        out = result.stdout + result.stderr
        assert f"127.0.0.1:{pg_cluster.port}/keymem as {OWNER}" in out, out
        assert "refuses this daemon" in out and "password authentication failed" in out, out
        assert "does not retry" in out, out
        assert wrong not in out and pg_cluster.passwords[OWNER] not in out, out
        assert took < scaled(START_BOUND), took
        log = (tmp_path / "data" / "logs" / "daemon.log").read_text(errors="replace")
        assert wrong not in log, log
        assert "trying again" not in log and "error connecting" not in log, log
        # One try reached the server, not a loop of them.
        with pg_cluster.log_file.open("rb") as server:
            server.seek(server_log)
            tries = server.read().decode(errors="replace").count(f'password authentication failed for user "{OWNER}"')
        assert tries == 1, tries
    finally:
        cli("stop", env=env)


def test_an_unknown_role_a_missing_database_and_no_connect_privilege_are_refusals_not_outages(
        pg_cluster: PgCluster) -> None:
    stranger = pg_cluster.create_role("stranger")  # may log in, has no CONNECT on keymem
    cases = {
        "unknown role": (pg_cluster.url.replace(f"{OWNER}:", "nobody_here_at_all:"), "authentication failed"),
        "missing database": (pg_cluster.url_for(OWNER, "no_such_database"),
                             'database "no_such_database" does not exist'),
        "no CONNECT": (pg_cluster.url_for(stranger), 'permission denied for database "keymem"'),
    }
    for case, (url, reason) in cases.items():
        error, took = _refused(url)
        assert not isinstance(error, StoreUnavailable), (case, error)
        assert "refuses this daemon" in error.message and reason in error.message, (case, error.message)
        assert f"127.0.0.1:{pg_cluster.port}/" in error.message, (case, error.message)
        assert all(secret not in error.message for secret in pg_cluster.passwords.values()), (case, error.message)
        assert took < scaled(REFUSAL_BOUND), (case, took)


def test_a_server_that_does_not_answer_is_still_an_outage(pg_cluster: PgCluster) -> None:
    with pytest.raises(StoreUnavailable, match="cannot reach the store"):
        PostgresRepository.open(pg_cluster.url.replace(f":{pg_cluster.port}/", ":1/")).close()


def test_a_daemon_started_while_the_server_was_down_stops_trying_once_the_server_refuses_it(
        own_pg_cluster: PgCluster, tmp_path: Path) -> None:
    cluster = own_pg_cluster
    wrong = "not-the-owners-password-0815"
    cluster.stop_server()
    factory = DaemonFactory(tmp_path)
    try:
        daemon = factory.start(KEYMEM_STORE_URL=cluster.url_for(OWNER, password=wrong))
        client = daemon.client()
        assert "does not answer" in client.get("/v1/stats").json()["stale"]
        server_log = cluster.log_file.stat().st_size
        cluster.start_server()
        stale = wait_for(lambda: "refuses this daemon" in str(client.get("/v1/stats").json().get("stale"))
                         and client.get("/v1/stats").json()["stale"], RECOVERY_TIMEOUT,
                         message=lambda: f"the daemon to say the server refuses it\n{daemon.log()}")
        assert f"127.0.0.1:{cluster.port}/keymem as {OWNER}" in stale and "password authentication failed" in stale
        assert wrong not in stale and "restarted" in stale, stale
        health = client.get("/health").json()
        assert any("refuses this daemon" in w for w in health.get("warnings", [])), health
        assert "not trying again" in daemon.log() and wrong not in daemon.log()
        with cluster.log_file.open("rb") as server:
            server.seek(server_log)
            tries = server.read().decode(errors="replace").count(f'password authentication failed for user "{OWNER}"')
        assert tries == 1, tries
    finally:
        factory.teardown()
