"""Where the daemon is and how to reach, start and stop it: ``daemon.json``, the lock, readiness.

The filelock on ``<data>/daemon.lock`` decides which process owns a data directory; the
daemon takes it before it opens the store and holds it until it exits (the OS drops it
when the process dies, even on SIGKILL). ``daemon.json`` only says where the owner
listens: it is written (mode 0600, temp file + ``os.replace``) after the socket is bound
and deleted before the daemon answers ``/v1/shutdown`` and at exit -- and only by the
process whose pid it names. A file left by a killed daemon names a dead pid; readers
treat it as absent and the next daemon replaces it.

``keymemd start`` is serialised by a second lock, ``<data>/start.lock``: racing starts
queue on it, and every one after the first finds the daemon already answering.

This module is imported by the shim and by the CLI's ``start``/``stop``/``status``, so it
stays light: the standard library, ``filelock`` and ``httpx`` only. ``httpx`` is imported by
the two functions that make requests: the daemon imports this module too and never makes
one, and the import would cost it 5 MB resident and 40 ms of start-up (httpx pulls in its
own CLI's ``rich`` and ``pygments``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final, Literal

import filelock

from keymem_daemon.config import Settings
from keymem_daemon.errors import Conflict, DaemonNotRunning

logger = logging.getLogger(__name__)

INFO_FILE: Final = "daemon.json"
LOCK_FILE: Final = "daemon.lock"
START_LOCK_FILE: Final = "start.lock"

# Every wait is bounded by one of these (seconds).
POLL_INTERVAL: Final = 0.05
"""How often readiness and process exit are polled."""
HEALTH_TIMEOUT: Final = 1.0
"""One ``GET /health``; loopback answers in milliseconds, a hung daemon must not stall us."""
SHUTDOWN_REQUEST_TIMEOUT: Final = 5.0
"""The ``POST /v1/shutdown`` request itself."""
SHUTDOWN_GRACE: Final = 15.0
"""After ``/v1/shutdown``: time to finish in-flight requests, flush and exit."""
TERM_GRACE: Final = 10.0
"""After SIGTERM: the same, for a daemon that did not answer the request."""
KILL_GRACE: Final = 5.0
"""After SIGKILL: the kernel reaps the process."""
DAEMON_LOCK_WAIT: Final = 1.0
"""How long a new daemon waits for ``daemon.lock`` before giving up."""
START_LOCK_MARGIN: Final = 10.0
"""A queued ``start`` waits this much longer than ``start_timeout`` for the one ahead of it."""

# Host identity belongs to one host session; a daemon spawned from a host must not inherit
# it, or it stamps every caller's memories with the first host's session (upstream 7489ba1).
HOST_SESSION_VARS: Final = ("CLAUDE_CODE_SESSION_ID", "CODEX_THREAD_ID")

HealthStatus = Literal["starting", "ready", "failed"]
StopOutcome = Literal["shutdown", "terminated", "killed", "not_running"]


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    """The contents of ``daemon.json``: where the daemon listens and how to authenticate."""

    pid: int
    port: int
    token: str
    version: str
    started_at: float
    data_dir: str
    embedder: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


# Field name -> accepted JSON types (bool is excluded from the numbers explicitly).
_FIELD_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "pid": (int,),
    "port": (int,),
    "token": (str,),
    "version": (str,),
    "started_at": (int, float),
    "data_dir": (str,),
    "embedder": (str, type(None)),
}
_REQUIRED: Final = tuple(f.name for f in fields(DaemonInfo) if f.name != "embedder")


def info_path(location: Path) -> Path:
    """``daemon.json`` for a data directory (a ``.json`` path is taken as the file itself)."""
    return location if location.suffix == ".json" else location / INFO_FILE


def parse_daemon_info(text: str, *, source: str = INFO_FILE) -> DaemonInfo:
    """Validate the JSON of a ``daemon.json``; every problem raises ``DaemonNotRunning``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DaemonNotRunning(
            f"{source} is not valid JSON ({exc.msg}); a daemon may be writing it or died while writing it"
        ) from None
    if not isinstance(data, dict):
        raise DaemonNotRunning(f"{source} holds a {type(data).__name__}, not an object")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise DaemonNotRunning(f"{source} lacks {', '.join(missing)}")
    values: dict[str, Any] = {}
    for name, kinds in _FIELD_TYPES.items():
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise DaemonNotRunning(f"{source} field {name!r} has the wrong type ({type(value).__name__}: {value!r})")
        values[name] = value
    if not 0 < values["port"] < 65536 or values["pid"] <= 0:
        raise DaemonNotRunning(f"{source} names pid {values['pid']} and port {values['port']}, which cannot be right")
    values["started_at"] = float(values["started_at"])
    return DaemonInfo(**values)


def read_daemon_info(location: Path) -> DaemonInfo:
    """The live daemon's ``DaemonInfo`` for a data directory (or a ``daemon.json`` path).

    Raises ``DaemonNotRunning`` -- with a message of its own -- for a missing file, bad
    JSON, a missing or mistyped field, and a pid that is no longer running (a stale file
    left by a killed daemon).
    """
    path = info_path(location)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DaemonNotRunning(f"keymemd is not running ({path} does not exist)") from None
    except OSError as exc:
        raise DaemonNotRunning(f"cannot read {path}: {exc.strerror or exc}") from None
    info = parse_daemon_info(text, source=str(path))
    if not pid_alive(info.pid):
        raise DaemonNotRunning(
            f"{path} is stale: pid {info.pid} is not running (the daemon was killed); the next start replaces it"
        )
    return info


def write_daemon_info(location: Path, info: DaemonInfo) -> None:
    """Publish ``info`` atomically: a private temp file (0600) renamed over ``daemon.json``."""
    path = info_path(location)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(info.to_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_daemon_info(location: Path, *, pid: int | None = None) -> bool:
    """Delete ``daemon.json`` if it names ``pid`` (default: this process); True if removed.

    A daemon never deletes a file another daemon wrote, and a malformed file is never one
    this process wrote (writes are atomic), so it is left alone.
    """
    path = info_path(location)
    owner = os.getpid() if pid is None else pid
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    if not isinstance(data, dict) or data.get("pid") != owner:
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def clear_stale_info(data_dir: Path) -> bool:
    """Remove a ``daemon.json`` whose daemon is dead (killed); True if one was removed.

    Compare-and-delete on the pid, so a file a new daemon has just written is never lost.
    """
    path = info_path(data_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        data = None
    pid = data.get("pid") if isinstance(data, dict) else None
    if isinstance(pid, int) and not isinstance(pid, bool):
        return not pid_alive(pid) and remove_daemon_info(data_dir, pid=pid)
    if not lock_is_free(data_dir):
        return False  # malformed, but someone owns the directory: leave it to them
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


# -- processes ---------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """Is ``pid`` a running process (not a zombie waiting to be reaped)?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True  # no procfs (macOS): kill(0) is all we have
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state not in (["Z"], ["X"])


def looks_like_daemon(pid: int) -> bool:
    """Guard against a recycled pid before signalling: is ``pid`` a keymem process?"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid_alive(pid)  # no procfs: trust the pid from daemon.json
    return b"keymem" in cmdline


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Poll until ``pid`` is gone, up to ``timeout`` seconds; True if it exited.

    Polls rather than ``waitpid``: the daemon is usually not our child (``start`` detaches
    it), so only its disappearance can be observed.
    """
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


# -- locks -------------------------------------------------------------------------------


def daemon_lock(data_dir: Path) -> filelock.BaseFileLock:
    """The lock that makes a process the owner of ``data_dir`` (not yet acquired)."""
    return filelock.FileLock(str(data_dir / LOCK_FILE), thread_local=False)


def acquire_daemon_lock(data_dir: Path, *, timeout: float = DAEMON_LOCK_WAIT) -> filelock.BaseFileLock:
    """Take ownership of ``data_dir``, or fail quickly with ``Conflict`` naming the owner.

    The short ``timeout`` lets a predecessor finish letting go (and rides out the instant
    in which ``lock_is_free`` probes the lock); a live owner makes this fail within it.
    """
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = daemon_lock(data_dir)
    try:
        lock.acquire(timeout=timeout, poll_interval=POLL_INTERVAL)
    except filelock.Timeout:
        try:
            owner = read_daemon_info(data_dir)
            where = f" (pid {owner.pid}, {owner.url})"
        except DaemonNotRunning:
            where = " (it is starting or shutting down)"
        raise Conflict(f"another keymemd already owns {data_dir}{where}") from None
    return lock


def lock_is_free(data_dir: Path) -> bool:
    """True when no process owns ``data_dir`` right now."""
    lock = daemon_lock(data_dir)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False
    lock.release()
    return True


def wait_for_lock_free(data_dir: Path, timeout: float) -> bool:
    """Wait for a dying owner of ``data_dir`` to let go (up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not lock_is_free(data_dir):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


def wait_for_owner(data_dir: Path, timeout: float) -> DaemonInfo | None:
    """The daemon that owns ``data_dir`` once it has published ``daemon.json``.

    For a daemon between taking the lock and publishing (starting) or between removing the
    file and exiting (stopping). None once nobody owns the directory; ``DaemonNotRunning``
    if the owner publishes nothing within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read_daemon_info(data_dir)
        except DaemonNotRunning:
            pass
        if lock_is_free(data_dir):
            return None
        if time.monotonic() >= deadline:
            raise DaemonNotRunning(
                f"a process holds {data_dir / LOCK_FILE} but published no daemon.json within {timeout:g} s"
            )
        time.sleep(POLL_INTERVAL)


@contextlib.contextmanager
def start_lock(data_dir: Path, timeout: float) -> Iterator[None]:
    """Serialise ``keymemd start`` (and the shim's autostart) for one data directory."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = filelock.FileLock(str(data_dir / START_LOCK_FILE), thread_local=False)
    try:
        lock.acquire(timeout=timeout, poll_interval=POLL_INTERVAL)
    except filelock.Timeout:
        raise DaemonNotRunning(f"another keymemd start for {data_dir} did not finish within {timeout:.0f} s") from None
    try:
        yield
    finally:
        lock.release()


# -- HTTP --------------------------------------------------------------------------------


def get_health(info: DaemonInfo, *, timeout: float = HEALTH_TIMEOUT) -> dict[str, Any] | None:
    """``GET /health`` of the daemon ``info`` names; None if it does not answer as keymem."""
    import httpx

    try:
        # trust_env=False: a proxy from the environment must never carry loopback traffic.
        response = httpx.get(f"{info.url}/health", timeout=timeout, trust_env=False)
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    if response.status_code != 200 or not isinstance(body, dict) or body.get("pid") != info.pid:
        return None  # not ours: something else answers on that port
    return body


def wait_until_ready(
    location: Path,
    *,
    timeout: float,
    process: subprocess.Popen[bytes] | None = None,
    deadline: float | None = None,
) -> DaemonInfo:
    """Poll ``daemon.json`` and ``/health`` until the daemon is ``ready`` or ``timeout`` passes.

    ``process`` (a daemon just spawned) ends the wait early if it exits. ``deadline`` (a
    ``time.monotonic()`` value) ends it earlier when part of ``timeout`` is spent already.
    Raises ``DaemonNotRunning`` saying what was last seen: no file yet, still starting,
    failed.
    """
    deadline = time.monotonic() + timeout if deadline is None else deadline
    last = "no daemon.json yet"
    while True:
        try:
            info = read_daemon_info(location)
        except DaemonNotRunning as exc:
            last = exc.message
        else:
            health = get_health(info, timeout=max(0.05, min(HEALTH_TIMEOUT, deadline - time.monotonic())))
            if health is None:
                last = f"pid {info.pid} does not answer on {info.url} yet"
            elif health.get("status") == "ready":
                return info
            elif health.get("status") == "failed":
                raise DaemonNotRunning(f"keymemd (pid {info.pid}) failed to load: {health.get('error', 'see the log')}")
            else:
                detail = health.get("detail")
                last = f"pid {info.pid} is still {health.get('status', 'starting')}" + (f": {detail}" if detail else "")
        if process is not None and process.poll() is not None:
            raise DaemonNotRunning(f"keymemd exited with code {process.returncode} while starting ({last})")
        if time.monotonic() >= deadline:
            raise DaemonNotRunning(f"keymemd was not ready within {timeout:g} s ({last})")
        time.sleep(POLL_INTERVAL)


def request_shutdown(info: DaemonInfo, *, timeout: float = SHUTDOWN_REQUEST_TIMEOUT) -> bool:
    """``POST /v1/shutdown``; True if the daemon accepted it."""
    import httpx

    try:
        response = httpx.post(f"{info.url}/v1/shutdown", headers=info.headers, timeout=timeout, trust_env=False)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def stop_daemon(
    info: DaemonInfo,
    location: Path,
    *,
    grace: float = SHUTDOWN_GRACE,
    term_grace: float = TERM_GRACE,
    kill_grace: float = KILL_GRACE,
) -> StopOutcome:
    """Stop the daemon politely, then firmly: ``/v1/shutdown``, SIGTERM, SIGKILL.

    Each step waits for the pid to disappear. A daemon that had to be killed leaves its
    ``daemon.json`` behind; it is removed here (it names the pid we just stopped).
    """
    if not pid_alive(info.pid) or not looks_like_daemon(info.pid):
        # Gone, or the pid was recycled by an unrelated process: never signal that one.
        remove_daemon_info(location, pid=info.pid)
        return "not_running"
    if request_shutdown(info) and wait_for_exit(info.pid, grace):
        return "shutdown"
    outcome: StopOutcome = "terminated"
    for sig, wait in ((signal.SIGTERM, term_grace), (signal.SIGKILL, kill_grace)):
        if not pid_alive(info.pid):
            break
        if not looks_like_daemon(info.pid):
            break  # the pid was recycled by an unrelated process: never signal it
        logger.info("sending %s to keymemd pid %d", signal.Signals(sig).name, info.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, sig)
        outcome = "terminated" if sig == signal.SIGTERM else "killed"
        if wait_for_exit(info.pid, wait):
            break
    else:
        raise DaemonNotRunning(f"keymemd pid {info.pid} did not exit even after SIGKILL")
    remove_daemon_info(location, pid=info.pid)
    return outcome


# -- starting ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartResult:
    info: DaemonInfo
    started: bool
    """False when a daemon was already running (``start`` was a no-op)."""


def daemon_command(data_dir: Path, run_args: Sequence[str] = ()) -> list[str]:
    """The command line of a detached daemon for ``data_dir``."""
    return [
        sys.executable,
        "-m",
        "keymem_daemon",
        "--data-dir",
        str(data_dir),
        "run",
        "--background",
        *run_args,
    ]


def daemon_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The daemon's environment: the caller's, without any host session identity."""
    return {k: v for k, v in environ.items() if k not in HOST_SESSION_VARS}


def running_daemon(data_dir: Path) -> DaemonInfo | None:
    """The daemon serving ``data_dir`` if it answers ``/health`` (starting or ready)."""
    try:
        info = read_daemon_info(data_dir)
    except DaemonNotRunning:
        return None
    health = get_health(info)
    if health is None or health.get("status") not in ("starting", "ready"):
        return None
    return info


def start_daemon(
    settings: Settings,
    *,
    timeout: float | None = None,
    run_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> StartResult:
    """Make sure a ready daemon serves ``settings.data_dir``; spawn one if none does.

    Concurrent callers queue on ``start.lock``; the first spawns, the others find it. A
    daemon that owns the directory but is not answering yet (starting) is waited for; one
    that is shutting down is waited out, then replaced. Raises ``DaemonNotRunning`` when no
    daemon is ready within ``timeout`` (the spawned one is left running: it may be busy
    migrating or downloading a model).
    """
    data_dir = settings.data_dir
    wait = settings.start_timeout if timeout is None else timeout
    deadline = time.monotonic() + wait
    with start_lock(data_dir, wait + START_LOCK_MARGIN):
        process: subprocess.Popen[bytes] | None = None
        while True:
            found = running_daemon(data_dir)
            if found is not None:
                ours = process is not None and found.pid == process.pid
                info = wait_until_ready(data_dir, timeout=wait, deadline=deadline, process=process if ours else None)
                return StartResult(info, started=ours)
            if process is None:
                # Spawn only into an unowned directory: an owner without daemon.json is
                # still importing (wait for it) or shutting down (wait it out).
                if lock_is_free(data_dir):
                    process = _spawn(settings, run_args, environ)
            elif process.poll() is not None and lock_is_free(data_dir):
                # Ours exited and nobody owns the directory: it failed. (If someone does own
                # it, ours lost a race to a daemon started another way: wait for that one.)
                raise DaemonNotRunning(f"keymemd exited with code {process.returncode} while starting")
            if time.monotonic() >= deadline:
                state = "still starting" if process is not None else f"{data_dir / LOCK_FILE} is held"
                raise DaemonNotRunning(f"keymemd was not ready within {wait:g} s ({state}; see keymemd logs)")
            time.sleep(POLL_INTERVAL)


def _spawn(settings: Settings, run_args: Sequence[str], environ: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
    """A detached ``keymemd run`` (own session, output appended to the log)."""
    log_path = settings.log_path
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = daemon_environment(os.environ if environ is None else environ)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            daemon_command(settings.data_dir, run_args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=str(settings.data_dir),
            start_new_session=True,
            close_fds=True,
        )
