"""The MCP side of the shim: a low-level ``mcp`` server whose every answer comes from keymemd.

Built on the ``mcp`` SDK 2.x low-level ``Server`` (pinned ``mcp>=2.3,<3``): the handlers
passed to it decide the capabilities (tools and prompts). The shim holds no tool or prompt
of its own: ``tools/list``, ``tools/call``, ``prompts/list`` and ``prompts/get`` are
``GET /v1/tools``, ``POST /v1/tools/{name}``, ``GET /v1/prompts`` and ``GET
/v1/prompts/{name}``; the server instructions are ``GET /v1/instructions``, read once at
start-up (the SDK sends them in the ``initialize`` answer).

A tool result is one text block holding the daemon's JSON result. Faults (malformed
arguments, an unknown tool, an unreachable daemon) carry ``is_error``; refusals the agent
should act on (an unknown memory id) are normal results with an ``error`` field, as the
daemon decides.
"""

from __future__ import annotations

import json
from typing import Any

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from keymem_daemon import __version__
from keymem_daemon.errors import KeymemError, NotFound
from keymem_daemon.mcp import instructions as texts
from keymem_shim._client import DaemonClient, ToolOutcome

SERVER_NAME = "keymem"


def fallback_instructions(*, hook_installed: bool) -> str:
    """The instructions when no daemon answered in time: the daemon's text, without stats."""
    return texts.instructions(
        "unknown (keymemd was still starting when this session began)",
        hook_installed=hook_installed,
    )


def render(outcome: ToolOutcome) -> types.CallToolResult:
    """A tool outcome as MCP content: one text block with the compact JSON result."""
    text = json.dumps(outcome.result, ensure_ascii=False, separators=(",", ":"), default=str)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=outcome.is_error)


def _mcp_error(exc: KeymemError, client: DaemonClient) -> MCPError:
    if isinstance(exc, NotFound):
        return MCPError(types.INVALID_PARAMS, exc.message)
    return MCPError(types.INTERNAL_ERROR, client.unavailable(exc))


def build_server(client: DaemonClient, *, instructions: str) -> Server[Any]:
    """The MCP server: four handlers, each one HTTP request to the daemon."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            tools = await client.list_tools()
        except KeymemError as exc:
            raise _mcp_error(exc, client) from None
        return types.ListToolsResult(tools=[types.Tool.model_validate(tool) for tool in tools])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return render(await client.call_tool(params.name, params.arguments))

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        try:
            body = await client.list_prompts()
        except KeymemError as exc:
            raise _mcp_error(exc, client) from None
        return types.ListPromptsResult.model_validate(body)

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        try:
            body = await client.get_prompt(params.name)
        except KeymemError as exc:
            raise _mcp_error(exc, client) from None
        return types.GetPromptResult.model_validate(body)

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


async def serve(client: DaemonClient, *, instructions: str) -> None:
    """Serve MCP over this process's stdin/stdout until the host closes stdin."""
    server = build_server(client, instructions=instructions)
    async with client, stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
