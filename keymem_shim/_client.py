"""The shim's side of the daemon: who the host is, finding or starting keymemd, calling it.

Nothing here imports the MCP SDK: ``_server.py`` turns what this module returns into MCP
types. Everything here is light (the standard library, ``httpx``, ``anyio`` and the daemon's
``config``/``errors``/``runtime`` modules) so the shim never loads a model.

Trust: every connection to the daemon is verified before it carries the token or any
memory (``keymem_daemon.verified``): the daemon must answer a fresh nonce with the proof
only the holder of ``daemon.json``'s token can give. A port taken over by another program
(the daemon died or stopped, and the shim still has its address) fails that check like a
refused connection, so it is handled the same way: re-read ``daemon.json``, restart.

Recovery, in one place (``DaemonClient``):

- A tool call that cannot reach the daemon (connection refused, or the connection dropped
  mid-request because the daemon died) restarts it -- ``runtime.start_daemon`` under the
  data dir's start lock, so racing shims start one daemon -- and retries **once**. Every
  call carries a fresh ``Idempotency-Key``, reused on that retry; the daemon honours it for
  the write tools, so a write that reached the daemon before the connection dropped is
  answered from its first result instead of being stored twice.
- A daemon that answers ``503`` (still loading) is waited for, up to ``start_timeout``,
  and the call is then retried once.
- A daemon that cannot be started is reported in the tool result (``is_error``), naming
  the log file; nothing waits longer than ``start_timeout``.
- Listing tools and prompts needs a daemon that answers, not a ready one (the daemon serves
  its definitions while the models load), so those wait at most ``ANSWER_TIMEOUT``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

import anyio
import anyio.to_thread
import httpx

from keymem_daemon import runtime, verified
from keymem_daemon.config import Settings
from keymem_daemon.errors import DaemonNotRunning, KeymemError, NotFound

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT: Final = 2.0
"""Opening a loopback connection; a listening daemon accepts in microseconds."""
READ_TIMEOUT: Final = 10.0
"""Tool definitions, prompts and instructions: quick reads the daemon answers while loading."""
CALL_TIMEOUT: Final = 600.0
"""One tool call (a large ``remember_batch`` re-embeds); hosts apply their own, shorter limits."""
ANSWER_TIMEOUT: Final = 8.0
"""How long listing waits for a (re)started daemon to answer: under Codex's 10 s MCP start."""

Agent = Literal["claude", "codex"]

AGENT_HEADER: Final = "X-Keymem-Host-Agent"
SESSION_HEADER: Final = "X-Keymem-Host-Session"
CWD_HEADER: Final = "X-Keymem-Host-Cwd"
HOOK_HEADER: Final = "X-Keymem-Hook-Installed"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"

# Host session identity, in precedence order: Claude Code wins when both are set.
HOST_SESSION_VARS: Final[tuple[tuple[str, Agent], ...]] = (
    ("CLAUDE_CODE_SESSION_ID", "claude"),
    ("CODEX_THREAD_ID", "codex"),
)
_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


# -- who is calling ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostIdentity:
    """The host session this shim serves; sent with every request, so provenance is per shim."""

    agent: Agent | None = None
    session: str | None = None
    cwd: str | None = None
    hook_installed: bool = False

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], *, cwd: str | None = None, hook_installed: bool = False
    ) -> HostIdentity:
        """Claude Code's ``CLAUDE_CODE_SESSION_ID``, else Codex's ``CODEX_THREAD_ID``.

        Only a UUID (any version, any case) counts; anything else means an unknown host
        (Claude Desktop, an older client), which sends no session at all.
        """
        for variable, agent in HOST_SESSION_VARS:
            value = environ.get(variable, "").strip()
            if _UUID.fullmatch(value):
                return cls(agent, value.lower(), cwd, hook_installed)
        return cls(None, None, cwd, hook_installed)

    def headers(self) -> dict[bytes, bytes]:
        """The ``X-Keymem-Host-*`` headers (the cwd as UTF-8 bytes: paths need not be ASCII)."""
        out: dict[bytes, bytes] = {}
        if self.agent and self.session:
            out[AGENT_HEADER.encode()] = self.agent.encode()
            out[SESSION_HEADER.encode()] = self.session.encode()
        if self.cwd and "\n" not in self.cwd and "\r" not in self.cwd:
            out[CWD_HEADER.encode()] = self.cwd.encode("utf-8", "surrogateescape")
        if self.hook_installed:
            out[HOOK_HEADER.encode()] = b"true"
        return out


# -- finding and starting the daemon (blocking; runs in threads) ----------------------------


class Launcher:
    """Finds the daemon serving ``settings.data_dir`` and starts one when none answers.

    Every method blocks (file locks, polling, ``subprocess``); the async client calls them
    through ``anyio.to_thread``. A background start (``start_in_background``) lets a caller
    go on as soon as the new daemon *answers*, while the start itself still waits for it
    to be ready and holds the start lock meanwhile -- so a tool call that needs a ready
    daemon simply queues behind it.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._starter: threading.Thread | None = None
        self._start_error: str | None = None

    @property
    def log_path(self) -> str:
        return str(self.settings.log_path)

    def find(self) -> runtime.DaemonInfo | None:
        """The daemon for this data dir if it answers ``/health`` (starting or ready)."""
        return runtime.running_daemon(self.settings.data_dir)

    def _not_running(self) -> DaemonNotRunning:
        return DaemonNotRunning(
            f"keymemd is not running for {self.settings.data_dir} and autostart is off "
            "(KEYMEM_AUTOSTART=false); start it with `keymemd start`"
        )

    def start_in_background(self) -> None:
        """Run ``keymemd start`` in a thread unless one is already running."""
        with self._lock:
            if self._starter is not None and self._starter.is_alive():
                return
            self._start_error = None
            self._starter = threading.Thread(target=self._start, name="keymem-shim-start", daemon=True)
            self._starter.start()

    def _start(self) -> None:
        try:
            self._run_start()
        except DaemonNotRunning as exc:
            self._start_error = exc.message
            logger.warning("could not start keymemd: %s", exc.message)

    def _run_start(self) -> runtime.DaemonInfo:
        """``keymemd start``; a failure carries what the daemon logged about it."""
        log_path = self.settings.log_path
        offset = _file_size(log_path)
        try:
            result = runtime.start_daemon(self.settings, timeout=self.settings.start_timeout)
        except OSError as exc:
            raise DaemonNotRunning(f"could not run keymemd: {exc}") from None
        except KeymemError as exc:
            reason = last_logged_error(log_path, offset)
            if reason is None or exc.message.endswith(reason.rsplit(": ", 1)[-1]):
                raise DaemonNotRunning(exc.message) from None  # it says so already
            raise DaemonNotRunning(f"{exc.message}; its log says: {reason}") from None
        if result.started:
            logger.info("started keymemd pid %d on %s", result.info.pid, result.info.url)
        return result.info

    def wait_answering(self, timeout: float) -> runtime.DaemonInfo:
        """A daemon that answers (maybe still loading), started in the background if needed.

        A live daemon that is slow to answer is waited for, not replaced. Raises
        ``DaemonNotRunning`` when none answers within ``timeout`` seconds, at once when
        there is none and autostart is off, and as soon as a background start has failed.
        """
        launched = False

        def answering() -> runtime.DaemonInfo | None:
            nonlocal launched
            info = self.find()
            if info is not None:
                return info
            if not launched and self._live_pid() is None:
                if not self.settings.autostart:
                    raise self._not_running()
                self.start_in_background()
                launched = True
            starter = self._starter
            if launched and starter is not None and not starter.is_alive() and self._start_error:
                raise DaemonNotRunning(self._start_error)
            return None

        info = runtime.poll_until(answering, time.monotonic() + timeout)
        if info is None:
            raise DaemonNotRunning(f"keymemd did not answer within {timeout:g} s")
        return info

    def _live_pid(self) -> int | None:
        """The pid ``daemon.json`` names if it is this data dir's daemon (maybe busy)."""
        try:
            info = runtime.read_daemon_info(self.settings.data_dir)
        except DaemonNotRunning:
            return None
        return info.pid if runtime.owns_data_dir(info.pid, self.settings.data_dir) else None

    def wait_ready(self) -> runtime.DaemonInfo:
        """A ready daemon: the live one once it is ready, or one started now.

        Waits at most ``start_timeout``. A live daemon (its pid in ``daemon.json``) is
        polled, never restarted: a loading daemon can be too busy to answer one health
        check in time. One that answers ``failed`` (a corrupt store) is reported at once;
        one that dies meanwhile, or a ``daemon.json`` naming a recycled pid or a port
        another program now holds (nothing proves itself there), is replaced.
        """
        data_dir = self.settings.data_dir
        seen: tuple[int, str | None] | None = None  # (pid, status) at the last look

        def ready() -> runtime.DaemonInfo | None:
            nonlocal seen
            try:
                info = runtime.read_daemon_info(data_dir)
            except DaemonNotRunning:
                if not self.settings.autostart:
                    raise self._not_running() from None
                return self._run_start()  # under the start lock: racing shims start one
            health = runtime.get_health(info)
            if health is None and not runtime.owns_data_dir(info.pid, data_dir):
                return self._run_start()  # daemon.json names a recycled pid
            status = health.get("status") if health is not None else None
            if status == "ready":
                return info
            if status == "failed" and health is not None:
                raise DaemonNotRunning(f"keymemd (pid {info.pid}) failed to load: {health.get('error', 'see its log')}")
            seen = (info.pid, status)
            return None

        info = runtime.poll_until(ready, time.monotonic() + self.settings.start_timeout)
        if info is None:
            pid, status = seen if seen is not None else (None, None)
            raise DaemonNotRunning(
                f"keymemd (pid {pid}) was not ready within "
                f"{self.settings.start_timeout:g} s (still {status or 'not answering'})"
            )
        return info


LOG_TAIL_BYTES: Final = 64 * 1024


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def last_logged_error(path: Path, offset: int) -> str | None:
    """The last ERROR line the daemon logged after ``offset`` (its message part), if any."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0 if size < offset else offset, size - LOG_TAIL_BYTES))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        if " ERROR " in line or " CRITICAL " in line:
            return line.split("]: ", 1)[-1].strip()[:500]
    return None


def fetch_instructions(
    info: runtime.DaemonInfo, identity: HostIdentity, *, timeout: float = READ_TIMEOUT
) -> str | None:
    """``GET /v1/instructions`` (blocking, for start-up); None if the daemon does not say."""
    headers = {**_bytes(info.headers), **identity.headers()}
    try:
        with httpx.Client(transport=verified.verified_transport(info), trust_env=False, timeout=timeout) as client:
            response = client.get(f"{info.url}/v1/instructions", headers=headers)
            body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        logger.warning("could not fetch the instructions from keymemd: %s", exc)
        return None
    text = body.get("instructions") if isinstance(body, dict) else None
    if response.status_code != 200 or not isinstance(text, str):
        logger.warning("keymemd answered /v1/instructions with %d", response.status_code)
        return None
    return text


class Bootstrap(threading.Thread):
    """Find (or start) the daemon and fetch its instructions in the background.

    ``main()`` runs this while it imports the MCP SDK, then joins it until its start-up
    deadline: whatever was found by then is used, the rest is left to the tool calls.
    """

    def __init__(self, launcher: Launcher, identity: HostIdentity, *, deadline: float) -> None:
        super().__init__(name="keymem-shim-bootstrap", daemon=True)
        self._launcher = launcher
        self._identity = identity
        self._deadline = deadline
        self.info: runtime.DaemonInfo | None = None
        self.instructions: str | None = None

    def run(self) -> None:
        try:
            info = self._launcher.wait_answering(max(0.0, self._deadline - time.monotonic()))
        except DaemonNotRunning as exc:
            logger.warning("no daemon yet: %s", exc.message)
            return
        self.instructions = fetch_instructions(
            info, self._identity, timeout=max(0.2, self._deadline - time.monotonic())
        )
        self.info = info

    def result(self) -> tuple[runtime.DaemonInfo | None, str | None]:
        """``(daemon, instructions)`` as far as they got by the deadline."""
        self.join(max(0.0, self._deadline - time.monotonic()))
        info = self.info
        return info, (self.instructions if info is not None else None)


def _bytes(headers: Mapping[str, str]) -> dict[bytes, bytes]:
    return {k.encode("latin-1"): v.encode("latin-1") for k, v in headers.items()}


# -- calling the daemon ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one tool call returns to the host: the JSON result and whether it is a fault."""

    result: Any
    is_error: bool


_LOST: Final = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)
"""Transport failures that mean the daemon is gone (or went away mid-request)."""


def _error_message(response: httpx.Response) -> tuple[str, str]:
    """``(code, message)`` from the daemon's ``{"error": {code, message}}`` shape."""
    try:
        body = response.json()
    except ValueError:
        return "http_error", f"HTTP {response.status_code}: {response.text[:500]}"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error.get("code", "error")), error["message"]
    return "http_error", f"HTTP {response.status_code}: {response.text[:500]}"


class DaemonClient:
    """The async HTTP client the MCP handlers use; one per shim, closed with it.

    ``info`` is the daemon found at start-up, if any. ``transport`` replaces the network
    (unit tests pass an ``httpx.MockTransport``); ``launcher`` is what finds, starts and
    waits for daemons.
    """

    def __init__(
        self,
        launcher: Launcher,
        identity: HostIdentity,
        *,
        info: runtime.DaemonInfo | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._launcher = launcher
        self._identity = identity
        self._info = info
        self._recovering = anyio.Lock()
        self._tools: list[dict[str, Any]] | None = None
        self._http = httpx.AsyncClient(
            transport=transport or verified.verified_async_transport(self._expected),
            trust_env=False,  # never route loopback traffic through an HTTP(S)_PROXY
            timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
        )

    async def __aenter__(self) -> DaemonClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._http.aclose()

    @property
    def log_path(self) -> str:
        return self._launcher.log_path

    # -- the daemon we talk to --

    def _expected(self, port: int) -> runtime.DaemonInfo | None:
        """The daemon a new connection to ``port`` must prove to be (verified transport)."""
        info = self._info
        return info if info is not None and info.port == port else None

    async def _daemon(self, *, ready: bool) -> runtime.DaemonInfo:
        info = self._info
        if info is not None:
            return info
        return await self._recover(None, ready=ready)

    async def _recover(self, failed: runtime.DaemonInfo | None, *, ready: bool) -> runtime.DaemonInfo:
        """Find or (re)start the daemon; concurrent callers share one recovery."""
        async with self._recovering:
            current = self._info
            if not ready and current is not None and current != failed:
                return current  # another request recovered while this one waited
            if ready:
                info = await anyio.to_thread.run_sync(self._launcher.wait_ready, abandon_on_cancel=True)
            else:
                info = await anyio.to_thread.run_sync(
                    self._launcher.wait_answering, ANSWER_TIMEOUT, abandon_on_cancel=True
                )
            if info != current:
                logger.info("talking to keymemd pid %d on %s", info.pid, info.url)
            self._info = info
            return info

    def _headers(self, info: runtime.DaemonInfo, **extra: str) -> dict[bytes, bytes]:
        return {**_bytes(info.headers), **self._identity.headers(), **_bytes(extra)}

    def unavailable(self, exc: KeymemError) -> str:
        """The message an agent gets when the daemon cannot be reached or started."""
        return (
            f"keymem is unavailable: {exc.message}. The daemon's log is {self.log_path} "
            "(`keymemd status` and `keymemd logs` show more)."
        )

    # -- reads: tool definitions, prompts --

    async def _get(self, path: str) -> httpx.Response:
        """``GET path``, recovering once when the daemon is gone (it need not be ready)."""
        info = await self._daemon(ready=False)
        for attempt in (1, 2):
            try:
                response = await self._http.get(info.url + path, headers=self._headers(info))
            except _LOST as exc:
                if attempt == 2:
                    raise DaemonNotRunning(f"keymemd went away ({type(exc).__name__})") from None
                info = await self._recover(info, ready=False)
                continue
            except httpx.HTTPError as exc:
                raise DaemonNotRunning(f"keymemd did not answer {path}: {exc}") from None
            if response.status_code == 401 and attempt == 1:
                info = await self._recover(info, ready=False)  # replaced by another daemon
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(self, response: httpx.Response, path: str) -> Any:
        if response.status_code == 404:
            raise NotFound(_error_message(response)[1])
        if response.status_code != 200:
            code, message = _error_message(response)
            raise KeymemError(f"keymemd refused {path} ({code}): {message}")
        try:
            return response.json()
        except ValueError:
            raise KeymemError(f"keymemd answered {path} with something other than JSON") from None

    async def list_tools(self) -> list[dict[str, Any]]:
        """The tool definitions for this host (the last good list if the daemon is gone)."""
        try:
            body = self._json(await self._get("/v1/tools"), "/v1/tools")
        except DaemonNotRunning:
            if self._tools is None:
                raise
            logger.warning("keymemd is unavailable; serving the tool list it gave before")
            return self._tools
        tools = body.get("tools") if isinstance(body, dict) else None
        if not isinstance(tools, list):
            raise KeymemError("keymemd answered /v1/tools without a tools list")
        self._tools = [t for t in tools if isinstance(t, dict)]
        return self._tools

    async def list_prompts(self) -> dict[str, Any]:
        body = self._json(await self._get("/v1/prompts"), "/v1/prompts")
        if not isinstance(body, dict):
            raise KeymemError("keymemd answered /v1/prompts with a non-object")
        return body

    async def get_prompt(self, name: str) -> dict[str, Any]:
        path = "/v1/prompts/" + _path_segment(name)
        body = self._json(await self._get(path), path)
        if not isinstance(body, dict):
            raise KeymemError(f"keymemd answered {path} with a non-object")
        return body

    # -- tool calls --

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None) -> ToolOutcome:
        """``POST /v1/tools/{name}``; faults and an unreachable daemon become ``is_error``.

        One fresh idempotency key per call, reused by the single retry.
        """
        key = str(uuid.uuid4())
        path = "/v1/tools/" + _path_segment(name)
        body = {"arguments": dict(arguments) if arguments is not None else {}}
        retried = False
        try:
            info = await self._daemon(ready=True)
            while True:
                try:
                    response = await self._http.post(
                        info.url + path,
                        json=body,
                        headers=self._headers(info, **{IDEMPOTENCY_HEADER: key}),
                        timeout=httpx.Timeout(CALL_TIMEOUT, connect=CONNECT_TIMEOUT),
                    )
                except _LOST as exc:
                    if retried:
                        raise DaemonNotRunning(
                            f"keymemd went away again after a restart ({type(exc).__name__})"
                        ) from None
                    retried = True
                    logger.warning("keymemd is gone (%s); restarting it", type(exc).__name__)
                    info = await self._recover(info, ready=True)
                    continue
                except httpx.TimeoutException:
                    return ToolOutcome(
                        {"error": f"keymemd did not answer {name} within {CALL_TIMEOUT:g} s; see {self.log_path}"},
                        is_error=True,
                    )
                if response.status_code in (401, 503) and not retried:
                    # 503: still loading (wait for ready); 401: another daemon took over.
                    retried = True
                    info = await self._recover(info, ready=True)
                    continue
                return self._outcome(name, response)
        except DaemonNotRunning as exc:
            return ToolOutcome({"error": self.unavailable(exc)}, is_error=True)

    def _outcome(self, name: str, response: httpx.Response) -> ToolOutcome:
        if response.status_code == 200:
            try:
                body = response.json()
            except ValueError:
                body = None
            if isinstance(body, dict) and "result" in body:
                return ToolOutcome(body["result"], bool(body.get("is_error", False)))
            return ToolOutcome({"error": f"keymemd answered {name} without a result"}, True)
        code, message = _error_message(response)
        if response.status_code == 503:
            return ToolOutcome({"error": f"{message} (see {self.log_path})", "code": code}, True)
        if response.status_code == 404:
            return ToolOutcome({"error": message}, True)
        return ToolOutcome({"error": message, "code": code}, True)


def _path_segment(name: str) -> str:
    """A tool or prompt name as one URL path segment (a name can never escape its route)."""
    return urllib.parse.quote(name, safe="")
