"""Install keymem the way each host does, on an empty HOME and a fresh data dir, and use it.

For Claude Code and for Codex: copy the plugin into the host's cache, substitute what the
host substitutes (and only that), then run what the host runs -- the SessionStart hook (the
daemon comes up), the MCP server command through the real MCP client (initialize,
tools/list, remember, recall) and the UserPromptSubmit hook with a real payload (the memory
surfaces in ``additionalContext``).

keymem is "already installed" here: a bin directory holding only ``keymem-shim`` and
``keymemd`` (what ``pipx install`` leaves) is first on PATH, so the launcher takes its
PATH branch and the hook finds ``keymemd``. The launcher's own venv bootstrap is tested in
``test_launcher.py``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import anyio
import pytest
from daemon_helpers import READY_TIMEOUT, isolated_env, scaled, wait_for
from installsim import (
    TEN_TOOLS,
    ClaudeCode,
    Codex,
    claude_prompt_payload,
    claude_session_start_payload,
    cleanup,
    codex_prompt_payload,
    codex_session_start_payload,
    processes_mentioning,
    run_hook,
    run_server,
)

from keymem_daemon import runtime

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

DEADLINE: Final = 120.0
BILLING: Final = (
    "The staging database for the billing service runs PostgreSQL 15 on port 5433; "
    "run migrations with `alembic upgrade head`.",
    ["billing service", "staging database", "PostgreSQL", "5433", "alembic"],
)
OTHERS: Final = (
    ("The user prefers tabs over spaces in Go code.", ["tabs", "indentation", "Go", "탭"]),
    ("Deploys to production happen on Tuesdays after the 10am standup.",
     ["deploy", "Tuesday", "배포", "production"]),
    ("Project Atlas builds with Bazel.", ["Atlas", "Bazel", "build"]),
)
"""A few unrelated facts: the push path ranks against the rest of the store."""
PROMPT: Final = "Which port does the billing staging database listen on?"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def installed_path(tmp_path: Path) -> str:
    """PATH with keymem installed as pipx installs it, and no other keymem on it."""
    bin_dir = tmp_path / "pipx-bin"
    bin_dir.mkdir()
    scripts = Path(sys.executable).parent
    for name in ("keymem-shim", "keymemd"):
        (bin_dir / name).symlink_to(scripts / name)
    rest = [
        entry for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not (Path(entry) / "keymem-shim").exists()
        and not (Path(entry) / "keymemd").exists()
    ]
    return os.pathsep.join([str(bin_dir), *rest])


@pytest.fixture
def host_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = isolated_env(
        tmp_path, PATH=installed_path(tmp_path), KEYMEM_HOOK_DEBUG_LOG=str(tmp_path / "hook.log")
    )
    (tmp_path / "project").mkdir()
    try:
        yield env
    finally:
        cleanup(Path(env["KEYMEM_DATA_DIR"]), wait_for)


def shim_process(data_dir: Path) -> int | None:
    """The keymem-shim the host spawned for ``data_dir`` (Linux /proc), if any.

    Not the daemon's warm shim nor its forks: /proc shows the environment they were started
    with, the daemon's, not the one a fork received from the host's shim.
    """
    for pid in processes_mentioning(str(data_dir)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"keymem_shim._forkserver" in cmdline:
            continue
        if b"keymem-shim" in cmdline or b"keymem_shim" in cmdline:
            return pid
    return None


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if b"=" in item)
    return {k: v for k, _, v in pairs}


async def use_the_plugin(host: ClaudeCode | Codex, tmp_path: Path, *, codex: bool) -> str:
    """The whole first session: SessionStart, MCP, a remember and a recall, then a prompt.

    Returns the server instructions the host received."""
    data_dir = Path(host.environ["KEYMEM_DATA_DIR"])
    assert not data_dir.exists(), "the data dir must start fresh"
    if not host.plugin_root.exists():
        host.install()
    assert (host.plugin_root / "plugin" / "launcher.sh").is_file()

    # SessionStart: exits 0 at once and leaves a daemon coming up.
    payload = codex_session_start_payload(host.project) if codex else \
        claude_session_start_payload(host.project)
    (start_hook,) = host.hooks("SessionStart")
    run = run_hook(start_hook, payload, host.project)
    assert run.returncode == 0 and run.stdout == "", run
    wait_for(lambda: runtime.running_daemon(data_dir), READY_TIMEOUT,
             message="the daemon started by the SessionStart hook")

    # The MCP server, exactly as the host spawns it.
    command = host.mcp_server()
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_server(command, tmp_path / "server.err") as server:
            assert server.init.server_info.name == "keymem", server.stderr()
            instructions = server.init.instructions or ""
            assert await server.tool_names() == TEN_TOOLS
            saved = await server.ok("remember", content=BILLING[0], keys=BILLING[1])
            memory_id = saved["saved"]
            await server.ok("remember_batch", items=[
                {"content": content, "keys": keys} for content, keys in OTHERS
            ])
            recalled = await server.ok("recall", query="billing staging database port",
                                       context=PROMPT)
            assert recalled["status"] == "found", recalled
            assert any(m["id"] == memory_id for m in recalled["memories"]), recalled
            if Path("/proc").is_dir():
                check_the_shim_knows_the_host_directory(host, data_dir, codex=codex)

    # UserPromptSubmit with the host's real payload: the memory surfaces.
    payload = codex_prompt_payload(PROMPT, host.project) if codex else \
        claude_prompt_payload(PROMPT, host.project)
    (prompt_hook,) = host.hooks("UserPromptSubmit")
    run = run_hook(prompt_hook, payload, host.project)
    assert run.returncode == 0 and run.stderr == "", run
    assert run.stdout, f"nothing surfaced: {hook_log(host)}"
    output = json.loads(run.stdout)
    assert set(output) == {"hookSpecificOutput"}
    assert output["hookSpecificOutput"]["hookEventName"] == "UserPromptSubmit"
    context = output["hookSpecificOutput"]["additionalContext"]
    assert "<keymem-surfaced>" in context and memory_id in context and "5433" in context
    return instructions


def hook_log(host: ClaudeCode | Codex) -> str:
    path = Path(host.environ["KEYMEM_HOOK_DEBUG_LOG"])
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no hook log)"


def check_the_shim_knows_the_host_directory(
    host: ClaudeCode | Codex, data_dir: Path, *, codex: bool
) -> None:
    """The launcher tells the shim where the host runs, never the plugin's cache dir."""
    pid = shim_process(data_dir)
    assert pid is not None, "no keymem-shim process"
    environ = proc_environ(pid)
    cwd = os.path.realpath(f"/proc/{pid}/cwd")
    plugin_root = str(host.plugin_root.resolve())
    assert cwd != plugin_root and environ["KEYMEM_HOST_CWD"] != plugin_root
    if codex:
        # Codex starts the server in the plugin dir; its own directory (the parent's, here
        # this test process's) is the host's.
        assert environ["KEYMEM_HOST_CWD"] == os.path.realpath(os.getcwd())
        # Codex's cleared environment: the allow-list, env_vars and env only.
        assert "KEYMEM_RERANK" in environ and "PYTEST_CURRENT_TEST" not in environ
    else:
        assert environ["KEYMEM_HOST_CWD"] == str(host.project.resolve()) == cwd
        assert environ["CLAUDE_PLUGIN_ROOT"] == str(host.plugin_root)
    assert environ["KEYMEM_HOOK_INSTALLED"] == "true"


async def test_a_claude_code_plugin_install_works_on_an_empty_home(
    tmp_path: Path, host_env: dict[str, str]
) -> None:
    host = ClaudeCode(Path(host_env["HOME"]), tmp_path / "project", host_env)
    assert not any(host.home.iterdir()), "HOME must start empty"
    await use_the_plugin(host, tmp_path, codex=False)


async def test_a_codex_plugin_install_works_on_an_empty_home(
    tmp_path: Path, host_env: dict[str, str]
) -> None:
    host = Codex(Path(host_env["HOME"]), tmp_path / "project", host_env)
    assert not any(host.home.iterdir()), "HOME must start empty"
    host.install()
    command = host.mcp_server()
    # What Codex does with the plugin's MCP file: nothing substituted, cwd under the root.
    assert command.command == "sh" and command.args == ["plugin/launcher.sh"]
    assert command.cwd.resolve() == host.plugin_root.resolve()
    assert "${" not in " ".join([command.command, *command.args])
    await use_the_plugin(host, tmp_path, codex=True)


async def test_the_plugin_shim_gets_the_hook_aware_instructions(
    tmp_path: Path, host_env: dict[str, str]
) -> None:
    host = ClaudeCode(Path(host_env["HOME"]), tmp_path / "project", host_env)
    instructions = await use_the_plugin(host, tmp_path, codex=False)
    # KEYMEM_HOOK_INSTALLED=true from the plugin's MCP config: act on surfaced memories.
    assert "<keymem-surfaced>" in instructions, instructions
