"""``plugin/launcher.sh`` when keymem is not installed: the private venv bootstrap.

The launcher finds no keymem-shim, so it builds ``<data>/venv`` from the plugin's own source
in the background and meanwhile serves the stand-in MCP server (``plugin/unavailable.py``),
which hands the session over to the real shim once the venv is ready.

The venv tests run the launcher's real ``pip install`` offline: pip's standard
``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS`` point it at a wheelhouse of keymem's dependencies
that the session builds once (see ``installsim.build_wheelhouse``), and
``KEYMEM_BOOTSTRAP_PYTHON`` names an interpreter without keymem. The launcher itself has no
test-only switch. A real networked bootstrap runs only with ``KEYMEM_TEST_NETWORK=1``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from daemon_helpers import isolated_env, scaled, wait_for
from installsim import (
    TEN_TOOLS,
    McpCommand,
    base_python,
    bootstrap_log,
    cleanup,
    copy_plugin,
    load_json,
    offline_pip_env,
    path_without_keymem,
    plugin_version,
    run_server,
    session_wheelhouse,
)
from mcp.shared.exceptions import MCPError

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

INSTALL_TIMEOUT: Final = 400.0
"""A full offline install on a loaded two-core machine (about 35 s when idle)."""
DEADLINE: Final = 500.0
STANDIN_TOOLS: Final = {"keymem_status"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def wheelhouse(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_wheelhouse(request, tmp_path_factory)


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """The plugin as a host's cache holds it."""
    return copy_plugin(tmp_path / "cache" / "keymem" / plugin_version())


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """No keymem anywhere: not on PATH, not in KEYMEM_PYTHON, no venv yet."""
    environ = isolated_env(tmp_path, PATH=path_without_keymem(), KEYMEM_BOOTSTRAP_WAIT="2")
    (tmp_path / "project").mkdir()
    try:
        yield environ
    finally:
        cleanup(Path(environ["KEYMEM_DATA_DIR"]), wait_for)


def launcher(plugin: Path, env: dict[str, str], cwd: Path) -> McpCommand:
    return McpCommand("sh", [str(plugin / "plugin" / "launcher.sh")], env, cwd)


def run_launcher(plugin: Path, env: dict[str, str], *args: str,
                 timeout: float = INSTALL_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(plugin / "plugin" / "launcher.sh"), *args], env=env, capture_output=True,
        text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
    )


def state(env: dict[str, str]) -> dict[str, Any]:
    path = Path(env["KEYMEM_DATA_DIR"]) / "bootstrap.json"
    data: dict[str, Any] = load_json(path) if path.exists() else {}
    return data


def log_of(env: dict[str, str]) -> str:
    return bootstrap_log(Path(env["KEYMEM_DATA_DIR"]))[-8000:]


def venv_creations(env: dict[str, str]) -> int:
    return len(re.findall(r"\$ \S+ -m venv ", bootstrap_log(Path(env["KEYMEM_DATA_DIR"]))))


def bootstrap_starts(env: dict[str, str]) -> list[str]:
    return re.findall(r"bootstrap start: .*", bootstrap_log(Path(env["KEYMEM_DATA_DIR"])))


async def start_up_error(command: McpCommand, errlog: Path) -> MCPError:
    """The MCP error the server answers ``initialize`` with (task groups wrap it)."""
    try:
        with anyio.fail_after(scaled(60)):
            async with run_server(command, errlog):
                pass
    except BaseException as exc:  # noqa: BLE001 - looking for the MCPError inside
        pending: list[BaseException] = [exc]
        while pending:
            current = pending.pop()
            if isinstance(current, MCPError):
                return current
            pending.extend(getattr(current, "exceptions", ()))  # an exception group
        raise
    pytest.fail("the server initialized: expected a start-up error")


def is_real_shim(instructions: str | None) -> bool:
    return "long-term associative memory" in (instructions or "")


# -- no venv can be built ------------------------------------------------------------------


async def test_without_a_usable_python_the_host_gets_a_clear_start_up_error(
    plugin: Path, env: dict[str, str], tmp_path: Path
) -> None:
    env["KEYMEM_BOOTSTRAP_PYTHON"] = str(tmp_path / "no-such-python")
    error = await start_up_error(launcher(plugin, env, tmp_path / "project"), tmp_path / "err")
    message = str(error)
    assert "Python 3.10 or newer" in message and "KEYMEM_BOOTSTRAP_PYTHON" in message, message
    assert "no-such-python" in log_of(env)


def old_python() -> str | None:
    for name in ("python3.9", "python3.8", "python3.7", "python2.7", "python2"):
        found = shutil.which(name)
        if found:
            return found
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in sorted(pyenv.glob("3.[6-9].*")) if pyenv.is_dir() else []:
        if (version / "bin" / "python").exists():
            return str(version / "bin" / "python")
    return None


async def test_an_interpreter_older_than_3_10_is_named_in_the_error(
    plugin: Path, env: dict[str, str], tmp_path: Path
) -> None:
    old = old_python()
    if old is None:
        pytest.skip("no Python older than 3.10 on this machine")
    env["KEYMEM_BOOTSTRAP_PYTHON"] = old
    error = await start_up_error(launcher(plugin, env, tmp_path / "project"), tmp_path / "err")
    assert old in str(error) and "3.10" in str(error)


async def test_an_interpreter_with_keymem_in_keymem_python_is_used_first(
    plugin: Path, env: dict[str, str], tmp_path: Path
) -> None:
    env.update(KEYMEM_PYTHON=sys.executable, KEYMEM_AUTOSTART="false")
    with anyio.fail_after(scaled(60)):
        async with run_server(launcher(plugin, env, tmp_path / "project"), tmp_path / "err") as server:
            assert is_real_shim(server.init.instructions), server.stderr()
    assert not (Path(env["KEYMEM_DATA_DIR"]) / "venv").exists(), "no venv when keymem is there"


# -- the venv ----------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_failed_install_is_reported_then_resumed_and_a_new_version_upgrades(
    plugin: Path, env: dict[str, str], tmp_path: Path, wheelhouse: Path
) -> None:
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    env["KEYMEM_BOOTSTRAP_PYTHON"] = base_python()
    empty = tmp_path / "empty-wheelhouse"
    empty.mkdir()
    env.update(offline_pip_env(empty))  # pip can find nothing: the install fails

    # 1. The first session: the stand-in answers at once, and reports the failure.
    with anyio.fail_after(scaled(DEADLINE)):
        async with run_server(launcher(plugin, env, tmp_path / "project"), tmp_path / "err") as server:
            assert "installing" in (server.init.instructions or ""), server.init.instructions
            assert await server.tool_names() == STANDIN_TOOLS
            while state(env).get("state") != "failed":
                await anyio.sleep(0.5)
            text, is_error = await server.call("recall", query="anything")
            assert is_error
            assert "could not install" in text and str(data_dir / "logs" / "bootstrap.log") in text
            assert "launcher.sh --bootstrap" in text, text
    assert not (data_dir / "venv" / "keymem-plugin-version").exists()
    assert (data_dir / "venv" / "bin" / "python").exists(), "the failed attempt left its venv"

    # 2. The next attempt continues in the same venv and finishes.
    env.update(offline_pip_env(wheelhouse))
    done = run_launcher(plugin, env, "--bootstrap")
    assert done.returncode == 0, done.stderr + log_of(env)
    assert venv_creations(env) == 1, log_of(env)
    final = state(env)
    assert final["state"] == "ready" and final["attempt"] >= 2, final
    assert (data_dir / "venv" / "keymem-plugin-version").read_text().strip() == plugin_version()
    status = json.loads(run_launcher(plugin, env, "--status", timeout=scaled(60)).stdout)
    assert status["ready"] is True and status["running"] is False, status

    # 3. A ready venv: the launcher execs the real shim at once, no stand-in.
    env["KEYMEM_AUTOSTART"] = "false"
    started = time.monotonic()
    with anyio.fail_after(scaled(60)):
        async with run_server(launcher(plugin, env, tmp_path / "project"), tmp_path / "err2") as server:
            assert is_real_shim(server.init.instructions), server.stderr()
    assert time.monotonic() - started < 30

    # 4. A plugin update (another version in another cache dir) upgrades the same venv.
    newer = copy_plugin(tmp_path / "cache" / "keymem" / "9.9.9", plugin)
    pyproject = newer / "pyproject.toml"
    pyproject.write_text(re.sub(r'(?m)^version = ".*"$', 'version = "9.9.9"', pyproject.read_text()))
    upgraded = run_launcher(newer, env, "--bootstrap")
    assert upgraded.returncode == 0, upgraded.stderr + log_of(env)
    assert (data_dir / "venv" / "keymem-plugin-version").read_text().strip() == "9.9.9"
    assert venv_creations(env) == 1, "an upgrade reuses the venv"
    tail = log_of(env).split("bootstrap start: keymem 9.9.9")[-1]
    assert "Successfully installed keymem-9.9.9" in tail, tail
    assert "numpy" not in tail.split("Successfully installed")[-1], "dependencies were reinstalled"


@pytest.mark.slow
async def test_two_cold_launchers_bootstrap_once_and_both_end_up_serving_keymem(
    plugin: Path, env: dict[str, str], tmp_path: Path, wheelhouse: Path
) -> None:
    env["KEYMEM_BOOTSTRAP_PYTHON"] = base_python()
    env.update(offline_pip_env(wheelhouse))
    remembered = anyio.Event()
    results: dict[str, Any] = {}

    async def session(name: str) -> None:
        command = launcher(plugin, dict(env), tmp_path / "project")
        async with run_server(command, tmp_path / f"{name}.err") as server:
            results[f"{name}-instructions"] = server.init.instructions
            results[f"{name}-first-tools"] = await server.tool_names()
            # The stand-in hands over when the venv is ready; tools/list then has the ten.
            while (tools := await server.tool_names()) == STANDIN_TOOLS:
                await anyio.sleep(1.0)
            results[f"{name}-tools"] = tools
            if name == "a":
                saved = await server.ok("remember", content="The user's editor is Helix.",
                                        keys=["editor", "Helix", "에디터"])
                results["memory"] = saved["saved"]
                remembered.set()
            else:
                await remembered.wait()
                memory = await server.ok("read_memory", memory_id=results["memory"])
                results["read"] = memory["memory"]["content"]

    with anyio.fail_after(scaled(DEADLINE)):
        async with anyio.create_task_group() as group:
            group.start_soon(session, "a")
            group.start_soon(session, "b")

    log = log_of(env)
    for name in ("a", "b"):
        # Cold: each first met the stand-in, which said keymem was installing ...
        assert "installing" in (results[f"{name}-instructions"] or ""), results
        assert results[f"{name}-first-tools"] == STANDIN_TOOLS
        # ... and ended up talking to the real shim in the same session.
        assert results[f"{name}-tools"] == TEN_TOOLS, results
    assert results["read"] == "The user's editor is Helix."
    # Exactly one bootstrap: one attempt started, one venv created.
    assert len(bootstrap_starts(env)) == 1, log
    assert venv_creations(env) == 1, log
    assert state(env)["state"] == "ready"


@pytest.mark.skipif(os.environ.get("KEYMEM_TEST_NETWORK") != "1",
                    reason="a real install from the package index (set KEYMEM_TEST_NETWORK=1)")
async def test_a_real_bootstrap_from_the_package_index(
    plugin: Path, env: dict[str, str], tmp_path: Path
) -> None:
    env["KEYMEM_BOOTSTRAP_PYTHON"] = base_python()
    started = time.monotonic()
    done = run_launcher(plugin, env, "--bootstrap", timeout=scaled(1800))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr + log_of(env)
    print(f"real bootstrap took {took:.1f} s")
    env["KEYMEM_AUTOSTART"] = "false"
    with anyio.fail_after(scaled(60)):
        async with run_server(launcher(plugin, env, tmp_path / "project"), tmp_path / "err") as server:
            assert is_real_shim(server.init.instructions), server.stderr()
