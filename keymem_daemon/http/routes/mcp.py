"""The MCP surface the shim forwards: tool definitions and calls, instructions, prompts."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Header

from keymem_daemon.engine.limits import MAX_IDEMPOTENCY_KEY
from keymem_daemon.http.bodies import JSONRoute
from keymem_daemon.http.deps import HookDep, HostDep, ServiceDep, WorkersDep, host_of
from keymem_daemon.http.schemas import (
    ERRORS,
    NOT_FOUND,
    InstructionsOut,
    PromptOut,
    PromptsOut,
    ToolCall,
    ToolResult,
    ToolsOut,
)

TOOLS_PATH: Final = "/v1/tools"

router = APIRouter(tags=["mcp"], route_class=JSONRoute, responses=ERRORS)


@router.get(TOOLS_PATH, response_model=ToolsOut)
async def list_tools(service: ServiceDep, workers: WorkersDep, host: HostDep) -> ToolsOut:
    """The MCP tool definitions visible to this caller (no models needed)."""

    def work() -> ToolsOut:
        return ToolsOut.model_validate({"tools": service.tool_definitions(host_of(service, host))})

    return await workers.run(work, quick=True)


@router.post(TOOLS_PATH + "/{name}", response_model=ToolResult, responses=NOT_FOUND)
async def call_tool(
    name: str,
    service: ServiceDep,
    workers: WorkersDep,
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
) -> ToolResult:
    """Call one tool: `{arguments}` -> `{result, is_error}`."""
    arguments: dict[str, Any] | None = body.arguments if body else None

    def work() -> ToolResult:
        outcome = service.call_tool(name, arguments, host_of(service, host), idempotency_key=idempotency_key or None)
        return ToolResult(result=outcome.result, is_error=outcome.is_error)

    return await workers.run(work)


@router.get("/v1/instructions", response_model=InstructionsOut)
async def get_instructions(service: ServiceDep, workers: WorkersDep, hook: HookDep) -> InstructionsOut:
    """The MCP server instructions, with live key/memory/link counts."""
    return await workers.run(lambda: InstructionsOut(instructions=service.instructions(hook_installed=hook)),
                             quick=True)


@router.get("/v1/prompts", response_model=PromptsOut)
async def list_prompts(service: ServiceDep, workers: WorkersDep) -> PromptsOut:
    """The MCP prompts."""
    return await workers.run(lambda: PromptsOut.from_domain(service.prompts()), quick=True)


@router.get("/v1/prompts/{name}", response_model=PromptOut, responses=NOT_FOUND)
async def get_prompt(name: str, service: ServiceDep, workers: WorkersDep, hook: HookDep) -> PromptOut:
    """One MCP prompt, rendered."""
    return await workers.run(lambda: PromptOut.from_domain(service.get_prompt(name, hook_installed=hook)),
                             quick=True)
