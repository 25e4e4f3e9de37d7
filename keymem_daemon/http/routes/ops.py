"""Operations: health (no token), stats, export, import and shutdown."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Body, Query
from fastapi.responses import Response, StreamingResponse

from keymem_daemon import runtime
from keymem_daemon.http.bodies import JSONRoute
from keymem_daemon.http.deps import LifecycleDep, ServiceDep, WorkersDep
from keymem_daemon.http.guard import IMPORT_PATH
from keymem_daemon.http.responses import json_response
from keymem_daemon.http.schemas import ERRORS, EXPORT_RESPONSE, ExportIn, HealthOut, ShutdownOut, StatsOut

logger = logging.getLogger(__name__)

router = APIRouter(route_class=JSONRoute, responses=ERRORS)


@router.get("/health", response_model=HealthOut, response_model_exclude_none=True, tags=["health"])
async def health(
    service: ServiceDep,
    lifecycle: LifecycleDep,
    nonce: Annotated[str | None, Query(min_length=1, max_length=runtime.MAX_NONCE_CHARS,
                                       pattern="^[A-Za-z0-9_-]+$",
                                       description="A fresh client nonce; the answer's proof signs it.")] = None,
) -> HealthOut:
    """Liveness and readiness (`starting` -> `ready`); no token needed."""
    out = HealthOut.from_domain(service.health())
    if nonce is not None:
        out.proof = runtime.health_proof(lifecycle.token, nonce, pid=out.pid, started_at=lifecycle.started_at)
    return out


@router.get("/v1/stats", response_model=StatsOut, tags=["operations"])
async def stats(service: ServiceDep, workers: WorkersDep) -> StatsOut:
    """State, uptime, counts, embedder, reranker and download progress."""
    return await workers.run(lambda: StatsOut.from_domain(service.stats()), quick=True)


@router.post("/v1/export", response_class=Response, responses=EXPORT_RESPONSE, tags=["operations"])
async def export(service: ServiceDep, workers: WorkersDep, body: ExportIn | None = None) -> Response:
    """The whole store as lossless JSON (the input of `/v1/import`).

    Free-form and possibly large, so it is serialised in the worker (``json_response``)."""
    include = bool(body and body.include_vectors)
    return await workers.run(lambda: json_response(service.export(include_vectors=include)))


@router.post(
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
    service: ServiceDep,
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


@router.post("/v1/shutdown", response_model=ShutdownOut, tags=["lifecycle"])
async def shutdown(workers: WorkersDep, lifecycle: LifecycleDep) -> ShutdownOut:
    """Stop the daemon: `daemon.json` is gone before this answers; in-flight requests finish."""

    def work() -> ShutdownOut:
        lifecycle.shutdown()
        logger.info("shutdown requested over HTTP")
        return ShutdownOut(status="shutting_down")

    return await workers.run(work, quick=True)
