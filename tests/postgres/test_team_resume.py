"""A daemon restarted on a PostgreSQL store resumes from its local replica (issue 22): it loads
its in-memory tables from ``<data>/team-replica.db`` and reads the change log from the
position the replica recorded, instead of fetching the whole store again -- and still serves
exactly the server's state: what another daemon saved, forgot or corrected while it was down
included. When the change log no longer reaches back to that position (truncated), it loads
everything again.

That the restart did not fetch the store again is read from the server's own statistics: the
rows read from ``memories`` (``pg_stat_user_tables``) while the restarted daemon ran, beside
those a daemon starting afresh reads for the same requests, each counted once its
connections are gone (a backend flushes its statistics when it exits)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
from daemon_helpers import DaemonFactory, DaemonProcess, wait_for
from pg_cluster import SUPERUSER, PgCluster, start_on

from keymem_daemon.store.postgres.offline import REPLICA_FILE
from keymem_daemon.store.postgres.resume import POSITION

SEEDED = 40
"""Memories in the store before the restart: a full load reads each of them at least twice
(the in-memory tables and the replica's fill), a resumed start only the few that changed."""
POSITION_TIMEOUT = 60.0
"""Seconds for a new daemon to fill its replica and record its position (a 40-memory store:
well under a second unloaded)."""
BACKENDS_TIMEOUT = 30.0
"""Seconds for the server's backends of stopped daemons to exit (and flush their statistics)."""


def _database(url: str) -> str:
    return url.rsplit("/", 1)[1]


def _rows_read_from_memories(cluster: PgCluster, database: str) -> int:
    """Rows the server read from ``memories`` so far (sequential and index fetches), once no
    other backend is connected to ``database``."""
    with psycopg.connect(cluster.url_for(SUPERUSER, database), autocommit=True) as conn:
        def idle() -> bool:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid != pg_backend_pid()",
                               (database,)).fetchone()
            return row is not None and row[0] == 0

        wait_for(idle, BACKENDS_TIMEOUT, message="the stopped daemons' backends to exit")
        row = conn.execute("SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
                           "WHERE relname = 'memories'").fetchone()
        assert row is not None
        return int(row[0])


def _recorded_position(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / REPLICA_FILE
    if not path.exists():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = ?", (POSITION,)).fetchone()
    except sqlite3.OperationalError:  # being created
        return None
    finally:
        conn.close()
    return None if row is None else dict(json.loads(row[0]))


def _current(daemon: DaemonProcess) -> dict[str, str | None]:
    """Every memory the daemon's store holds: id -> the id superseding it (None: current)."""
    return {m["id"]: m.get("superseded_by") for m in daemon.export()["memories"]}


def _recalled(daemon: DaemonProcess, query: str) -> str:
    return json.dumps(daemon.call("recall", {"query": query})["result"])


def _changed_while_b_was_down(factories: list[DaemonFactory], tmp_path: Path, url: str
                              ) -> tuple[dict[str, str], dict[str, str | None]]:
    """A store of ``SEEDED`` memories through daemon a; daemon b started on it until its
    replica recorded a position, then stopped; then, through a, one memory saved, one
    forgotten and one corrected; a stopped. The ids involved, and the store's memories then."""
    a = start_on(factories, tmp_path, "a", url)
    ids = [a.remember(f"note {i}: the build agent number {i} runs the nightly pipeline for team {i % 4}",
                      [f"build agent {i}", "nightly pipeline"]) for i in range(SEEDED)]
    b = start_on(factories, tmp_path, "b", url)
    wait_for(lambda: _recorded_position(b.data_dir) is not None, POSITION_TIMEOUT,
             message="b's replica to record its position")
    factories[-1].stop(b)
    saved = a.remember("the release freeze starts on the first friday of december", ["release freeze"])
    forgotten = ids[3]
    assert not a.call("forget", {"memory_id": forgotten})["is_error"]
    old = ids[5]
    corrected = a.call("correct", {"memory_id": old, "content": "note 5: build agent 5 was retired last week"})
    assert not corrected["is_error"], corrected
    new = str(corrected["result"].get("new_id") or corrected["result"].get("saved"))
    expected = _current(a)
    factories[0].stop(a)
    assert forgotten not in expected and expected[old] == new and expected[saved] is None
    return {"saved": saved, "forgotten": forgotten, "old": old, "new": new}, expected


def _serves_exactly(daemon: DaemonProcess, ids: dict[str, str], expected: dict[str, str | None]) -> None:
    assert _current(daemon) == expected
    assert ids["saved"] in _recalled(daemon, "release freeze first friday of december")
    assert ids["forgotten"] not in _recalled(daemon, "note 3 build agent number 3 nightly pipeline")
    found = _recalled(daemon, "build agent 5")
    assert ids["new"] in found and ids["old"] not in found, found
    assert "not found" in json.dumps(daemon.call("read_memory", {"memory_id": ids["forgotten"]})["result"])


def test_a_restarted_daemon_resumes_from_its_replica_and_serves_exactly_the_current_state(
        factories: list[DaemonFactory], tmp_path: Path, pg_cluster: PgCluster, pg_database: str) -> None:
    ids, expected = _changed_while_b_was_down(factories, tmp_path, pg_database)
    b = start_on(factories, tmp_path, "b", pg_database)
    assert "resuming from the local replica" in b.log(), b.log()
    _serves_exactly(b, ids, expected)
    factories[-1].stop(b)

    # What a start reads from the server: resumed again, beside a daemon starting afresh (its
    # replica filled before it stops); neither serves a request.
    database = _database(pg_database)
    before = _rows_read_from_memories(pg_cluster, database)
    b = start_on(factories, tmp_path, "b", pg_database)
    factories[-1].stop(b)
    resumed = _rows_read_from_memories(pg_cluster, database) - before
    c = start_on(factories, tmp_path, "c", pg_database)
    wait_for(lambda: _recorded_position(c.data_dir) is not None, POSITION_TIMEOUT,
             message="c's replica to record its position")
    factories[-1].stop(c)
    fresh = _rows_read_from_memories(pg_cluster, database) - before - resumed

    print(f"rows read from memories at start: {resumed} by the resumed daemon, {fresh} by a fresh one "
          f"(the store holds {len(expected)})")
    # A fresh start reads the whole store twice (its tables, its replica); a resumed one not once.
    assert fresh - resumed >= 2 * len(expected) and resumed < len(expected), (fresh, resumed)


def test_a_change_log_truncated_past_the_replica_makes_the_restart_load_everything(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    ids, expected = _changed_while_b_was_down(factories, tmp_path, pg_database)
    with psycopg.connect(pg_database, autocommit=True) as conn:  # the owner's
        conn.execute("TRUNCATE changes")

    b = start_on(factories, tmp_path, "b", pg_database)
    assert "not resuming from the local replica" in b.log() and "truncated" in b.log(), b.log()
    _serves_exactly(b, ids, expected)
    factories[-1].stop(b)  # before the first b's teardown, which checks the data dir is left clean
