"""The HTTP edge of the daemon: ``create_app(service, settings, token)``.

Routes map one-to-one onto ``Service`` methods (``DESIGN.md`` §2); pydantic appears only
here, for request and response bodies, so the OpenAPI document (``GET /openapi.json``,
token required) describes every route exactly.

Every request first passes ``_Guard``, a pure ASGI middleware that refuses, before any
route runs or any body is read:

- a ``Host`` other than ``127.0.0.1:<port>`` / ``localhost:<port>``, and any ``Origin``
  header (403: DNS rebinding and browser pages) -- except that the inspector's ``/ui``
  pages accept their own origin, and authorise by their session cookie, not the token
  (``keymem_daemon/ui``); no other route ever reads the cookie;
- a missing or wrong bearer token on anything but ``GET /health`` (401, compared in
  constant time);
- a POST body that is not ``application/json`` (415) or is larger than
  ``KEYMEM_MAX_BODY_BYTES`` (413, decided from ``Content-Length`` without reading it, or
  as soon as a chunked body passes the cap).

Errors have one shape, ``{"error": {"code", "message"}}``: ``KeymemError`` renders its own
``status``/``code``, request validation is 422 ``invalid_input``, routing misses are 404 /
405, anything else is a 500 logged with its traceback.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import anyio
import anyio.to_thread
from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keymem_daemon import __version__, runtime
from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import Host
from keymem_daemon.engine.records import render
from keymem_daemon.errors import (
    ForbiddenOrigin,
    InvalidInput,
    KeymemError,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from keymem_daemon.service import InjectRequest, Service
from keymem_daemon.ui.routes import INSPECT_PREFIX, UI_IMPORT_PATH, UI_PREFIX, build_apps

logger = logging.getLogger(__name__)

PUBLIC_PATHS: Final = frozenset({"/health"})
"""The only paths served without the bearer token."""
IMPORT_PATH: Final = "/v1/import"
TOOLS_PATH: Final = "/v1/tools"
IMPORT_PATHS: Final = frozenset({IMPORT_PATH, UI_IMPORT_PATH})
IMPORT_MAX_BYTES: Final = 512 * 1024 * 1024
"""Imports carry whole exports, so they take more than ``KEYMEM_MAX_BODY_BYTES``."""
BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
MAX_IDEMPOTENCY_KEY: Final = 200
STORE_THREADS: Final = 32
"""Worker threads for tool calls, inject, export (writes still go through one writer)."""
QUICK_THREADS: Final = 8
"""Worker threads for quick reads that must answer during a burst of writes."""
MAX_JSON_DEPTH: Final = 64
"""Deepest nesting a request body may have. Real bodies (an import's memory with its source
object) stay under ten levels; the bound keeps every later walk of a value far from Python's
recursion limit, which the parser itself hits near 1,000 levels."""
PARSE_INLINE_BYTES: Final = 1024 * 1024
"""Bodies up to this size are parsed on the event loop (a thread hop would cost more); larger
ones (imports) in a worker thread, so other requests are answered meanwhile."""
MAX_NUMBER_CHARS: Final = 100
"""Longest number literal a body may hold. No argument needs more digits; Python refuses to
read an integer of over 4,300 digits and reads long ones in quadratic time."""


# -- request and response bodies -----------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable error code, e.g. not_found.")
    message: str = Field(description="What is wrong, for a human or an agent.")


class ErrorOut(BaseModel):
    error: ErrorDetail


class HealthOut(BaseModel):
    status: Literal["starting", "ready", "failed"]
    version: str
    pid: int
    error: str | None = Field(None, description="Why loading failed (status failed only).")
    detail: str | None = Field(None, description="What a long start is doing, with its progress "
                                                 "(status starting only).")
    proof: str | None = Field(None, description="With ?nonce=: HMAC-SHA256 under the token over the nonce, "
                                                "pid and start time (runtime.health_proof), so a client knows "
                                                "it talks to the daemon of daemon.json before it sends the token.")
    warnings: list[str] | None = Field(None, description="What is wrong with the store (deleted under the "
                                                         "daemon, empty next to full backups) or was "
                                                         "repaired in it at start.")


class ToolDefinition(BaseModel):
    name: str
    description: str
    inputSchema: dict[str, Any] = Field(description="JSON Schema of the tool's arguments.")  # noqa: N815


class ToolsOut(BaseModel):
    tools: list[ToolDefinition]


class ToolCall(_Strict):
    arguments: dict[str, Any] | None = Field(None, description="The tool's arguments (see its inputSchema).")


class ToolResult(BaseModel):
    result: Any = Field(description="The tool's JSON result; refusals carry an `error` field.")
    is_error: bool = Field(description="True when the call itself was malformed (bad arguments).")


class InstructionsOut(BaseModel):
    instructions: str


class PromptArgument(BaseModel):
    name: str
    description: str | None = None
    required: bool | None = None


class PromptInfo(BaseModel):
    name: str
    description: str
    arguments: list[PromptArgument]


class PromptsOut(BaseModel):
    prompts: list[PromptInfo]


class PromptMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: dict[str, Any] = Field(description='MCP content block, e.g. {"type": "text", "text": ...}.')


class PromptOut(BaseModel):
    description: str
    messages: list[PromptMessage]


class InjectIn(_Strict):
    prompt: str = Field(description="The user's message.")
    cwd: str | None = Field(None, description="The host's working directory (selects namespaces).")
    namespace: str | None = Field(None, description="Search this namespace instead of the cwd's.")
    top_k: int = Field(2, ge=1, le=10, description="Most memories to surface.")
    max_chars: int | None = Field(None, ge=256, le=20000, description="Size of the rendered block.")
    session_id: str | None = Field(None, min_length=1, max_length=200,
                                   description="The host's session: what it was shown is not repeated.")
    agent: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt must be a non-empty string")
        return value


class KeyRefOut(BaseModel):
    concept: str
    key_id: str


class InjectedMemoryOut(BaseModel):
    id: str
    content: str
    namespace: str
    relevance_score: float
    matched_key: KeyRefOut | None
    keys: list[KeyRefOut]
    validity: dict[str, Any]
    why: str = Field(description="What in the prompt brought it, in a few words.")
    content_truncated: bool | None = None


class InjectOut(BaseModel):
    context: str | None = Field(description="The block to add to the prompt; null when nothing is relevant.")
    memories: list[InjectedMemoryOut]
    keys: list[KeyRefOut]
    took_ms: float
    skipped: str | None = Field(None, description="Why nothing was searched (too short, a slash command).")
    held_back: list[str] = Field(default_factory=list,
                                 description="Relevant memories this session was already shown, not repeated.")


class StatsOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    state: Literal["starting", "ready", "failed"]
    uptime_s: float
    data_dir: str
    store: str = Field(description='Which store: "sqlite PATH" or "postgresql HOST:PORT/DATABASE as ROLE".')


class ExportIn(_Strict):
    include_vectors: bool = Field(False, description="Also export key and memory vectors (base64).")


class ImportEvent(BaseModel):
    """One NDJSON line of ``POST /v1/import``."""

    event: Literal["progress", "done", "error"]
    phase: str | None = None
    done: int | None = None
    total: int | None = None
    result: dict[str, Any] | None = None
    error: ErrorDetail | None = None


class ShutdownOut(BaseModel):
    status: Literal["shutting_down"]


# -- errors ----------------------------------------------------------------------------------


_HTTP_CODES: Final = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        where = "body" if error.get("type") == "json_invalid" else ".".join(loc) or "body"
        message = str(error.get("msg", "invalid"))
        detail = (error.get("ctx") or {}).get("error")
        if error.get("type") == "json_invalid" and detail:
            message = f"{message} ({detail})"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        parts.append(f"{where}: {message}")
    return "; ".join(parts) or "invalid request"


def _route_hint(path: str) -> str:
    """What the caller probably meant, for a path that is one slash off a real route."""
    if path.rstrip("/") == TOOLS_PATH:
        return f" (a tool call names its tool: POST {TOOLS_PATH}/{{name}}; GET {TOOLS_PATH} lists them)"
    if path.endswith("/") and len(path) > 1:
        return f" (routes take no trailing slash: {path.rstrip('/')})"
    return ""


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    """The one exception handler: every error leaves the daemon in the same shape."""
    if isinstance(exc, KeymemError):
        if exc.status >= 500 and exc.status != 503:
            logger.warning(
                "%s %s -> %d %s: %s",
                request.method,
                request.url.path,
                exc.status,
                exc.code,
                exc.message,
            )
        return error_response(exc.status, exc.code, exc.message)
    if isinstance(exc, RequestValidationError):
        return error_response(InvalidInput.status, InvalidInput.code, _validation_message(exc))
    if isinstance(exc, StarletteHTTPException):
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}{_route_hint(request.url.path)}"
        elif exc.status_code == 405:
            message = f"{request.url.path} does not accept {request.method}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, code, message)
    logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, KeymemError.code, f"internal error: {type(exc).__name__}")


# -- request bodies ------------------------------------------------------------------------


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class _Refused:
    """A number literal the parser read but the body may not hold; the walk names its field."""

    what: str


def _parse_int(literal: str) -> int | _Refused:
    if len(literal) > MAX_NUMBER_CHARS:
        return _Refused(f"a number of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are read")
    return int(literal)


def _parse_float(literal: str) -> float | _Refused:
    if len(literal) > MAX_NUMBER_CHARS:
        return _Refused(f"a number of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are read")
    value = float(literal)
    return value if math.isfinite(value) else _Refused(f"{literal}, a number out of range; send a finite number")


def _parse_constant(name: str) -> _Refused:
    return _Refused(f"{name}, which is not JSON; send a finite number")


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON, refusing with ``InvalidInput`` what keymem cannot store or
    compute with, and saying which: bytes that are not UTF-8, a syntax error (with its line and
    column), nesting past ``MAX_JSON_DEPTH``, ``NaN``/``Infinity`` or a number that overflows
    (``1e999``) or runs past ``MAX_NUMBER_CHARS``, and a lone surrogate (``\\ud800``, or raw
    CESU-8 bytes) in any string. Every refusal after the parse names the field (``arguments.top_k``).
    """
    try:
        # Raw CESU-8 surrogates decode to lone surrogates, which the walk reports with their field.
        text = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the request body is not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset "
                           f"{exc.start} ({exc.reason}); send JSON encoded as UTF-8") from None
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                           f"column {exc.colno}") from None
    except RecursionError:
        raise InvalidInput("the request body is not usable JSON: it nests too deeply (the parser stops "
                           f"near 1,000 levels; keymem reads at most {MAX_JSON_DEPTH})") from None
    _check_json(value)
    return value


def _check_json(root: Any) -> None:
    """Walk a parsed body (without recursion) for what ``parse_json_body`` refuses."""
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        where = path or "the request body"
        if isinstance(value, _Refused):
            raise InvalidInput(f"{where} holds {value.what}", field=path or None)
        if isinstance(value, str):
            _check_text(value, where, path)
        elif isinstance(value, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise InvalidInput(f"{where} nests deeper than {MAX_JSON_DEPTH} levels", field=path or None)
            if isinstance(value, dict):
                for name, item in value.items():
                    inner = f"{path}.{name}" if path else name
                    _check_text(name, f"a field name in {where}", path)
                    stack.append((item, inner, depth + 1))
            else:
                stack.extend((item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value))


def _check_text(text: str, where: str, field: str) -> None:
    found = _SURROGATE.search(text)
    if found is not None:
        raise InvalidInput(f"{where} holds a lone surrogate (U+{ord(found.group()):04X} at character "
                           f"{found.start()}), which is not Unicode text; send valid UTF-8",
                           field=field or None)


class _JSONRequest(Request):
    """A request whose JSON body is read by ``parse_json_body`` (once; FastAPI reuses it)."""

    async def json(self) -> Any:
        if not hasattr(self, "_parsed_json"):
            body = await self.body()
            if len(body) > PARSE_INLINE_BYTES:  # an import: parse it off the event loop
                self._parsed_json = await anyio.to_thread.run_sync(parse_json_body, body)
            else:
                self._parsed_json = parse_json_body(body)
        return self._parsed_json


class _JSONRoute(APIRoute):
    """Routes that parse their body before FastAPI does, so a refusal reaches the one error
    handler with its own message (FastAPI turns any other parse failure into "There was an
    error parsing the body")."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def parse_first(request: Request) -> Response:
            strict = _JSONRequest(request.scope, request.receive)
            if (request.method in BODY_METHODS and _is_json(request.headers.get("content-type", ""))
                    and await strict.body()):
                await strict.json()
            response: Response = await handler(strict)
            return response

        return parse_first


# -- the guard -------------------------------------------------------------------------------


class Activity:
    """When the last authenticated request ended, and how many are running (idle exit)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last = clock()

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._last = self._clock()

    def idle_for(self) -> float:
        """Seconds since the last request ended; 0 while one is running."""
        with self._lock:
            return 0.0 if self._in_flight else self._clock() - self._last


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json"


class _Guard:
    """Host, Origin, token, media type and body size, checked before anything else runs."""

    def __init__(self, app: ASGIApp, *, token: str, port: int, max_body_bytes: int, activity: Activity) -> None:
        self.app = app
        self._token = token.encode()
        self._hosts = {f"127.0.0.1:{port}", f"localhost:{port}"} if port else None
        self._max_body = max_body_bytes
        self._activity = activity

    def _host_ok(self, host: str) -> bool:
        if self._hosts is not None:
            return host.lower() in self._hosts
        return host.lower().rsplit(":", 1)[0] in ("127.0.0.1", "localhost")  # port unknown (tests)

    def _refuse(self, scope: Scope, headers: Headers) -> KeymemError | None:
        path = scope["path"]
        if not self._host_ok(headers.get("host", "")):
            return ForbiddenOrigin(
                "requests must address 127.0.0.1 or localhost on the daemon's port (foreign Host header refused)"
            )
        if path == UI_PREFIX or path.startswith(UI_PREFIX + "/"):
            return self._browser_refusal(headers)
        if "origin" in headers:
            return ForbiddenOrigin("requests from web pages (with an Origin header) are refused")
        if path not in PUBLIC_PATHS:
            scheme, _, supplied = headers.get("authorization", "").strip().partition(" ")
            if scheme.lower() != "bearer" or not supplied.strip():
                return Unauthorized("missing bearer token (Authorization: Bearer <token from daemon.json>)")
            if not hmac.compare_digest(supplied.strip().encode("latin-1", "replace"), self._token):
                return Unauthorized("wrong bearer token")
        return None

    @staticmethod
    def _browser_refusal(headers: Headers) -> KeymemError | None:
        """The inspector's pages: only this daemon's own origin; its routes check the session
        cookie (and CSRF token) themselves -- no bearer token here, and no cookie elsewhere."""
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{headers.get('host', '').lower()}":
            return ForbiddenOrigin("requests to the inspector from another origin are refused")
        if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            return ForbiddenOrigin("requests to the inspector from another site are refused")
        return None

    def _limit(self, path: str) -> int:
        return max(self._max_body, IMPORT_MAX_BYTES) if path in IMPORT_PATHS else self._max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refuse(scope, headers)
        if refusal is None and scope["method"] in BODY_METHODS:
            refusal, receive = await self._body(scope, headers, receive)
        if refusal is not None:
            logger.info("refused %s %s: %d %s", scope["method"], scope["path"], refusal.status, refusal.code)
            await error_response(refusal.status, refusal.code, refusal.message)(scope, receive, send)
            return
        counted = scope["path"] not in PUBLIC_PATHS
        if counted:
            self._activity.begin()
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            logger.exception("%s %s failed", scope["method"], scope["path"])
            if started:
                raise
            await error_response(500, KeymemError.code, "internal error; see the daemon log")(scope, receive, send)
        finally:
            if counted:
                self._activity.end()

    async def _body(self, scope: Scope, headers: Headers, receive: Receive) -> tuple[KeymemError | None, Receive]:
        limit = self._limit(scope["path"])
        length_header = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if length_header is not None:
            try:
                length = int(length_header)
            except ValueError:
                return InvalidInput("Content-Length is not a number"), receive
            if length == 0 and not chunked:
                return None, receive
        elif not chunked:
            return None, receive  # no body at all
        else:
            length = -1
        if not _is_json(headers.get("content-type", "")):
            return UnsupportedMediaType("request bodies must be application/json"), receive
        if length > limit:
            return PayloadTooLarge(
                f"request body of {length} bytes exceeds the limit of {limit} bytes (KEYMEM_MAX_BODY_BYTES)"
            ), receive
        if length >= 0:
            return None, receive  # the server enforces Content-Length framing
        # Chunked: read up to the cap, stop as soon as it is passed, then replay.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return InvalidInput("the client went away while sending the body"), receive
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return PayloadTooLarge(
                    f"request body exceeds the limit of {limit} bytes (KEYMEM_MAX_BODY_BYTES)"
                ), receive
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return None, replay


# -- the app ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostHeaders:
    """The ``X-Keymem-Host-*`` headers of one request, resolved to a ``Host`` in a worker."""

    agent: str | None
    session: str | None
    cwd: str | None


async def host_headers(
    x_keymem_host_agent: Annotated[str | None, Header(description="claude or codex")] = None,
    x_keymem_host_session: Annotated[str | None, Header(description="Host session UUID")] = None,
    x_keymem_host_cwd: Annotated[str | None, Header(description="Host working directory (UTF-8)")] = None,
) -> HostHeaders:
    """Who is calling (the daemon has no identity of its own: every request says)."""
    return HostHeaders(x_keymem_host_agent, x_keymem_host_session, _utf8_header(x_keymem_host_cwd))


def _utf8_header(value: str | None) -> str | None:
    """Header values arrive decoded as latin-1; clients send UTF-8 bytes (a Korean path)."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


HostDep = Annotated[HostHeaders, Depends(host_headers)]


async def hook_installed(
    x_keymem_hook_installed: Annotated[
        str | None, Header(description="true when the caller's host runs the keymem prompt hook")] = None,
) -> bool | None:
    """Whether the calling host has the prompt hook: the instructions adapt per caller,
    because whichever client started the daemon must not decide it for everyone."""
    if x_keymem_hook_installed is None:
        return None
    return x_keymem_hook_installed.strip().lower() in ("1", "true", "yes", "on")


HookDep = Annotated[bool | None, Depends(hook_installed)]

_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": ErrorOut, "description": description}
    for status, description in (
        (401, "Missing or wrong bearer token"),
        (403, "Foreign Host header, or an Origin header"),
        (413, "Request body too large"),
        (415, "Request body is not application/json"),
        (422, "Invalid request body"),
        (500, "Internal error"),
        (503, "Still loading, or loading failed"),
    )
}
_NOT_FOUND: Final[dict[int | str, dict[str, Any]]] = {404: {"model": ErrorOut, "description": "Unknown name"}}


def json_response(data: Any, status: int = 200) -> Response:
    """Serialise in the calling (worker) thread, so a large body never stalls the event loop."""
    body = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body.encode("utf-8"), status_code=status, media_type="application/json")


class _Workers:
    """Blocking work runs in worker threads, one hop per request.

    One hop matters: anyio's limiter is first-come first-served, so a request that needed
    several hops would queue behind every request that arrived meanwhile, and under a burst
    nobody would get an answer until everybody was done. Quick reads (tool definitions,
    stats, prompts) have their own threads so ``keymemd status`` answers during a burst.
    """

    def __init__(self) -> None:
        self.store = anyio.CapacityLimiter(STORE_THREADS)
        self.quick = anyio.CapacityLimiter(QUICK_THREADS)

    async def run(self, fn: Callable[[], Response], *, quick: bool = False) -> Response:
        return await anyio.to_thread.run_sync(fn, limiter=self.quick if quick else self.store)


def create_app(
    service: Service,
    settings: Settings,
    token: str,
    *,
    on_shutdown: Callable[[], None] | None = None,
    activity: Activity | None = None,
    started_at: float | None = None,
) -> FastAPI:
    """The daemon's FastAPI application.

    ``settings.port`` must be the bound port (the Host check uses it). ``on_shutdown`` is
    called by ``POST /v1/shutdown`` before it replies: the daemon removes ``daemon.json``
    there and asks uvicorn to exit once in-flight requests are done. ``activity`` records
    authenticated requests for the idle-exit check. ``started_at`` is the start time
    ``daemon.json`` publishes, which ``/health``'s proof covers.
    """
    started = time.time() if started_at is None else started_at
    app = FastAPI(
        title="keymemd",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # A JSON API answers a wrong path with a JSON error, not a redirect with an empty body
        # (POST /v1/tools/ got a 307 to GET-only /v1/tools).
        redirect_slashes=False,
        responses=_ERRORS,
        description="keymem daemon: associative long-term memory for LLM coding agents. "
        "Every route except /health needs `Authorization: Bearer <token>` "
        "(the token is in <data>/daemon.json).",
    )
    app.router.route_class = _JSONRoute
    app.state.activity = activity or Activity()
    app.state.service = service
    for exc_type in (KeymemError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle_error)
    app.add_middleware(
        _Guard,
        token=token,
        port=settings.port,
        max_body_bytes=settings.max_body_bytes,
        activity=app.state.activity,
    )
    workers = _Workers()

    def host_of(headers: HostHeaders) -> Host:
        return service.host(headers.agent, headers.session, headers.cwd)

    @app.get("/health", response_model=HealthOut, response_model_exclude_none=True, tags=["health"])
    async def health(
        nonce: Annotated[str | None, Query(min_length=1, max_length=runtime.MAX_NONCE_CHARS,
                                           pattern="^[A-Za-z0-9_-]+$",
                                           description="A fresh client nonce; the answer's proof signs it.")] = None,
    ) -> dict[str, Any]:
        """Liveness and readiness (`starting` -> `ready`); no token needed."""
        body = service.health()
        if nonce is not None:
            body["proof"] = runtime.health_proof(token, nonce, pid=body["pid"], started_at=started)
        return body

    @app.get(TOOLS_PATH, response_model=ToolsOut, tags=["mcp"])
    async def list_tools(host: HostDep) -> Response:
        """The MCP tool definitions visible to this caller (no models needed)."""
        return await workers.run(lambda: json_response({"tools": service.tool_definitions(host_of(host))}), quick=True)

    @app.post(TOOLS_PATH + "/{name}", response_model=ToolResult, tags=["mcp"], responses=_NOT_FOUND)
    async def call_tool(
        name: str,
        host: HostDep,
        body: ToolCall | None = None,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                max_length=MAX_IDEMPOTENCY_KEY,
                description="A retried write returns the first result instead of writing twice.",
            ),
        ] = None,
    ) -> Response:
        """Call one tool: `{arguments}` -> `{result, is_error}`."""
        arguments = body.arguments if body else None

        def work() -> Response:
            outcome = service.call_tool(name, arguments, host_of(host), idempotency_key=idempotency_key or None)
            return json_response({"result": outcome.result, "is_error": outcome.is_error})

        return await workers.run(work)

    @app.get("/v1/instructions", response_model=InstructionsOut, tags=["mcp"])
    async def get_instructions(hook: HookDep) -> Response:
        """The MCP server instructions, with live key/memory/link counts."""
        return await workers.run(
            lambda: json_response({"instructions": service.instructions(hook_installed=hook)}), quick=True)

    @app.get("/v1/prompts", response_model=PromptsOut, tags=["mcp"])
    async def list_prompts() -> Response:
        """The MCP prompts."""
        return await workers.run(lambda: json_response({"prompts": service.prompts()}), quick=True)

    @app.get("/v1/prompts/{name}", response_model=PromptOut, tags=["mcp"], responses=_NOT_FOUND)
    async def get_prompt(name: str, hook: HookDep) -> Response:
        """One MCP prompt, rendered."""
        return await workers.run(lambda: json_response(service.get_prompt(name, hook_installed=hook)), quick=True)

    @app.post("/v1/inject", response_model=InjectOut, tags=["push"])
    async def inject(body: InjectIn) -> Response:
        """The push path: memories relevant to a prompt, rendered for the prompt hook."""
        request = InjectRequest(**body.model_dump())
        return await workers.run(lambda: json_response(render(service.inject(request))))

    @app.get("/v1/stats", response_model=StatsOut, tags=["operations"])
    async def stats() -> Response:
        """State, uptime, counts, embedder, reranker and download progress."""
        return await workers.run(lambda: json_response(render(service.stats())), quick=True)

    @app.post("/v1/export", response_model=dict[str, Any], tags=["operations"])
    async def export(body: ExportIn | None = None) -> Response:
        """The whole store as lossless JSON (the input of `/v1/import`)."""
        include = bool(body and body.include_vectors)
        return await workers.run(lambda: json_response(service.export(include_vectors=include)))

    @app.post(
        IMPORT_PATH,
        response_class=StreamingResponse,
        tags=["operations"],
        responses={
            200: {
                "description": "NDJSON: progress lines, then one `done` or `error` line.",
                "content": {"application/x-ndjson": {"schema": {"$ref": "#/components/schemas/ImportEvent"}}},
            }
        },
    )
    async def import_(
        data: Annotated[dict[str, Any], Body(description="A keymem export, or an upstream keymem graph.json.")],
    ) -> StreamingResponse:
        """Import an export (or an upstream graph.json), streaming progress as NDJSON.

        A client that goes away (Ctrl+C) cancels it: nothing is written."""
        service.ready_graph()  # 503 now, rather than an error line after a 200
        cancelled = threading.Event()
        events = service.import_events(data, cancelled=cancelled)

        async def lines() -> AsyncIterator[str]:
            try:
                while (line := await anyio.to_thread.run_sync(next, events, None, abandon_on_cancel=True)) is not None:
                    yield line + "\n"
            finally:
                cancelled.set()  # the client left (the stream was cancelled), or the import ended

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/v1/shutdown", response_model=ShutdownOut, tags=["lifecycle"])
    async def shutdown() -> Response:
        """Stop the daemon: `daemon.json` is gone before this answers; in-flight requests finish."""

        def work() -> Response:
            if on_shutdown is not None:
                on_shutdown()
            else:
                runtime.remove_daemon_info(settings.data_dir)
            logger.info("shutdown requested over HTTP")
            return json_response({"status": "shutting_down"})

        return await workers.run(work, quick=True)

    ui_app, inspect_app = build_apps(service, settings, run=workers.run, handle_error=handle_error,
                                     json_response=json_response)
    app.mount(INSPECT_PREFIX, inspect_app)
    app.mount(UI_PREFIX, ui_app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {})["ImportEvent"] = ImportEvent.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            for name, sub in (
                ImportEvent.model_json_schema(ref_template="#/components/schemas/{model}").get("$defs", {}).items()
            ):
                components["schemas"].setdefault(name, sub)
            components["schemas"]["ImportEvent"].pop("$defs", None)
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            health_op = schema["paths"]["/health"]["get"]
            health_op["security"] = []
            health_op["responses"].pop("401", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
