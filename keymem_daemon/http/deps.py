"""What a route is handed: the service, the caller's host headers, the worker threads.

``create_app`` puts the service, its settings and the per-app state on ``app.state``; the
routers (``routes/``) are module-level tables that reach them only through these
dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Final, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, Header, Request

from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.service import Service

T = TypeVar("T")

STORE_THREADS: Final = 32
"""Worker threads for tool calls, inject, export (writes still go through one writer)."""
QUICK_THREADS: Final = 8
"""Worker threads for quick reads that must answer during a burst of writes."""


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


async def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(_service)]


def host_of(service: Service, headers: HostHeaders) -> Host:
    """The caller as the engine sees it; called inside the worker hop, because it may read
    the host's transcript."""
    return service.host(headers.agent, headers.session, headers.cwd)


class Workers:
    """Blocking work runs in worker threads, one hop per request.

    One hop matters: anyio's limiter is first-come first-served, so a request that needed
    several hops would queue behind every request that arrived meanwhile, and under a burst
    nobody would get an answer until everybody was done. Quick reads (tool definitions,
    stats, prompts) have their own threads so ``keymemd status`` answers during a burst.
    """

    def __init__(self) -> None:
        self.store = anyio.CapacityLimiter(STORE_THREADS)
        self.quick = anyio.CapacityLimiter(QUICK_THREADS)

    async def run(self, fn: Callable[[], T], *, quick: bool = False) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=self.quick if quick else self.store)


async def _workers(request: Request) -> Workers:
    workers: Workers = request.app.state.workers
    return workers


WorkersDep = Annotated[Workers, Depends(_workers)]


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """What the daemon's own routes need beyond the service: the token ``/health`` signs
    its proof with, the start time ``daemon.json`` publishes, and how to stop."""

    token: str
    started_at: float
    shutdown: Callable[[], None]


async def _lifecycle(request: Request) -> Lifecycle:
    lifecycle: Lifecycle = request.app.state.lifecycle
    return lifecycle


LifecycleDep = Annotated[Lifecycle, Depends(_lifecycle)]
