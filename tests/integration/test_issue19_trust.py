"""Issue 19, items 8-10: clients verify the daemon before they send it anything.

A real foreign HTTP server (``impostor.py``, a separate process) answers the way keymemd
does -- ``/health`` ready with the pid daemon.json names, an injected block, a saved id --
but it has no token, so it cannot prove itself. It takes the port a stopped or killed
daemon freed, or sits behind a ``daemon.json`` whose pid is alive (recycled). Neither the
hook, the shim nor the CLI may send it the token, a prompt or a memory; the hook prints
nothing, the shim starts a real daemon and carries on, and ``keymemd stop`` signals no
process that is not this data dir's daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from daemon_helpers import EXIT_TIMEOUT, READY_TIMEOUT, isolated_env, scaled, wait_for
from test_hook_push import claude_payload, claude_session_start, run_hook
from test_shim_mcp import daemon_pids, run_shim

from keymem_daemon import __version__, runtime
from keymem_daemon.errors import DaemonNotRunning

IMPOSTOR: Final = Path(__file__).with_name("impostor.py")
PROMPT: Final = "Which port does the billing staging database listen on?"
DEADLINE: Final = 120.0
"""One shim scenario: a daemon start, a stop, a restart, on a loaded two-core machine."""


@dataclass
class Impostor:
    process: subprocess.Popen[str]
    port: int
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]

    def assert_received_nothing_secret(self, *secrets: str) -> None:
        """Only nonce-carrying health checks ever reached it: no token, no content."""
        for request in self.requests():
            headers = {k.lower(): v for k, v in request["headers"].items()}
            assert "authorization" not in headers, request
            assert request["method"] == "GET" and request["path"].startswith("/health?nonce="), request
            for secret in secrets:
                assert secret not in json.dumps(request), request


@contextlib.contextmanager
def impostor(tmp_path: Path, *, port: int = 0, claimed_pid: int = 0) -> Iterator[Impostor]:
    """A running impostor on ``port`` (0: any) claiming ``claimed_pid`` (0: its own)."""
    log = tmp_path / f"impostor-{port}.log"
    process = subprocess.Popen(
        [sys.executable, str(IMPOSTOR), str(port), str(claimed_pid), str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        bound = int(process.stdout.readline())  # printed once it listens
        yield Impostor(process, bound, log)
    finally:
        process.kill()
        process.wait(timeout=scaled(EXIT_TIMEOUT))
        if process.stdout is not None:
            process.stdout.close()


def impostor_info(data_dir: Path, fake: Impostor) -> runtime.DaemonInfo:
    """A daemon.json naming the impostor's live pid and port (a recycled pid)."""
    info = runtime.DaemonInfo(
        pid=fake.process.pid,
        port=fake.port,
        token="a-token-the-impostor-must-never-see",
        version=__version__,
        started_at=1_795_964_006.85,
        data_dir=str(data_dir),
    )
    runtime.write_daemon_info(data_dir, info)
    return info


def stop_whatever_runs(data_dir: Path) -> None:
    """Teardown: stop the daemon a client started for ``data_dir``, then make sure."""
    with contextlib.suppress(DaemonNotRunning):
        info = runtime.read_daemon_info(data_dir)
        if runtime.owns_data_dir(info.pid, data_dir):
            runtime.stop_daemon(info, data_dir)
    for pid in daemon_pids(data_dir):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not daemon_pids(data_dir), EXIT_TIMEOUT, message="the daemons to exit")


# -- the hook (item 9) ---------------------------------------------------------------------


def test_issue19_the_hook_sends_no_token_or_prompt_to_a_server_behind_a_recycled_pid(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, KEYMEM_AUTOSTART="false", KEYMEM_HOOK_DEBUG_LOG=str(tmp_path / "debug.log"))
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    data_dir.mkdir()
    with impostor(tmp_path) as fake:
        info = impostor_info(data_dir, fake)
        run = run_hook(env, claude_payload(PROMPT, tmp_path), "user-prompt-submit")
        assert (run.returncode, run.stdout, run.stderr) == (0, "", ""), run
        assert fake.requests(), "the hook never even looked at the impostor"
        fake.assert_received_nothing_secret(info.token, PROMPT)
    assert "not keymemd" in run.outcome or "not keymemd" in json.dumps(run.debug), run.debug


def test_issue19_session_start_starts_a_real_daemon_instead_of_trusting_an_impostor(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, KEYMEM_HOOK_DEBUG_LOG=str(tmp_path / "debug.log"))
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    data_dir.mkdir()
    try:
        with impostor(tmp_path) as fake:
            info = impostor_info(data_dir, fake)
            run = run_hook(env, claude_session_start(tmp_path), "session-start")
            assert (run.returncode, run.stdout, run.stderr) == (0, "", ""), run
            assert run.outcome != "daemon answers", run.debug
            real = runtime.wait_until_ready(data_dir, timeout=READY_TIMEOUT)
            assert real.pid != fake.process.pid
            fake.assert_received_nothing_secret(info.token)
    finally:
        stop_whatever_runs(data_dir)


# -- the shim (item 8) ---------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("warm", "how"), [("true", "stopped"), ("false", "killed")], ids=["warm-shim-stopped", "in-process-killed"]
)
async def test_issue19_a_shim_whose_daemon_went_away_never_talks_to_what_took_its_port(
    tmp_path: Path, warm: str, how: str
) -> None:
    env = isolated_env(tmp_path, KEYMEM_WARM_SHIM=warm, KEYMEM_TOOLS="full")
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    secret = "Fact B: the deploy key lives in the vault under ops/deploy."
    try:
        # The daemon is up before the shim, so a warm shim (when on) serves the session.
        started = subprocess.run([sys.executable, "-m", "keymem_daemon", "start"], env=env, capture_output=True,
                                 text=True, timeout=scaled(READY_TIMEOUT) + 30, check=False)
        assert started.returncode == 0, started.stderr
        first = runtime.read_daemon_info(data_dir)
        with anyio.fail_after(scaled(DEADLINE)):
            async with run_shim(env, tmp_path / "shim.err") as shim:
                await shim.ok("remember", content="Fact A: the build uses uv.", keys=["build", "uv"])
                if how == "stopped":
                    assert await anyio.to_thread.run_sync(runtime.stop_daemon, first, data_dir) == "shutdown"
                else:
                    os.kill(first.pid, signal.SIGKILL)
                    await anyio.to_thread.run_sync(
                        lambda: wait_for(lambda: not runtime.pid_alive(first.pid), EXIT_TIMEOUT, message="the kill")
                    )
                with impostor(tmp_path, port=first.port, claimed_pid=first.pid) as fake:
                    saved = await shim.ok("remember", content=secret, keys=["deploy key", "vault"])
                    listed = await shim.ok("list_memories")
                fake.assert_received_nothing_secret(first.token, secret)
        assert saved["saved"] != "m_impostor"
        second = runtime.read_daemon_info(data_dir)
        assert second.pid != first.pid and second.port != first.port
        contents = sorted(m["content"] for m in listed["memories"])
        assert contents == ["Fact A: the build uses uv.", secret], (contents, shim.stderr())
    finally:
        stop_whatever_runs(data_dir)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the CLI -------------------------------------------------------------------------------


def test_issue19_the_cli_sends_no_token_to_a_server_behind_a_recycled_pid(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, KEYMEM_START_TIMEOUT="2")
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    data_dir.mkdir()
    with impostor(tmp_path) as fake:
        info = impostor_info(data_dir, fake)
        for command in (["status"], ["export"], ["stop"]):
            result = subprocess.run(
                [sys.executable, "-m", "keymem_daemon", *command],
                env=env,
                capture_output=True,
                text=True,
                timeout=scaled(60),
                check=False,
            )
            assert "Traceback" not in result.stderr, result.stderr
            assert "m_impostor" not in result.stdout
        fake.assert_received_nothing_secret(info.token)
        assert fake.process.poll() is None, "keymemd stop signalled the impostor"


# -- keymemd stop (item 10) ----------------------------------------------------------------


def test_issue19_stop_leaves_a_live_process_named_keymem_alone(tmp_path: Path) -> None:
    """A stale daemon.json whose pid now belongs to an editor open on keymem's README."""
    env = isolated_env(tmp_path)
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    data_dir.mkdir()
    editor = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()", str(tmp_path / "src" / "keymem" / "README.md")]
    )
    try:
        wait_for(lambda: b"keymem" in Path(f"/proc/{editor.pid}/cmdline").read_bytes(), EXIT_TIMEOUT,
                 message="the editor to start")
        runtime.write_daemon_info(
            data_dir,
            runtime.DaemonInfo(pid=editor.pid, port=9, token="t" * 43, version=__version__, started_at=0.0,
                               data_dir=str(data_dir)),
        )
        result = subprocess.run(
            [sys.executable, "-m", "keymem_daemon", "stop", "--json"],
            env=env, capture_output=True, text=True, timeout=scaled(60), check=False,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["stopped"] is False
        assert editor.poll() is None, "keymemd stop signalled an unrelated process"
        assert not (data_dir / runtime.INFO_FILE).exists(), "the stale daemon.json stays"
    finally:
        editor.kill()
        editor.wait()
