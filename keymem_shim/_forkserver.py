"""The warm shim: one process with the MCP SDK imported that forks a ready shim per host session.

Importing the ``mcp`` SDK costs every new shim about 0.4 s of CPU (pydantic builds the protocol
models at import), more than an ``initialize`` answer may take. So keymemd starts this process
beside itself (``KEYMEM_WARM_SHIM``): it imports the shim once and listens on
``<data>/shim.sock``. ``keymem-shim`` then only starts Python, connects, and hands over its
stdin, stdout and stderr (``SCM_RIGHTS``) with its environment and working directory; a forked
copy of this process runs the same ``keymem_shim.serve`` an in-process shim runs, on those
descriptors, with the imports already done. The launcher stays until that copy ends and exits
with its code, so the host still sees one process whose life is the session's:

- the host closes stdin -> the forked shim finishes -> sends its exit code -> the launcher exits;
- the host kills the launcher -> the connection closes -> the forked shim exits at once.

Anything unexpected before the hand-over (no socket, a dead one, another keymem version, no
answer within ``HANDOFF_TIMEOUT``) and the launcher serves in-process: slower, never broken.
The fork server follows its daemon: it exits when its parent is gone or stops it, and a new
daemon's fork server takes the socket path over (``os.replace``), so a stale one never answers.

Wire format on the Unix socket, one JSON object per line: the launcher sends ``version``,
``cwd`` and ``environ`` carrying three descriptors; the forked shim answers ``{"pid": n}``
once it holds them; the launcher commits with ``{"go": true}`` (a launcher that gave up
waiting closes instead, and the fork exits without reading anything), and the forked shim
ends with ``{"exit": code}``. A refusal is ``{"refused": reason}``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO, Final

from keymem_daemon import __version__
from keymem_daemon.config import Settings

logger = logging.getLogger(__name__)

HANDOFF_TIMEOUT: Final = 2.0
"""Seconds the launcher waits for a forked shim to take its descriptors before serving itself."""
PARENT_POLL: Final = 1.0
"""How often the fork server checks that the daemon that started it is still its parent."""
MAX_REQUEST_BYTES: Final = 1 << 20
"""A hand-over request is an environment and a path; anything larger is not a launcher."""
STDIO: Final = (0, 1, 2)


def _read_message(reader: BinaryIO) -> dict[str, Any] | None:
    line = reader.readline(MAX_REQUEST_BYTES)
    if not line.endswith(b"\n"):
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _send_message(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


# -- the launcher's side -----------------------------------------------------------------------


def hand_over(path: Path, *, cwd: str | None) -> int | None:
    """Have the warm shim on ``path`` serve this process's stdio; its exit code, or None to serve here."""
    if not hasattr(socket, "send_fds") or not path.exists():
        return None
    request = {"version": __version__, "cwd": cwd, "environ": dict(os.environ)}
    data = json.dumps(request).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(HANDOFF_TIMEOUT)
            sock.connect(str(path))
            sent = socket.send_fds(sock, [data], list(STDIO))
            sock.sendall(data[sent:])
            reader = sock.makefile("rb")
            answer = _read_message(reader)
        except (OSError, ValueError):
            return None  # not handed over: nothing has touched stdin yet
        if answer is None or not isinstance(answer.get("pid"), int):
            if answer is not None and "refused" in answer:
                print(f"keymem-shim: the warm shim refused: {answer['refused']}", file=sys.stderr)
            return None
        try:
            _send_message(sock, {"go": True})
        except OSError:
            return None  # the forked shim is gone before serving anything
        # From here the forked shim owns the session; this process only waits for its end.
        sock.settimeout(None)
        try:
            end = _read_message(reader)
        except OSError:
            end = None
    code = end.get("exit") if end is not None else None
    return code if isinstance(code, int) else 1


# -- the fork server ---------------------------------------------------------------------------


class _Request:
    """A validated hand-over: the launcher's environment, working directory and stdio."""

    def __init__(self, message: dict[str, Any], fds: list[int]) -> None:
        environ = message.get("environ")
        cwd = message.get("cwd")
        if len(fds) != len(STDIO):
            raise ValueError(f"expected {len(STDIO)} descriptors, got {len(fds)}")
        if not isinstance(environ, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in environ.items()
        ):
            raise ValueError("environ must be an object of strings")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError("cwd must be a string or null")
        self.version = message.get("version")
        self.environ: dict[str, str] = environ
        self.cwd: str | None = cwd
        self.fds = fds


def _receive(conn: socket.socket) -> _Request:
    fds: list[int] = []
    try:
        data, fds, _flags, _address = socket.recv_fds(conn, 65536, len(STDIO))
        while not data.endswith(b"\n"):
            if len(data) > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            chunk = conn.recv(65536)
            if not chunk:
                raise ValueError("connection closed mid-request")
            data += chunk
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ValueError("request is not a JSON object")
        return _Request(message, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _exit_when_launcher_goes(conn: socket.socket) -> None:
    """The launcher never writes after its go: EOF here means the host killed it."""
    with contextlib.suppress(OSError):
        conn.recv(1)
    os._exit(0)


def _serve_session(conn: socket.socket, request: _Request) -> int:
    """In the forked child: become the launcher's shim, serve its session, report the end."""
    from keymem_shim._session import serve

    # Its own session: a Ctrl-C meant for a foreground keymemd must not end host sessions.
    os.setsid()
    for target, fd in zip(STDIO, request.fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request.environ)
    if request.cwd is not None:
        with contextlib.suppress(OSError):
            os.chdir(request.cwd)
    # Serve only on the launcher's go: one that gave up waiting serves the session itself,
    # and two servers must never read the same stdin.
    conn.settimeout(HANDOFF_TIMEOUT)
    _send_message(conn, {"pid": os.getpid()})
    go = _read_message(conn.makefile("rb"))
    if go is None or go.get("go") is not True:
        return 1
    conn.settimeout(None)
    threading.Thread(target=_exit_when_launcher_goes, args=(conn,), daemon=True).start()
    code = 1
    try:
        serve(Settings.from_env(os.environ), started=time.monotonic(), cwd=request.cwd)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        logger.exception("the forked shim failed")
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            _send_message(conn, {"exit": code})
    return code


def _fork_session(listener: socket.socket, conn: socket.socket) -> None:
    conn.settimeout(HANDOFF_TIMEOUT)
    try:
        request = _receive(conn)
    except (OSError, ValueError) as exc:
        logger.warning("ignored a malformed hand-over: %s", exc)
        return
    if request.version != __version__:
        for fd in request.fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            _send_message(conn, {"refused": f"keymem {__version__} here, the launcher is {request.version}"})
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        for fd in request.fds:
            os.close(fd)
        return
    # The child never returns into the accept loop, and skips this process's exit handlers.
    code = 1
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code = _serve_session(conn, request)
    finally:
        os._exit(code)


def _listen(path: Path) -> socket.socket:
    """Bind beside ``path`` and move into place: a live older fork server loses the name at once."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(staging))
        os.chmod(staging, 0o600)
        listener.listen(64)
        os.replace(staging, path)
    except BaseException:
        listener.close()
        with contextlib.suppress(OSError):
            staging.unlink()
        raise
    return listener


def run(settings: Settings, *, parent: int) -> int:
    """Serve hand-overs on ``<data>/shim.sock`` until the daemon ``parent`` goes or stops us.

    The daemon passes its pid: one killed before this process got this far has already
    made init its parent, and a parent read here would be that one.
    """
    if os.getppid() != parent:
        return 0
    from keymem_shim import _server  # noqa: F401 -- the imports every forked shim inherits

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="keymem-shim warm[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    path = settings.warm_shim_socket
    try:
        listener = _listen(path)
    except OSError as exc:  # an over-long data dir path, say: hosts' shims serve in-process
        logger.warning("no warm shim for %s: %s", settings.data_dir, exc)
        return 1
    inode = os.stat(path).st_ino

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps forked shims
    gc.freeze()  # keep the imported objects out of collections: fewer copied pages per fork
    listener.settimeout(PARENT_POLL)
    try:
        while os.getppid() == parent:
            try:
                conn, _address = listener.accept()
            except TimeoutError:
                continue
            with conn:
                _fork_session(listener, conn)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:  # not a newer fork server's socket
                path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(Settings.from_env(os.environ), parent=int(sys.argv[1])))
