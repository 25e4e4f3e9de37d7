"""``keymemd team grant|revoke|list`` as a person runs them: real subprocesses against the
throwaway PostgreSQL cluster, checked through what the granted role then sees over plain SQL."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from daemon_helpers import isolated_env
from pg_cluster import OWNER, PgCluster
from psycopg.conninfo import conninfo_to_dict

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _team(cli: Cli, tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("team", *args, env=isolated_env(tmp_path, KEYMEM_STORE_URL=url))


def _ok(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


def _secrets(cluster: PgCluster) -> list[str]:
    return list(cluster.passwords.values())


def _seed(url: str) -> None:
    with psycopg.connect(url) as owner:
        for memory_id, namespace in (("m-deploy", "deploy-rules"), ("m-private", "alice-notes")):
            owner.execute("INSERT INTO memories(id, content, dedup_hash, namespace, created_at, updated_at, "
                          "last_confirmed_at) VALUES (%s, 'x', %s, %s, 1, 1, 1)", (memory_id, memory_id, namespace))


def test_a_granted_namespace_is_what_the_role_sees_until_it_is_revoked(
        cli: Cli, tmp_path: Path, pg_cluster: PgCluster, pg_database: str) -> None:
    database = str(conninfo_to_dict(pg_database)["dbname"])
    alice = pg_cluster.create_role("alice")
    # The first grant sets the empty database up.
    granted = _ok(_team(cli, tmp_path, pg_database, "grant", "Deploy-Rules", alice, "--json"))
    assert {k: granted[k] for k in ("namespace", "role", "mode")} == {"namespace": "deploy-rules", "role": alice,
                                                                      "mode": "read"}
    _seed(pg_database)
    with psycopg.connect(pg_cluster.url_for(alice, database)) as conn:
        assert conn.execute("SELECT id FROM memories").fetchall() == [("m-deploy",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO memories(id, content, dedup_hash, namespace, created_at, updated_at, "
                         "last_confirmed_at) VALUES ('m-new', 'x', 'h', 'deploy-rules', 1, 1, 1)")
    # Granting again changes the mode.
    regranted = _ok(_team(cli, tmp_path, pg_database, "grant", "deploy-rules", alice, "--write", "--json"))
    assert regranted["mode"] == "write"
    with psycopg.connect(pg_cluster.url_for(alice, database)) as conn:
        conn.execute("INSERT INTO memories(id, content, dedup_hash, namespace, created_at, updated_at, "
                     "last_confirmed_at) VALUES ('m-new', 'x', 'h', 'deploy-rules', 1, 1, 1)")
    listed = _ok(_team(cli, tmp_path, pg_database, "list", "--json"))["grants"]
    assert [(g["namespace"], g["role"], g["mode"]) for g in listed] == [  # type: ignore[attr-defined]
        ("deploy-rules", alice, "write")]
    human = _team(cli, tmp_path, pg_database, "list")
    assert human.returncode == 0 and alice in human.stdout and "write" in human.stdout
    assert _ok(_team(cli, tmp_path, pg_database, "revoke", "deploy-rules", alice, "--json"))["revoked"] is True
    # Its last grant gone, the role may not even connect.
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(pg_cluster.url_for(alice, database)).close()
    assert _ok(_team(cli, tmp_path, pg_database, "revoke", "deploy-rules", alice, "--json"))["revoked"] is False


def test_a_role_without_ownership_cannot_grant_and_sees_only_its_own_grants(
        cli: Cli, tmp_path: Path, pg_cluster: PgCluster, pg_database: str) -> None:
    database = str(conninfo_to_dict(pg_database)["dbname"])
    alice, bob = pg_cluster.create_role("alice"), pg_cluster.create_role("bob")
    _ok(_team(cli, tmp_path, pg_database, "grant", "deploy-rules", alice, "--write", "--json"))
    _ok(_team(cli, tmp_path, pg_database, "grant", "other", bob, "--json"))
    alice_url = pg_cluster.url_for(alice, database)
    refused = _team(cli, tmp_path, alice_url, "grant", "alice-notes", alice, "--write")
    assert refused.returncode == 1
    assert "only the database's owner" in refused.stderr and "Traceback" not in refused.stderr
    listed = _ok(_team(cli, tmp_path, alice_url, "list", "--json"))["grants"]
    assert [(g["namespace"], g["role"]) for g in listed] == [("deploy-rules", alice)]  # type: ignore[attr-defined]
    for secret in _secrets(pg_cluster):
        assert secret not in refused.stderr + refused.stdout


def test_team_commands_say_clearly_what_is_wrong(cli: Cli, tmp_path: Path, pg_cluster: PgCluster,
                                                  pg_database: str) -> None:
    unknown = _team(cli, tmp_path, pg_database, "grant", "deploy-rules", "nobody_here")
    assert unknown.returncode == 1 and "role 'nobody_here' does not exist" in unknown.stderr
    listing = _team(cli, tmp_path, pg_database, "list")
    assert listing.returncode == 1 and "holds no keymem store yet" in listing.stderr
    wrong = pg_cluster.url_for(OWNER, str(conninfo_to_dict(pg_database)["dbname"]), password="wrong-password")
    denied = _team(cli, tmp_path, wrong, "list")
    assert denied.returncode == 1
    assert f"cannot reach the store at postgresql 127.0.0.1:{pg_cluster.port}/" in denied.stderr
    assert "wrong-password" not in denied.stderr and "Traceback" not in denied.stderr
    unset = cli("team", "list", env=isolated_env(tmp_path))
    assert unset.returncode == 1 and "KEYMEM_STORE_URL is not set" in unset.stderr
    for done in (unknown, listing, denied, unset):
        for secret in _secrets(pg_cluster):
            assert secret not in done.stderr + done.stdout
