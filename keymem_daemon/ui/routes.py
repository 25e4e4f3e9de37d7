"""The inspector's HTTP surface: two small apps ``create_app`` mounts beside the token API.

``/ui`` is for the browser: the page shell, its static assets, the login exchange and the
page data under ``/ui/api`` -- authorised by the session cookie (``auth.py``), never by the
bearer token; state-changing requests also carry the session's CSRF token in
``X-CSRF-Token``. ``/v1/inspect`` serves the same page data to the bearer-token API (the
``keymemd search/show/keys/activity`` commands) and mints login links for ``keymemd ui``.

Both sit behind the daemon's guard (Host, Origin, token, body size); the guard lets a
same-origin browser request reach ``/ui`` and nothing else. Writes go through
``Service.call_tool`` -- the tools agents use -- so the page cannot do what an agent cannot.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Annotated, Any, Final

import anyio
from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from keymem_daemon.activity_log import MAX_PAGE, ActivityLog
from keymem_daemon.config import Settings
from keymem_daemon.engine.records import render
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import ForbiddenOrigin, InvalidInput, KeymemError, NotFound, Unauthorized
from keymem_daemon.service import Service
from keymem_daemon.ui.auth import LOGIN_TTL, Session, UiAuth
from keymem_daemon.ui.data import Inspector, SearchFilters

UI_PREFIX: Final = "/ui"
INSPECT_PREFIX: Final = "/v1/inspect"
UI_IMPORT_PATH: Final = "/ui/api/import"
UI_TOOLS: Final = frozenset({"correct", "forget", "confirm_memory", "dismiss"})
"""What the page may call: the curation tools (reads have their own page-data routes)."""
CSRF_HEADER: Final = "x-csrf-token"
ACTOR: Final = "inspector"
"""How the page's writes appear in the activity log."""
STATIC_TYPES: Final = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".svg": "image/svg+xml"}
CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
              "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""Only the package's own files run: a memory's text can never bring a script or a request
elsewhere. Inline *styles* are allowed because the graph library positions its canvas with them."""
_HEADERS: Final = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
                   "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}

STREAM_SECONDS: Final = 15.0
"""How long one live-feed stream stays open before it ends and the browser's EventSource
reconnects (after ``STREAM_RETRY_MS``, resuming from ``Last-Event-ID``): a tab left open never
holds a connection the daemon must wait for on stop longer than this."""
STREAM_RETRY_MS: Final = 500
STREAM_KEEPALIVE: Final = 5.0
"""A comment line this often keeps proxies and the browser from taking a quiet feed for dead."""

Run = Callable[..., Awaitable[Response]]


async def _activity_events(log: ActivityLog, *, after: int, kind: str | None) -> AsyncIterator[str]:
    """The activity log as server-sent events: each new entry is one ``entry`` event (its
    ``id`` the entry's), sent when the log's thread has stored it."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    unwatch = log.watch(lambda: loop.call_soon_threadsafe(wake.set))
    latest = after
    deadline = loop.time() + STREAM_SECONDS
    try:
        yield f"retry: {STREAM_RETRY_MS}\n\n"
        while not log.watches_ended:
            wake.clear()
            page = await anyio.to_thread.run_sync(functools.partial(log.page, after=latest, limit=MAX_PAGE,
                                                                    kind=kind))
            for entry in reversed(page.entries):
                data = json.dumps(render(entry), ensure_ascii=False)
                yield f"id: {entry.id}\nevent: entry\ndata: {data}\n\n"
            latest = max(latest, page.latest_id)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(wake.wait(), min(STREAM_KEEPALIVE, remaining))
            except TimeoutError:
                yield ": keep-alive\n\n"
    finally:
        unwatch()


def cookie_name(settings: Settings) -> str:
    """Browsers keep cookies per host, not per port: each daemon's cookie has its own name."""
    return f"keymem_ui_{settings.port}" if settings.port else "keymem_ui"


def _static(name: str) -> bytes:
    return (resources.files("keymem_daemon.ui") / "static" / name).read_bytes()


def _page(body: str, status: int = 200) -> HTMLResponse:
    html = ("<!doctype html><html lang=en><head><meta charset=utf-8><title>keymem</title>"
            "<link rel=stylesheet href=/ui/static/app.css></head><body class=notice><main>"
            f"{body}</main></body></html>")
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


_LOGIN_AGAIN: Final = ("<h1>keymem inspector</h1><p>{why}</p><p>Run <code>keymemd ui</code> for a new "
                       "login link (it works once, for one minute).</p>")


def _sub_app(handle_error: Callable[..., Any]) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    for exc_type in (KeymemError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle_error)
    return app


def build_apps(service: Service, settings: Settings, *, run: Run, handle_error: Callable[..., Any],
               json_response: Callable[[Any], Response], auth: UiAuth | None = None) -> tuple[FastAPI, FastAPI]:
    """``(ui, inspect)``: the apps to mount at ``/ui`` and ``/v1/inspect``."""
    auth = auth or UiAuth()
    inspector = Inspector(service)
    cookie = cookie_name(settings)
    ui = _sub_app(handle_error)
    inspect = _sub_app(handle_error)

    def session_of(request: Request) -> Session:
        session = auth.session(request.cookies.get(cookie))
        if session is None:
            raise Unauthorized("no inspector session: open the link `keymemd ui` prints")
        return session

    def csrf_checked(request: Request) -> Session:
        session = session_of(request)
        if not auth.csrf_ok(session, request.headers.get(CSRF_HEADER)):
            raise ForbiddenOrigin("missing or wrong CSRF token (X-CSRF-Token)")
        return session

    # Dependencies by decorator: these closures are not module globals, which string
    # annotations (``from __future__ import annotations``) would need to resolve.
    session_required = [Depends(session_of)]
    csrf_required = [Depends(csrf_checked)]

    # -- the browser's pages --------------------------------------------------------------

    @ui.get("/login", include_in_schema=False)
    async def login(token: str = "") -> Response:
        session = auth.redeem(token) if token else None
        if session is None:
            return _page(_LOGIN_AGAIN.format(why="This login link is not valid: it was used already, it "
                                                  "expired, or it belongs to another daemon."), 401)
        response = RedirectResponse(f"{UI_PREFIX}/", status_code=303, headers={"Cache-Control": "no-store"})
        response.set_cookie(cookie, session.id, httponly=True, samesite="strict", path=UI_PREFIX, secure=False)
        return response

    @ui.get("/", include_in_schema=False)
    async def shell(request: Request) -> Response:
        session = auth.session(request.cookies.get(cookie))
        if session is None:
            return _page(_LOGIN_AGAIN.format(why="You are not logged in to this daemon's inspector."), 401)
        html = _static("index.html").decode("utf-8").replace("{{csrf}}", session.csrf)
        return HTMLResponse(html, headers=_HEADERS)

    @ui.get("/static/{name:path}", include_in_schema=False)
    async def static(name: str) -> Response:
        suffix = name[name.rfind("."):] if "." in name else ""
        parts = name.split("/")
        if suffix not in STATIC_TYPES or any(p in ("", ".", "..") for p in parts):
            raise NotFound(f"no static file {name}")
        try:
            data = _static(name)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no static file {name}") from None
        return Response(data, media_type=STATIC_TYPES[suffix],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

    # -- curation, export and import (cookie + CSRF) ------------------------------------

    @ui.post("/api/tools/{name}", include_in_schema=False, dependencies=csrf_required)
    async def call_tool(name: str, body: Annotated[dict[str, Any], Body()]) -> Response:
        if name not in UI_TOOLS:
            raise NotFound(f"the inspector does not call {name}")
        arguments = body.get("arguments")
        if not isinstance(arguments, dict):
            raise InvalidInput("arguments must be an object", field="arguments")

        def work() -> Response:
            outcome = service.call_tool(name, arguments, Host(), actor=ACTOR)
            return json_response({"result": outcome.result, "is_error": outcome.is_error})

        return await run(work)

    @ui.post("/api/import", include_in_schema=False, dependencies=csrf_required)
    async def import_(data: Annotated[dict[str, Any], Body()]) -> Response:
        return await run(lambda: json_response({"result": service.import_(data)}))

    @ui.get("/api/export", include_in_schema=False, dependencies=session_required)
    async def export() -> Response:
        def work() -> Response:
            body = json.dumps(service.export(), ensure_ascii=False).encode("utf-8")
            return Response(body, media_type="application/json",
                            headers={"Content-Disposition": 'attachment; filename="keymem-export.json"'})

        return await run(work)

    @ui.get("/api/backups/{name}", include_in_schema=False, dependencies=session_required)
    async def backup(name: str) -> Response:
        path = inspector.backup_path(name)
        return FileResponse(path, media_type="application/vnd.sqlite3", filename=name)

    # -- login links for `keymemd ui` (bearer token) -------------------------------------

    @inspect.post("/login-link", include_in_schema=False)
    async def login_link() -> Response:
        token = auth.mint_link()
        url = f"http://127.0.0.1:{settings.port}{UI_PREFIX}/login?token={token}"
        return json_response({"url": url, "expires_in_s": LOGIN_TTL})

    # -- page data: the same reads for both apps -----------------------------------------

    def add_reads(app: FastAPI, prefix: str, guard: list[Any]) -> None:
        def get(path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
            return app.get(prefix + path, dependencies=guard, include_in_schema=False)

        @get("/search")
        async def search(q: str = "", namespace: str | None = None, status: str | None = None,
                         decay_profile: str | None = None, key: str | None = None, agent: str | None = None,
                         session: str | None = None, since: float | None = None, until: float | None = None,
                         limit: Annotated[int, Query(ge=1, le=100)] = 20) -> Response:
            filters = SearchFilters(namespace or None, status or None, decay_profile or None, key or None,
                                    agent or None, session or None, since, until)
            return await run(lambda: json_response(inspector.search(q, filters, limit=limit)))

        @get("/memory/{memory_id}")
        async def memory(memory_id: str) -> Response:
            return await run(lambda: json_response(inspector.memory(memory_id)))

        @get("/key/{key_id}")
        async def key(key_id: str, namespace: str | None = None) -> Response:
            return await run(lambda: json_response(inspector.key(key_id, namespace=namespace)))

        @get("/key-by-name")
        async def key_by_name(concept: str) -> Response:
            return await run(lambda: json_response({"key_id": inspector.find_key(concept)}), quick=True)

        @get("/keys")
        async def keys(namespace: str | None = None, hubs: bool = False,
                       limit: Annotated[int, Query(ge=1, le=500)] = 100,
                       offset: Annotated[int, Query(ge=0)] = 0) -> Response:
            return await run(lambda: json_response(
                inspector.keys(namespace=namespace, hubs_only=hubs, limit=limit, offset=offset)))

        @get("/graph/key/{key_id}")
        async def graph_key(key_id: str) -> Response:
            return await run(lambda: json_response(inspector.graph_of_key(key_id)))

        @get("/graph/memory/{memory_id}")
        async def graph_memory(memory_id: str) -> Response:
            return await run(lambda: json_response(inspector.graph_of_memory(memory_id)))

        @get("/activity")
        async def activity(after: Annotated[int, Query(ge=0)] = 0, before: Annotated[int | None, Query(ge=1)] = None,
                           limit: Annotated[int, Query(ge=1, le=500)] = 100, kind: str | None = None) -> Response:
            return await run(lambda: json_response(
                inspector.activity(after=after, before=before, limit=limit, kind=kind)), quick=True)

        @get("/activity/stream")
        async def activity_stream(request: Request, after: Annotated[int, Query(ge=0)] = 0,
                                  kind: str | None = None) -> Response:
            log = service.activity
            if log is None:
                service.ready_graph()  # NotReady while loading
                raise NotFound("the activity log is not open")
            resume = request.headers.get("last-event-id", "")
            if resume:
                if not resume.isdigit():
                    raise InvalidInput("Last-Event-ID must be an entry id", field="Last-Event-ID")
                after = max(after, int(resume))
            return StreamingResponse(_activity_events(log, after=after, kind=kind or None),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

        @get("/health")
        async def health() -> Response:
            return await run(lambda: json_response(inspector.health()), quick=True)

    add_reads(ui, "/api", session_required)
    add_reads(inspect, "", [])
    return ui, inspect
