"""Installing keymem the way Claude Code and Codex do, for the install tests.

A host installs a plugin by copying its directory into a cache under the user's home, reads
the plugin's manifest, substitutes the placeholders it substitutes (and only those) and runs
the commands it names. The helpers here do each of those steps, on an empty ``HOME`` and a
fresh data dir, so the tests can run the real MCP server command through the real MCP client
and the real hook commands with real payloads:

- Claude Code (integration.md §1.5, §1.7, §1.8): the plugin is copied to
  ``~/.claude/plugins/cache/<marketplace>/<plugin>/<version>/``; ``${CLAUDE_PLUGIN_ROOT}``
  and ``${CLAUDE_PLUGIN_DATA}`` are substituted in MCP ``command``/``args``/``env`` and in
  hook commands, and exported to both; MCP servers start in the project directory; hook
  commands (no ``args``) run through ``sh -c``.
- Codex (integration.md §3.1, §3.3, §3.4; openai/codex ``codex-mcp/src/plugin_config.rs``,
  ``rmcp-client/src/utils.rs``): the plugin is copied to
  ``~/.codex/plugins/cache/<marketplace>/<plugin>/<version>/``; MCP ``command`` and ``args``
  are used literally; a relative ``cwd`` is joined to the plugin root; the server's
  environment is cleared down to an allow-list plus ``env_vars`` and ``env``; hook commands
  run through ``sh -c`` with ``PLUGIN_ROOT``/``PLUGIN_DATA`` and their ``CLAUDE_*`` aliases
  in the environment, in the session's directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import mcp.types as types
import pytest
from daemon_helpers import live_processes, scaled, session_tmp
from filelock import FileLock
from mcp import ClientSession, StdioServerParameters, stdio_client

from keymem_daemon import runtime
from keymem_daemon.errors import DaemonNotRunning

ROOT: Final = Path(__file__).resolve().parents[2]
"""The repository root, which is the plugin."""
MARKETPLACE: Final = "keymem"
PLUGIN: Final = "keymem"
COPY_EXCLUDES: Final = (
    ".git", ".venv", "venv", "bench-out", "__pycache__", ".pytest_cache", ".mypy_cache",
    ".ruff_cache", "build", "dist", "*.egg-info", "node_modules",
)
"""What a checkout holds that a host's copy of the plugin would not (a clone has none)."""
CODEX_DEFAULT_ENV: Final = (
    "HOME", "LOGNAME", "PATH", "SHELL", "USER", "__CF_USER_TEXT_ENCODING", "LANG", "LC_ALL",
    "TERM", "TMPDIR", "TZ",
)
"""What Codex passes a stdio MCP server by default (rmcp-client DEFAULT_ENV_VARS, unix)."""
CLAUDE_PLACEHOLDERS: Final = ("CLAUDE_PLUGIN_ROOT", "CLAUDE_PLUGIN_DATA")
TEN_TOOLS: Final = frozenset({
    "recall", "browse_keys", "read_key", "read_memory", "confirm_memory", "remember",
    "correct", "dismiss", "forget", "remember_batch",
})
HOOK_TIMEOUT: Final = 30.0
EXIT_TIMEOUT: Final = 30.0


def plugin_version(root: Path = ROOT) -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def copy_plugin(dest: Path, source: Path = ROOT) -> Path:
    """Copy the plugin directory as a host's cache holds it (the checkout's clutter left out)."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(*COPY_EXCLUDES), symlinks=True)
    return dest


# -- hosts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class McpCommand:
    """A stdio MCP server as the host would spawn it."""

    command: str
    args: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass(frozen=True)
class HookCommand:
    """A command hook as the host would run it: ``sh -c command`` in ``cwd`` with ``env``."""

    event: str
    command: str
    timeout: float
    env: dict[str, str]


@dataclass
class ClaudeCode:
    """Claude Code's side of an install: where it copies the plugin and how it runs it."""

    home: Path
    project: Path
    environ: dict[str, str]

    @property
    def plugin_root(self) -> Path:
        return self.home / ".claude" / "plugins" / "cache" / MARKETPLACE / PLUGIN / plugin_version()

    @property
    def plugin_data(self) -> Path:
        return self.home / ".claude" / "plugins" / "data" / f"{PLUGIN}-{MARKETPLACE}"

    def install(self) -> Path:
        copy_plugin(self.plugin_root)
        self.plugin_data.mkdir(parents=True, exist_ok=True)
        return self.plugin_root

    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = load_json(self.plugin_root / ".claude-plugin" / "plugin.json")
        return data

    def substitute(self, text: str) -> str:
        """Exactly the plugin placeholders Claude Code substitutes (integration.md §1.7)."""
        values = {
            "CLAUDE_PLUGIN_ROOT": str(self.plugin_root),
            "CLAUDE_PLUGIN_DATA": str(self.plugin_data),
        }
        for name, value in values.items():
            text = text.replace("${" + name + "}", value)
        return text

    def exported(self) -> dict[str, str]:
        return {
            "CLAUDE_PLUGIN_ROOT": str(self.plugin_root),
            "CLAUDE_PLUGIN_DATA": str(self.plugin_data),
            "CLAUDE_PROJECT_DIR": str(self.project),
            "CLAUDECODE": "1",
        }

    def mcp_server(self, name: str = "keymem") -> McpCommand:
        path = self.plugin_root / self.manifest()["mcpServers"]
        servers = load_json(path)
        server = servers.get("mcpServers", servers)[name]
        env = dict(self.environ)
        env.update(self.exported())
        env.update({k: self.substitute(v) for k, v in server.get("env", {}).items()})
        return McpCommand(
            self.substitute(server["command"]),
            [self.substitute(a) for a in server.get("args", [])],
            env,
            self.project,  # Claude Code ignores a server's cwd: it starts it in the project
        )

    def hooks(self, event: str) -> list[HookCommand]:
        config = load_json(self.plugin_root / "hooks" / "hooks.json")
        env = dict(self.environ)
        env.update(self.exported())
        found = []
        for group in config["hooks"].get(event, []):
            for hook in group["hooks"]:
                assert hook["type"] == "command" and "args" not in hook, hook
                found.append(
                    HookCommand(event, self.substitute(hook["command"]), hook.get("timeout", 600), env)
                )
        return found


@dataclass
class Codex:
    """Codex's side of an install."""

    home: Path
    project: Path
    environ: dict[str, str]

    @property
    def plugin_root(self) -> Path:
        return self.home / ".codex" / "plugins" / "cache" / MARKETPLACE / PLUGIN / plugin_version()

    @property
    def plugin_data(self) -> Path:
        return self.home / ".codex" / "plugins" / "data" / f"{PLUGIN}-{MARKETPLACE}"

    def install(self) -> Path:
        copy_plugin(self.plugin_root)
        self.plugin_data.mkdir(parents=True, exist_ok=True)
        return self.plugin_root

    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = load_json(self.plugin_root / ".codex-plugin" / "plugin.json")
        return data

    def resolve(self, field: str) -> Path:
        """A manifest path: ``./`` relative to the plugin root (manifest.rs rules)."""
        raw = self.manifest()[field]
        assert raw.startswith("./") and raw != "./" and ".." not in raw.split("/"), raw
        return self.plugin_root / raw[2:]

    def mcp_server(self, name: str = "keymem") -> McpCommand:
        servers = load_json(self.resolve("mcpServers"))
        server = servers.get("mcpServers", servers)[name]
        env = {k: self.environ[k] for k in CODEX_DEFAULT_ENV if k in self.environ}
        env.update({k: self.environ[k] for k in server.get("env_vars", []) if k in self.environ})
        env.update(server.get("env", {}))
        cwd = Path(server.get("cwd", "."))
        if not cwd.is_absolute():
            cwd = self.plugin_root / cwd  # plugin_config.rs: a relative cwd joins the root
        return McpCommand(server["command"], list(server.get("args", [])), env, cwd)

    def hooks(self, event: str) -> list[HookCommand]:
        config = load_json(self.resolve("hooks"))
        env = dict(self.environ)
        env.update({
            "PLUGIN_ROOT": str(self.plugin_root),
            "PLUGIN_DATA": str(self.plugin_data),
            "CLAUDE_PLUGIN_ROOT": str(self.plugin_root),
            "CLAUDE_PLUGIN_DATA": str(self.plugin_data),
        })
        found = []
        for group in config["hooks"].get(event, []):
            for hook in group["hooks"]:
                assert hook["type"] == "command", hook
                found.append(HookCommand(event, hook["command"], hook.get("timeout", 600), env))
        return found


# -- payloads --------------------------------------------------------------------------------


def claude_prompt_payload(prompt: str, cwd: Path) -> dict[str, Any]:
    session = str(uuid.uuid4())
    return {
        "session_id": session,
        "transcript_path": f"{cwd}/.claude-transcript-{session}.jsonl",
        "cwd": str(cwd),
        "permission_mode": "default",
        "hook_event_name": "UserPromptSubmit",
        "prompt": prompt,
        "prompt_id": str(uuid.uuid4()),
    }


def claude_session_start_payload(cwd: Path) -> dict[str, Any]:
    session = str(uuid.uuid4())
    return {
        "session_id": session,
        "transcript_path": f"{cwd}/.claude-transcript-{session}.jsonl",
        "cwd": str(cwd),
        "hook_event_name": "SessionStart",
        "source": "startup",
        "model": "claude-sonnet-4-5",
    }


def codex_prompt_payload(prompt: str, cwd: Path) -> dict[str, Any]:
    session = str(uuid.uuid4())
    return {
        "session_id": session,
        "turn_id": str(uuid.uuid4()),
        "transcript_path": None,
        "cwd": str(cwd),
        "hook_event_name": "UserPromptSubmit",
        "model": "gpt-5.1-codex",
        "permission_mode": "default",
        "prompt": prompt,
    }


def codex_session_start_payload(cwd: Path) -> dict[str, Any]:
    return {
        "session_id": str(uuid.uuid4()),
        "transcript_path": None,
        "cwd": str(cwd),
        "hook_event_name": "SessionStart",
        "model": "gpt-5.1-codex",
        "source": "startup",
    }


def run_hook(hook: HookCommand, payload: Mapping[str, Any], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command hook the way both hosts do: ``sh -c``, the event JSON on stdin."""
    return subprocess.run(
        ["sh", "-c", hook.command],
        input=json.dumps(payload),
        env=hook.env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=max(hook.timeout, 1) + HOOK_TIMEOUT,
        check=False,
    )


# -- the MCP server ----------------------------------------------------------------------------


class Server:
    """An initialized MCP session with a server started from a host's command."""

    def __init__(self, session: ClientSession, init: types.InitializeResult, errlog: Path) -> None:
        self.session = session
        self.init = init
        self.errlog = errlog

    def stderr(self) -> str:
        return self.errlog.read_text(errors="replace")[-6000:] if self.errlog.exists() else ""

    async def tool_names(self) -> set[str]:
        return {tool.name for tool in (await self.session.list_tools()).tools}

    async def call(self, tool: str, **arguments: Any) -> tuple[Any, bool]:
        result = await self.session.call_tool(tool, arguments)
        assert len(result.content) == 1, result
        block = result.content[0]
        assert isinstance(block, types.TextContent), block
        try:
            value: Any = json.loads(block.text)
        except ValueError:
            value = block.text
        return value, bool(result.is_error)

    async def ok(self, tool: str, **arguments: Any) -> Any:
        value, is_error = await self.call(tool, **arguments)
        assert not is_error, f"{tool}: {value}\n{self.stderr()}"
        assert not (isinstance(value, dict) and "error" in value), f"{tool}: {value}"
        return value


@contextlib.asynccontextmanager
async def run_server(command: McpCommand, errlog: Path) -> AsyncIterator[Server]:
    """Spawn the server with the real ``stdio_client`` and initialize it.

    mcp's client adds its own default variables (HOME, PATH, ...) under ``env``; ``env``
    wins for each, and the host's allow-list is a subset of them, so what the server sees
    is what the host would give it.
    """
    params = StdioServerParameters(
        command=command.command, args=command.args, env=command.env, cwd=command.cwd
    )
    with open(errlog, "w") as sink:
        async with (
            stdio_client(params, errlog=sink) as (read, write),
            ClientSession(read, write) as session,
        ):
            init = await session.initialize()
            yield Server(session, init, errlog)


# -- processes and cleanup ---------------------------------------------------------------------


def processes_mentioning(needle: str) -> list[int]:
    """Live processes whose command line or environment mentions ``needle`` (Linux /proc)."""
    return [pid for pid, cmdline, environ in live_processes() if needle.encode() in cmdline + b"\0" + environ]


def stop_daemon(data_dir: Path) -> str:
    """Stop the daemon serving ``data_dir`` the way ``keymemd stop`` does."""
    try:
        info = runtime.read_daemon_info(data_dir)
    except DaemonNotRunning:
        return "not_running"
    return runtime.stop_daemon(info, data_dir)


def cleanup(data_dir: Path, wait_for: Any) -> None:
    """Stop the daemon, let background installs end, and leave no keymem process behind."""
    outcome = stop_daemon(data_dir)
    needle = str(data_dir)
    try:
        wait_for(lambda: not processes_mentioning(needle), EXIT_TIMEOUT * 4,
                 message=lambda: f"processes using {needle} to exit: {processes_mentioning(needle)}")
    finally:
        for pid in processes_mentioning(needle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert outcome in ("shutdown", "not_running"), f"the daemon had to be {outcome}"


def base_python() -> str:
    """An interpreter without keymem installed: the one this test venv was made from."""
    candidate = getattr(sys, "_base_executable", "") or sys.executable
    probe = subprocess.run(
        [candidate, "-c", "import keymem_shim"], capture_output=True, check=False, timeout=scaled(60),
        cwd=os.path.expanduser("~") if os.path.isdir(os.path.expanduser("~")) else "/",
    )
    if probe.returncode == 0:
        pytest.skip(f"{candidate} can import keymem_shim: no clean interpreter to bootstrap from")
    return candidate


def bootstrap_log(data_dir: Path) -> str:
    path = data_dir / "logs" / "bootstrap.log"
    return path.read_text(errors="replace") if path.exists() else ""


# -- an offline wheelhouse for the venv bootstrap ------------------------------------------------


def wheelhouse_key() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    deps = text.split("[project.optional-dependencies]")[0]
    material = f"{deps}\n{sys.version_info[:2]}\n{sys.platform}\n{os.uname().machine}"
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def build_wheelhouse(cache: Path) -> Path:
    """Wheels for keymem's dependencies and its build backend, built once and kept.

    The launcher's venv bootstrap then runs with ``PIP_NO_INDEX=1`` and
    ``PIP_FIND_LINKS=<this dir>``: pip's own offline mode, so the tests exercise the
    launcher's real ``pip install`` without the network. Building it needs PyPI (or pip's
    cache) once; without either the venv tests are skipped, saying so.
    """
    target = cache / f"wheelhouse-{wheelhouse_key()}"
    if (target / ".complete").exists():
        return target
    staging = cache / f"staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    source = staging / "src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    for entry in ROOT.iterdir():
        if entry.is_dir() and (entry / "__init__.py").exists():
            shutil.copytree(entry, source / entry.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
    wheels = staging / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--wheel-dir", str(wheels), str(source), "setuptools>=77"],
        capture_output=True, text=True, timeout=scaled(1200), check=False,
    )
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.skip(f"cannot build the offline wheelhouse (PyPI unreachable?): "
                    f"{result.stderr.strip()[-800:]}")
    for wheel in wheels.glob("keymem-*.whl"):
        wheel.unlink()  # the launcher builds keymem from the plugin's own source
    shutil.rmtree(target, ignore_errors=True)
    wheels.rename(target)
    (target / ".complete").write_text("ok\n")
    shutil.rmtree(staging, ignore_errors=True)
    return target


def offline_pip_env(wheelhouse: Path, *, compile_modules: bool = False) -> dict[str, str]:
    """pip's standard variables for an offline install from ``wheelhouse``.

    Without ``compile_modules`` pip writes no .pyc for the modules it installs (its
    ``--no-compile``): about a third of an install's time, and what runs then compiles what
    it imports, as after any install -- which makes the first start of a daemon slower, so a
    test whose start keeps a fixed budget (README's ``keymemd start``: 20 s) compiles."""
    return {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        # Not PIP_NO_COMPILE=1: pip reads a "no-" variable's value as the option's, so that
        # one would mean compile.
        "PIP_COMPILE": "1" if compile_modules else "0",
        # A machine-wide pip.conf may add indexes or constraints; none of it applies here.
        "PIP_CONFIG_FILE": os.devnull,
    }


def session_wheelhouse(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The offline wheelhouse: in pytest's cache between runs, else once per session. Built
    once under a lock: pytest-xdist's workers share it (the others wait, then find it built)."""
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        where = Path(cache.mkdir("keymem-wheelhouse"))
    else:
        where = session_tmp(tmp_path_factory) / "keymem-wheelhouse"
        where.mkdir(exist_ok=True)
    with FileLock(where / "build.lock"):
        return build_wheelhouse(where)


def path_without_keymem() -> str:
    """PATH minus every directory holding a keymem command."""
    return os.pathsep.join(
        entry for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not (Path(entry) / "keymem-shim").exists()
        and not (Path(entry) / "keymemd").exists()
    )
