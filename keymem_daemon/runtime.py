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

A client never takes ``daemon.json``'s word for who listens on its port (the daemon may
have died and the port been taken by another program, or the pid been recycled): before
it sends the token or a prompt, the daemon proves it holds the token by answering a fresh
nonce on ``GET /health?nonce=...`` with ``health_proof`` (an HMAC under the token over the
nonce, its pid and start time; ``keymem_daemon.proof``). ``get_health`` checks it; ``keymem_daemon.verified`` checks
it on every new connection the shim and the CLI open. Signals go only to the process that
holds ``daemon.lock`` (``owns_data_dir``) or that has just proven itself.

This module is imported by the shim and by the CLI's ``start``/``stop``/``status``, so it
stays light: the standard library, ``filelock`` and ``httpx`` only. ``httpx`` is imported by
the two functions that make requests: the daemon imports this module too and never makes
one, and the import would cost it 5 MB resident and 40 ms of start-up (httpx pulls in its
own CLI's ``rich`` and ``pygments``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import filelock

from keymem_daemon.config import Settings
from keymem_daemon.errors import ConfigError, Conflict, DaemonNotRunning, StoreError
from keymem_daemon.proof import MAX_NONCE_CHARS as MAX_NONCE_CHARS
from keymem_daemon.proof import NONCE_BYTES as NONCE_BYTES
from keymem_daemon.proof import PROOF_VERSION as PROOF_VERSION
from keymem_daemon.proof import health_proof as health_proof
from keymem_daemon.proof import new_nonce as new_nonce
from keymem_daemon.proof import proof_matches

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

PRIVATE_DIR_MODE: Final = 0o700
PRIVATE_FILE_MODE: Final = 0o600
COMMAND_SHOWN: Final = 160
"""Characters of a lock holder's command line a message quotes."""
WRITE_PROBE_BYTES: Final = 64 * 1024
"""What a start writes (and removes) to learn that the data dir takes writes: a file system
with less room than this cannot hold the store's next transaction either."""

# Host identity belongs to one host session; a daemon spawned from a host must not inherit
# it, or it stamps every caller's memories with the first host's session (upstream 7489ba1).
HOST_SESSION_VARS: Final = ("CLAUDE_CODE_SESSION_ID", "CODEX_THREAD_ID")

T = TypeVar("T")

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
    path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), PRIVATE_FILE_MODE)
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


# -- waiting -----------------------------------------------------------------------------


def poll_until(predicate: Callable[[], T | None], deadline: float, *, interval: float = POLL_INTERVAL) -> T | None:
    """Call ``predicate`` until it returns something other than None; None once ``deadline``
    (a ``time.monotonic()`` value) has passed.

    The one loop that waits to a deadline: it always asks at least once, and once more after
    the last sleep, so a wait whose deadline has already passed still sees the present state.
    A predicate ends the wait early by raising. ``plugin/bootstrap.py`` holds a copy of these
    lines (it runs before keymem is installed); a test keeps the two the same.
    """
    while True:
        value = predicate()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


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


def lock_holders(path: Path) -> list[int] | None:
    """The pids holding a lock on ``path`` (``filelock`` uses ``flock``), as ``/proc/locks``
    lists them: [] when nobody does, None where there is no ``/proc/locks`` (not Linux)."""
    try:
        table = Path("/proc/locks").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    try:
        st = path.stat()
    except OSError:
        return []
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = []
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2163738 0 EOF"; "->" marks a waiter, not a holder
        fields = line.split()
        if len(fields) >= 6 and "->" not in fields and fields[5] == device and fields[4].isdigit():
            holders.append(int(fields[4]))
    return holders


def _runs_daemon_for(pid: int, data_dir: Path) -> bool:
    """Is ``pid`` exactly ``python -m keymem_daemon [--data-dir DIR] run`` for ``data_dir``?
    (Where ``/proc/locks`` is missing; False without procfs.)"""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [a.decode("utf-8", "surrogateescape") for a in argv if a]
    module = any(args[i:i + 2] == ["-m", "keymem_daemon"] for i in range(len(args)))
    script = any(Path(a).name == "keymemd" for a in args[:2])
    if not (module or script) or "run" not in args:
        return False
    if "--data-dir" in args[:-1]:
        named = args[args.index("--data-dir") + 1]
    else:
        env = dict(e.decode("utf-8", "surrogateescape").partition("=")[::2] for e in environ if b"=" in e)
        named = env.get("KEYMEM_DATA_DIR") or str(Path(env.get("HOME", "~")) / ".keymem")
    try:
        return Path(named).expanduser().resolve() == data_dir.resolve()
    except OSError:
        return False


def owns_data_dir(pid: int, data_dir: Path) -> bool:
    """Is ``pid`` this data dir's daemon -- the holder of its ``daemon.lock``?

    The guard before any signal: a ``daemon.json`` left by a killed daemon may name a pid
    the system has since given to anything (an editor open on keymem's README). Where the
    kernel's lock table cannot be read, the exact command line and data dir decide.
    """
    if not pid_alive(pid):
        return False
    holders = lock_holders(data_dir / LOCK_FILE)
    if holders is not None:
        return pid in holders
    return _runs_daemon_for(pid, data_dir)


def describe_holder(path: Path) -> str:
    """Who holds the lock ``path``, as " (held by pid 123, user ann: python -m ...)"; "" if
    nobody does or it cannot be told."""
    holders = lock_holders(path)
    if not holders:
        return ""
    pid = holders[0]
    try:
        uid = Path(f"/proc/{pid}").stat().st_uid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return f" (held by pid {pid})"
    import pwd

    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    command = " ".join(argv.replace("\0", " ").split())
    return f" (held by pid {pid}, user {user}: {command[:COMMAND_SHOWN]})"


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Poll until ``pid`` is gone, up to ``timeout`` seconds; True if it exited.

    Polls rather than ``waitpid``: the daemon is usually not our child (``start`` detaches
    it), so only its disappearance can be observed.
    """
    return poll_until(lambda: None if pid_alive(pid) else True, time.monotonic() + timeout) is not None


# -- the data directory ------------------------------------------------------------------


def prepare_data_dir(data_dir: Path) -> str | None:
    """Create ``data_dir`` private (0700), or make an existing one private; check it takes writes.

    Returns a note when an existing directory was tightened (for the log). Raises
    ``ConfigError`` for a directory another user owns, ``StoreError`` for one that takes no
    writes (read-only, full, not ours to write), each saying what to do.
    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        st = data_dir.stat()
    except OSError as exc:
        raise _unwritable(data_dir, exc) from None
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"the data directory {data_dir} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
            "keymem keeps your memories only in a directory of your own (set KEYMEM_DATA_DIR)"
        )
    note = None
    if st.st_mode & 0o077:
        try:
            os.chmod(data_dir, PRIVATE_DIR_MODE)
        except OSError as exc:
            raise _unwritable(data_dir, exc) from None
        note = f"made {data_dir} private (mode {st.st_mode & 0o777:o} -> {PRIVATE_DIR_MODE:o}): memories are yours only"
    probe = data_dir / f".write-probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        try:
            os.write(fd, b"\0" * WRITE_PROBE_BYTES)  # a full file system refuses it (no fsync: starts stay quick)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _unwritable(data_dir, exc) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return note


def _unwritable(data_dir: Path, exc: OSError) -> StoreError:
    """One line for a data dir that takes no writes, naming why and what to do."""
    if exc.errno == errno.EROFS:
        why = "it is on a read-only file system"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            st = os.statvfs(data_dir)
            free = f" ({st.f_bavail * st.f_frsize // 1024} KB free)"
        except OSError:
            free = ""
        why = f"its file system is full{free}; free some space"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = "you may not write there"
    else:
        why = exc.strerror or str(exc)
    return StoreError(
        f"keymem cannot write to its data directory {data_dir}: {why} "
        f"({exc.strerror or exc}); it needs a writable directory of your own (KEYMEM_DATA_DIR)"
    )


def data_dir_problem(data_dir: Path) -> str | None:
    """Why ``data_dir`` cannot hold a daemon (read-only, full, foreign), or None: for a
    start whose daemon exited without saying (its log may be what could not be written)."""
    try:
        prepare_data_dir(data_dir)
    except (StoreError, ConfigError) as exc:
        return exc.message
    return None


# -- locks -------------------------------------------------------------------------------


def daemon_lock(data_dir: Path) -> filelock.BaseFileLock:
    """The lock that makes a process the owner of ``data_dir`` (not yet acquired)."""
    return filelock.FileLock(str(data_dir / LOCK_FILE), mode=PRIVATE_FILE_MODE, thread_local=False)


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
            where = describe_holder(data_dir / LOCK_FILE) or " (it is starting or shutting down)"
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
    return poll_until(lambda: True if lock_is_free(data_dir) else None, time.monotonic() + timeout) is not None


def wait_for_owner(data_dir: Path, timeout: float) -> DaemonInfo | None:
    """The daemon that owns ``data_dir`` once it has published ``daemon.json``.

    For a daemon between taking the lock and publishing (starting) or between removing the
    file and exiting (stopping). None once nobody owns the directory; ``DaemonNotRunning``
    if the owner publishes nothing within ``timeout``.
    """

    def owner() -> DaemonInfo | Literal["free"] | None:
        try:
            return read_daemon_info(data_dir)
        except DaemonNotRunning:
            return "free" if lock_is_free(data_dir) else None

    found = poll_until(owner, time.monotonic() + timeout)
    if found is None:
        raise DaemonNotRunning(
            f"a process holds {data_dir / LOCK_FILE} but published no daemon.json within {timeout:g} s"
        )
    return found if isinstance(found, DaemonInfo) else None


@contextlib.contextmanager
def start_lock(data_dir: Path, timeout: float) -> Iterator[None]:
    """Serialise ``keymemd start`` (and the shim's autostart) for one data directory."""
    path = data_dir / START_LOCK_FILE
    lock = filelock.FileLock(str(path), mode=PRIVATE_FILE_MODE, thread_local=False)
    try:
        lock.acquire(timeout=timeout, poll_interval=POLL_INTERVAL)
    except filelock.Timeout:
        raise DaemonNotRunning(
            f"another keymemd start for {data_dir} did not finish within {timeout:.0f} s{describe_holder(path)}"
        ) from None
    except OSError as exc:
        raise _unwritable(data_dir, exc) from None
    try:
        yield
    finally:
        lock.release()


# -- HTTP --------------------------------------------------------------------------------


def get_health(info: DaemonInfo, *, timeout: float = HEALTH_TIMEOUT) -> dict[str, Any] | None:
    """``GET /health`` of the daemon ``info`` names; None unless it proves to be that daemon.

    The proof (``health_proof`` over a fresh nonce) is what counts: a program that took over
    the port, or answers with the right pid, is not keymem without the token.
    """
    import httpx

    nonce = new_nonce()
    try:
        # trust_env=False: a proxy from the environment must never carry loopback traffic.
        response = httpx.get(f"{info.url}/health", params={"nonce": nonce}, timeout=timeout, trust_env=False)
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    if response.status_code != 200 or not proof_matches(info, nonce, body):
        return None  # not ours: something else answers on that port
    result: dict[str, Any] = body
    return result


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

    def ready() -> DaemonInfo | None:
        nonlocal last
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
            raise exited_while_starting(process, info_path(location).parent, last)
        return None

    info = poll_until(ready, deadline)
    if info is None:
        raise DaemonNotRunning(f"keymemd was not ready within {timeout:g} s ({last})")
    return info


def exited_while_starting(process: subprocess.Popen[bytes], data_dir: Path, last: str | None = None
                          ) -> DaemonNotRunning:
    """A spawned daemon exited before it was ready: say so, and why when the data dir tells
    (read-only, full: then its log may be the very thing it could not write)."""
    problem = data_dir_problem(data_dir)
    detail = f": {problem}" if problem else f" ({last})" if last else ""
    return DaemonNotRunning(f"keymemd exited with code {process.returncode} while starting{detail}")


def request_shutdown(info: DaemonInfo, *, timeout: float = SHUTDOWN_REQUEST_TIMEOUT) -> bool:
    """``POST /v1/shutdown`` over a verified connection; True if the daemon accepted it."""
    import httpx

    from keymem_daemon.verified import verified_transport

    try:
        with httpx.Client(transport=verified_transport(info), timeout=timeout, trust_env=False) as client:
            response = client.post(f"{info.url}/v1/shutdown", headers=info.headers)
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

    Only this data dir's daemon is ever signalled: the process that proves itself on
    ``/health`` or holds ``daemon.lock`` (``owns_data_dir``), checked again before each
    signal. Anything else ``daemon.json`` names (a recycled pid) is left alone and the
    stale file removed. Each step waits for the pid to disappear. A daemon that had to be
    killed leaves its ``daemon.json`` behind; it is removed here (it names the pid we just
    stopped).
    """
    data_dir = location.parent if location.suffix == ".json" else location

    def ours() -> bool:
        return owns_data_dir(info.pid, data_dir) or get_health(info) is not None

    if not pid_alive(info.pid) or not ours():
        remove_daemon_info(location, pid=info.pid)
        return "not_running"
    if request_shutdown(info) and wait_for_exit(info.pid, grace):
        return "shutdown"
    outcome: StopOutcome = "terminated"
    for sig, wait in ((signal.SIGTERM, term_grace), (signal.SIGKILL, kill_grace)):
        if not pid_alive(info.pid) or not ours():
            break  # gone, or the pid was recycled by an unrelated process: never signal it
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
    prepare_data_dir(data_dir)
    process: subprocess.Popen[bytes] | None = None

    def started() -> StartResult | None:
        nonlocal process
        found = running_daemon(data_dir)
        if found is not None:
            ours = process is not None and found.pid == process.pid
            info = wait_until_ready(data_dir, timeout=wait, deadline=deadline, process=process if ours else None)
            return StartResult(info, started=ours)
        if process is None:
            # Spawn only into an unowned directory: an owner without daemon.json is still
            # importing (wait for it) or shutting down (wait it out).
            if lock_is_free(data_dir):
                process = _spawn(settings, run_args, environ)
        elif process.poll() is not None and lock_is_free(data_dir):
            # Ours exited and nobody owns the directory: it failed. (If someone does own it,
            # ours lost a race to a daemon started another way: wait for that one.)
            raise exited_while_starting(process, data_dir)
        return None

    with start_lock(data_dir, wait + START_LOCK_MARGIN):
        result = poll_until(started, deadline)
    if result is None:
        lock = data_dir / LOCK_FILE
        state = "still starting" if process is not None else f"{lock} is taken{describe_holder(lock)}"
        raise DaemonNotRunning(f"keymemd was not ready within {wait:g} s ({state}; see keymemd logs)")
    return result


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
