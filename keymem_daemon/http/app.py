"""The HTTP edge of the daemon: ``create_app(service, settings, token)``.

Routes map one-to-one onto ``Service`` methods (``DESIGN.md`` §2). The route table is
``routes.ROUTERS``: one ``APIRouter`` per group (``routes/mcp.py``, ``push.py``, ``ops.py``),
each route returning the response model it declares (``schemas.py``), so FastAPI checks
every answer and the OpenAPI document (``GET /openapi.json``, token required) describes
every route exactly.

Every request first passes ``guard.Guard`` (Host, Origin, token, media type, body size).
Errors have one shape, ``{"error": {"code", "message"}}``, rendered by ``handle_error``, the
one exception handler: ``KeymemError`` renders its own ``status``/``code``, request
validation is 422 ``invalid_input``, routing misses are 404 / 405, anything else (a response
that does not match its model too) is a 500 logged with its traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from keymem_daemon import __version__, runtime
from keymem_daemon.config import Settings
from keymem_daemon.errors import InvalidInput, KeymemError
from keymem_daemon.http.deps import Lifecycle, Workers
from keymem_daemon.http.guard import Activity, Guard
from keymem_daemon.http.responses import error_response, json_response
from keymem_daemon.http.routes import ROUTERS
from keymem_daemon.http.routes.mcp import TOOLS_PATH
from keymem_daemon.http.schemas import ImportEvent
from keymem_daemon.service import Service
from keymem_daemon.ui.routes import INSPECT_PREFIX, UI_PREFIX, build_apps

logger = logging.getLogger(__name__)

_HTTP_CODES: Final = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


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
    app = FastAPI(
        title="keymemd",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # A JSON API answers a wrong path with a JSON error, not a redirect with an empty body
        # (POST /v1/tools/ got a 307 to GET-only /v1/tools).
        redirect_slashes=False,
        description="keymem daemon: associative long-term memory for LLM coding agents. "
        "Every route except /health needs `Authorization: Bearer <token>` "
        "(the token is in <data>/daemon.json).",
    )
    app.state.activity = activity or Activity()
    app.state.service = service
    for exc_type in (KeymemError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle_error)
    app.add_middleware(
        Guard,
        token=token,
        port=settings.port,
        max_body_bytes=settings.max_body_bytes,
        activity=app.state.activity,
    )
    def remove_info() -> None:
        runtime.remove_daemon_info(settings.data_dir)

    workers = Workers()
    app.state.workers = workers
    app.state.lifecycle = Lifecycle(
        token=token,
        started_at=time.time() if started_at is None else started_at,
        shutdown=on_shutdown or remove_info,
    )
    for router in ROUTERS:
        # The routes themselves rather than include_router, which since FastAPI 0.165 adds one
        # lazy node: app.routes lists every route, as the docs tests and the openapi walk expect.
        app.router.routes.extend(router.routes)

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
