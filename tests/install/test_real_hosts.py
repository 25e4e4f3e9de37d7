"""The real hosts install and run the plugin: Claude Code and Codex CLIs, offline.

Each test uses a host's own CLI on an empty HOME: it adds this repository as a marketplace,
installs ``keymem@keymem``, then runs one non-interactive turn (``claude -p`` / ``codex
exec``) against a fake model API on 127.0.0.1 that records what the host sends. The turn
passes only if the host started keymem's MCP server from its plugin cache, loaded the
skill, ran the hooks, and put the memory the UserPromptSubmit hook surfaced into the
model's input. No credentials and no network: the fake API answers "ok".

Two more tests do the same on a machine where keymem is not installed at all: the host
gets the launcher's stand-in server at once (it says keymem is installing), the venv is
built in the background from an offline wheelhouse, and Claude Code picks up the real
tools in the same session when the stand-in hands over and announces them.

The CLIs are not Python packages; ``scripts/run-tests.sh`` installs the pinned versions with
npm when it can, or by hand::

    npm install --prefix /opt/hosts @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0
    PATH=/opt/hosts/node_modules/.bin:$PATH pytest tests/install/test_real_hosts.py

(or name the binaries in ``KEYMEM_TEST_CLAUDE`` / ``KEYMEM_TEST_CODEX``); elsewhere they
are skipped, and under ``CI=true`` they fail. Checked with Claude Code 2.1.332 and Codex 0.171.0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from daemon_helpers import READY_TIMEOUT, isolated_env, scaled, wait_for
from installsim import (
    ROOT,
    TEN_TOOLS,
    base_python,
    bootstrap_log,
    cleanup,
    copy_plugin,
    offline_pip_env,
    path_without_keymem,
    plugin_version,
    session_wheelhouse,
)

from keymem_daemon import runtime

pytestmark = pytest.mark.timeout(420)

HOST_TIMEOUT: Final = 180.0
PROMPT: Final = "Which port does the billing staging database listen on?"
MEMORIES: Final = (
    ("The staging database for the billing service runs PostgreSQL 15 on port 5433.",
     ["billing service", "staging database", "PostgreSQL", "5433"]),
    ("The user prefers tabs over spaces in Go code.", ["tabs", "indentation", "Go"]),
    ("Deploys to production happen on Tuesdays.", ["deploy", "Tuesday", "배포"]),
    ("Project Atlas builds with Bazel.", ["Atlas", "Bazel", "build"]),
)
QUIET: Final = {
    # Claude Code: no telemetry, no update checks, no other traffic.
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


def host_binary(name: str, variable: str) -> str:
    found = os.environ.get(variable) or shutil.which(name)
    if not found:
        # CI installs the hosts (scripts/run-tests.sh): there a missing one is a failure.
        skip_or_fail = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
        skip_or_fail(f"{name} is not installed (npm install @anthropic-ai/claude-code "
                    f"@openai/codex, or set {variable})")
    return found


# -- a fake model API that records requests ------------------------------------------------


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests: list[dict[str, Any]]

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.requests.append({"method": "GET", "path": self.path})
        self.reply(200, "application/json", b'{"object":"list","data":[],"has_more":false}')

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append({"method": "POST", "path": self.path, "body": body})
        if "count_tokens" in self.path:
            self.reply(200, "application/json", b'{"input_tokens": 10}')
        elif "/responses" in self.path:
            self.reply(200, "text/event-stream", sse(responses_events()))
        else:
            model = body.get("model", "claude") if isinstance(body, dict) else "claude"
            self.reply(200, "text/event-stream", sse(messages_events(model)))


def sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def messages_events(model: str) -> list[dict[str, Any]]:
    """Anthropic Messages API streaming events for the reply "ok"."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 10, "output_tokens": 1}}
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]


def responses_events() -> list[dict[str, Any]]:
    """OpenAI Responses API streaming events for the reply "ok"."""
    text = {"type": "output_text", "text": "ok", "annotations": []}
    return [
        {"type": "response.created",
         "response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"type": "message", "id": "m1", "role": "assistant", "status": "in_progress",
                  "content": []}},
        {"type": "response.output_text.delta", "item_id": "m1", "output_index": 0,
         "content_index": 0, "delta": "ok"},
        {"type": "response.output_item.done", "output_index": 0,
         "item": {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                  "content": [text]}},
        {"type": "response.completed",
         "response": {"id": "resp_1", "object": "response", "status": "completed", "output": [],
                      "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                                "output_tokens": 1,
                                "output_tokens_details": {"reasoning_tokens": 0},
                                "total_tokens": 11}}},
    ]


@pytest.fixture
def model_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    requests: list[dict[str, Any]] = []
    handler = type("Handler", (Recorder,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


# -- the user's machine ------------------------------------------------------------------------


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An empty HOME, keymem installed as pipx would (keymem-shim and keymemd on PATH)."""
    bin_dir = tmp_path / "pipx-bin"
    bin_dir.mkdir()
    for name in ("keymem-shim", "keymemd"):
        (bin_dir / name).symlink_to(Path(sys.executable).parent / name)
    rest = [e for e in os.environ.get("PATH", "").split(os.pathsep)
            if e and not (Path(e) / "keymem-shim").exists()]
    env = isolated_env(tmp_path, PATH=os.pathsep.join([str(bin_dir), *rest]), **QUIET)
    (tmp_path / "project").mkdir()
    try:
        yield env
    finally:
        cleanup(Path(env["KEYMEM_DATA_DIR"]), wait_for)


def seed_memories(env: dict[str, str]) -> str:
    """Start the daemon and store a few facts; returns the billing memory's id."""
    subprocess.run([sys.executable, "-m", "keymem_daemon", "start"], env=env, check=True,
                   capture_output=True, timeout=scaled(READY_TIMEOUT) + 30)
    info = runtime.read_daemon_info(Path(env["KEYMEM_DATA_DIR"]))
    ids = []
    with httpx.Client(base_url=info.url, headers=info.headers, timeout=scaled(30)) as client:
        for content, keys in MEMORIES:
            response = client.post("/v1/tools/remember",
                                   json={"arguments": {"content": content, "keys": keys}})
            assert response.status_code == 200, response.text
            ids.append(response.json()["result"]["saved"])
    return ids[0]


def marketplace_copy(tmp_path: Path) -> Path:
    """The repository as a user's clone has it (a local marketplace for both hosts)."""
    return copy_plugin(tmp_path / "keymem-repo", ROOT)


def run(argv: list[str], env: dict[str, str], cwd: Path,
        timeout: float = HOST_TIMEOUT) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{argv}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def model_inputs(requests: list[dict[str, Any]], path: str) -> list[str]:
    return [json.dumps(r["body"], ensure_ascii=False) for r in requests
            if r["method"] == "POST" and path in r["path"] and isinstance(r.get("body"), dict)]


# -- Claude Code ---------------------------------------------------------------------------------


def test_claude_code_validates_the_manifests(tmp_path: Path, machine: dict[str, str]) -> None:
    claude = host_binary("claude", "KEYMEM_TEST_CLAUDE")
    for target in (ROOT / ".claude-plugin" / "marketplace.json",
                   ROOT / ".claude-plugin" / "plugin.json"):
        result = subprocess.run([claude, "plugin", "validate", "--strict", "--json", str(target)],
                                env=machine, capture_output=True, text=True, timeout=scaled(120),
                                check=False)
        report = json.loads(result.stdout)
        assert result.returncode == 0 and report["success"], result.stdout
        assert not report["manifest"]["errors"] and not report["manifest"]["warnings"], report


def test_claude_code_installs_the_plugin_and_runs_it_in_a_turn(
    tmp_path: Path, machine: dict[str, str], model_api: tuple[str, list[dict[str, Any]]]
) -> None:
    claude = host_binary("claude", "KEYMEM_TEST_CLAUDE")
    url, requests = model_api
    env = dict(machine, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-ant-test",
               MCP_CONNECTION_NONBLOCKING="false")
    project = tmp_path / "project"
    repo = marketplace_copy(tmp_path)
    run([claude, "plugin", "marketplace", "add", str(repo)], env, project)
    run([claude, "plugin", "install", "keymem@keymem"], env, project)
    installed = load_installed(Path(env["HOME"]) / ".claude" / "plugins" / "installed_plugins.json")
    assert installed["version"] == plugin_version(), installed

    memory_id = seed_memories(env)
    debug = tmp_path / "claude-debug.log"
    run([claude, "-p", PROMPT, "--output-format", "json", "--debug-file", str(debug)], env, project)

    log = debug.read_text(errors="replace")
    assert 'MCP server "plugin:keymem:keymem": Successfully connected' in log, log[-4000:]
    (sent,) = model_inputs(requests, "/v1/messages")
    assert "Memories keymem surfaced" in sent and memory_id in sent, sent[-4000:]
    assert "mcp__plugin_keymem_keymem__recall" in sent
    assert "keymem:keymem" in sent, "the skill is not listed"
    assert "keymem is your long-term associative memory" in sent, "no server instructions"


def load_installed(path: Path) -> dict[str, Any]:
    (entry,) = json.loads(path.read_text())["plugins"]["keymem@keymem"]
    assert isinstance(entry, dict)
    return entry


# -- Codex -----------------------------------------------------------------------------------------


def test_codex_installs_the_plugin_and_runs_it_in_a_turn(
    tmp_path: Path, machine: dict[str, str], model_api: tuple[str, list[dict[str, Any]]]
) -> None:
    codex = host_binary("codex", "KEYMEM_TEST_CODEX")
    url, requests = model_api
    env = dict(machine, KEYMEM_TEST_MODEL_KEY="sk-test")
    home = Path(env["HOME"])
    project = tmp_path / "project"
    repo = marketplace_copy(tmp_path)
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(
        'model = "gpt-5.1-codex"\nmodel_provider = "fake"\n\n'
        "[model_providers.fake]\n"
        f'name = "fake"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        'env_key = "KEYMEM_TEST_MODEL_KEY"\nsupports_websockets = false\n'
    )
    run([codex, "plugin", "marketplace", "add", str(repo)], env, project)
    listed = json.loads(run([codex, "plugin", "list", "--json", "--available"], env, project).stdout)
    assert [p["pluginId"] for p in listed["available"]] == ["keymem@keymem"], listed
    run([codex, "plugin", "add", "keymem@keymem"], env, project)
    cache = home / ".codex" / "plugins" / "cache" / "keymem" / "keymem" / plugin_version()
    assert (cache / ".codex-plugin" / "plugin.json").is_file()

    memory_id = seed_memories(env)
    run([codex, "exec", "--skip-git-repo-check", "--dangerously-bypass-hook-trust", "--json",
         PROMPT], env, project)

    (sent,) = model_inputs(requests, "/responses")
    body = json.loads(sent)
    assert "Memories keymem surfaced" in sent and memory_id in sent, sent[-4000:]
    namespaces = {t.get("name"): t for t in body["tools"] if t.get("type") == "namespace"}
    assert "mcp__keymem" in namespaces, [t.get("name") for t in body["tools"]]
    # The MCP server answered initialize (its instructions describe the namespace) and
    # tools/list (the ten tools in it).
    assert "long-term associative memory" in namespaces["mcp__keymem"]["description"]
    assert {t["name"] for t in namespaces["mcp__keymem"]["tools"]} == TEN_TOOLS
    assert "keymem:keymem" in sent, "the skill is not listed"
    wait_for(lambda: runtime.running_daemon(Path(env["KEYMEM_DATA_DIR"])), READY_TIMEOUT)


# -- a machine without keymem: the stand-in, then the real tools -------------------------------


@pytest.fixture(scope="session")
def wheelhouse(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_wheelhouse(request, tmp_path_factory)


@pytest.fixture
def bare_machine(tmp_path: Path, wheelhouse: Path) -> Iterator[dict[str, str]]:
    """An empty HOME and no keymem anywhere; pip installs offline from the wheelhouse."""
    env = isolated_env(tmp_path, PATH=path_without_keymem(),
                       KEYMEM_BOOTSTRAP_PYTHON=base_python(), **QUIET)
    env.update(offline_pip_env(wheelhouse))
    (tmp_path / "project").mkdir()
    try:
        yield env
    finally:
        cleanup(Path(env["KEYMEM_DATA_DIR"]), wait_for)


@pytest.mark.slow
def test_claude_code_without_keymem_gets_the_stand_in_then_the_real_tools(
    tmp_path: Path, bare_machine: dict[str, str], model_api: tuple[str, list[dict[str, Any]]]
) -> None:
    claude = host_binary("claude", "KEYMEM_TEST_CLAUDE")
    url, requests = model_api
    env = dict(bare_machine, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-ant-test",
               MCP_CONNECTION_NONBLOCKING="false")
    project = tmp_path / "project"
    repo = marketplace_copy(tmp_path)
    run([claude, "plugin", "marketplace", "add", str(repo)], env, project)
    run([claude, "plugin", "install", "keymem@keymem"], env, project)
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    debug = tmp_path / "claude-debug.log"
    session = subprocess.Popen(
        [claude, "-p", "--input-format", "stream-json", "--output-format", "stream-json",
         "--verbose", "--debug-file", str(debug)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        cwd=project, env=env,
    )
    assert session.stdin is not None and session.stdout is not None

    def turn(text: str) -> None:
        assert session.stdin is not None and session.stdout is not None
        message = {"type": "user",
                   "message": {"role": "user", "content": [{"type": "text", "text": text}]}}
        session.stdin.write(json.dumps(message) + "\n")
        session.stdin.flush()
        for line in session.stdout:
            if json.loads(line).get("type") == "result":
                return
        pytest.fail("claude ended the session early")

    try:
        turn("hello")
        (first,) = model_inputs(requests, "/v1/messages")
        assert "is installing its Python dependencies" in first, first[-3000:]
        assert "keymem_status" in first
        wait_for(lambda: "Received tools/list_changed" in debug.read_text(errors="replace"),
                 HOST_TIMEOUT, message=lambda: "the hand-over\n" + bootstrap_log(data_dir)[-3000:])
        # Claude Code refreshes its tool list in the background after the notification: the
        # real tools reach the model within a turn or two of the same session.
        for _ in range(5):
            turn("Which editor do I use?")
            latest = model_inputs(requests, "/v1/messages")[-1]
            if "mcp__plugin_keymem_keymem__recall" in latest:
                break
        else:
            pytest.fail("the real tools never reached the model:\n" + latest[-3000:])
    finally:
        session.stdin.close()
        session.wait(timeout=scaled(60))
        session.stdout.close()
    log = bootstrap_log(data_dir)
    assert log.count("bootstrap start:") == 1 and "handing the MCP session over" in log, log


@pytest.mark.slow
def test_codex_without_keymem_gets_the_stand_in_in_the_first_turn(
    tmp_path: Path, bare_machine: dict[str, str], model_api: tuple[str, list[dict[str, Any]]]
) -> None:
    codex = host_binary("codex", "KEYMEM_TEST_CODEX")
    url, requests = model_api
    env = dict(bare_machine, KEYMEM_TEST_MODEL_KEY="sk-test")
    home = Path(env["HOME"])
    project = tmp_path / "project"
    repo = marketplace_copy(tmp_path)
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(
        'model = "gpt-5.1-codex"\nmodel_provider = "fake"\n\n'
        "[model_providers.fake]\n"
        f'name = "fake"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        'env_key = "KEYMEM_TEST_MODEL_KEY"\nsupports_websockets = false\n'
    )
    run([codex, "plugin", "marketplace", "add", str(repo)], env, project)
    run([codex, "plugin", "add", "keymem@keymem"], env, project)
    run([codex, "exec", "--skip-git-repo-check", "--dangerously-bypass-hook-trust", "--json",
         "hello"], env, project)
    (sent,) = model_inputs(requests, "/responses")
    tools = {t.get("name"): t for t in json.loads(sent)["tools"] if t.get("type") == "namespace"}
    assert "mcp__keymem" in tools, list(tools)
    assert "is installing" in tools["mcp__keymem"]["description"]
    assert [t["name"] for t in tools["mcp__keymem"]["tools"]] == ["keymem_status"]
    # The install goes on after the session: the next one gets the real server.
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    wait_for(lambda: (data_dir / "venv" / "keymem-plugin-version").exists(), HOST_TIMEOUT,
             message=lambda: "the venv\n" + bootstrap_log(data_dir)[-3000:])
