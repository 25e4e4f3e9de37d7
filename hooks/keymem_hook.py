#!/usr/bin/env python3
"""keymem-hook: surface keymem memories next to a prompt (Claude Code and Codex hooks).

One file, standard library only, so a host runs it with whatever ``python3`` it finds::

    python3 keymem_hook.py user-prompt-submit [--codex]   # UserPromptSubmit
    python3 keymem_hook.py session-start [--codex]        # SessionStart: warm the daemon

It reads the host's hook JSON on stdin, finds the daemon through ``<data>/daemon.json``,
makes it prove who it is (``GET /health?nonce=...`` must come back with the HMAC that
only the holder of daemon.json's token can compute: a recycled pid or a program that took
the port over gets neither the token nor the prompt), then, on the same connection,
posts ``{prompt, cwd, session_id, agent, top_k[, max_chars]}`` to ``/v1/inject`` and
prints exactly ``{"hookSpecificOutput": {"hookEventName": "UserPromptSubmit",
"additionalContext": <the daemon's block>}}`` -- the two keys Codex's
``additionalProperties: false`` schema allows, which Claude Code reads too. The session id
lets the daemon hold back what this session was already shown; a prompt longer than
``PROMPT_SEND_CHARS`` is sent as its head and tail.

It **always exits 0 and prints nothing on any failure** (no daemon, a slow or failing
daemon, bad stdin, an unreadable ``daemon.json``): memory must never block or break a
prompt. With no daemon running it starts one in the background and returns at once;
``session-start`` does only that, so the models are warm before the first prompt.

Variables (read here only; the daemon never reads the ``KEYMEM_HOOK_*`` ones):

- ``KEYMEM_DATA_DIR``            data directory (default ``~/.keymem``), as the daemon's
- ``KEYMEM_HOOK_TIMEOUT_MS``     budget for the whole run after start-up (default 2000)
- ``KEYMEM_HOOK_TOP_K``          most memories to surface, 1-10 (default 2)
- ``KEYMEM_HOOK_MIN_CHARS``      shorter prompts are skipped (default 6)
- ``KEYMEM_HOOK_MAX_CHARS``      size of the block, 256-9500 (default: the daemon's, 2000)
- ``KEYMEM_HOOK_DEBUG_LOG``      a file to append one line per run to (default: none)
- ``KEYMEM_AUTOSTART``           ``false`` stops the hook from starting a daemon
- ``KEYMEM_PYTHON``              interpreter with keymem installed, to start the daemon

The daemon is started with the first of: ``$KEYMEM_PYTHON -m keymem_daemon``, this
interpreter if it can import ``keymem_daemon``, ``keymemd`` on PATH, the plugin's private
venv under ``<data>/venv`` once its install is complete. A stamp file keeps it from starting one on every prompt while
one is still coming up.
"""

from __future__ import annotations

import _socket
import os
import sys
import time

# The fast path imports nothing it can do without, because every prompt waits for this
# process: ``_socket`` rather than ``socket`` (whose module builds enums and imports
# selectors), and HMAC-SHA256 from the interpreter's own SHA-256 rather than ``hashlib`` and
# ``hmac`` (which load OpenSSL's libcrypto). ``python -X importtime`` on a Claude Code
# prompt (load 13): the modules the request path adds to a bare interpreter 15 -> 9, their
# import time 55 -> 10 ms. JSON goes through ``_json``, the C codec the ``json`` package wraps:
# ``json`` imports ``re``, ``enum`` and ``collections`` (23 modules, a third of the
# interpreter's start-up on CPU: ``python -c "import json"`` 29 ms of CPU against 17 for
# ``pass`` at load 23); nor is ``contextlib`` imported, which brings ``collections``. The
# hooks' configs run the interpreter with ``-S``: the hook needs nothing of site-packages,
# whose ``.pth`` files cost every start (``python -S -c pass`` 12 ms of CPU against 17).

try:
    import _json
except ImportError:  # an interpreter without CPython's codec
    _json = None

_JSON_CONSTANTS: dict[str, float] = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Decoding:
    """What ``_json``'s scanner reads of a decoder: ``json.JSONDecoder()``'s defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _JSON_CONSTANTS.__getitem__


def _not_serializable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


if _json is not None:
    _scan = _json.make_scanner(_Decoding())
    _encode = _json.make_encoder({}, _not_serializable, _json.encode_basestring, None, ": ", ", ", False, False,
                                 True)

    def json_loads(data: bytes | str) -> object:
        """``json.loads``: ValueError for anything that is not one JSON value."""
        text = (data.decode("utf-8") if isinstance(data, bytes) else data).strip(" \t\n\r")
        try:
            value, end = _scan(text, 0)
        except (StopIteration, SystemError):
            # A malformed string or number is reported through json.decoder's error class,
            # which CPython before 3.12 only finds when json.decoder is imported already: here
            # it is not, and the scanner fails with a SystemError instead.
            raise ValueError("not JSON") from None
        if end != len(text):
            raise ValueError("not one JSON value")
        return value

    def json_dumps(value: dict[str, object]) -> str:
        """``json.dumps(value, ensure_ascii=False)`` of a dict."""
        return "".join(_encode(value, 0))
else:
    import json

    json_loads = json.loads

    def json_dumps(value: dict[str, object]) -> str:
        return json.dumps(value, ensure_ascii=False)

# -- constants (the daemon's side lives in keymem_daemon/runtime.py and config.py) -------

INFO_FILE = "daemon.json"
SPAWN_STAMP = "hook-start.stamp"
"""Touched under the data dir when the hook starts a daemon."""
SPAWN_QUIET_S = 30.0
"""After starting a daemon, the hook starts no other one for this long."""
DEFAULT_TIMEOUT_MS = 2000
PROBE_TIMEOUT_S = 0.5
"""session-start's check that the daemon answers and proves itself."""
PROOF_VERSION = "keymem-health-v1"
"""What the daemon's /health proof signs (runtime.PROOF_VERSION)."""
NONCE_BYTES = 16
DEFAULT_TOP_K = 2
DEFAULT_MIN_CHARS = 6
MAX_CHARS_RANGE = (256, 9500)
"""What the hook may ask for: the daemon's minimum, and room under the host cap."""
HOST_CONTEXT_CAP = 10000
"""Claude Code and Codex both cap additionalContext at 10,000 characters."""
PROMPT_SEND_CHARS = 64000
"""A pasted log or stack trace is read whole up to this (the daemon's push.PROMPT_READ_CHARS);
a longer prompt is sent as its head and tail, where the question and the error usually are."""
MAX_RESPONSE_BYTES = 1 << 20
VENV_MARKER = "keymem-plugin-version"
"""Written into ``<data>/venv`` by the plugin's bootstrap after a verified install."""
HOST_SESSION_VARS = ("CLAUDE_CODE_SESSION_ID", "CODEX_THREAD_ID")
"""Never inherited by a daemon the hook starts (it serves every session)."""
_FALSE = ("0", "false", "no", "off")
_INFO_TYPES = {
    "pid": (int,),
    "port": (int,),
    "token": (str,),
    "version": (str,),
    "started_at": (int, float),
    "data_dir": (str,),
}
"""daemon.json's required fields and their JSON types (``embedder`` is optional)."""

MODES = ("user-prompt-submit", "session-start")
EVENT_MODES = {"UserPromptSubmit": "user-prompt-submit", "SessionStart": "session-start"}


class HookFailure(Exception):
    """Anything that ends a run early; its message goes only to the debug log."""


class NotTheDaemon(HookFailure):
    """Whatever answers on daemon.json's port did not prove it is keymemd."""


# -- settings -----------------------------------------------------------------------------


def env_int(environ: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """An integer variable clamped to [low, high]; unset or malformed gives ``default``."""
    try:
        value = int(environ.get(name, "").strip())
    except ValueError:
        return default
    return max(low, min(high, value))


def data_dir(environ: dict[str, str]) -> str:
    """``KEYMEM_DATA_DIR``, else ``$HOME/.keymem``: the daemon's rule (config.py)."""
    raw = environ.get("KEYMEM_DATA_DIR", "").strip()
    if raw:
        return os.path.realpath(os.path.expanduser(raw))
    home = environ.get("HOME") or os.path.expanduser("~")
    return os.path.realpath(os.path.join(home, ".keymem"))


# -- the daemon ---------------------------------------------------------------------------


def read_info(directory: str) -> tuple[int, int, str, float]:
    """``(pid, port, token, started_at)`` from ``daemon.json``, checked as
    runtime.parse_daemon_info does."""
    try:
        with open(os.path.join(directory, INFO_FILE), "rb") as handle:
            data = json_loads(handle.read(65536))
    except FileNotFoundError:
        raise HookFailure("no daemon.json") from None
    except (OSError, ValueError) as exc:
        raise HookFailure(f"unreadable daemon.json ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise HookFailure("daemon.json is not an object")
    for name, kinds in _INFO_TYPES.items():
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise HookFailure(f"daemon.json field {name} is missing or mistyped")
    embedder = data.get("embedder")
    if embedder is not None and not isinstance(embedder, str):
        raise HookFailure("daemon.json field embedder is mistyped")
    pid, port, token = int(data["pid"]), int(data["port"]), str(data["token"])
    if not (0 < port < 65536 and pid > 0):
        raise HookFailure("daemon.json names an impossible pid or port")
    if not token or not all(33 <= ord(c) < 127 for c in token):
        raise HookFailure("daemon.json token is not a header-safe string")
    return pid, port, token, float(data["started_at"])


def health_proof(token: str, nonce: str, pid: int, started_at: float) -> str:
    """runtime.health_proof: HMAC-SHA256 under the token over nonce, pid and start time."""
    message = f"{PROOF_VERSION}\n{nonce}\n{pid}\n{started_at:.6f}".encode()
    return hmac_sha256(token.encode("utf-8"), message)


SHA256_BLOCK = 64
"""SHA-256's block size in bytes: HMAC pads its key to it (RFC 2104)."""


def hmac_sha256(key: bytes, message: bytes) -> str:
    """RFC 2104 HMAC over SHA-256, as ``hmac.new(key, message, hashlib.sha256).hexdigest()``."""
    if len(key) > SHA256_BLOCK:
        key = sha256(key)
    key = key.ljust(SHA256_BLOCK, b"\0")
    inner = sha256(bytes(b ^ 0x36 for b in key) + message)
    return sha256(bytes(b ^ 0x5C for b in key) + inner).hex()


def sha256(data: bytes) -> bytes:
    """SHA-256 from the interpreter's built-in module (``_sha2`` from 3.12, ``_sha256``
    before; named by string, one per version), hashlib's where neither is built in."""
    try:
        module = __import__("_sha2" if sys.version_info >= (3, 12) else "_sha256")
    except ImportError:
        import hashlib

        return hashlib.sha256(data).digest()
    return bytes(module.sha256(data).digest())


def same_digest(a: str, b: str) -> bool:
    """Constant-time comparison (``hmac.compare_digest`` is this function)."""
    from _operator import _compare_digest

    return bool(_compare_digest(a, b))


def pid_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # os.kill(pid, 0) would terminate it on Windows: let the connect decide
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise HookFailure("timed out")
    return left


def exchange(sock: _socket.socket, request: bytes, deadline: float) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on ``sock`` and read its response by ``deadline``: (status, body).

    A raw socket rather than http.client: importing that costs more than the request.
    """
    sock.settimeout(remaining(deadline))
    sock.sendall(request)
    data = b""
    expected = -1
    header_end = -1
    while True:
        sock.settimeout(remaining(deadline))
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_RESPONSE_BYTES:
            raise HookFailure("response too large")
        if header_end < 0:
            header_end = data.find(b"\r\n\r\n")
            if header_end >= 0:
                expected = content_length(data[:header_end])
        if expected >= 0 and len(data) - header_end - 4 >= expected:
            break
    if header_end < 0:
        raise HookFailure("no HTTP response")
    lines = data[:header_end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise HookFailure("malformed status line")
    payload = data[header_end + 4 :]
    if expected >= 0:
        payload = payload[:expected]
    elif any(h.lower().replace(" ", "") == "transfer-encoding:chunked" for h in lines[1:]):
        payload = dechunk(payload)
    return int(parts[1]), payload


def verify(sock: _socket.socket, daemon: tuple[int, int, str, float], deadline: float) -> None:
    """Make whatever ``sock`` reaches prove it is daemon.json's daemon; NotTheDaemon if not.

    Sends only a fresh nonce (never the token); the connection stays open for the request.
    """
    pid, port, token, started_at = daemon
    nonce = os.urandom(NONCE_BYTES).hex()
    request = f"GET /health?nonce={nonce} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: keep-alive\r\n\r\n"
    status, body = exchange(sock, request.encode("ascii"), deadline)
    try:
        answer = json_loads(body)
    except ValueError:
        raise NotTheDaemon("not keymemd: /health is not JSON") from None
    if status != 200 or not isinstance(answer, dict) or answer.get("pid") != pid:
        raise NotTheDaemon("not keymemd: not its /health")
    proof = answer.get("proof")
    if not isinstance(proof, str):
        raise NotTheDaemon("not keymemd: no proof")
    if not same_digest(proof, health_proof(token, nonce, pid, started_at)):
        raise NotTheDaemon("not keymemd: wrong proof")


def post_json(
    sock: _socket.socket, port: int, path: str, token: str, body: bytes, deadline: float
) -> tuple[int, bytes]:
    """One POST on a verified connection to the daemon: (status, body)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    return exchange(sock, head + body, deadline)


def connect(port: int, timeout: float) -> _socket.socket:
    """A TCP connection to 127.0.0.1 (no name lookup, unlike socket.create_connection)."""
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return -1


def dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return out
        out += rest[:size]
        data = rest[size + 2 :]


def proves_itself(daemon: tuple[int, int, str, float], deadline: float) -> bool:
    """session-start: does daemon.json's daemon answer and prove itself? A slow answer
    counts (a busy daemon is still there: starting another would not help)."""
    budget = time.monotonic() + min(PROBE_TIMEOUT_S, remaining(deadline))
    try:
        sock = connect(daemon[1], remaining(budget))
    except OSError as exc:
        return not isinstance(exc, ConnectionRefusedError)
    try:
        verify(sock, daemon, budget)
    except NotTheDaemon:
        return False
    except (OSError, ValueError, HookFailure):
        return True
    finally:
        sock.close()
    return True


# -- starting the daemon ------------------------------------------------------------------


def daemon_command(environ: dict[str, str], directory: str) -> list[str] | None:
    """The command that runs a daemon for ``directory``, or None when keymem is not found.

    The same ``run --background`` line as runtime.daemon_command.
    """
    run = ["--data-dir", directory, "run", "--background"]
    python = environ.get("KEYMEM_PYTHON", "").strip()
    if python:
        return [python, "-m", "keymem_daemon", *run]
    import importlib.util

    if sys.flags.no_site:
        # Run with -S (as the hooks' configs do): site-packages, where pip put keymem, only now.
        import site

        site.main()
    if sys.executable and importlib.util.find_spec("keymem_daemon") is not None:
        return [sys.executable, "-m", "keymem_daemon", *run]
    import shutil

    keymemd = shutil.which("keymemd", path=environ.get("PATH"))
    if keymemd:
        return [keymemd, *run]
    # The plugin launcher's venv, once its install is verified (plugin/bootstrap.py writes
    # the version marker last): a venv still being built is left alone.
    venv = os.path.join(directory, "venv")
    bin_dir, name = ("Scripts", "keymemd.exe") if os.name == "nt" else ("bin", "keymemd")
    private = os.path.join(venv, bin_dir, name)
    if os.path.isfile(os.path.join(venv, VENV_MARKER)) and os.access(private, os.X_OK):
        return [private, *run]
    return None


def start_daemon(environ: dict[str, str], directory: str) -> str:
    """Start a daemon in the background unless one was started moments ago; says what it did."""
    if environ.get("KEYMEM_AUTOSTART", "").strip().lower() in _FALSE:
        return "autostart off"
    stamp = os.path.join(directory, SPAWN_STAMP)
    try:
        if time.time() - os.stat(stamp).st_mtime < SPAWN_QUIET_S:
            return "a daemon is starting"
    except OSError:
        pass
    command = daemon_command(environ, directory)
    if command is None:
        return "keymem not found; no daemon started"
    logs = os.path.join(directory, "logs")
    os.makedirs(directory, mode=0o700, exist_ok=True)  # private, as the daemon makes it
    os.makedirs(logs, mode=0o700, exist_ok=True)
    with open(stamp, "w", encoding="ascii") as handle:
        handle.write(f"{time.time():.3f} {os.getpid()}\n")
    import subprocess

    options: dict[str, object] = {}
    if os.name == "nt":
        options["creationflags"] = 0x00000008 | 0x00000200  # DETACHED_PROCESS, new group
    else:
        options["start_new_session"] = True
    env = {k: v for k, v in environ.items() if k not in HOST_SESSION_VARS}
    try:
        with open(os.path.join(logs, "daemon.log"), "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                cwd=directory,
                close_fds=True,
                **options,  # type: ignore[call-overload]
            )
    except OSError as exc:
        # The stamp stays: a broken interpreter is not retried on every prompt.
        return f"could not start a daemon ({type(exc).__name__}: {exc})"
    process.returncode = 0  # never waited for: it outlives us (no ResourceWarning)
    return f"started a daemon (pid {process.pid})"


# -- the run ------------------------------------------------------------------------------


def fit(context: str, cap: int) -> str | None:
    """The block within ``cap`` characters, dropping whole memory lines from the end."""
    if len(context) <= cap:
        return context
    lines = context.split("\n")
    head, body, tail = lines[:2], lines[2:-1], lines[-1:]
    while body and len("\n".join(head + body + tail)) > cap:
        body.pop()
    return "\n".join(head + body + tail) if body else None


def parse_args(argv: list[str]) -> tuple[str | None, bool]:
    mode = next((a for a in argv if a in MODES), None)
    return mode, "--codex" in argv


def read_payload() -> dict[str, object]:
    stdin = sys.stdin
    if stdin is None or stdin.isatty():
        raise HookFailure("no stdin")
    try:
        data = json_loads(stdin.buffer.read())
    except ValueError:
        raise HookFailure("stdin is not JSON") from None
    if not isinstance(data, dict):
        raise HookFailure("stdin is not a JSON object")
    return data


def text_field(payload: dict[str, object], name: str) -> str | None:
    value = payload.get(name)
    return value if isinstance(value, str) and value else None


def run(argv: list[str], environ: dict[str, str], started: float, note: dict[str, object]) -> str | None:
    """One hook run; returns the JSON to print, or None. Raises HookFailure to stop early."""
    timeout_ms = env_int(environ, "KEYMEM_HOOK_TIMEOUT_MS", DEFAULT_TIMEOUT_MS, 50, 60000)
    deadline = started + timeout_ms / 1000.0
    mode, codex = parse_args(argv)
    payload = read_payload()
    if mode is None:
        mode = EVENT_MODES.get(str(payload.get("hook_event_name")))
    # Codex sends turn_id and model on UserPromptSubmit; Claude Code sends neither there.
    codex = codex or ("turn_id" in payload and "model" in payload)
    note.update(mode=mode, agent="codex" if codex else "claude")
    if mode is None:
        raise HookFailure("unknown mode")
    directory = data_dir(environ)

    if mode == "session-start":
        try:
            daemon = read_info(directory)
            alive = pid_alive(daemon[0]) and proves_itself(daemon, deadline)
        except HookFailure as exc:
            note["daemon"] = str(exc)
            alive = False
        note["outcome"] = "daemon answers" if alive else start_daemon(environ, directory)
        return None

    prompt = payload.get("prompt")
    if not isinstance(prompt, str):
        raise HookFailure("no prompt")
    stripped = prompt.strip()
    min_chars = env_int(environ, "KEYMEM_HOOK_MIN_CHARS", DEFAULT_MIN_CHARS, 0, 10000)
    note["prompt_chars"] = len(stripped)
    if not stripped or len(stripped) < min_chars:
        raise HookFailure("prompt too short")
    if stripped.startswith("/"):
        raise HookFailure("slash command")

    try:
        daemon = read_info(directory)
        if not pid_alive(daemon[0]):
            raise HookFailure("daemon.json names a dead pid")
    except HookFailure as exc:
        note["daemon"] = str(exc)
        raise HookFailure(start_daemon(environ, directory)) from None

    if len(stripped) > PROMPT_SEND_CHARS:
        half = PROMPT_SEND_CHARS // 2
        stripped = stripped[:half] + "\n" + stripped[-half:]
    request: dict[str, object] = {
        "prompt": stripped,
        "top_k": env_int(environ, "KEYMEM_HOOK_TOP_K", DEFAULT_TOP_K, 1, 10),
        "agent": "codex" if codex else "claude",
    }
    # Hosts run hooks in the session's directory; the payload's cwd is the better witness.
    request["cwd"] = text_field(payload, "cwd") or os.getcwd()
    session = text_field(payload, "session_id")
    if session is not None:
        request["session_id"] = session
    if environ.get("KEYMEM_HOOK_MAX_CHARS", "").strip():
        low, high = MAX_CHARS_RANGE
        request["max_chars"] = env_int(environ, "KEYMEM_HOOK_MAX_CHARS", 2000, low, high)
    body = json_dumps(request).encode("utf-8")

    sent = time.monotonic()
    _, port, token, _ = daemon
    try:
        sock = connect(port, remaining(deadline))
        try:
            verify(sock, daemon, deadline)
            status, answer = post_json(sock, port, "/v1/inject", token, body, deadline)
        finally:
            sock.close()
    except (ConnectionRefusedError, NotTheDaemon) as exc:
        note["daemon"] = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
        raise HookFailure(start_daemon(environ, directory)) from None
    except (OSError, ValueError, HookFailure) as exc:  # a socket timeout is an OSError
        raise HookFailure(f"request failed ({type(exc).__name__}: {exc})") from None
    note["http_ms"] = round((time.monotonic() - sent) * 1000, 1)
    if status != 200:
        raise HookFailure(f"daemon answered {status}")
    try:
        result = json_loads(answer)
    except ValueError:
        raise HookFailure("response is not JSON") from None
    context = result.get("context") if isinstance(result, dict) else None
    note["daemon_ms"] = result.get("took_ms") if isinstance(result, dict) else None
    if not isinstance(context, str) or not context.strip():
        note["outcome"] = "nothing relevant"
        return None
    context = fit(context, HOST_CONTEXT_CAP)
    if context is None:
        raise HookFailure("block larger than the host cap")
    note.update(outcome="surfaced", context_chars=len(context))
    output = {"hookEventName": "UserPromptSubmit", "additionalContext": context}
    return json_dumps({"hookSpecificOutput": output})


def write_stdout(text: str) -> None:
    """Write and flush all of it before the process exits (upstream lost output on a pipe)."""
    out = sys.stdout.buffer
    out.write(text.encode("utf-8"))
    out.flush()


def silence_stdout() -> None:
    """After a failed write, point fd 1 at /dev/null so the exit-time flush cannot complain."""
    try:  # noqa: SIM105 -- contextlib imports collections and functools (see the imports)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except Exception:
        pass


def debug_log(environ: dict[str, str], started: float, note: dict[str, object]) -> None:
    path = environ.get("KEYMEM_HOOK_DEBUG_LOG", "").strip()
    if not path:
        return
    note["total_ms"] = round((time.monotonic() - started) * 1000, 1)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    with open(os.path.expanduser(path), "a", encoding="utf-8") as handle:
        handle.write(f"{stamp} keymem-hook {json_dumps(note)}\n")


def main(argv: list[str] | None = None) -> int:
    """Run the hook; always returns 0 (the console script's exit code)."""
    started = time.monotonic()
    note: dict[str, object] = {"pid": os.getpid()}
    environ = dict(os.environ)
    try:
        output = run(sys.argv[1:] if argv is None else argv, environ, started, note)
        if output is not None:
            write_stdout(output)
    except HookFailure as exc:
        note.setdefault("outcome", str(exc))
    except BaseException as exc:  # never raise, never print: a broken hook must not block a prompt
        note["outcome"] = f"error {type(exc).__name__}: {exc}"
        silence_stdout()
    try:  # noqa: SIM105 -- as in silence_stdout
        debug_log(environ, started, note)
    except BaseException:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
