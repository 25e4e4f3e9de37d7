"""The role's password changed while the daemon runs (issue 22, Faults): an administrator's
``ALTER ROLE ... PASSWORD`` and the daemon's sessions ended (a restart of the server, a pooler
recycling them). The daemon's password comes from ``PGPASSFILE``, which libpq reads again at
every connection. Until the file is fixed, a write fails naming the server, the role and the
server's reason ("password authentication failed"), nothing is written, and ``/health`` says
the same; once the file holds the new password the daemon is back by itself."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Final

import psycopg
import pytest
from daemon_helpers import DaemonFactory, scaled, wait_for
from pg_cluster import PgCluster, start_on
from psycopg import sql

pytestmark = pytest.mark.timeout(600)

REFUSAL_TIMEOUT: Final = 30.0
"""Seconds for the daemon to try the server again after its sessions ended (0.5 s)."""
RECOVERY_TIMEOUT: Final = 60.0
"""Seconds for the daemon to find the fixed password: its reconnect backoff is at most 10 s."""


def test_a_changed_password_is_named_as_the_servers_refusal_and_a_fixed_passfile_brings_the_daemon_back(
        pg_cluster: PgCluster, factories: list[DaemonFactory], tmp_path: Path) -> None:
    role = pg_cluster.create_role("rotated")
    database = pg_cluster.create_database(role)
    passfile = tmp_path / "pgpass"

    def write_passfile(password: str) -> None:
        passfile.write_text(f"{pg_cluster.host}:{pg_cluster.port}:{database}:{role}:{password}\n")
        passfile.chmod(0o600)

    write_passfile(pg_cluster.passwords[role])
    url = f"postgresql://{role}@{pg_cluster.host}:{pg_cluster.port}/{database}"
    daemon = start_on(factories, tmp_path, "d", url, PGPASSFILE=str(passfile))
    first = daemon.remember("the release train leaves on thursdays at noon", ["release train"])
    new_password = "rotated-" + pg_cluster.passwords[role]
    pg_cluster.admin(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(new_password)))
    pg_cluster.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", params=(role,))

    with daemon.client(timeout=scaled(120.0)) as client:
        # The daemon learns why at its first try to reconnect (0.5 s after the sessions ended);
        # until then a write says only that the server does not answer.
        wait_for(lambda: "password authentication failed" in (client.get("/v1/stats").json().get("stale") or ""),
                 REFUSAL_TIMEOUT, message="the daemon to find its password refused")
        began = time.monotonic()
        answer = client.post("/v1/tools/remember", json={"arguments": {
            "content": "the release train skips the week of a holiday", "keys": ["release train"]}})
        took = time.monotonic() - began
        health = client.get("/health").json()
    text = json.dumps(answer.json())
    assert answer.status_code >= 400, answer.text
    assert "password authentication failed" in text and role in text and str(pg_cluster.port) in text, text
    assert "nothing was written" in text, text
    assert new_password not in text and pg_cluster.passwords[role] not in text
    assert took < scaled(15.0), took
    assert any("possibly stale" in w and "password authentication failed" in w for w in health["warnings"]), health
    with psycopg.connect(pg_cluster.url_for(role, database, password=new_password)) as conn:
        assert conn.execute("SELECT id FROM memories").fetchall() == [(first,)]

    write_passfile(new_password)
    with daemon.client(timeout=scaled(120.0)) as client:
        wait_for(lambda: client.get("/v1/stats").json().get("stale") is None, RECOVERY_TIMEOUT,
                 message="the daemon to connect with the fixed passfile")
    second = daemon.remember("the release train skips the week of a holiday", ["release train"])
    with psycopg.connect(pg_cluster.url_for(role, database, password=new_password)) as conn:
        assert {row[0] for row in conn.execute("SELECT id FROM memories")} == {first, second}
