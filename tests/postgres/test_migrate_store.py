"""``keymemd migrate-store --to URL`` as a person runs it (issue 22): real CLI subprocesses, a
real SQLite daemon, the throwaway PostgreSQL cluster, and a daemon on the copy whose
``keymemd export`` must be the SQLite one, byte for byte. The first run is killed with
SIGKILL between two batches; the second continues, duplicating nothing, and verifies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon_helpers import CLOSED_PORT, DaemonFactory, isolated_env
from pg_cluster import OWNER, PgCluster
from psycopg.conninfo import conninfo_to_dict

Cli = Callable[..., subprocess.CompletedProcess[str]]

MEMORIES = 3000
"""Enough for several batches of ``store_migration.COPY_BATCH`` (500): the kill lands between two."""
KEYS = 300
SECONDS_PER_MEMORY = 0.1
"""A generous budget for copying one memory on a loaded 2-core machine (it takes ~2 ms)."""
MIGRATE_TIMEOUT = 120 + MEMORIES * SECONDS_PER_MEMORY
pytestmark = pytest.mark.timeout(int(4 * MIGRATE_TIMEOUT))


def _bulk_export() -> dict[str, Any]:
    """An export of ``MEMORIES`` memories over ``KEYS`` keys (two each), with relations and aliases."""
    keys = [{"id": f"k-{k:04d}", "concept": f"subsystem {k} of the build farm", "key_type": "concept",
             "created_at": 1_700_000_000.0 + k, "aliases": [{"alias": f"farm part {k}", "learned": k % 2 == 0,
                                                            "added_at": 1_700_000_100.0, "hits": k % 5}]}
            for k in range(KEYS)]
    memories = [{"id": f"m-{i:05d}", "content": f"build farm note {i}: node {i % 97} needs its cache at "
                                                f"/var/cache/farm/{i} cleared before release {i % 13}",
                 "namespace": ("default", "proj-farm")[i % 2], "created_at": 1_700_000_000.0 + i,
                 "depth": (i % 10) / 10, "access_count": i % 7, "source": {"agent": "test", "n": i}}
                for i in range(MEMORIES)]
    links = [{"key_id": f"k-{(i + j * 7) % KEYS:04d}", "memory_id": f"m-{i:05d}", "weight": 1.0 + j / 4,
              "auto": j == 1} for i in range(MEMORIES) for j in range(2)]
    # Relations reach across batches (a memory of the first to one of the last).
    relations = [{"from": f"m-{i:05d}", "to": f"m-{MEMORIES - 1 - i:05d}"} for i in range(0, MEMORIES // 2, 50)]
    return {"format": "keymem-export", "version": 1, "keys": keys, "memories": memories, "links": links,
            "relations": relations}


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _seed_sqlite(cli: Cli, factory: DaemonFactory, tmp_path: Path) -> bytes:
    """A SQLite store with the bulk export and a few real writes (a correction, a
    confirmation); its ``keymemd export``, taken before the daemon stops."""
    daemon = factory.start()
    bulk = tmp_path / "bulk.json"
    bulk.write_text(json.dumps(_bulk_export()))
    _ok(cli("import", str(bulk), env=factory.env(), timeout=MIGRATE_TIMEOUT))
    old = daemon.remember("the nightly build publishes to the staging mirror", ["nightly build"])
    corrected = daemon.call("correct", {"memory_id": old, "content": "the nightly build publishes to the prod mirror"})
    assert not corrected["is_error"], corrected
    kept = daemon.remember("deploys to the farm need two approvals", ["deploy approvals", "build farm"],
                           namespace="proj-farm")
    assert not daemon.call("confirm_memory", {"memory_id": kept, "evidence": "user"})["is_error"]
    exported = tmp_path / "sqlite-export.json"
    _ok(cli("export", "-o", str(exported), env=factory.env(), timeout=MIGRATE_TIMEOUT))
    factory.stop(daemon)
    return exported.read_bytes()


def _rows(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {table: int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])  # type: ignore[index]
                for table in ("memories", "links", "keys", "memory_fts")}


def test_a_migration_killed_midway_continues_and_a_daemon_on_the_copy_exports_what_sqlite_did(
        cli: Cli, tmp_path: Path, pg_database: str) -> None:
    local = DaemonFactory(tmp_path / "local")
    (tmp_path / "local").mkdir()
    try:
        sqlite_export = _seed_sqlite(cli, local, tmp_path)
    finally:
        local.teardown()
    env = local.env()
    # The first run, SIGKILLed once it has committed a batch of memories and before the last.
    args = [sys.executable, "-m", "keymem_daemon", "migrate-store", "--to", pg_database]
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        assert first.stderr is not None
        deadline = time.monotonic() + MIGRATE_TIMEOUT
        for line in first.stderr:
            seen.append(line)
            if line.startswith("memories: ") and not line.startswith(f"memories: {MEMORIES}"):
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            pytest.fail(f"the migration ended before a batch of memories was copied:\n{''.join(seen)}")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=60)
        if first.stderr is not None:
            first.stderr.close()
    partial = _rows(pg_database)
    assert 0 < partial["memories"] < MEMORIES, (partial, seen)
    # Whole batches only: every copied memory has all its links, every current one its index row.
    source = json.loads(sqlite_export)
    links_of: dict[str, int] = {}
    for link in source["links"]:
        links_of[link["memory_id"]] = links_of.get(link["memory_id"], 0) + 1
    with psycopg.connect(pg_database) as conn:
        copied: dict[str, int] = dict(conn.execute("SELECT m.id, COUNT(l.key_id) FROM memories m LEFT JOIN links l ON "
                                   "l.memory_id = m.id GROUP BY m.id").fetchall())
        unindexed = conn.execute("SELECT m.id FROM memories m WHERE m.superseded_by IS NULL AND NOT EXISTS "
                                 "(SELECT 1 FROM memory_fts f WHERE f.memory_id = m.id)").fetchall()
    assert copied == {memory_id: links_of[memory_id] for memory_id in copied}, partial
    assert unindexed == [], unindexed
    # The second run continues after the last committed batch and verifies the copy.
    second = _ok(cli("migrate-store", "--to", pg_database, "--json", env=env, timeout=MIGRATE_TIMEOUT))
    report = json.loads(second.stdout)
    assert report["resumed"] is True, report
    assert report["result"]["skipped"]["memories"] == partial["memories"], report
    assert report["counts"]["memories"] == len(source["memories"]) == MEMORIES + 3, report  # + remembered, corrected
    assert report["counts"]["relations"] == len(source["relations"]) == MEMORIES // 100, report
    assert "memories: " in second.stderr and "verifying: 1/1" in second.stderr, second.stderr
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM memories").fetchone() == (
            MEMORIES + 3, MEMORIES + 3)
    # Run again on a finished copy: nothing to add, verified again.
    again = json.loads(_ok(cli("migrate-store", "--to", pg_database, "--json", env=env,
                               timeout=MIGRATE_TIMEOUT)).stdout)
    assert again["result"]["imported"]["memories"] == 0 and again["sha256"] == report["sha256"], again
    # A daemon on the copy (its own data dir) exports exactly what the SQLite daemon did.
    remote = DaemonFactory(tmp_path / "remote")
    (tmp_path / "remote").mkdir()
    try:
        daemon = remote.start(KEYMEM_STORE_URL=pg_database)
        out = tmp_path / "pg-export.json"
        _ok(cli("export", "-o", str(out), env=remote.env(KEYMEM_STORE_URL=pg_database), timeout=MIGRATE_TIMEOUT))
        recalled = json.dumps(daemon.call("recall", {"query": "nightly build mirror"})["result"])
        assert "prod mirror" in recalled and "staging mirror" not in recalled, recalled
    finally:
        remote.teardown()
    assert out.read_bytes() == sqlite_export


def test_migrate_store_refuses_a_database_holding_other_data_and_names_an_unreachable_server(
        cli: Cli, tmp_path: Path, pg_cluster: PgCluster, pg_database: str) -> None:
    # Another daemon's data in the target: refused, the target unchanged.
    (tmp_path / "team").mkdir()
    team = DaemonFactory(tmp_path / "team")
    try:
        team.start(KEYMEM_STORE_URL=pg_database).remember("the team's own note on the release checklist",
                                                          ["release checklist"])
    finally:
        team.teardown()
    before = _rows(pg_database)
    (tmp_path / "local").mkdir()
    local = DaemonFactory(tmp_path / "local")
    try:
        local.start().remember("a personal note on my editor's key bindings", ["editor bindings"])
    finally:
        local.teardown()
    refused = cli("migrate-store", "--to", pg_database, env=local.env(), timeout=MIGRATE_TIMEOUT)
    assert refused.returncode == 1, refused.stderr
    assert "already holds 1 memories and 1 keys that are not from this migration" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert _rows(pg_database) == before
    # A server nobody answers at: named (role, host, port, database), never the password.
    database = str(conninfo_to_dict(pg_database)["dbname"])
    port = CLOSED_PORT
    dead = pg_cluster.url_for(OWNER, database).replace(f":{pg_cluster.port}/", f":{port}/")
    unreachable = cli("migrate-store", "--to", dead, env=local.env(), timeout=MIGRATE_TIMEOUT)
    assert unreachable.returncode == 1
    assert f"cannot reach the store at postgresql 127.0.0.1:{port}/{database} as {OWNER}" in unreachable.stderr, (
        unreachable.stderr)
    assert pg_cluster.passwords[OWNER] not in unreachable.stderr + unreachable.stdout
    assert "Traceback" not in unreachable.stderr
    # No SQLite store to migrate.
    (tmp_path / "empty").mkdir()
    nothing = cli("migrate-store", "--to", pg_database, env=isolated_env(tmp_path / "empty"))
    assert nothing.returncode == 1 and "there is no SQLite store at" in nothing.stderr, nothing.stderr


def test_migrate_store_refuses_while_the_daemon_runs(cli: Cli, tmp_path: Path, pg_database: str) -> None:
    (tmp_path / "local").mkdir()
    local = DaemonFactory(tmp_path / "local")
    try:
        local.start().remember("a note written while the daemon runs", ["running daemon"])
        refused = cli("migrate-store", "--to", pg_database, env=local.env(), timeout=MIGRATE_TIMEOUT)
    finally:
        local.teardown()
    assert refused.returncode == 1 and "stop it (keymemd stop)" in refused.stderr, refused.stderr
    with psycopg.connect(pg_database) as conn:  # refused before the target was touched
        assert conn.execute("SELECT to_regclass('memories')").fetchone() == (None,)
