"""Build and repair keymem's private virtualenv from the plugin's own source.

Standard library only: it runs on the interpreter that builds the venv (Python >= 3.10),
chosen by ``plugin/launcher.sh``. Hosts install no Python dependencies for a plugin, so on
the first run keymem installs itself here::

    <data>/venv/                        the virtualenv (keymem and its dependencies)
    <data>/venv/keymem-plugin-version   written last, after a verified install
    <data>/bootstrap.json               the last attempt: installing | failed | ready
    <data>/bootstrap.lock               held (fcntl) for a whole attempt
    <data>/logs/bootstrap.log           every attempt, pip's output included

One attempt at a time: an attempt holds an exclusive ``flock`` on ``bootstrap.lock``, which
the kernel releases when the process dies, so a crashed or killed attempt never leaves a
stale lock. A second attempt that finds the lock taken exits at once. Every attempt is a
repair: it reuses a venv whose interpreter and pip still work (``pip install`` is
idempotent and skips what is already there) and recreates one that does not, so an
interrupted or failed attempt is simply continued by the next. The version marker is
removed when an attempt starts and written when it succeeds; a plugin of another version
finds a marker that does not match and upgrades the venv in place.

``pip`` reads its usual environment (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``,
``PIP_NO_INDEX``, proxies), which is how an offline machine installs from a wheelhouse.

Usage (``launcher.sh --bootstrap`` and ``--prepare`` run these)::

    python3 bootstrap.py run PLUGIN_ROOT     # build or repair now; exit 0 ready, 1 failed
    python3 bootstrap.py start PLUGIN_ROOT   # the same in the background, unless one runs
    python3 bootstrap.py status PLUGIN_ROOT  # the state as JSON
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

MIN_PYTHON: Final = (3, 10)
VERSION_MARKER: Final = "keymem-plugin-version"
STATE_FILE: Final = "bootstrap.json"
LOCK_FILE: Final = "bootstrap.lock"
LOG_NAME: Final = "bootstrap.log"
STAGE_DIR: Final = "bootstrap-src"
PIP_TIMEOUT: Final = 3600.0
"""A whole ``pip install``; pip's own network timeouts and retries come first."""
CHECK_TIMEOUT: Final = 120.0
"""``venv`` creation and the import checks."""
LOG_ROTATE_BYTES: Final = 5 * 1024 * 1024
"""bootstrap.log moves to bootstrap.log.1 when an attempt starts past this size."""
ERROR_TAIL_LINES: Final = 6
"""Lines of a failed step's output kept in bootstrap.json for the MCP error message."""
SOURCE_FILES: Final = ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "LICENSE")
_VERSION_LINE: Final = re.compile(r'^version\s*=\s*"([^"]+)"', re.MULTILINE)
_BIN: Final = "Scripts" if os.name == "nt" else "bin"
_EXE: Final = ".exe" if os.name == "nt" else ""
POLL_INTERVAL: Final = 0.25
"""How often a wait for the venv looks again (an install takes a minute or more)."""

T = TypeVar("T")


class BootstrapError(Exception):
    """A step failed; the message is what the user sees (MCP error, log, state)."""


@dataclass(frozen=True)
class Paths:
    """Where one data dir keeps its venv, and which plugin it is built from."""

    root: Path
    data: Path

    @property
    def venv(self) -> Path:
        return self.data / "venv"

    @property
    def python(self) -> Path:
        return self.venv / _BIN / f"python{_EXE}"

    @property
    def shim(self) -> Path:
        return self.venv / _BIN / f"keymem-shim{_EXE}"

    @property
    def marker(self) -> Path:
        return self.venv / VERSION_MARKER

    @property
    def state(self) -> Path:
        return self.data / STATE_FILE

    @property
    def lock(self) -> Path:
        return self.data / LOCK_FILE

    @property
    def log(self) -> Path:
        return self.data / "logs" / LOG_NAME

    @property
    def stage(self) -> Path:
        return self.data / STAGE_DIR


def data_dir(environ: Mapping[str, str]) -> Path:
    """``KEYMEM_DATA_DIR``, else ``$HOME/.keymem``: the daemon's and the hook's rule."""
    raw = environ.get("KEYMEM_DATA_DIR", "").strip()
    if raw:
        return Path(os.path.realpath(os.path.expanduser(raw)))
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(os.path.realpath(os.path.join(home, ".keymem")))


def paths_for(root: str | Path, environ: Mapping[str, str] | None = None) -> Paths:
    return Paths(Path(root).resolve(), data_dir(os.environ if environ is None else environ))


def plugin_version(root: Path) -> str:
    """The ``version`` of ``[project]`` in the plugin's pyproject.toml (what pip installs)."""
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError as exc:
        raise BootstrapError(f"cannot read {root / 'pyproject.toml'}: {exc}") from None
    match = _VERSION_LINE.search(text)
    if match is None:
        raise BootstrapError(f"no version in {root / 'pyproject.toml'}")
    return match.group(1)


def is_ready(paths: Paths, version: str) -> bool:
    """The venv holds a verified install of exactly this plugin version."""
    try:
        built = paths.marker.read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return built == version and os.access(paths.shim, os.X_OK)


def poll_until(predicate: Callable[[], T | None], deadline: float, *, interval: float = POLL_INTERVAL) -> T | None:
    """Call ``predicate`` until it returns something other than None; None once ``deadline``
    (a ``time.monotonic()`` value) has passed.

    A copy of ``keymem_daemon.runtime.poll_until``, which this file cannot import: it runs
    before keymem is installed. tests/unit/test_runtime.py keeps the two the same.
    """
    while True:
        value = predicate()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


# -- state and log ------------------------------------------------------------------------


def read_state(paths: Paths) -> dict[str, Any]:
    try:
        data = json.loads(paths.state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_state(paths: Paths, **state: Any) -> None:
    paths.data.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = paths.state.with_name(f".{STATE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, paths.state)


def log(paths: Paths, message: str) -> None:
    """One timestamped line in bootstrap.log (and nothing on failure: logging never fails)."""
    with contextlib.suppress(OSError):
        paths.log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        with open(paths.log, "a", encoding="utf-8") as handle:
            handle.write(f"{stamp} [{os.getpid()}] {message}\n")


@contextlib.contextmanager
def attempt_lock(paths: Paths) -> Iterator[bool]:
    """Hold ``bootstrap.lock`` for the block; yields False (at once) when another holds it."""
    paths.data.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(paths.lock, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def attempt_running(paths: Paths) -> bool:
    """Whether some process holds the attempt lock right now."""
    with attempt_lock(paths) as acquired:
        return not acquired


# -- the steps ----------------------------------------------------------------------------


def run_step(paths: Paths, argv: list[str], *, timeout: float, what: str) -> None:
    """Run one command with its output appended to the log; BootstrapError when it fails."""
    log(paths, f"$ {' '.join(argv)}")
    start = paths.log.stat().st_size if paths.log.exists() else 0
    with open(paths.log, "ab") as sink:
        try:
            # In the data dir: run from a source checkout, ``import keymem_shim`` would
            # otherwise find the checkout instead of the venv's copy.
            code = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                timeout=timeout, check=False, cwd=str(paths.data),
            ).returncode
        except subprocess.TimeoutExpired:
            raise BootstrapError(f"{what} took longer than {timeout:.0f} s") from None
        except OSError as exc:
            raise BootstrapError(f"{what} could not run: {exc}") from None
    if code != 0:
        raise BootstrapError(f"{what} failed (exit {code}): {log_tail(paths, start)}")


def log_tail(paths: Paths, offset: int) -> str:
    """The last meaningful lines written to the log since ``offset``, on one line."""
    try:
        with open(paths.log, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return "(no output)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if "is ignored: it is neither" not in line] or lines
    return " | ".join(lines[-ERROR_TAIL_LINES:]) or "(no output)"


def venv_works(paths: Paths) -> bool:
    """The venv's interpreter starts and has pip (a half-created venv has neither)."""
    if not paths.python.exists():
        return False
    try:
        result = subprocess.run(
            [str(paths.python), "-m", "pip", "--version"], stdin=subprocess.DEVNULL,
            capture_output=True, timeout=CHECK_TIMEOUT, check=False, cwd=str(paths.data),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def stage_source(paths: Paths) -> Path:
    """Copy what pip builds (pyproject.toml, README, the packages) out of the plugin dir.

    Building from a copy keeps the plugin dir untouched (setuptools writes build/ and
    *.egg-info/ next to the source) and works when the host's cache is read-only. A package
    is any top-level directory with an ``__init__.py``.
    """
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(paths.stage)
    paths.stage.mkdir(parents=True)
    for name in SOURCE_FILES:
        if (paths.root / name).is_file():
            shutil.copy2(paths.root / name, paths.stage / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for entry in sorted(paths.root.iterdir()):
        if entry.is_dir() and (entry / "__init__.py").is_file():
            shutil.copytree(entry, paths.stage / entry.name, ignore=ignore)
    return paths.stage


def install(paths: Paths, version: str) -> None:
    """Create or repair the venv and install the plugin's source into it."""
    if sys.version_info < MIN_PYTHON:
        found = ".".join(map(str, sys.version_info[:3]))
        raise BootstrapError(
            f"keymem needs Python {'.'.join(map(str, MIN_PYTHON))} or newer; {sys.executable} "
            f"is {found} (set KEYMEM_BOOTSTRAP_PYTHON to a newer interpreter)"
        )
    with contextlib.suppress(FileNotFoundError):
        paths.marker.unlink()
    if not venv_works(paths):
        if paths.venv.exists():
            log(paths, f"{paths.venv} is incomplete or broken: recreating it")
            shutil.rmtree(paths.venv)
        run_step(paths, [sys.executable, "-m", "venv", str(paths.venv)],
                 timeout=CHECK_TIMEOUT, what="creating the virtualenv")
    source = stage_source(paths)
    try:
        run_step(
            paths,
            [str(paths.python), "-m", "pip", "install", "--disable-pip-version-check",
             "--no-input", "--progress-bar", "off", str(source)],
            timeout=PIP_TIMEOUT,
            what="pip install",
        )
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(source)
    run_step(paths, [str(paths.python), "-c", "import keymem_shim, keymem_daemon"],
             timeout=CHECK_TIMEOUT, what="checking the installed packages")
    if not os.access(paths.shim, os.X_OK):
        raise BootstrapError(f"pip installed keymem but {paths.shim} is missing")
    tmp = paths.marker.with_name(f".{VERSION_MARKER}.{os.getpid()}")
    tmp.write_text(version + "\n", encoding="utf-8")
    os.replace(tmp, paths.marker)


def run(paths: Paths) -> int:
    """One attempt under the lock: 0 ready (built now or already), 1 failed, 2 busy."""
    with attempt_lock(paths) as acquired:
        if not acquired:
            log(paths, "another bootstrap is running; not starting a second one")
            return 2
        try:
            version = plugin_version(paths.root)
        except BootstrapError as exc:
            log(paths, f"bootstrap failed: {exc}")
            write_state(paths, state="failed", error=str(exc), pid=os.getpid(),
                        finished_at=time.time(), plugin_root=str(paths.root))
            return 1
        if is_ready(paths, version):
            log(paths, f"venv already holds keymem {version}; nothing to do")
            return 0
        with contextlib.suppress(OSError):
            if paths.log.stat().st_size > LOG_ROTATE_BYTES:
                os.replace(paths.log, paths.log.with_name(LOG_NAME + ".1"))
        previous = read_state(paths)
        attempt = int(previous.get("attempt", 0)) + 1 if previous.get("state") != "ready" else 1
        started = time.time()
        write_state(paths, state="installing", pid=os.getpid(), version=version,
                    plugin_root=str(paths.root), python=sys.executable,
                    started_at=started, attempt=attempt,
                    previous_error=previous.get("error") if previous.get("state") else None)
        log(paths, f"bootstrap start: keymem {version} from {paths.root} into {paths.venv} "
                   f"with {sys.executable} (attempt {attempt})")
        try:
            install(paths, version)
        except (BootstrapError, OSError) as exc:
            message = str(exc) if isinstance(exc, BootstrapError) else f"{type(exc).__name__}: {exc}"
            log(paths, f"bootstrap failed after {time.time() - started:.1f} s: {message}")
            write_state(paths, state="failed", pid=os.getpid(), version=version,
                        plugin_root=str(paths.root), python=sys.executable,
                        started_at=started, finished_at=time.time(), attempt=attempt,
                        error=message)
            return 1
        took = time.time() - started
        log(paths, f"bootstrap done: keymem {version} ready in {took:.1f} s")
        write_state(paths, state="ready", pid=os.getpid(), version=version,
                    plugin_root=str(paths.root), python=sys.executable, started_at=started,
                    finished_at=time.time(), seconds=round(took, 1), attempt=attempt)
        return 0


def start(paths: Paths) -> int | None:
    """Run an attempt in a detached process unless one is running; returns its pid.

    The child gets a session of its own, so a host that kills the MCP server's process
    group when a session ends does not kill a half-done install.
    """
    if attempt_running(paths):
        return None
    paths.log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(paths.log, "ab") as sink:
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "run", str(paths.root)],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, cwd=str(paths.data),
            start_new_session=True, close_fds=True,
        )
    process.returncode = 0  # never waited for: it outlives us (no ResourceWarning)
    return process.pid


def status(paths: Paths) -> dict[str, Any]:
    state = read_state(paths)
    try:
        version = plugin_version(paths.root)
    except BootstrapError as exc:
        version = None
        state.setdefault("error", str(exc))
    state.update(
        ready=version is not None and is_ready(paths, version),
        running=attempt_running(paths),
        plugin_version=version,
        venv=str(paths.venv),
        log=str(paths.log),
    )
    return state


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("run", "start", "status"):
        print("usage: bootstrap.py run|start|status PLUGIN_ROOT", file=sys.stderr)
        return 2
    command, root = argv
    paths = paths_for(root)
    if command == "run":
        code = run(paths)
        if code == 1:
            print(f"keymem: bootstrap failed: {read_state(paths).get('error')}; see {paths.log}",
                  file=sys.stderr)
        elif code == 2:
            print("keymem: another bootstrap is running", file=sys.stderr)
        return code
    if command == "start":
        start(paths)
        return 0
    print(json.dumps(status(paths), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
