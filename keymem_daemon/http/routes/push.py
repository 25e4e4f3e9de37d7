"""The push path: what the prompt hook asks before every user message."""

from __future__ import annotations

from fastapi import APIRouter

from keymem_daemon.http.bodies import JSONRoute
from keymem_daemon.http.deps import ServiceDep, WorkersDep
from keymem_daemon.http.schemas import ERRORS, InjectIn, InjectOut
from keymem_daemon.service import InjectRequest

router = APIRouter(tags=["push"], route_class=JSONRoute, responses=ERRORS)


@router.post("/v1/inject", response_model=InjectOut)
async def inject(body: InjectIn, service: ServiceDep, workers: WorkersDep) -> InjectOut:
    """The push path: memories relevant to a prompt, rendered for the prompt hook."""
    request = InjectRequest(**body.model_dump())
    return await workers.run(lambda: InjectOut.from_domain(service.inject(request)))
