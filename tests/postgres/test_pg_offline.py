"""A daemon on a shared PostgreSQL store whose server stops (issue 22, Faults): reads keep
answering from its local replica, marked possibly stale, without waiting for the pool's
timeout; writes are refused at once, naming the server; the real shim and the real hook
answer promptly; once the server is back the daemon catches up with what another daemon
wrote and stops saying stale."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import anyio
import mcp.types as types
import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, isolated_env, wait_for
from mcp import ClientSession, StdioServerParameters, stdio_client
from pg_cluster import PgCluster

from keymem_daemon.store.postgres.repository import POOL_TIMEOUT

pytestmark = pytest.mark.timeout(600)

HOOK: Final = Path(__file__).resolve().parents[2] / "hooks" / "keymem_hook.py"
HOOK_BUDGET: Final = 2.0
"""KEYMEM_HOOK_TIMEOUT_MS's default: the most the hook may wait for the daemon."""
STARTUP_ALLOWANCE: Final = 1.5
"""Interpreter start and exit on a loaded machine, on top of the hook's budget."""
RUN_TIMEOUT: Final = 30.0
"""subprocess.run's own deadline: far past any budget, so a hung hook fails, not hangs."""

REPLICA_TIMEOUT: Final = 120.0
"""Seconds for a new daemon's local replica to be filled (a few memories: well under one)."""
NOTICE_TIMEOUT: Final = 30.0
"""Seconds for the daemon to notice the stopped server (its change-log connection is cut at once)."""
PROPAGATION_TIMEOUT: Final = 30.0
RECOVERY_TIMEOUT: Final = 120.0
"""Seconds for the daemon to follow the restarted server again (reconnects back off to 10 s)."""
ANSWER_LIMIT: Final = POOL_TIMEOUT
"""What no answer may take while the server is down: the pool's timeout is what a read or a
write waited for before (each of them), to fail."""

KEPT = "the staging database password rotates every ninety days through the vault"
FORGOTTEN = "the staging database is backed up nightly to the old tape robot"
OLD = "the staging database lives on host db-old in the basement rack"
NEW = "the staging database lives on host db-new in the cloud region"


def _start(tmp_path: Path, factories: list[DaemonFactory], name: str, url: str) -> DaemonProcess:
    (tmp_path / name).mkdir()
    factory = DaemonFactory(tmp_path / name)
    factories.append(factory)
    return factory.start(KEYMEM_STORE_URL=url)


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.monotonic()
    value = fn()
    return value, time.monotonic() - started


def _recall_text(daemon: DaemonProcess, query: str) -> dict[str, Any]:
    body: dict[str, Any] = daemon.call("recall", {"query": query})
    return body


def test_a_stopped_server_leaves_reads_answering_from_the_replica_and_writes_refused_at_once(
        own_pg_cluster: PgCluster, tmp_path: Path) -> None:
    factories: list[DaemonFactory] = []
    try:
        _scenario(own_pg_cluster, tmp_path, factories)
    finally:
        for factory in factories:
            factory.teardown()


def _scenario(cluster: PgCluster, tmp_path: Path, factories: list[DaemonFactory]) -> None:
    a = _start(tmp_path, factories, "a", cluster.url)
    b = _start(tmp_path, factories, "b", cluster.url)
    kept = b.remember(KEPT, ["staging database password"])
    forgotten = b.remember(FORGOTTEN, ["staging database backup"])
    old = b.remember(OLD, ["staging database host"])
    assert not b.call("forget", {"memory_id": forgotten})["is_error"]
    corrected = b.call("correct", {"memory_id": old, "content": NEW})
    assert not corrected["is_error"], corrected
    new = str(corrected["result"].get("new_id") or corrected["result"].get("saved"))
    client = a.client()

    def a_follows() -> bool:
        stats = client.get("/v1/stats").json()
        text = json.dumps(_recall_text(a, "staging database host"))
        return str(stats.get("replica", "")).startswith("ready") and new in text and old not in text
    wait_for(a_follows, REPLICA_TIMEOUT, message=lambda: f"a to follow b and fill its replica\n{a.log()}")

    cluster.stop_server()
    stale = wait_for(lambda: client.get("/v1/stats").json().get("stale"), NOTICE_TIMEOUT,
                     message="a to say it is possibly stale")
    assert "possibly stale" in stale and f"127.0.0.1:{cluster.port}" in stale and "local replica" in stale, stale
    health = client.get("/health").json()
    assert any("possibly stale" in w for w in health.get("warnings", [])), health
    status = subprocess.run([sys.executable, "-m", "keymem_daemon", "status", "--json"],
                            env=isolated_env(tmp_path / "a"), capture_output=True, text=True, timeout=RUN_TIMEOUT,
                            check=False)
    assert any("possibly stale" in w for w in json.loads(status.stdout)["warnings"]), status

    # Reads answer from the replica, at once, marked stale; what was forgotten or corrected
    # before the outage is not served as current.
    recalled, took = _timed(lambda: _recall_text(a, "staging database password vault"))
    assert not recalled["is_error"] and kept in json.dumps(recalled["result"]), recalled
    assert "possibly stale" in recalled["result"]["stale"], recalled
    assert took < ANSWER_LIMIT, took
    for query in ("staging database backup tape robot", "staging database host"):
        text = json.dumps(_recall_text(a, query))
        assert forgotten not in text and old not in text, text
    host = json.dumps(_recall_text(a, "staging database host cloud region"))
    assert new in host, host
    got, took = _timed(lambda: a.call("read_memory", {"memory_id": kept}))
    assert not got["is_error"] and got["result"]["memory"]["content"] == KEPT and "stale" in got["result"], got
    assert took < ANSWER_LIMIT, took
    gone = a.call("read_memory", {"memory_id": forgotten})
    assert "not found" in json.dumps(gone).lower(), gone
    injected, took = _timed(lambda: client.post("/v1/inject", json={
        "prompt": "how often does the staging database password rotate in the vault?"}).json())
    assert kept in json.dumps(injected["memories"]) and "possibly stale" in injected["stale"], injected
    assert took < ANSWER_LIMIT, took

    # Writes are refused at once, naming the server, and nothing of them is written.
    for _ in range(3):
        response, took = _timed(lambda: client.post("/v1/tools/remember", json={"arguments": {
            "content": "the staging database moves again next week", "keys": ["staging move"]}}))
        body = response.json()
        assert response.status_code >= 500, body
        message = body["error"]["message"]
        assert body["error"]["code"] == "store_unavailable", body
        assert f"127.0.0.1:{cluster.port}" in message and "nothing was written" in message, message
        assert all(secret not in message for secret in cluster.passwords.values())
        assert took < ANSWER_LIMIT, took

    # The real shim and the real hook answer promptly.
    env = isolated_env(tmp_path / "a")
    shim_answer = anyio.run(_through_the_shim, env, tmp_path / "shim.err", kept)
    assert shim_answer["recall"] < ANSWER_LIMIT and shim_answer["remember"] < ANSWER_LIMIT, shim_answer
    prompt = {"prompt": "how often does the staging database password rotate in the vault?", "cwd": str(tmp_path),
              "session_id": "s", "hook_event_name": "UserPromptSubmit"}
    hook, took = _timed(lambda: subprocess.run([sys.executable, str(HOOK), "user-prompt-submit"],
                                               input=json.dumps(prompt).encode(), env=env, capture_output=True,
                                               timeout=RUN_TIMEOUT, check=False))
    assert hook.returncode == 0 and hook.stderr == b"", hook
    assert took < HOOK_BUDGET + STARTUP_ALLOWANCE, took
    assert hook.stdout == b"" or kept in hook.stdout.decode(), hook

    # The server comes back: a write through b is seen through a, which stops saying stale.
    cluster.start_server()
    after = wait_for(lambda: _remember_or_none(b, "the staging database freeze starts on the first of june",
                                               ["staging freeze"]), RECOVERY_TIMEOUT, interval=0.5,
                     message="b to write again")
    wait_for(lambda: "stale" not in client.get("/v1/stats").json(), RECOVERY_TIMEOUT,
             message=lambda: f"a to follow the server again\n{a.log()}")
    wait_for(lambda: after in json.dumps(_recall_text(a, "staging database freeze june")), PROPAGATION_TIMEOUT,
             message="a to recall what b wrote after the restart")
    saved = a.remember("the staging database freeze ends in july", ["staging freeze"])
    assert "stale" not in json.dumps(a.call("read_memory", {"memory_id": saved}))


def _remember_or_none(daemon: DaemonProcess, content: str, keys: list[str]) -> str | None:
    body = daemon.client().post("/v1/tools/remember", json={"arguments": {"content": content, "keys": keys}})
    if body.status_code != 200 or body.json().get("is_error"):
        return None
    return str(body.json()["result"]["saved"])


async def _through_the_shim(env: dict[str, str], errlog: Path, kept: str) -> dict[str, float]:
    """A recall and a remember through ``python -m keymem_shim`` and mcp's stdio client; how
    long each took."""
    took: dict[str, float] = {}
    params = StdioServerParameters(command=sys.executable, args=["-m", "keymem_shim"], env=env)
    with open(errlog, "w") as sink:
        async with stdio_client(params, errlog=sink) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for tool, arguments in (("recall", {"query": "staging database password vault"}),
                                    ("remember", {"content": "the staging database moves in may",
                                                  "keys": ["staging move"]})):
                started = time.monotonic()
                result = await session.call_tool(tool, arguments)
                took[tool] = time.monotonic() - started
                block = result.content[0]
                assert isinstance(block, types.TextContent), result
                if tool == "recall":
                    value = json.loads(block.text)
                    assert not result.is_error and kept in block.text and "possibly stale" in value["stale"], value
                else:
                    assert result.is_error and "does not answer" in block.text, block.text
    return took
