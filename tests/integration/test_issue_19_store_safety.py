"""Issue 19, the store-safety items: what a hostile test found that made a store unusable or
lost memories, each replayed against a real daemon on real files.

- 1: an import of malformed vectors is refused naming the record; a store that already
  holds some starts anyway, re-embeds them and says so.
- 2: remember_batch items share the keys they create; a start merges the duplicate keys
  such batches made before.
- 4: ``keymem.db`` deleted under a running daemon: writes are refused, /health, status and
  the log say so, a copy of what the daemon still holds open is saved, restore brings it back.
- 5: a start on a zero-length store next to a backup with memories says so loudly, and
  backup rotation keeps that backup.
- 6, 20: an import meets the limits of a tool call; a failure names the record and field.
- 25: a foreign SQLite file as keymem.db is refused and left byte for byte as it was.
- 26: a damaged store's error points to backups/ and ``keymemd restore``, which restores the
  newest good backup and keeps the damaged file aside.

The tests that only call the API share one daemon for the module, its store emptied before
each; those that restart, damage or delete the store run their own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_helpers import READY_TIMEOUT, DaemonFactory, DaemonProcess, isolated_env, scaled, wait_for

pytestmark = pytest.mark.timeout(300)

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def daemon(module_store: DaemonProcess) -> DaemonProcess:
    """The module's daemon, its store emptied."""
    return module_store


def _import(daemon: DaemonProcess, data: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/import``; the last NDJSON event (``done`` or ``error``)."""
    response = daemon.client(timeout=120).post("/v1/import", json=data)
    assert response.status_code == 200, response.text
    last: dict[str, Any] = json.loads(response.text.splitlines()[-1])
    return last


def _import_error(daemon: DaemonProcess, data: dict[str, Any]) -> str:
    event = _import(daemon, data)
    assert event["event"] == "error", event
    message: str = event["error"]["message"]
    return message


def _rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return [tuple(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def _b64(values: np.ndarray) -> str:
    return base64.b64encode(np.asarray(values, dtype=np.float32).tobytes()).decode()


def _health(daemon: DaemonProcess) -> dict[str, Any]:
    body: dict[str, Any] = daemon.client(token="").get("/health").json()
    return body


# -- 1: malformed vectors ---------------------------------------------------------------


def test_an_import_of_malformed_vectors_is_refused_naming_the_record(daemon: DaemonProcess) -> None:
    memory = daemon.remember("The staging database runs Postgres 16", ["staging", "database", "postgres"])
    exported = daemon.client().post("/v1/export", json={"include_vectors": True}).json()
    assert daemon.call("forget", {"memory_id": memory})["result"]
    empty = daemon.export()
    assert empty["memories"] == [] and empty["keys"] == []
    nan = _b64(np.full(512, np.nan))
    cases = {
        "keys[0].vector": ("keys", base64.b64encode(b"\0" * 8).decode(), "is 8 bytes"),
        "memories[0].vector": ("memories", base64.b64encode(b"\0" * 12).decode(), "is 12 bytes"),
        "keys[0].vector ": ("keys", nan, "not finite"),
        "memories[0].vector ": ("memories", _b64(np.full(512, 3.0)), "unit length"),
        " memories[0].vector": ("memories", [0.1] * 512, "base64 string"),
        " keys[0].vector": ("keys", "not base64!", "not valid base64"),
    }
    for field, (table, vector, says) in cases.items():
        tampered = json.loads(json.dumps(exported))
        tampered[table][0]["vector"] = vector
        message = _import_error(daemon, tampered)
        assert field.strip() in message and says in message, (field, message)
        assert daemon.export() == empty, f"{field}: a refused import changed the store"
    # Untampered, the same export imports, and recall answers JSON.
    assert _import(daemon, exported)["event"] == "done"
    assert daemon.call("recall", {"query": "postgres"})["result"]["status"] == "found"


def test_a_store_holding_malformed_vectors_starts_and_re_embeds_them(daemons: DaemonFactory) -> None:
    first = daemons.start()
    kept = first.remember("The deploy script is ops/deploy.sh", ["deploy", "script", "배포"])
    broken = first.remember("Backups run nightly at 02:00", ["backup", "nightly"])
    daemons.stop(first)
    db = daemons.data_dir / "keymem.db"
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE keys SET vector = ? WHERE concept = 'deploy'", (b"\0" * 8,))
        conn.execute("UPDATE keys SET vector = ? WHERE concept = 'nightly'",
                     (np.full(512, np.nan, dtype=np.float32).tobytes(),))
        conn.execute("UPDATE memories SET vector = ? WHERE id = ?", (b"\1" * 12, broken))
    conn.close()

    second = daemons.start()  # before: "could not broadcast input array from shape (2,) into shape (512,)"
    warnings = " ".join(_health(second).get("warnings", []))
    assert "2 key vector(s) and 1 memory vector(s)" in warnings and "re-embedded" in warnings, warnings
    assert "re-embedded from their text" in second.log()
    for concept in ("deploy", "nightly"):
        (blob,) = _rows(db, "SELECT vector FROM keys WHERE concept = ?", concept)[0]
        vector = np.frombuffer(blob, dtype=np.float32)
        assert vector.shape == (512,) and np.isfinite(vector).all() and abs(float(vector @ vector) - 1) < 1e-3
    found = second.call("recall", {"query": "deploy"})["result"]
    assert found["status"] == "found" and found["memories"][0]["id"] == kept
    assert second.call("recall", {"query": "nightly backup"})["result"]["memories"][0]["id"] == broken


# -- 2: remember_batch keys --------------------------------------------------------------


def _keys_named(export: dict[str, Any], *concepts: str) -> dict[str, list[str]]:
    """concept -> the ids of the keys with that concept."""
    found: dict[str, list[str]] = {c: [] for c in concepts}
    for key in export["keys"]:
        if key["concept"] in found:
            found[key["concept"]].append(key["id"])
    return found


def test_items_of_one_batch_share_the_keys_they_create_in_both_languages(daemon: DaemonProcess) -> None:
    english = [{"content": f"Service {name} listens on port {port}", "keys": ["service", "port", "서비스", "포트"]}
               for name, port in (("auth", 8081), ("billing", 8082), ("search", 8083))]
    korean = [{"content": f"{team}팀이 배포 서버를 관리한다", "keys": ["배포", "서버"]} for team in ("1", "2", "3")]
    result = daemon.call("remember_batch", {"items": english + korean})["result"]
    assert result["saved"] == 6, result
    export = daemon.export()
    keys = _keys_named(export, "service", "port", "서비스", "포트", "배포", "서버")
    assert [len(keys[c]) for c in ("service", "port", "배포", "서버")] == [1, 1, 1, 1], keys
    assert keys["서비스"] == [] and keys["포트"] == [], "the Korean keys are aliases of the English ones"
    linked = [link["key_id"] for link in export["links"]]
    for concept in ("service", "port", "배포", "서버"):
        assert linked.count(keys[concept][0]) == 3, concept
    recalled = daemon.call("recall", {"query": "service"})["result"]
    services = [k for k in recalled["keys"] if k["concept"] == "service"]
    assert len(services) == 1 and services[0]["memory_count"] == 3, recalled["keys"]


def test_a_start_merges_the_duplicate_keys_an_old_batch_made(daemons: DaemonFactory) -> None:
    first = daemons.start()
    ids = [first.remember(f"Service {name} listens on port {port}", ["service", "port", "서비스", "포트"])
           for name, port in (("auth", 8081), ("billing", 8082), ("search", 8083))]
    daemons.stop(first)
    db = daemons.data_dir / "keymem.db"
    # What the old remember_batch made: one `service` and one `port` key per item, each
    # with its own alias and a single memory.
    conn = sqlite3.connect(db)
    clones: dict[str, list[str]] = {}
    with conn:
        for concept in ("service", "port"):
            (original,) = conn.execute("SELECT id FROM keys WHERE concept = ?", (concept,)).fetchone()
            for n, memory in enumerate(ids[1:], start=1):
                # Ids are random hex: shifting the first byte by n keeps a valid id that can
                # never equal the original (a fixed prefix such as "01" sometimes did).
                clone = f"{(int(original[:2], 16) + n) % 256:02x}{original[2:]}"
                clones.setdefault(concept, []).append(clone)
                conn.execute("INSERT INTO keys(id, concept, norm, compact, key_type, vector, created_at) "
                             "SELECT ?, concept, norm, compact, key_type, vector, created_at + ? FROM keys "
                             "WHERE id = ?", (clone, n, original))
                conn.execute("INSERT INTO aliases(key_id, alias, norm, compact, learned, added_at, hits) "
                             "SELECT ?, alias, norm, compact, learned, added_at, hits FROM aliases "
                             "WHERE key_id = ?", (clone, original))
                conn.execute("UPDATE links SET key_id = ? WHERE key_id = ? AND memory_id = ?",
                             (clone, original, memory))
        conn.execute("INSERT INTO aliases(key_id, alias, norm, compact, learned, added_at, hits) "
                     "VALUES (?, 'svc', 'svc', 'svc', 0, 0, 0)", (clones["service"][0],))
    conn.close()
    assert len(_rows(db, "SELECT id FROM keys WHERE concept = 'service'")) == 3
    links_before = len(_rows(db, "SELECT * FROM links"))

    second = daemons.start()
    assert "merged 4 duplicate key(s) into 2" in second.log()
    assert any("merged 4 duplicate key(s)" in w for w in _health(second).get("warnings", []))
    export = second.export()
    keys = _keys_named(export, "service", "port")
    assert len(keys["service"]) == 1 and len(keys["port"]) == 1, keys
    service = next(k for k in export["keys"] if k["concept"] == "service")
    assert {a["alias"] for a in service["aliases"]} == {"서비스", "svc"}
    assert len(export["links"]) == links_before
    assert sorted(link["memory_id"] for link in export["links"] if link["key_id"] == service["id"]) == sorted(ids)
    recalled = second.call("recall", {"query": "svc"})["result"]
    assert [(k["concept"], k["memory_count"]) for k in recalled["keys"][:1]] == [("service", 3)], recalled["keys"]
    daemons.stop(second)
    third = daemons.start()
    assert "duplicate key" not in " ".join(_health(third).get("warnings", []))


# -- 4: the store deleted under the daemon -----------------------------------------------


def test_a_store_deleted_under_the_daemon_refuses_writes_and_restore_brings_it_back(
        daemons: DaemonFactory, cli: Cli) -> None:
    daemon = daemons.start()
    kept = daemon.remember("The user prefers tabs over spaces", ["indentation", "tabs", "preference"])
    db = daemons.data_dir / "keymem.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink()

    response = daemon.client().post("/v1/tools/remember", json={"arguments": {
        "content": "The user deploys on Fridays", "keys": ["deploy", "friday"]}})
    assert response.status_code >= 500, response.text  # before: 200 "saved", into a deleted file
    error = response.json()["error"]
    assert error["code"] == "store_error" and "was deleted while keymemd was running" in error["message"]

    def warned() -> str | None:
        text = " ".join(_health(daemon).get("warnings", []))
        return text if "keymem-rescued-" in text else None

    warning = wait_for(warned, 30, message="/health to report the deleted store and its rescued copy")
    assert "was deleted" in warning and "keymemd restore" in warning and "backups" in warning
    assert _health(daemon)["status"] == "ready"  # reads still answer from the open file
    status = cli("status", env=daemon.env)
    assert status.returncode == 0 and "WARNING:" in status.stdout and "was deleted" in status.stdout, status.stdout
    assert "was deleted while keymemd was running" in daemon.log()
    rescued = list((daemons.data_dir / "backups").glob("keymem-rescued-*.db"))
    assert len(rescued) == 1 and _rows(rescued[0], "SELECT id FROM memories") == [(kept,)]

    restored = cli("restore", "--json", env=daemon.env, timeout=READY_TIMEOUT * 2)
    try:
        assert restored.returncode == 0, restored.stderr
        data = json.loads(restored.stdout)
        assert data["restored"] == str(rescued[0]) and data["started"] and data["stopped"] == daemon.pid
        assert daemon.process.wait(timeout=scaled(30)) == 0
        assert _rows(db, "SELECT id FROM memories") == [(kept,)]
        status = cli("status", "--json", env=daemon.env)
        assert json.loads(status.stdout)["memories"] == 1 and "warnings" not in json.loads(status.stdout)
    finally:
        cli("stop", env=daemon.env)


# -- 5: an empty store next to full backups ---------------------------------------------


def test_a_start_on_an_empty_store_next_to_a_full_backup_says_so_and_rotation_keeps_it(
        tmp_path: Path, daemons: DaemonFactory, cli: Cli) -> None:
    first = daemons.start()
    for n in range(3):
        first.remember(f"Fact number {n} about the build", ["build", f"fact{n}"])
    daemons.stop(first)
    backups = daemons.data_dir / "backups"
    backups.mkdir(exist_ok=True)
    for old in backups.glob("*.db"):
        old.unlink()
    good = backups / "keymem-20200101T000000Z.db"
    shutil.copy(daemons.data_dir / "keymem.db", good)
    (daemons.data_dir / "keymem.db").write_bytes(b"")  # zero-length
    for suffix in ("-wal", "-shm"):
        Path(f"{daemons.data_dir / 'keymem.db'}{suffix}").unlink(missing_ok=True)

    env = isolated_env(tmp_path, KEYMEM_BACKUP_INTERVAL="1", KEYMEM_BACKUP_KEEP="1")
    started = cli("start", env=env)
    try:
        assert started.returncode == 0, started.stderr
        assert "WARNING:" in started.stderr and "was an empty (zero-length) file" in started.stderr, started.stderr
        assert good.name in started.stderr and "keymemd restore" in started.stderr
        status = cli("status", env=env)
        assert "WARNING:" in status.stdout and good.name in status.stdout
        log = (daemons.data_dir / "logs" / "daemon.log").read_text()
        assert "was an empty (zero-length) file" in log

        def rotated() -> bool:  # three backups of the empty store, two rotations past KEEP=1
            return log_path.read_text().count("backup written to") >= 3

        log_path = daemons.data_dir / "logs" / "daemon.log"
        wait_for(rotated, 60, message="three backups of the empty store")
        assert good.exists(), "rotation deleted the only backup holding memories"
        assert _rows(good, "SELECT COUNT(*) FROM memories") == [(3,)]
        assert len(list(backups.glob("keymem-2*.db"))) <= 3  # the others still rotate
    finally:
        cli("stop", env=env)


# -- 6, 20: import limits and named failures ----------------------------------------------


def test_an_import_meets_the_limits_of_remember_and_names_each_record_over_them(daemon: DaemonProcess) -> None:
    def memory(mid: str, content: str) -> dict[str, Any]:
        return {"id": mid, "content": content}

    data = {"format": "keymem-export", "version": 1,
            "keys": [{"id": "a00000000001", "concept": "k" * 101}, {"id": "a00000000002", "concept": "fine"}],
            "memories": [memory("b00000000001", "short"), memory("b00000000002", "x" * 20_001),
                         memory("b00000000003", "y" * 20_000), memory("b00000000004", "z" * 1_000_000)],
            "links": []}
    message = _import_error(daemon, data)
    assert "3 record(s) are over the limits" in message
    assert "keys[0].concept is 101 characters; the limit is 100" in message
    assert "memories[1].content is 20001 characters; the limit is 20000" in message
    assert "memories[3].content is 1000000 characters" in message and "memories[2]" not in message
    assert daemon.export()["memories"] == []
    data["keys"][0]["concept"] = "long"
    data["memories"] = [memory("b00000000003", "y" * 20_000)]
    assert _import(daemon, data)["event"] == "done"


@pytest.mark.parametrize(("field", "value", "says"), [
    ("access_count", 1e20, "memories[0].access_count must be within"),  # before: "see the log"
    ("created_at", 1e300, "memories[0].created_at must be within"),
    ("source", {"note": "s" * 6000}, "memories[0].source is"),
])
def test_an_import_failure_names_the_record_and_field(daemon: DaemonProcess, field: str, value: Any,
                                                      says: str) -> None:
    data = {"format": "keymem-export", "version": 1, "keys": [],
            "memories": [{"id": "c00000000001", "content": "The user likes tea", field: value}], "links": []}
    message = _import_error(daemon, data)
    assert says in message, message
    assert "see the log" not in message
    assert daemon.export()["memories"] == []


# -- 25: a foreign SQLite file --------------------------------------------------------------


def test_a_foreign_sqlite_file_is_refused_and_left_unchanged(tmp_path: Path, cli: Cli) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / "keymem.db"
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes(body) VALUES ('not a keymem store')")
    conn.close()
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    env = isolated_env(tmp_path)
    started = cli("start", env=env)
    try:
        assert started.returncode == 1, started.stdout  # before: started, and added its tables to the file
        assert "not a keymem store" in started.stderr and "left unchanged" in started.stderr, started.stderr
    finally:
        cli("stop", env=env)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert _rows(db, "PRAGMA journal_mode") == [("delete",)]
    assert not Path(f"{db}-wal").exists()
    assert _rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'") == [("notes",)]


# -- 26: a damaged store and keymemd restore ----------------------------------------------


def test_a_damaged_store_points_to_restore_which_puts_the_newest_good_backup_back(
        tmp_path: Path, daemons: DaemonFactory, cli: Cli) -> None:
    first = daemons.start()
    kept = first.remember("The release train leaves every second Tuesday", ["release", "schedule"])
    daemons.stop(first)
    data = daemons.data_dir
    backups = data / "backups"
    backups.mkdir(exist_ok=True)
    for old in backups.glob("*.db"):
        old.unlink()
    good = backups / "keymem-20260101T000000Z.db"
    shutil.copy(data / "keymem.db", good)
    newer = backups / "keymem-20260102T000000Z.db"  # the newest, but damaged
    newer.write_bytes(b"SQLite format 3\0" + b"\xff" * 4080)
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    damaged = b"SQLite format 3\0" + b"\x00" * 84 + b"garbage" * 600
    (data / "keymem.db").write_bytes(damaged)
    env = isolated_env(tmp_path)

    started = cli("start", env=env)
    assert started.returncode == 1
    assert str(backups) in started.stderr and "keymemd restore" in started.stderr, started.stderr

    refused = cli("restore", str(foreign), env=env)
    assert refused.returncode == 1 and "not a keymem store" in refused.stderr, refused.stderr
    assert (data / "keymem.db").read_bytes() == damaged

    restored = cli("restore", "--json", env=env, timeout=READY_TIMEOUT * 2)
    try:
        assert restored.returncode == 0, restored.stderr
        result = json.loads(restored.stdout)
        assert result["restored"] == str(good) and result["memories"] == 1 and result["started"]
        (aside,) = [Path(p) for p in result["set_aside"] if p.endswith("keymem.db")]
        assert aside.parent.parent == data / "replaced" and aside.read_bytes() == damaged
        status = json.loads(cli("status", "--json", env=env).stdout)
        assert status["state"] == "ready" and status["memories"] == 1
        assert _rows(data / "keymem.db", "SELECT id FROM memories") == [(kept,)]
    finally:
        cli("stop", env=env)
