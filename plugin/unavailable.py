"""keymem's stand-in MCP server while its private venv is being built (or could not be).

Standard library only. ``plugin/launcher.sh`` runs it when no keymem-shim is installed yet:

1. It starts the venv bootstrap in the background (``bootstrap.py``; one at a time).
2. It waits up to ``KEYMEM_BOOTSTRAP_WAIT`` seconds (default 0) for the bootstrap to finish.
   If it does, it execs the real shim before reading a byte of stdin, so the host talks to
   keymem as if nothing had happened.
3. Otherwise it answers MCP itself, at once, so the host gets a clear message instead of a
   start-up timeout (Codex allows a server 10 s; a first install takes a minute or more;
   ``codex exec`` does not even wait for a server that is slow to answer ``initialize``):
   ``initialize`` carries instructions saying keymem is installing (or failed, and why),
   with the log's path; ``tools/list`` lists one ``keymem_status`` tool; every
   ``tools/call`` returns an ``is_error`` result with the same message.
4. When the bootstrap finishes during the session, it hands over: it starts the real shim,
   replays the host's ``initialize`` to it, then relays every message both ways and sends
   ``notifications/tools/list_changed`` so the host fetches the real tools. A host that
   ignores the notification gets them in its next session.

Messages are newline-delimited JSON-RPC on stdin/stdout; diagnostics go to stderr and to
``<data>/logs/bootstrap.log``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO, Final

sys.dont_write_bytecode = True  # leave the host's copy of the plugin as it was installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bootstrap  # noqa: E402  (this directory, not an installed package)

SERVER_NAME: Final = "keymem"
STATUS_TOOL: Final = "keymem_status"
DEFAULT_WAIT: Final = 0.0
"""Seconds to wait for a running bootstrap before answering as the stand-in. None by
default: an install takes far longer than any host waits (Codex allows 10 s, Claude Code
30 s, and ``codex exec`` starts the first turn without a server that has not answered), and
the stand-in hands over by itself once the venv is ready."""
WATCH_INTERVAL: Final = 1.0
"""How often a serving stand-in checks whether the venv has become ready."""
HANDOFF_TIMEOUT: Final = 60.0
"""How long the real shim may take to answer the replayed ``initialize``."""
PROTOCOL_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
REPLAY_ID: Final = "keymem-handoff-initialize"
PROBE_ID: Final = "keymem-handoff-tools"
METHOD_NOT_FOUND: Final = -32601
INVALID_REQUEST: Final = -32600
PARSE_ERROR: Final = -32700


def wait_seconds(environ: dict[str, str]) -> float:
    try:
        value = float(environ.get("KEYMEM_BOOTSTRAP_WAIT", "").strip())
    except ValueError:
        return DEFAULT_WAIT
    return max(0.0, min(value, 600.0))


def failed(paths: bootstrap.Paths, since: float | None) -> bool:
    """The last attempt failed, none is running, and (with ``since``) it ended after then."""
    state = bootstrap.read_state(paths)
    if state.get("state") != "failed" or bootstrap.attempt_running(paths):
        return False
    return since is None or float(state.get("finished_at") or 0) >= since


def describe(paths: bootstrap.Paths, since: float | None = None) -> str:
    """What the agent (and, through it, the user) is told while keymem is unavailable.

    ``since``: when this process started an attempt; an older failure is not news then.
    """
    state = bootstrap.read_state(paths)
    retry = f"sh {paths.root / 'plugin' / 'launcher.sh'} --bootstrap"
    if not failed(paths, since):
        text = (
            f"keymem (long-term memory) is installing its Python dependencies into "
            f"{paths.venv}. This happens once and takes a minute or two. Its memory tools are "
            f"not available yet; they appear when the install finishes (in this session if "
            f"the host reloads tools, otherwise in the next one). Progress: {paths.log}."
        )
        previous = state.get("previous_error") or (
            state.get("error") if state.get("state") == "failed" else None
        )
        if previous:
            text += f" The previous attempt failed: {previous}"
    else:
        error = state.get("error") or "unknown error"
        text = (
            f"keymem (long-term memory) could not install its Python dependencies: {error}. "
            f"Details: {paths.log}. keymem retries when a session starts; to retry now run "
            f"`{retry}`, or install keymem so that keymem-shim is on PATH "
            f"(pipx install {paths.root})."
        )
    return text + (
        " Memory is unavailable for now: work normally, and mention this only if the user "
        "asks about memory or keymem."
    )


class Output:
    """stdout, one JSON message per line, from any thread."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        self.write_line(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode())

    def write_line(self, line: bytes) -> None:
        with self._lock:
            self._stream.write(line.rstrip(b"\r\n") + b"\n")
            self._stream.flush()


class Standin:
    """The stand-in server, and the relay it becomes once the real shim runs."""

    def __init__(
        self, paths: bootstrap.Paths, version: str, out: Output, *, since: float | None = None
    ) -> None:
        self.paths = paths
        self.version = version
        self.since = since
        self.out = out
        self.lock = threading.Lock()
        self.initialize: dict[str, Any] | None = None
        self.negotiated: str | None = None
        self.initialized = False
        self.child: subprocess.Popen[bytes] | None = None
        self.handoff_failed = False
        self.closed = threading.Event()

    # -- answering as the stand-in ------------------------------------------------------

    def handle(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self.out.send(error_response(None, INVALID_REQUEST, "not a JSON-RPC 2.0 message"))
            return
        method = message.get("method")
        has_id = "id" in message
        if not isinstance(method, str):
            return  # a response to something we never asked: ignore
        if not has_id:
            if method == "notifications/initialized":
                self.initialized = True
            return
        ident = message["id"]
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        if method == "initialize":
            self.initialize = message
            self.out.send(result_response(ident, self.initialize_result(params)))
        elif method == "ping":
            self.out.send(result_response(ident, {}))
        elif method == "tools/list":
            self.out.send(result_response(ident, {"tools": [status_tool()]}))
        elif method == "tools/call":
            text = describe(self.paths, self.since)
            self.out.send(result_response(ident, {
                "content": [{"type": "text", "text": text}],
                "isError": True,
            }))
        else:
            self.out.send(error_response(ident, METHOD_NOT_FOUND, f"method not found: {method}"))

    def initialize_result(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[1]
        self.negotiated = version
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": SERVER_NAME, "version": self.version},
            "instructions": describe(self.paths, self.since),
        }

    # -- handing over to the real shim --------------------------------------------------

    def spawn_shim(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(self.paths.shim)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=None, env=dict(os.environ), close_fds=True,
        )

    def hand_over(self, *, replay: bool) -> bool:
        """Start the real shim and route everything to it; call with ``self.lock`` held."""
        bootstrap.log(self.paths, "venv ready: handing the MCP session over to keymem-shim")
        try:
            child = self.spawn_shim()
        except OSError as exc:
            self.fail_handoff(f"could not start {self.paths.shim}: {exc}")
            return False
        assert child.stdin is not None and child.stdout is not None
        if replay:
            assert self.initialize is not None
            # The version the host and the stand-in agreed on, so the shim speaks it too.
            params = dict(self.initialize.get("params") or {}, protocolVersion=self.negotiated)
            request = dict(self.initialize, id=REPLAY_ID, params=params)
            if not self.replay(child, request):
                child.kill()
                child.wait()
                self.fail_handoff("keymem-shim did not answer the replayed initialize")
                return False
        self.child = child
        threading.Thread(target=self.pump, args=(child,), daemon=True).start()
        if replay:
            self.out.send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return True

    def replay(self, child: subprocess.Popen[bytes], request: dict[str, Any]) -> bool:
        """Bring the real shim to where the host's session is, swallowing its answers.

        The host's ``initialize`` again (and ``initialized`` if the host sent it), then one
        ``tools/list``: it returns once the shim has reached its daemon, so the host's own
        refresh after ``list_changed`` is answered at once.
        """
        if not self.exchange(child, request):
            return False
        try:
            if self.initialized:
                self.send_to(child, {"jsonrpc": "2.0", "method": "notifications/initialized"})
                self.exchange(child, {"jsonrpc": "2.0", "id": PROBE_ID, "method": "tools/list"})
        except OSError:
            return False
        return True

    @staticmethod
    def send_to(child: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        assert child.stdin is not None
        child.stdin.write(json.dumps(message).encode() + b"\n")
        child.stdin.flush()

    def exchange(self, child: subprocess.Popen[bytes], request: dict[str, Any]) -> bool:
        """Send one request to the shim and wait for (and drop) its answer."""
        answered = threading.Event()

        def read_answer() -> None:
            assert child.stdout is not None
            for line in child.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict) and message.get("id") == request["id"]:
                    answered.set()
                    return

        reader = threading.Thread(target=read_answer, daemon=True)
        try:
            self.send_to(child, request)
        except OSError:
            return False
        reader.start()
        if not answered.wait(HANDOFF_TIMEOUT):
            return False
        reader.join()
        return True

    def fail_handoff(self, reason: str) -> None:
        self.handoff_failed = True
        bootstrap.log(self.paths, f"handoff failed: {reason}")
        print(f"keymem: {reason}", file=sys.stderr, flush=True)

    def pump(self, child: subprocess.Popen[bytes]) -> None:
        """The real shim's stdout to ours, until it exits; then this process ends too."""
        assert child.stdout is not None
        for line in child.stdout:
            self.out.write_line(line)
        code = child.wait()
        self.closed.set()
        os._exit(code if code > 0 else 0)

    def watch(self) -> None:
        """Poll for a ready venv and hand over as soon as the host has initialized."""
        while not self.closed.is_set():
            time.sleep(WATCH_INTERVAL)
            with self.lock:
                if self.child is not None or self.handoff_failed:
                    return
                if self.initialize is None or not bootstrap.is_ready(self.paths, self.version):
                    continue
                self.hand_over(replay=True)
                return

    def feed(self, line: bytes) -> None:
        """One line from the host."""
        with self.lock:
            if self.child is None and not self.handoff_failed and self.initialize is None \
                    and bootstrap.is_ready(self.paths, self.version):
                self.hand_over(replay=False)  # nothing answered yet: the shim takes it all
            child = self.child
            if child is None:
                try:
                    message = json.loads(line)
                except ValueError:
                    self.out.send(error_response(None, PARSE_ERROR, "invalid JSON"))
                    return
                self.handle(message)
                return
        assert child.stdin is not None
        try:
            child.stdin.write(line.rstrip(b"\r\n") + b"\n")
            child.stdin.flush()
        except OSError:
            pass  # the shim exited; pump() ends this process

    def serve(self, stdin: BinaryIO) -> int:
        threading.Thread(target=self.watch, daemon=True).start()
        for line in stdin:
            if line.strip():
                self.feed(line)
        self.closed.set()
        with self.lock:
            child = self.child
        if child is not None:
            assert child.stdin is not None
            with contextlib.suppress(OSError):
                child.stdin.close()
            try:
                return child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.terminate()
                return child.wait()
        return 0


def status_tool() -> dict[str, Any]:
    return {
        "name": STATUS_TOOL,
        "description": (
            "Why keymem's memory tools are not available yet (installing, or the install "
            "failed) and where its log is. The real tools replace this one when ready."
        ),
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
    }


def result_response(ident: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def error_response(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def exec_shim(paths: bootstrap.Paths) -> None:
    """Replace this process with the real shim (stdin untouched: it reads the host's first
    message itself)."""
    os.execv(str(paths.shim), [str(paths.shim)])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: unavailable.py PLUGIN_ROOT", file=sys.stderr)
        return 2
    paths = bootstrap.paths_for(argv[0])
    try:
        version = bootstrap.plugin_version(paths.root)
    except bootstrap.BootstrapError as exc:
        version = "unknown"
        bootstrap.write_state(paths, state="failed", error=str(exc))
    since: float | None = None
    if version != "unknown" and not bootstrap.is_ready(paths, version):
        since = time.time()
        pid = bootstrap.start(paths)
        if pid is not None:
            bootstrap.log(paths, f"launcher started bootstrap pid {pid}")
        wait = wait_seconds(dict(os.environ))
        if wait > 0:
            bootstrap.poll_until(lambda: bootstrap.is_ready(paths, version) or failed(paths, since) or None,
                                 time.monotonic() + wait)
    if version != "unknown" and bootstrap.is_ready(paths, version):
        exec_shim(paths)
    message = describe(paths, since)
    bootstrap.log(paths, f"serving the stand-in MCP server: {message}")
    if failed(paths, since) or version == "unknown":
        # Hosts file a server's stderr under errors: only a failure goes there.
        print(f"keymem: {message}", file=sys.stderr, flush=True)
    standin = Standin(paths, version, Output(sys.stdout.buffer), since=since)
    # Hosts end a server with SIGINT or SIGTERM: leave quietly (a handed-over shim sees
    # its stdin close and exits too).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        return standin.serve(sys.stdin.buffer)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
