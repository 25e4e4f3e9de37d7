"""The guard: Host, Origin, token, media type and body size, checked before any route runs.

``Guard`` is a pure ASGI middleware that refuses, before any route runs or any body is read:

- a ``Host`` other than ``127.0.0.1:<port>`` / ``localhost:<port>``, and any ``Origin``
  header (403: DNS rebinding and browser pages) -- except that the inspector's ``/ui``
  pages accept their own origin, and authorise by their session cookie, not the token
  (``keymem_daemon/ui``); no other route ever reads the cookie;
- a missing or wrong bearer token on anything but ``GET /health`` (401, compared in
  constant time);
- a POST body that is not ``application/json`` (415) or is larger than
  ``KEYMEM_MAX_BODY_BYTES`` (413, decided from ``Content-Length`` without reading it, or
  as soon as a chunked body passes the cap).

It also counts authenticated requests in flight (``Activity``) for the idle exit.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keymem_daemon.errors import (
    ForbiddenOrigin,
    InvalidInput,
    KeymemError,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from keymem_daemon.http.bodies import BODY_METHODS, is_json
from keymem_daemon.http.responses import error_response
from keymem_daemon.ui.routes import UI_IMPORT_PATH, UI_PREFIX

logger = logging.getLogger(__name__)

PUBLIC_PATHS: Final = frozenset({"/health"})
"""The only paths served without the bearer token."""
IMPORT_PATH: Final = "/v1/import"
IMPORT_PATHS: Final = frozenset({IMPORT_PATH, UI_IMPORT_PATH})
IMPORT_MAX_BYTES: Final = 512 * 1024 * 1024
"""Imports carry whole exports, so they take more than ``KEYMEM_MAX_BODY_BYTES``."""


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



class Guard:
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
        if not is_json(headers.get("content-type", "")):
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

