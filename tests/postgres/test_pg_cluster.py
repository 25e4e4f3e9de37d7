"""The throwaway PostgreSQL cluster itself (tests/pg_cluster.py): it runs, needs passwords,
and is not run as root."""

from __future__ import annotations

import os

import psycopg
import pytest
from pg_cluster import OWNER, PgCluster


def test_the_owner_reaches_its_database_with_its_password(pg_cluster: PgCluster) -> None:
    with psycopg.connect(pg_cluster.url) as conn:
        row = conn.execute("SELECT current_user, current_database(), current_setting('server_version_num')::int")
        assert row.fetchone() == (OWNER, "keymem", pytest.approx(150000, abs=99999))


def test_a_wrong_password_is_refused(pg_cluster: PgCluster) -> None:
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg_cluster.url_for(OWNER, password="not-the-password")).close()


def test_the_server_runs_as_an_unprivileged_user(pg_cluster: PgCluster) -> None:
    # PostgreSQL refuses root; when the tests run as root the cluster runs as another user.
    pid = int((pg_cluster.data_dir / "postmaster.pid").read_text().split()[0])
    assert os.stat(f"/proc/{pid}").st_uid != 0
    assert (pg_cluster.socket_dir / f".s.PGSQL.{pg_cluster.port}").is_socket()
