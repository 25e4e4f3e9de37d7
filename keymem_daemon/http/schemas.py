"""The request and response bodies of the token API: the only pydantic models of the daemon.

Each route declares one of these as its ``response_model`` and returns it, so FastAPI checks
every answer against the model the OpenAPI document (``GET /openapi.json``) publishes.
Responses are built from the engine's records once, here (``InjectOut.from_domain``).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from keymem_daemon.engine import limits
from keymem_daemon.engine.reads.inject import InjectResult
from keymem_daemon.engine.records import render
from keymem_daemon.service import DaemonStats, Health, Prompt, RenderedPrompt


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

    @classmethod
    def from_domain(cls, health: Health) -> HealthOut:
        return cls.model_validate(render(health))


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

    @classmethod
    def from_domain(cls, prompts: list[Prompt]) -> PromptsOut:
        return cls.model_validate({"prompts": render(prompts)})


class PromptMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: dict[str, Any] = Field(description='MCP content block, e.g. {"type": "text", "text": ...}.')


class PromptOut(BaseModel):
    description: str
    messages: list[PromptMessage]

    @classmethod
    def from_domain(cls, prompt: RenderedPrompt) -> PromptOut:
        return cls.model_validate(render(prompt))


class InjectIn(_Strict):
    prompt: str = Field(description="The user's message.")
    cwd: str | None = Field(None, description="The host's working directory (selects namespaces).")
    namespace: str | None = Field(None, description="Search this namespace instead of the cwd's.")
    top_k: int = Field(limits.INJECT_TOP_K.default, ge=limits.INJECT_TOP_K.low, le=limits.INJECT_TOP_K.high,
                       description="Most memories to surface.")
    max_chars: int | None = Field(None, ge=limits.INJECT_MAX_CHARS.low, le=limits.INJECT_MAX_CHARS.high,
                                  description="Size of the rendered block.")
    session_id: str | None = Field(None, min_length=1, max_length=limits.MAX_SESSION_ID_CHARS,
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
    stale: str | None = Field(None, description="Why the answer may lag a shared store whose server does not "
                                                "answer (it came from the daemon's local replica).")

    @classmethod
    def from_domain(cls, result: InjectResult) -> InjectOut:
        return cls.model_validate(render(result))


class StatsOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    state: Literal["starting", "ready", "failed"]
    uptime_s: float
    data_dir: str
    store: str = Field(description='Which store: "sqlite PATH" or "postgresql HOST:PORT/DATABASE as ROLE".')

    @classmethod
    def from_domain(cls, stats: DaemonStats) -> StatsOut:
        return cls.model_validate(stats.as_dict())


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


# -- what the OpenAPI document says beyond the models ---------------------------------------

ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": ErrorOut, "description": description}
    for status, description in (
        (401, "Missing or wrong bearer token"),
        (403, "Foreign Host header, or an Origin header"),
        (413, "Request body too large"),
        (415, "Request body is not application/json"),
        (422, "Invalid request body"),
        (500, "Internal error"),
        (503, "Still loading, loading failed, or every connection to the shared store busy (store_busy: try again)"),
    )
}
"""The errors any route may answer, in the one shape."""
NOT_FOUND: Final[dict[int | str, dict[str, Any]]] = {404: {"model": ErrorOut, "description": "Unknown name"}}
EXPORT_RESPONSE: Final[dict[int | str, dict[str, Any]]] = {200: {
    "description": "A keymem export: free-form JSON, the input of `/v1/import`.",
    "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}},
}}
