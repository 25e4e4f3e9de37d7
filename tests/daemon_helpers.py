"""Real daemons in real processes for the tests, and the one helper that waits.

``wait_for(predicate, timeout)`` is the only place in the tests that sleeps: it polls to a
deadline -- or, given ``progress``, until the work it waits for stops making progress for
``timeout`` seconds, so a wait on a long job (re-embedding thousands of memories) grows
with the job and with how busy the machine is. Every deadline a test sets is stated for a
quiet machine and stretched by ``BUSY_FACTOR`` through ``scaled`` (``wait_for`` and the
timeouts below do it themselves; ``tests/conftest.py`` does it for pytest-timeout's), so
no test fails for lack of time on a loaded one, however many pytest-xdist workers share
its cores. ``DaemonFactory`` (behind the ``daemon``
fixture of ``conftest.py``) runs ``python -m keymem_daemon run`` with ``HOME`` and
``KEYMEM_DATA_DIR`` under ``tmp_path``, waits with the CLI's own ``wait_until_ready``, and at
teardown stops it and asserts that the process exited cleanly and ``daemon.json`` is gone.
Every failure message carries the daemon's log.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import filelock
import httpx
import pytest

from keymem_daemon import runtime
from keymem_daemon.errors import DaemonNotRunning
from keymem_daemon.inference.embedders import CHECK_SUFFIX

T = TypeVar("T")

LOADED_FACTOR: Final = 4.0
"""How much longer than on a quiet machine a test's work may take when the suite runs in one
process: it must pass on two cores while two busy loops keep both loaded (issue 20). There a
test's processes (pytest, its daemon, the CLI or hook it runs) share the cores with the two
loops, so each gets a third to a half of a core, and the scheduler's slices add their own
delays: 4 covers it. A deadline is a bound for a hang, so a generous one costs nothing until
something hangs."""


def worker_share(workers: int, cores: int) -> float:
    """How much less CPU a test gets when ``workers`` pytest-xdist workers run the suite on
    ``cores`` cores with one busy loop per core (the loaded machine ``LOADED_FACTOR`` is stated
    for): each worker's test is one of ``workers + cores`` runnable processes instead of one
    of ``1 + cores`` -- 4/3 for two workers on two cores, 5/3 for three."""
    return max(1.0, (workers + cores) / (1 + cores))


BUSY_FACTOR: Final = LOADED_FACTOR * worker_share(
    int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), os.cpu_count() or 1
)
"""How much longer than on a quiet machine a test's work may take here: the loaded machine's
factor, stretched for the other workers sharing the cores (xdist tells each worker how many
there are in ``PYTEST_XDIST_WORKER_COUNT``; a run without xdist is one worker)."""


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on a quiet machine, as it must be on a busy one."""
    return seconds * BUSY_FACTOR


# The deadlines below, like every number of seconds a test waits, are quiet-machine figures:
# whatever waits on them scales them (``wait_for`` itself; ``scaled(...)`` around the others).
READY_TIMEOUT: Final = 45.0
"""Start to ready (typically 2-3 s); past the imports, a daemon that keeps logging
(re-embedding, migrating) is waited for as long as it does."""
READY_SLICE: Final = 1.0
"""One ``wait_until_ready`` inside the wait above, between looks at the daemon's progress."""
EXIT_TIMEOUT: Final = 30.0
CLI_TIMEOUT: Final = 60.0
REQUEST_TIMEOUT: Final = 30.0
"""One request to a test daemon (httpx's 5 s default is too short for a first write, which
warms the embedder and Kiwi, on a busy 2-core machine)."""
POLL: Final = 0.02
FORGET_ROUNDS: Final = 10
"""``DaemonProcess.forget_all``: one round per version a chain of corrections stacked up."""

CLOSED_PORT: Final = 9
"""A port on 127.0.0.1 nothing listens on (connecting is refused at once). Below the ephemeral
range, so no daemon, cluster or connection of the suite is ever given it -- unlike a port bound
and released to find a free one, which another xdist worker's daemon (they bind port 0) can
be handed before the test connects."""

# Never inherited by a test daemon: they would change what it does or who it thinks calls.
_SCRUBBED_PREFIXES: Final = ("KEYMEM_", "CLAUDE_", "CODEX_", "HF_", "HUGGINGFACE_")


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    *,
    interval: float = POLL,
    message: str | Callable[[], str] = "condition",
    progress: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` seconds
    (stated for a quiet machine: the wait allows ``scaled(timeout)``).

    With ``progress`` (a reading of the work being waited for, such as a log's size), the
    ``timeout`` counts from the last time its reading changed: the wait lasts as long as
    the work keeps moving, however much there is and however busy the machine, and fails
    once it stalls.
    """
    timeout = scaled(timeout)
    started = time.monotonic()
    deadline = started + timeout
    seen = progress() if progress is not None else None
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if progress is not None:
            reading = progress()
            if reading != seen:
                seen, deadline = reading, now + timeout
        if now >= deadline:
            text = message() if callable(message) else message
            stalled = f" without progress (after {now - started:.0f} s in all)" if progress is not None else ""
            pytest.fail(f"timed out after {timeout:g} s{stalled} waiting for {text}")
        time.sleep(interval)


def log_growth(data_dir: Path) -> int:
    """The daemon log's size: what ``wait_for(progress=...)`` watches while a daemon works
    through a long start (it logs each chunk it re-embeds or migrates)."""
    try:
        return (data_dir / "logs" / "daemon.log").stat().st_size
    except OSError:
        return 0


def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this test session's, shared by all its pytest-xdist workers (each has
    its own base temp dir under it); the base temp dir itself without xdist. What is built
    there once for the session is built under a ``filelock.FileLock`` beside it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment for a daemon or CLI under ``tmp_path`` (offline, no reranker)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(
        {
            "HOME": str(home),
            "KEYMEM_DATA_DIR": str(tmp_path / "data"),
            "KEYMEM_RERANK": "false",
            # Nothing listens there: no test reaches the network.
            "KEYMEM_HF_ENDPOINT": f"http://127.0.0.1:{CLOSED_PORT}",
            "HF_HUB_OFFLINE": "1",
            "KEYMEM_LOG_LEVEL": "info",
            # A start the CLI or a shim waits for gets the tests' budget, not the 20 s default.
            "KEYMEM_START_TIMEOUT": f"{scaled(READY_TIMEOUT):g}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def live_processes() -> Iterator[tuple[int, bytes, bytes]]:
    """``(pid, cmdline, environ)`` of every live process but this one, as /proc has them
    (NUL-separated); none without /proc or for processes whose files cannot be read."""
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if runtime.pid_alive(pid):
            yield pid, cmdline, environ


def warm_shims(data_dir: Path) -> list[int]:
    """Live warm shims started for ``data_dir``, and their forks (Linux /proc; else none)."""
    needle = f"KEYMEM_DATA_DIR={data_dir}".encode()
    return [
        pid
        for pid, cmdline, environ in live_processes()
        if b"keymem_shim._forkserver" in cmdline and needle in environ.split(b"\0")
    ]


@dataclass
class DaemonProcess:
    """One ``keymemd run`` process and how to talk to it."""

    process: subprocess.Popen[bytes]
    info: runtime.DaemonInfo
    data_dir: Path
    env: dict[str, str]
    output: Path
    expect_clean_exit: bool = True
    _clients: list[httpx.Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def token(self) -> str:
        return self.info.token

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        parts = []
        for path in (self.data_dir / "logs" / "daemon.log", self.output):
            if path.exists():
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-6000:]}")
        return "\n".join(parts) or "(no log)"

    def client(self, *, token: str | None = None, timeout: float = REQUEST_TIMEOUT, **kwargs: Any) -> httpx.Client:
        """An HTTP client for this daemon, authenticated unless ``token=""``; closed at teardown."""
        token = self.token if token is None else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kwargs.pop("headers", {}))
        client = httpx.Client(base_url=self.url, headers=headers, timeout=scaled(timeout), **kwargs)
        self._clients.append(client)
        return client

    def call(self, tool: str, arguments: Mapping[str, Any], **headers: str) -> dict[str, Any]:
        """``POST /v1/tools/<tool>``; asserts a 200 and returns ``{result, is_error}``."""
        response = self.client().post(f"/v1/tools/{tool}", json={"arguments": dict(arguments)}, headers=headers)
        assert response.status_code == 200, f"{tool}: {response.status_code} {response.text}\n{self.log()}"
        body: dict[str, Any] = response.json()
        return body

    def remember(self, content: str, keys: list[str], **extra: Any) -> str:
        body = self.call("remember", {"content": content, "keys": keys, **extra})
        assert not body["is_error"] and "saved" in body["result"], body
        return str(body["result"]["saved"])

    def export(self) -> dict[str, Any]:
        response = self.client().post("/v1/export", json={})
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def forget_all(self) -> None:
        """Forget every memory, so a test on a daemon shared with others starts from an empty
        store as on a fresh one (forgetting a correction brings back the version it replaced:
        hence the rounds)."""
        for _ in range(FORGET_ROUNDS):
            memories = self.export()["memories"]
            if not memories:
                return
            for memory in memories:
                self.call("forget", {"memory_id": memory["id"]})
        assert not self.export()["memories"], f"memories left after {FORGET_ROUNDS} rounds of forget"

    def kill(self) -> None:
        """SIGKILL: no cleanup runs; ``daemon.json`` stays behind, stale."""
        self.expect_clean_exit = False
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=scaled(EXIT_TIMEOUT))

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=scaled(EXIT_TIMEOUT))

    def close_clients(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()


PIECE_TABLE_GLOB: Final = "use-multilingual-v3-*.table"
"""The default embedder's 65 MB piece table, which a daemon keeps under ``<data>/models``."""


@contextlib.contextmanager
def built_once(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """``session_tmp``'s ``name``, for something a session fixture builds once (the cluster
    every cluster of the run copies), held under a lock beside it: the first worker to take
    it builds what is missing; the others wait for it and reuse it."""
    base = session_tmp(tmp_path_factory)
    with filelock.FileLock(base / f"{name}.lock"):
        yield base / name


@functools.cache
def _shared_tables() -> Path:
    """Where the session keeps the piece table the test daemons share (removed at exit)."""
    shared = Path(tempfile.mkdtemp(prefix="keymem-test-tables-"))
    atexit.register(shutil.rmtree, shared, ignore_errors=True)
    return shared


def seed_piece_table(data_dir: Path) -> None:
    """Give a test daemon's data dir the session's piece table before it starts, as a hard
    link with a copy of its check record: the daemon then finds it checked and reads none
    of it, instead of writing 65 MB per test (a daemon replaces the file, never writes into
    it, so the shared one cannot be changed through a link)."""
    for table in _shared_tables().glob(PIECE_TABLE_GLOB):
        target = data_dir / "models" / table.name
        if target.exists():
            continue
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        target.parent.mkdir(exist_ok=True)
        try:
            os.link(table, target)
        except OSError:
            return  # another file system: the daemon writes its own, as without the share
        record = table.with_name(table.name + CHECK_SUFFIX)
        if record.exists():
            shutil.copyfile(record, target.with_name(record.name))


def share_piece_table(data_dir: Path) -> None:
    """After a daemon became ready on ``data_dir``: its piece table becomes the session's if
    there is none yet, and its check record (the newest, so the most likely to be trusted)
    becomes the shared one's if both are the same file."""
    for table in (data_dir / "models").glob(PIECE_TABLE_GLOB):
        shared = _shared_tables() / table.name
        if not shared.exists():
            try:
                os.link(table, shared)
            except OSError:
                return  # another file system: each daemon keeps writing its own
        record = table.with_name(table.name + CHECK_SUFFIX)
        if record.exists() and os.path.samefile(table, shared):
            shutil.copyfile(record, shared.with_name(record.name))


class DaemonFactory:
    """Starts daemons on one data directory (restarts reuse it) and cleans up after them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.data_dir = tmp_path / "data"
        self.started: list[DaemonProcess] = []

    def env(self, **extra: str) -> dict[str, str]:
        return isolated_env(self.tmp_path, **extra)

    def spawn(self, **extra_env: str) -> tuple[subprocess.Popen[bytes], Path]:
        output = self.tmp_path / f"daemon-{len(self.started)}-{time.monotonic_ns()}.out"
        env = self.env(**extra_env)
        seed_piece_table(self.data_dir)
        with open(output, "wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "keymem_daemon", "run"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        return process, output

    def start(self, **extra_env: str) -> DaemonProcess:
        """Run a daemon and return once it is ready (fails with its log otherwise)."""
        process, output = self.spawn(**extra_env)
        env = self.env(**extra_env)
        last = ["not started"]

        def ready() -> runtime.DaemonInfo | None:
            try:
                return runtime.wait_until_ready(self.data_dir, timeout=READY_SLICE, process=process)
            except DaemonNotRunning as exc:
                last[0] = exc.message
                if process.poll() is not None:
                    raise  # it exited: no point waiting on
                return None  # not ready yet, or failed (a failed daemon exits by itself)

        try:
            info = wait_for(ready, READY_TIMEOUT, message=lambda: f"the daemon to be ready ({last[0]})",
                            progress=lambda: log_growth(self.data_dir))
        except (DaemonNotRunning, pytest.fail.Exception) as exc:
            process.kill()
            process.wait(timeout=scaled(EXIT_TIMEOUT))
            log = output.read_text(errors="replace")
            daemon_log = self.data_dir / "logs" / "daemon.log"
            if daemon_log.exists():
                log += "\n--- daemon.log ---\n" + daemon_log.read_text(errors="replace")[-6000:]
            pytest.fail(f"daemon did not become ready: {exc}\n{log}")
        assert info.pid == process.pid, "daemon.json names another process"
        share_piece_table(self.data_dir)
        daemon = DaemonProcess(process, info, self.data_dir, env, output)
        self.started.append(daemon)
        return daemon

    def stop(self, daemon: DaemonProcess) -> None:
        """Stop gracefully the way ``keymemd stop`` does and check it exited cleanly."""
        daemon.close_clients()
        if daemon.process.poll() is None:
            runtime.stop_daemon(daemon.info, self.data_dir)
            daemon.process.wait(timeout=scaled(EXIT_TIMEOUT))
        if daemon.expect_clean_exit:
            assert daemon.process.returncode == 0, f"daemon exited with {daemon.process.returncode}\n{daemon.log()}"

    def teardown(self) -> None:
        problems = []
        for daemon in self.started:
            try:
                self.stop(daemon)
            except (AssertionError, subprocess.TimeoutExpired, DaemonNotRunning) as exc:
                if daemon.process.poll() is None:
                    daemon.process.kill()
                    daemon.process.wait(timeout=scaled(EXIT_TIMEOUT))
                problems.append(f"pid {daemon.pid}: {exc}")
        # The warm shim goes with its daemon, however the daemon ended.
        try:
            wait_for(lambda: not warm_shims(self.data_dir), EXIT_TIMEOUT, message="the warm shims to exit")
        except pytest.fail.Exception as exc:
            problems.append(str(exc))
            for pid in warm_shims(self.data_dir):
                os.kill(pid, signal.SIGKILL)
        if self.started and self.started[-1].expect_clean_exit:
            info_file = self.data_dir / runtime.INFO_FILE
            if info_file.exists():
                problems.append(f"{info_file} is still there after the daemon exited")
        if problems:
            log = self.started[-1].log() if self.started else ""
            pytest.fail("daemon teardown: " + "; ".join(problems) + "\n" + log)


@contextlib.contextmanager
def shared_daemon(tmp_path: Path, **extra_env: str) -> Iterator[DaemonProcess]:
    """One daemon for a whole module (from a module-scoped fixture), stopped and checked after."""
    factory = DaemonFactory(tmp_path)
    try:
        yield factory.start(**extra_env)
    finally:
        factory.teardown()
