"""Personal namespaces in the local SQLite store, team namespaces in PostgreSQL (issue 22):
real daemons with ``KEYMEM_STORE_URL`` and ``KEYMEM_TEAM_NAMESPACES`` on a throwaway cluster,
each with its own SQLite data directory. What a person saves for themselves stays in their
``keymem.db``; what they save in a team namespace lands in the database, where a teammate's
daemon sees it; recall, ``recall_memories``, the push path and the hook span both."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest
from daemon_helpers import READY_TIMEOUT, DaemonFactory, DaemonProcess, isolated_env, wait_for
from pg_cluster import OWNER, PgCluster, start_on

ROOT: Final = Path(__file__).resolve().parents[2]
HOOK: Final = ROOT / "hooks" / "keymem_hook.py"
PROPAGATION_TIMEOUT: Final = 30.0
"""Seconds a team write may take to reach the other daemon on a loaded machine (well under one)."""
HOOK_RUN_TIMEOUT: Final = 120.0
HOOK_BUDGET_MS: Final = "60000"
"""The hook's own budget, generous: the daemon answers in tens of ms, a loaded CI box is slower."""
TEAM: Final = "team-*,deploy-rules"
Cli = Callable[..., subprocess.CompletedProcess[str]]

PERSONAL = "my own checkout of zebrafish-gateway builds with make zebrafish-dev and the vim keymap"
PROJECT = "the zebrafish-gateway service deploys only after zebra-canary-check passes on the canary"


def _start(factories: list[DaemonFactory], tmp_path: Path, name: str, url: str, **env: str) -> DaemonProcess:
    return start_on(factories, tmp_path, name, url, KEYMEM_TEAM_NAMESPACES=TEAM, KEYMEM_TOOLS="full", **env)


def _in_sqlite(daemon: DaemonProcess, memory_id: str) -> bool:
    with sqlite3.connect(daemon.data_dir / "keymem.db") as conn:
        return conn.execute("SELECT COUNT(*) FROM memories WHERE id = ?", (memory_id,)).fetchone()[0] == 1


def _in_postgres(url: str, memory_id: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT COUNT(*) FROM memories WHERE id = %s", (memory_id,)).fetchone()
    return row is not None and row[0] == 1


def _key_ids_in_sqlite(daemon: DaemonProcess) -> set[str]:
    with sqlite3.connect(daemon.data_dir / "keymem.db") as conn:
        return {r[0] for r in conn.execute("SELECT id FROM keys")}


def _key_ids_in_postgres(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM keys")}


def _hits(daemon: DaemonProcess, query: str, **extra: Any) -> list[str]:
    body = daemon.call("recall_memories", {"query": query, "reinforce": False, **extra})
    assert not body["is_error"], body
    return [hit["id"] for hit in body["result"]]


def test_personal_memories_stay_in_sqlite_and_team_ones_are_shared_through_postgresql(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str, cli: Cli) -> None:
    alice = _start(factories, tmp_path, "alice", pg_database)
    bob = _start(factories, tmp_path, "bob", pg_database)
    personal = alice.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev", "vim keymap"])
    project = alice.remember(PROJECT, ["zebrafish-gateway", "zebra-canary-check", "deploy"],
                             namespace="team-payments")
    rules = alice.remember("every deploy of the ledger needs two approvals in the release channel",
                           ["ledger deploy", "approvals"], namespace="Deploy-Rules")
    # Where each one landed, by SQL in both stores.
    assert _in_sqlite(alice, personal) and not _in_postgres(pg_database, personal)
    assert _in_postgres(pg_database, project) and not _in_sqlite(alice, project)
    assert _in_postgres(pg_database, rules) and not _in_sqlite(alice, rules)
    # Bob's daemon sees the team memories, never alice's personal one.
    wait_for(lambda: project in _hits(bob, "zebrafish-gateway zebra-canary-check deploy"), PROPAGATION_TIMEOUT,
             message="alice's team memory to reach bob's daemon")
    assert personal not in _hits(bob, "zebrafish-gateway make zebrafish-dev vim keymap")
    assert bob.call("read_memory", {"memory_id": personal})["result"] == {"error": f"Memory {personal} not found"}
    assert not _in_sqlite(bob, project)
    # Alice recalls both kinds in one ranked answer: hits from both stores, key clusters of both.
    both = _hits(alice, "zebrafish-gateway make zebrafish-dev zebra-canary-check deploy")
    assert {personal, project} <= set(both), both
    recalled = alice.call("recall", {"query": "zebrafish-gateway zebrafish-dev canary-check"})["result"]
    clusters = {k["key_id"] for k in recalled["keys"]}
    assert clusters & _key_ids_in_sqlite(alice) and clusters & _key_ids_in_postgres(pg_database), recalled
    assert len(recalled["keys"]) <= 8 and len(recalled["memories"]) == 1
    # A read over one namespace asks its store only.
    assert _hits(alice, "zebrafish-gateway zebra-canary-check", namespace="team-payments") == [project]
    assert personal in _hits(alice, "zebrafish-gateway make zebrafish-dev", namespace="default")
    assert project not in _hits(alice, "zebrafish-gateway zebra-canary-check", namespace="default")
    # Reads and writes by id find the memory's store: a read of the team one, a correction
    # of the personal one (its new version stays personal).
    read = alice.call("read_memory", {"memory_id": project})["result"]["memory"]
    assert read["id"] == project and read["namespace"] == "team-payments", read
    corrected = alice.call("correct", {"memory_id": personal, "content": PERSONAL.replace("vim", "emacs")})
    assert not corrected["is_error"], corrected
    assert _in_sqlite(alice, corrected["result"]["new_id"]) and not _in_postgres(pg_database,
                                                                                 corrected["result"]["new_id"])
    # A batch spanning both stores: each item in its store, answered in the order sent.
    batch = alice.call("remember_batch", {"items": [
        {"content": "my dotfiles live in the dotfiles repo under config", "keys": ["dotfiles"]},
        {"content": "the payments runbook lives in the wiki under payments ops", "keys": ["payments runbook"],
         "namespace": "team-payments"},
        {"content": "", "keys": ["empty"]}]})["result"]
    assert [item["index"] for item in batch["items"]] == [0, 1, 2] and batch["saved"] == 2 and batch["failed"] == 1
    assert _in_sqlite(alice, batch["items"][0]["saved"]) and _in_postgres(pg_database, batch["items"][1]["saved"])
    # Stats say per store, and their sum.
    stats = alice.client().get("/v1/stats").json()
    assert [s["store"].split()[0] for s in stats["stores"]] == ["sqlite", "postgresql"], stats
    local, team = (s["counts"] for s in stats["stores"])
    # Active memories: the corrected one's new version and the dotfiles; the team's three.
    assert (local["memories"], local["superseded"], team["memories"], stats["memories"]) == (2, 1, 3, 5), stats
    assert "team-*" in stats["store"]
    status = cli("status", env=alice.env)
    assert status.returncode == 0, status.stderr
    assert f"sqlite {alice.data_dir / 'keymem.db'}: 2 memories" in status.stdout, status.stdout
    assert "postgresql 127.0.0.1:" in status.stdout and ": 3 memories" in status.stdout, status.stdout
    # Where the daemon is in the team store's change log: what it has caught up to.
    log = wait_for(lambda: (found := alice.client().get("/v1/stats").json()["change_log"])["connected"] and found,
                   PROPAGATION_TIMEOUT, message="the change log's connection")
    assert log["position"] > 0 and log["read_to_end_s_ago"] is not None, log
    assert "change log: at position " in status.stdout, status.stdout
    # The export says per store: the local one's (importable as ever), the team one's inside.
    exported = alice.export()
    assert exported["store"].startswith("sqlite ") and exported["team"]["store"].startswith("postgresql ")
    local_ids = {m["id"] for m in exported["memories"]}
    assert personal in local_ids and project not in local_ids
    assert {project, rules} <= {m["id"] for m in exported["team"]["memories"]}


def test_the_push_path_and_the_hook_surface_memories_from_both_stores(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    alice = _start(factories, tmp_path, "alice", pg_database)
    personal = alice.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev", "vim keymap"])
    project = alice.remember(PROJECT, ["zebrafish-gateway", "zebra-canary-check", "deploy"],
                             namespace="team-payments")
    project_dir = tmp_path / "src" / "zebrafish-gateway"
    project_dir.mkdir(parents=True)
    (alice.data_dir / "namespaces.json").write_text(json.dumps({str(project_dir): ["team-payments"]}))
    prompt = ("build zebrafish-gateway with make zebrafish-dev, then deploy it once zebra-canary-check passes "
              "on the canary")
    response = alice.client().post("/v1/inject", json={"prompt": prompt, "cwd": str(project_dir), "top_k": 2})
    assert response.status_code == 200, response.text
    surfaced = response.json()
    assert {m["id"] for m in surfaced["memories"]} == {personal, project}, surfaced
    assert personal in surfaced["context"] and project in surfaced["context"]
    # The hook, as the host runs it: the same two in the block it prints.
    done = subprocess.run(
        [sys.executable, str(HOOK), "user-prompt-submit"],
        input=json.dumps({"prompt": prompt, "cwd": str(project_dir), "hook_event_name": "UserPromptSubmit"}),
        env={**alice.env, "KEYMEM_HOOK_TIMEOUT_MS": HOOK_BUDGET_MS}, capture_output=True, text=True,
        timeout=HOOK_RUN_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    block = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    assert personal in block and project in block, block
    # A cwd mapped to no team namespace surfaces the personal store only.
    elsewhere = alice.client().post("/v1/inject", json={"prompt": prompt, "namespace": "default"}).json()
    assert [m["id"] for m in elsewhere["memories"]] == [personal], elsewhere


def test_with_the_server_down_the_personal_half_still_answers_and_team_writes_fail_clearly(
        factories: list[DaemonFactory], tmp_path: Path, own_pg_cluster: PgCluster) -> None:
    alice = _start(factories, tmp_path, "alice", own_pg_cluster.url)
    personal = alice.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev", "vim keymap"])
    alice.remember(PROJECT, ["zebrafish-gateway", "zebra-canary-check"], namespace="team-payments")
    own_pg_cluster.stop_server()
    client = alice.client()
    wait_for(lambda: "stale" in client.get("/v1/stats").json(), PROPAGATION_TIMEOUT,
             message="the daemon to notice the server is gone")
    # Reads over every namespace still answer, the personal half from SQLite (the team half
    # from the daemon's replica of the server, once filled).
    assert personal in _hits(alice, "zebrafish-gateway make zebrafish-dev vim keymap")
    recalled = alice.call("recall", {"query": "make zebrafish-dev vim keymap"})["result"]
    assert recalled["status"] == "found" and recalled["memories"][0]["id"] == personal, recalled
    prompt = "build zebrafish-gateway with make zebrafish-dev and the vim keymap"
    surfaced = client.post("/v1/inject", json={"prompt": prompt, "top_k": 2}).json()
    assert personal in [m["id"] for m in surfaced["memories"]], surfaced
    # A personal write works; a team write fails naming the server, and nothing is half-written.
    saved = alice.remember("my tmux prefix is control-a", ["tmux prefix"])
    assert _in_sqlite(alice, saved)
    refused = client.post("/v1/tools/remember", json={"arguments": {
        "content": "the team tmux config lives in the dotfiles repo", "keys": ["tmux"], "namespace": "team-ops"}})
    assert f"127.0.0.1:{own_pg_cluster.port}" in refused.text, refused.text
    assert all(secret not in refused.text for secret in own_pg_cluster.passwords.values())
    # An import with a team memory is refused naming the server, its personal half unwritten.
    failed = _import(alice, SPANNING)
    assert failed["event"] == "error" and f"127.0.0.1:{own_pg_cluster.port}" in failed["error"]["message"], failed
    assert not _in_sqlite(alice, "mpersonal001")
    own_pg_cluster.start_server()


@pytest.mark.parametrize(("variables", "said"), [
    ({"KEYMEM_TEAM_NAMESPACES": "team-*"}, "KEYMEM_STORE_URL is not"),
    ({"KEYMEM_TEAM_NAMESPACES": "te*am"}, "'te*am' may hold '*' only at its end"),
    ({"KEYMEM_TEAM_NAMESPACES": "team-*,,ops"}, "entry 2 is empty"),
    ({"KEYMEM_TEAM_NAMESPACES": "*"}, "'*' maps every namespace"),
])
def test_a_bad_namespace_mapping_is_refused_at_start(tmp_path: Path, variables: dict[str, str], said: str) -> None:
    factory = DaemonFactory(tmp_path)
    env = dict(variables)
    if "STORE_URL is not" not in said:
        env["KEYMEM_STORE_URL"] = "postgresql://alice@db.example:5432/keymem"
    process, output = factory.spawn(**env)
    assert process.wait(timeout=READY_TIMEOUT) != 0
    text = output.read_text(errors="replace")
    assert "KEYMEM_TEAM_NAMESPACES" in text and said in text, text
    assert not (factory.data_dir / "daemon.json").exists()


def _import(daemon: DaemonProcess, data: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/import``'s last NDJSON event (``done`` with the counts, or ``error``)."""
    response = daemon.client(timeout=IMPORT_TIMEOUT).post("/v1/import", json=data)
    assert response.status_code == 200, response.text
    last: dict[str, Any] = json.loads(response.text.splitlines()[-1])
    return last


def _store_counts(daemon: DaemonProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    """``/v1/stats``'s counts of the local store and of the team store."""
    stats = daemon.client().get("/v1/stats").json()
    assert [s["store"].split()[0] for s in stats["stores"]] == ["sqlite", "postgresql"], stats
    local, team = (s["counts"] for s in stats["stores"])
    return local, team


def _records(exported: dict[str, Any]) -> dict[str, Any]:
    """A federated export without the lines naming where its stores are (a new data dir and
    database name them differently)."""
    return {**{k: v for k, v in exported.items() if k != "store"},
            "team": {k: v for k, v in exported["team"].items() if k != "store"}}


IMPORT_TIMEOUT: Final = 300.0
"""Seconds an import of a few memories may take (embedding them on a loaded machine)."""
SPANNING: Final[dict[str, Any]] = {
    "format": "keymem-export", "version": 1,
    "keys": [{"id": "kzebrafish01", "concept": "zebrafish-gateway"},
             {"id": "kdevbuild002", "concept": "make zebrafish-dev"},
             {"id": "kcanary00003", "concept": "zebra-canary-check"}],
    "memories": [{"id": "mpersonal001", "content": PERSONAL, "namespace": "default"},
                 {"id": "mproject0001", "content": PROJECT, "namespace": "team-payments"}],
    "links": [{"key_id": "kzebrafish01", "memory_id": "mpersonal001"},
              {"key_id": "kdevbuild002", "memory_id": "mpersonal001"},
              {"key_id": "kzebrafish01", "memory_id": "mproject0001"},
              {"key_id": "kcanary00003", "memory_id": "mproject0001"}],
    "relations": [{"from": "mproject0001", "to": "mpersonal001"}],
}
"""An export (not a federated one) with a personal and a team memory sharing a key."""


def test_an_import_spanning_both_stores_puts_each_memory_in_the_store_of_its_namespace(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    alice = _start(factories, tmp_path, "alice", pg_database)
    done = _import(alice, SPANNING)
    assert done["event"] == "done", done
    assert done["result"]["imported"]["memories"] == 2 and done["result"]["imported"]["links"] == 4, done
    # The relation between the personal and the team memory cannot be kept, and the answer says so.
    left_out = done["result"]["not_imported"]
    assert (left_out["relations"], left_out["supersessions"]) == (1, 0) and "team store" in left_out["why"], done
    assert _in_sqlite(alice, "mpersonal001") and not _in_postgres(pg_database, "mpersonal001")
    assert _in_postgres(pg_database, "mproject0001") and not _in_sqlite(alice, "mproject0001")
    # The shared key is in both stores, each of the others in its memory's only.
    assert _key_ids_in_sqlite(alice) == {"kzebrafish01", "kdevbuild002"}
    assert _key_ids_in_postgres(pg_database) == {"kzebrafish01", "kcanary00003"}
    local, team = _store_counts(alice)
    assert (local["memories"], local["keys"], local["links"]) == (1, 2, 2), local
    assert (team["memories"], team["keys"], team["links"]) == (1, 2, 2), team
    # The daemon finds each where it is: by id, and by recall over its namespace.
    read = alice.call("read_memory", {"memory_id": "mproject0001"})["result"]["memory"]
    assert read["namespace"] == "team-payments" and read["content"] == PROJECT, read
    assert _hits(alice, "zebrafish-gateway zebra-canary-check", namespace="team-payments") == ["mproject0001"]
    assert "mpersonal001" in _hits(alice, "zebrafish-gateway make zebrafish-dev", namespace="default")


def test_a_federated_export_wiped_and_imported_gives_the_same_export(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str, pg_cluster: PgCluster) -> None:
    alice = _start(factories, tmp_path, "alice", pg_database)
    personal = alice.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev", "vim keymap"])
    alice.remember(PROJECT, ["zebrafish-gateway", "zebra-canary-check", "deploy"], namespace="team-payments")
    alice.remember("every deploy of the ledger needs two approvals in the release channel",
                   ["ledger deploy", "approvals"], namespace="Deploy-Rules")
    alice.call("correct", {"memory_id": personal, "content": PERSONAL.replace("vim", "emacs")})
    exported = alice.export()
    assert len(exported["memories"]) == 2 and len(exported["team"]["memories"]) == 2, exported
    # A wiped store: a new data directory and a new, empty database.
    database = pg_cluster.create_database()
    try:
        url = pg_cluster.url_for(OWNER, database)
        fresh = _start(factories, tmp_path, "fresh", url)
        done = _import(fresh, exported)
        assert done["event"] == "done", done
        assert done["result"]["imported"]["memories"] == 4, done
        assert _records(fresh.export()) == _records(exported)
        local, team = _store_counts(fresh)
        assert (local["memories"], local["superseded"], team["memories"]) == (1, 1, 2), (local, team)
        fresh.terminate()
    finally:
        pg_cluster.drop_database(database)


@pytest.mark.parametrize(("where", "said"), [("memories", "memories[1]"), ("team", "team.memories[0]")])
def test_a_bad_import_changes_neither_store(factories: list[DaemonFactory], tmp_path: Path, pg_database: str,
                                            where: str, said: str) -> None:
    alice = _start(factories, tmp_path, "alice", pg_database)
    alice.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev"])
    alice.remember(PROJECT, ["zebrafish-gateway", "zebra-canary-check"], namespace="team-payments")
    before = alice.export()
    bad: dict[str, Any] = {**SPANNING, "team": {
        "format": "keymem-export", "version": 1, "keys": [{"id": "kledger00001", "concept": "ledger deploy"}],
        "memories": [{"id": "mrules000001", "content": "ledger deploys need two approvals",
                      "namespace": "deploy-rules"}],
        "links": [{"key_id": "kledger00001", "memory_id": "mrules000001"}]}}
    if where == "team":
        bad["team"]["memories"][0]["content"] = 42
    else:
        bad["memories"] = [SPANNING["memories"][0], {**SPANNING["memories"][1], "content": 42}]
    refused = _import(alice, bad)
    assert refused["event"] == "error" and said in refused["error"]["message"], refused
    assert alice.export() == before
    local, team = _store_counts(alice)
    assert (local["memories"], team["memories"]) == (1, 1), (local, team)


def _memory_ids_in_postgres(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM memories")}


def test_an_import_one_store_refuses_leaves_the_other_unchanged_too(
        factories: list[DaemonFactory], tmp_path: Path, cli: Cli, pg_cluster: PgCluster, pg_database: str) -> None:
    alice_role = pg_cluster.create_role("alice")
    for grant in (("team-payments", alice_role, "--write"), ("deploy-rules", alice_role)):
        granted = cli("team", "grant", *grant, env=isolated_env(tmp_path, KEYMEM_STORE_URL=pg_database))
        assert granted.returncode == 0, granted.stderr
    alice = _start(factories, tmp_path, "alice", pg_cluster.url_for(alice_role, pg_database.rsplit("/", 1)[1]))
    before = alice.export()
    # The team part goes to a namespace alice may only read: row-level security refuses it,
    # and the personal part, written first, is rolled back.
    read_only = {**SPANNING, "memories": [SPANNING["memories"][0], {**SPANNING["memories"][1],
                                                                      "namespace": "deploy-rules"}]}
    refused = _import(alice, read_only)
    said = refused["error"]["message"]
    # The error names the record's place in the file as sent (the team part's first memory).
    assert refused["event"] == "error" and said.startswith("memories[1] cannot be stored: "), refused
    assert "row-level security" in said, refused
    assert not _in_sqlite(alice, "mpersonal001") and _memory_ids_in_postgres(pg_database) == set()
    # The local file is locked by another process: the personal part cannot be written, and
    # the team part, which the server would take, is not left behind.
    with sqlite3.connect(alice.data_dir / "keymem.db", isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")
        locked = _import(alice, SPANNING)
        other.execute("ROLLBACK")
    assert locked["event"] == "error" and "locked" in locked["error"]["message"], locked
    assert not _in_sqlite(alice, "mpersonal001") and _memory_ids_in_postgres(pg_database) == set()
    assert alice.export() == before
    local, team = _store_counts(alice)
    assert (local["memories"], local["keys"], team["memories"], team["keys"]) == (0, 0, 0, 0), (local, team)
    # Once nothing stands in the way, the same file imports whole.
    done = _import(alice, SPANNING)
    assert done["event"] == "done" and done["result"]["imported"]["memories"] == 2, done
    assert _in_sqlite(alice, "mpersonal001") and _memory_ids_in_postgres(pg_database) == {"mproject0001"}


def test_a_concept_keyed_in_both_stores_is_one_key_to_the_tools(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    alice = _start(factories, tmp_path, "alice", pg_database)
    personal = alice.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev", "vim keymap"])
    project = alice.remember(PROJECT, ["Zebrafish-Gateway", "zebra-canary-check", "deploy"],
                             namespace="team-payments")
    # The rule: a key lives in every store holding a memory linked to it, each under its own id.
    with sqlite3.connect(alice.data_dir / "keymem.db") as conn:
        local_key = conn.execute("SELECT id FROM keys WHERE norm = 'zebrafish-gateway'").fetchone()[0]
    with psycopg.connect(pg_database) as pg:
        row = pg.execute("SELECT id FROM keys WHERE norm = 'zebrafish-gateway'").fetchone()
    assert row is not None and row[0] != local_key
    team_key = row[0]
    # Listed once, with the memories of both.
    browsed = alice.call("browse_keys", {"limit": 20})["result"]
    gateway = [k for k in browsed["keys"] if k["concept"].casefold() == "zebrafish-gateway"]
    assert len(gateway) == 1 and gateway[0]["memory_count"] == 2, browsed
    concepts = [k["concept"].casefold() for k in browsed["keys"]]
    assert browsed["key_count"] == len(concepts) == len(set(concepts)), browsed
    # Recalled as one cluster, whose id leads to both memories.
    recalled = alice.call("recall", {"query": "zebrafish-gateway"})["result"]
    clusters = [k for k in recalled["keys"] if k["concept"].casefold() == "zebrafish-gateway"]
    assert len(clusters) == 1 and clusters[0]["memory_count"] == 2, recalled
    assert clusters[0]["key_id"] in {local_key, team_key}
    for key_id in (local_key, team_key):
        under = alice.call("read_key", {"key_id": key_id, "query": "zebrafish-gateway"})["result"]
        assert {h["memory_id"] for h in under["memories"]} == {personal, project} and under["total"] == 2, under
        assert under["key"]["key_id"] == key_id and under["key"]["memory_count"] == 2, under
        # Following the key to either memory works, whichever store's id the key was shown with.
        for memory_id in (personal, project):
            read = alice.call("read_memory", {"memory_id": memory_id, "via_key_id": key_id})
            assert not read["is_error"] and read["result"]["memory"]["id"] == memory_id, read
    # Over one namespace, that namespace's store's key.
    one = alice.call("read_key", {"key_id": local_key, "namespace": "team-payments"})["result"]
    assert one["key"]["key_id"] == team_key and [h["memory_id"] for h in one["memories"]] == [project], one


def test_a_relation_across_the_two_stores_is_refused_naming_both_and_nothing_is_saved(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    """``related_to`` joining a personal memory and a team one (remember, remember_batch,
    correct) cannot be kept -- each store's relations name its own memories -- so it is
    refused before anything is written, saying which namespace lives in which store; a
    relation inside one store is kept as ever."""
    daemon = _start(factories, tmp_path, "a", pg_database)
    personal = daemon.remember(PERSONAL, ["zebrafish-gateway"])
    team = daemon.remember(PROJECT, ["zebrafish-gateway"], namespace="team-payments")
    before = daemon.export()
    refused = [
        ("remember", {"content": "the canary job posts to zebra-alerts", "keys": ["zebra-canary-check"],
                      "namespace": "team-payments", "related_to": [personal]}, personal, "team-payments"),
        ("remember", {"content": "my zebra-alerts filter hides the canary job", "keys": ["zebra-alerts"],
                      "related_to": [team]}, team, "default"),
        ("correct", {"memory_id": team, "content": PROJECT.replace("passes", "passes twice"),
                     "related_to": [personal]}, personal, "team-payments"),
        ("remember_batch", {"items": [
            {"content": "my zebra-alerts filter hides the canary job", "keys": ["zebra-alerts"]},
            {"content": "the canary job posts to zebra-alerts", "keys": ["zebra-canary-check"],
             "namespace": "team-payments", "related_to": json.dumps([personal])}]}, personal, "team-payments"),
    ]
    for tool, arguments, other, target in refused:
        body = daemon.call(tool, arguments)
        text = json.dumps(body)
        assert body["is_error"], (tool, body)
        assert other in text and "not kept" in text and "nothing was saved" in text, (tool, body)
        assert f"goes to namespace '{target}'" in text, (tool, body)
        assert "sqlite" in text and "postgresql" in text, (tool, body)
    assert daemon.export() == before
    kept = daemon.call("remember", {"content": "the canary job posts to zebra-alerts", "keys": ["zebra-canary-check"],
                                    "namespace": "team-payments", "related_to": [team]})
    assert not kept["is_error"], kept
    assert _in_postgres(pg_database, kept["result"]["saved"])


def test_the_inspector_searches_lists_and_opens_memories_and_keys_of_both_stores(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    """The inspector's pages (``/ui/api``, logged in through a link as a browser is) span both
    stores as recall does: search and the newest memories list the personal and the team
    memory, the memory page and its graph open the team one, the key list and key page
    find the team store's key, and a concept keyed in both stores is one key whose page
    lists the members of both."""
    daemon = _start(factories, tmp_path, "a", pg_database)
    personal = daemon.remember(PERSONAL, ["zebrafish-gateway"])
    team = daemon.remember(PROJECT, ["zebra-canary-check", "zebrafish-gateway"], namespace="team-payments")
    assert _in_postgres(pg_database, team) and _in_sqlite(daemon, personal)
    link = daemon.client().post("/v1/inspect/login-link").json()["url"]
    browser = daemon.client(token="")
    assert browser.get(link, follow_redirects=False).status_code == 303

    def api(path: str) -> Any:
        response = browser.get(f"/ui/api{path}")
        assert response.status_code == 200, (path, response.text)
        return response.json()

    found = {r["id"] for r in api("/search?q=zebrafish-gateway")["results"]}
    assert {personal, team} <= found, found
    assert {r["id"] for r in api("/search")["results"]} == {personal, team}
    assert [r["id"] for r in api("/search?namespace=team-payments")["results"]] == [team]
    page = api(f"/memory/{team}")
    assert page["memory"]["content"] == PROJECT and page["memory"]["namespace"] == "team-payments", page
    assert f"m:{team}" in {n["id"] for n in api(f"/graph/memory/{team}")["nodes"]}
    concepts = {k["concept"]: k["key_id"] for k in api("/keys")["keys"]}
    assert {"zebrafish-gateway", "zebra-canary-check"} <= set(concepts), concepts
    key_id = api("/key-by-name?concept=zebra-canary-check")["key_id"]
    assert key_id == concepts["zebra-canary-check"]
    assert [m["memory_id"] for m in api(f"/key/{key_id}")["members"]] == [team]
    assert f"m:{team}" in {n["id"] for n in api(f"/graph/key/{key_id}")["nodes"]}
    keys = api("/keys")["keys"]
    assert [k["concept"] for k in keys].count("zebrafish-gateway") == 1, keys
    shared = api(f"/key/{concepts['zebrafish-gateway']}")
    assert {m["memory_id"] for m in shared["members"]} == {personal, team}, shared
    assert all(m["content"] for m in shared["members"]), shared


def _inspector(daemon: DaemonProcess) -> Callable[[str], Any]:
    """A GET of the inspector's page data (``/ui/api``), logged in through a link as a browser is."""
    link = daemon.client().post("/v1/inspect/login-link").json()["url"]
    browser = daemon.client(token="")
    assert browser.get(link, follow_redirects=False).status_code == 303

    def api(path: str) -> Any:
        response = browser.get(f"/ui/api{path}")
        assert response.status_code == 200, (path, response.text)
        return response.json()

    return api


TEAM_HALF: Final[dict[str, Any]] = {
    "format": "keymem-export", "version": 1,
    "keys": [{"id": "2e0fa9a7e209", "concept": "zebrafish-gateway", "aliases": [{"alias": "zgw", "hits": 3}]},
             {"id": "kcanary00003", "concept": "zebra-canary-check"}],
    "memories": [{"id": "mproject0001", "content": PROJECT, "namespace": "team-payments"}],
    "links": [{"key_id": "2e0fa9a7e209", "memory_id": "mproject0001"},
              {"key_id": "kcanary00003", "memory_id": "mproject0001"}],
}
"""The team memory of ``SPANNING`` alone, its gateway key with an alias only the team store holds."""


def test_the_inspector_key_page_and_key_graph_of_a_concept_keyed_in_both_stores_span_both(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    """A concept keyed in both stores (a personal memory's key in SQLite, a team memory's
    under another id in PostgreSQL) is one key on the inspector's key page and in its graph,
    opened by either id: the aliases of both (the team key's here), the co-occurring keys of
    both, the links of both; the graph's one node for it links both stores' memories."""
    daemon = _start(factories, tmp_path, "a", pg_database)
    personal = daemon.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev"])
    assert _import(daemon, TEAM_HALF)["event"] == "done"
    with sqlite3.connect(daemon.data_dir / "keymem.db") as conn:
        local_key = conn.execute("SELECT id FROM keys WHERE norm = 'zebrafish-gateway'").fetchone()[0]
    assert local_key != "2e0fa9a7e209" and "2e0fa9a7e209" in _key_ids_in_postgres(pg_database)
    api = _inspector(daemon)
    for opened in (local_key, "2e0fa9a7e209"):
        page = api(f"/key/{opened}")
        assert {m["memory_id"] for m in page["members"]} == {personal, "mproject0001"}, page
        assert [(a["alias"], a["learned"], a["hits"]) for a in page["aliases"]] == [("zgw", False, 3)], page
        assert {c["concept"] for c in page["co_keys"]} == {"make zebrafish-dev", "zebra-canary-check"}, page
        assert page["links_all_namespaces"] == 2 and page["idf"] == 0.5, page
        assert [(s["store"].split()[0], s["key_id"]) for s in page["stores"]] == sorted(
            [("sqlite", local_key), ("postgresql", "2e0fa9a7e209")], key=lambda s: s[1] != opened), page
        graph = api(f"/graph/key/{opened}")
        assert graph["center"] == f"k:{local_key}", graph
        labels = sorted(n["label"] for n in graph["nodes"] if n["kind"] == "key")
        assert labels == ["make zebrafish-dev", "zebra-canary-check", "zebrafish-gateway"], graph
        assert {n["ref"] for n in graph["nodes"] if n["kind"] == "memory"} == {personal, "mproject0001"}, graph
        assert {e["target"] for e in graph["edges"] if e["source"] == f"k:{local_key}"} == \
            {f"m:{personal}", "m:mproject0001"}, graph
        assert next(n for n in graph["nodes"] if n["id"] == f"k:{local_key}")["links"] == 2, graph
    # The team memory's graph names the concept by the same node, so a walk joins both stores.
    walked = api("/graph/memory/mproject0001")
    assert f"k:{local_key}" in {n["id"] for n in walked["nodes"]}, walked
    assert "k:2e0fa9a7e209" not in {n["id"] for n in walked["nodes"]}, walked
    # Over one namespace, that namespace's store's key, as read_key reads it.
    team_only = api(f"/key/{local_key}?namespace=team-payments")
    assert team_only["key"]["key_id"] == "2e0fa9a7e209", team_only
    assert [m["memory_id"] for m in team_only["members"]] == ["mproject0001"], team_only


SHARED_KEY: Final = "5ca1ab1e0001"
"""``SPANNING``'s shared key under an id the tools take (12 hex digits)."""


def test_a_key_an_import_put_in_both_stores_under_one_id_is_one_key_with_the_memories_of_both(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    """An import puts a key linked from a personal and a team memory in both stores under its
    one id: read_key and the inspector's key page list the memories of both, as for a concept
    keyed in both stores under two ids."""
    daemon = _start(factories, tmp_path, "a", pg_database)
    spanning = json.loads(json.dumps(SPANNING).replace("kzebrafish01", SHARED_KEY))
    assert _import(daemon, spanning)["event"] == "done"
    assert SHARED_KEY in _key_ids_in_sqlite(daemon) and SHARED_KEY in _key_ids_in_postgres(pg_database)
    read = daemon.call("read_key", {"key_id": SHARED_KEY})["result"]
    assert {h["memory_id"] for h in read["memories"]} == {"mpersonal001", "mproject0001"}, read
    # Counted once each: the import's reload of the tables and the change log's batch of the
    # team half do not both count it.
    assert read["total"] == 2 and read["key"]["memory_count"] == 2, read
    page = _inspector(daemon)(f"/key/{SHARED_KEY}")
    assert {m["memory_id"] for m in page["members"]} == {"mpersonal001", "mproject0001"}, page
    assert {c["concept"] for c in page["co_keys"]} == {"make zebrafish-dev", "zebra-canary-check"}, page


def test_related_and_the_inspector_memory_page_find_neighbours_in_the_other_store_through_a_shared_concept(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    """``related`` (and the inspector's neighbours through shared keys) of a personal memory
    lists the team memory sharing one of its concepts, and the other way round -- each store
    keys the concept under its own id -- while a memory sharing nothing stays out."""
    daemon = _start(factories, tmp_path, "a", pg_database)
    personal = daemon.remember(PERSONAL, ["zebrafish-gateway", "make zebrafish-dev"])
    project = daemon.remember(PROJECT, ["zebrafish-gateway", "zebra-canary-check"], namespace="team-payments")
    daemon.remember("the ledger's nightly export runs at two", ["ledger export"], namespace="team-payments")
    for memory_id, other in ((personal, project), (project, personal)):
        body = daemon.call("related", {"memory_id": memory_id})
        assert not body["is_error"], body
        assert [(r["id"], r["shared_keys"]) for r in body["result"]] == [(other, ["zebrafish-gateway"])], body
        page = _inspector(daemon)(f"/memory/{memory_id}")
        assert [n["id"] for n in page["neighbours"]] == [other], page
