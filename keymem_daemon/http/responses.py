"""The two ways a route answers outside its response model: the one error shape and raw JSON."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse, Response


def error_response(status: int, code: str, message: str) -> JSONResponse:
    """``{"error": {"code", "message"}}``: the shape of every error the daemon gives."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def json_response(data: Any, status: int = 200) -> Response:
    """Serialise in the calling (worker) thread, so a large body (an export) never stalls the
    event loop; only for routes whose body is free-form, with no response model to check."""
    body = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body.encode("utf-8"), status_code=status, media_type="application/json")
