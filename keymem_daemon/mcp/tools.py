"""The MCP tools: their definitions (what the shim lists) and their calls.

Each ``Tool`` has the JSON schema the host sees and a handler that validates and coerces
the arguments (arrays and objects may arrive as JSON strings, numbers as strings), calls
the engine and returns its result. ``call_tool`` turns the outcome into the one shape the
shim forwards: a JSON result, with ``is_error`` for faults (malformed arguments) and a
plain ``{"error": ...}`` result for refusals the agent should act on (an unknown memory
id, a keyless memory) -- the agent repairs those, it is not a broken call.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from keymem_daemon import transcripts
from keymem_daemon.config import Settings
from keymem_daemon.engine import limits
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.limits import MAX_REMEMBER_BATCH, MAX_TTL_SECONDS
from keymem_daemon.engine.reads import hybrid, recall
from keymem_daemon.engine.reads.query import scope_of
from keymem_daemon.engine.records import IdempotencyKey, NewMemory, Replayed, render
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput, NotFound, Refused

logger = logging.getLogger(__name__)

# Unknown argument names an error lists, and the characters shown of each: 10,000 names (or
# one huge one) made an 88 KB message.
MAX_NAMES_SHOWN: Final = 5
MAX_NAME_CHARS: Final = 40


@dataclass(frozen=True, slots=True)
class Context:
    """What a tool call runs against: the graph, the settings and who is calling."""

    graph: MemoryGraph
    settings: Settings
    host: Host
    idempotency_key: IdempotencyKey | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    result: Any
    is_error: bool = False


Handler = Callable[[Context, "Args"], Any]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    properties: Mapping[str, Any]
    required: tuple[str, ...]
    handler: Handler
    surface: str = "default"  # "default" | "full" | "trusted"

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": {
                "type": "object",
                "properties": dict(self.properties),
                "required": list(self.required),
                "additionalProperties": False,
            },
        }


class Args:
    """Typed access to a call's arguments; every problem raises ``InvalidInput(field=...)``."""

    def __init__(self, tool: Tool, raw: Mapping[str, Any] | None) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise InvalidInput("arguments must be an object")
        unknown = sorted(set(raw) - set(tool.properties))
        if unknown:
            raise InvalidInput(f"{tool.name} has no argument {_some(unknown)} "
                               f"(accepted: {', '.join(tool.properties)})", field=unknown[0])
        for name in tool.required:
            if raw.get(name) is None:
                raise InvalidInput(f"{name} is required", field=name)
        self._tool = tool
        self._raw = raw

    def raw(self, name: str) -> Any:
        return self._raw.get(name)

    def has(self, name: str) -> bool:
        return self._raw.get(name) is not None

    def given(self, name: str) -> bool:
        """Whether the call names the argument at all (``null`` included: it clears a value)."""
        return name in self._raw

    def text(self, name: str, *, default: str | None = None) -> str | None:
        value = self._raw.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise InvalidInput(f"{name} must be a string", field=name)
        return value

    def integer(self, name: str, *, default: int | None = None) -> int:
        """An integer argument, clamped into its schema's ``minimum`` .. ``maximum`` (which
        every integer property has); when absent, ``default`` or else the schema's."""
        value = self._numeric(name)
        if value is None:
            return int(self._tool.properties[name]["default"] if default is None else default)
        return int(self._clamp(name, value))

    def number(self, name: str) -> float:
        """A number argument, clamped into its schema's range; the schema's default when absent."""
        value = self._numeric(name)
        return float(self._tool.properties[name]["default"]) if value is None else self._clamp(name, value)

    def _clamp(self, name: str, value: float) -> float:
        schema = self._tool.properties[name]
        return float(min(schema["maximum"], max(schema["minimum"], value)))

    def _numeric(self, name: str) -> float | None:
        """A finite number, or a string holding one (clients send both); None when absent."""
        value = given = self._raw.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise InvalidInput(f"{name} must be a number", field=name) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(f"{name} must be a number", field=name)
        try:
            number = float(value)
        except OverflowError:  # an int past float's range
            number = float("inf")
        if not math.isfinite(number):
            raise InvalidInput(f"{name} must be a finite number, not {str(given)[:40]}", field=name)
        return number

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self._raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise InvalidInput(f"{name} must be true or false", field=name)

    def array(self, name: str) -> list[Any] | None:
        value = self._raw.get(name)
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise InvalidInput(f"{name} is not a valid JSON array", field=name) from None
        if value is not None and not isinstance(value, list):
            raise InvalidInput(f"{name} must be an array", field=name)
        return value


def _some(names: list[str]) -> str:
    """The first few of many names, and how many there are: an error stays one line."""
    shown = ", ".join(repr(n[:MAX_NAME_CHARS]) for n in names[:MAX_NAMES_SHOWN])
    return shown if len(names) <= MAX_NAMES_SHOWN else f"{shown} and {len(names) - MAX_NAMES_SHOWN} more"


# -- JSON schema fragments -------------------------------------------------------------

_NS = {"type": "string", "description": "Namespace (project or context); normalised to lower case."}
_KEYS = {"type": "array", "items": {"type": "string"}, "minItems": 1,
         "description": "3-6 atomic concept keys of 1-2 words, in both Korean and English where useful."}
_KEY_TYPES = {"type": "object", "additionalProperties": {"enum": ["concept", "name", "proper_noun"]},
              "description": "Key -> type. name/proper_noun keys match only literally (people, products)."}
_DECAY = {"enum": ["transient", "standard", "stable", "permanent"],
          "description": "Freshness half-life: transient 7 d, standard 90 d (default), stable 365 d, permanent."}
_TTL = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TTL_SECONDS,
        "description": "Expire this many seconds from now (omit it for a memory that never expires)."}
_RELATED = {"type": "array", "items": {"type": "string"}, "description": "Ids of memories to link explicitly."}
_SOURCE = {"type": "object", "description": "Provenance fields to attach (merged over the automatic stamp)."}
_OBSERVED = {"type": "string",
             "description": "When the fact was observed (ISO-8601 date or date-time), if not now."}
_MEMORY_ID = {"type": "string", "description": "12-character memory id."}
_KEY_ID = {"type": "string", "description": "12-character key id (from recall, browse_keys or read_memory)."}


def _new_memory(ctx: Context, item: Mapping[str, Any], *, require_keys: bool = True) -> NewMemory:
    return ctx.graph.prepare(
        content=item.get("content"), keys=item.get("keys"), key_types=item.get("key_types"),
        namespace=item.get("namespace"), ttl_seconds=item.get("ttl_seconds"),
        decay_profile=item.get("decay_profile"), related_to=item.get("related_to"), source=item.get("source"),
        observed_at=item.get("observed_at"), require_keys=require_keys)


def _raw_fields(args: Args, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: args.raw(name) for name in names}


_WRITE_FIELDS: Final = ("content", "keys", "key_types", "namespace", "ttl_seconds", "decay_profile",
                        "related_to", "source", "observed_at")


# -- handlers --------------------------------------------------------------------------


def _recall(ctx: Context, args: Args) -> Any:
    return recall.recall(
        ctx.graph, args.text("query"), namespace=args.raw("namespace"), top_k=args.integer("top_k"),
        context=args.raw("context"), explain=args.boolean("explain"),
        max_chars=args.integer("max_chars", default=ctx.settings.inject_max_chars), host=ctx.host)


def _browse_keys(ctx: Context, args: Args) -> Any:
    return ctx.graph.browse_keys(args.raw("namespace"), hubs_only=args.boolean("hubs_only"),
                                 limit=args.integer("limit"), offset=args.integer("offset"))


def _read_key(ctx: Context, args: Args) -> Any:
    return ctx.graph.read_key(args.raw("key_id"), query=args.text("query"), namespace=args.raw("namespace"),
                              limit=args.integer("limit"), offset=args.integer("offset"))


def _read_memory(ctx: Context, args: Args) -> Any:
    return ctx.graph.read_memory(args.raw("memory_id"), via_key_id=args.raw("via_key_id"),
                                 namespace=args.raw("namespace"))


def _confirm_memory(ctx: Context, args: Args) -> Any:
    source = args.raw("source")
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError:
            raise InvalidInput("source is not a JSON object", field="source") from None
    return ctx.graph.confirm_memory(args.raw("memory_id"), args.raw("evidence"), namespace=args.raw("namespace"),
                                    source=source, host=ctx.host)


def _remember(ctx: Context, args: Args) -> Any:
    request = _new_memory(ctx, _raw_fields(args, _WRITE_FIELDS))
    return ctx.graph.remember(request, host=ctx.host, idempotency_key=ctx.idempotency_key)


def _remember_batch(ctx: Context, args: Args) -> Any:
    items = args.array("items")
    if not items:
        raise InvalidInput("items must be a non-empty array of {content, keys, ...}", field="items")
    if len(items) > MAX_REMEMBER_BATCH:
        raise InvalidInput(f"items has {len(items)} entries; send at most {MAX_REMEMBER_BATCH} per call", field="items")
    prepared: list[NewMemory | InvalidInput] = []
    allowed = set(_WRITE_FIELDS)
    for index, item in enumerate(items):
        try:
            if not isinstance(item, Mapping):
                raise InvalidInput(f"items[{index}] must be an object", field=f"items[{index}]")
            unknown = sorted(set(item) - allowed)
            if unknown:
                raise InvalidInput(f"items[{index}] has no field {unknown[0]!r}", field=f"items[{index}].{unknown[0]}")
            prepared.append(_new_memory(ctx, item))
        except (InvalidInput, Refused) as exc:
            field = getattr(exc, "field", None) or "keys"
            prepared.append(InvalidInput(exc.message, field=field))
    return ctx.graph.remember_batch(prepared, host=ctx.host, idempotency_key=ctx.idempotency_key)


def _correct(ctx: Context, args: Args) -> Any:
    request = _new_memory(ctx, _raw_fields(args, _WRITE_FIELDS), require_keys=False)
    return ctx.graph.correct(
        args.raw("memory_id"), request, keys_given=args.has("keys"), related_given=args.has("related_to"),
        ttl_given=args.given("ttl_seconds"), decay_given=args.has("decay_profile"), host=ctx.host,
        idempotency_key=ctx.idempotency_key)


def _dismiss(ctx: Context, args: Args) -> Any:
    return ctx.graph.dismiss(args.raw("memory_id"), args.raw("key_id"), namespace=args.raw("namespace"))


def _forget(ctx: Context, args: Args) -> Any:
    return ctx.graph.forget(args.raw("memory_id"), idempotency_key=ctx.idempotency_key)


def _related(ctx: Context, args: Args) -> Any:
    return ctx.graph.related(args.raw("memory_id"))


def _list_memories(ctx: Context, args: Args) -> Any:
    return ctx.graph.list_memories(args.raw("namespace"), limit=args.integer("limit"), offset=args.integer("offset"))


def _memory_stats(ctx: Context, args: Args) -> Any:
    return ctx.graph.stats()


def _cleanup_expired(ctx: Context, args: Args) -> Any:
    return ctx.graph.cleanup_expired()


def _recall_memories(ctx: Context, args: Args) -> Any:
    query = args.text("query")
    if not query or not query.strip():
        raise InvalidInput("query must be a non-empty string", field="query")
    namespace = ctx.graph.resolve_namespace(args.raw("namespace"))
    result = hybrid.hybrid_recall(
        ctx.graph, query.strip()[:limits.MAX_QUERY_CHARS], scope=scope_of(namespace),
        top_k=args.integer("top_k"), hops=args.integer("hops"), min_rel_score=args.number("min_rel_score"),
        min_depth=args.number("min_depth"), reinforce=args.boolean("reinforce", True),
        context=args.text("context"))
    return result.hits


def _list_sessions(ctx: Context, args: Args) -> Any:
    agent = args.text("agent")
    if agent is not None and agent not in transcripts.AGENTS:
        raise InvalidInput("agent must be claude or codex", field="agent")
    return transcripts.list_sessions(transcripts.TranscriptRoots.from_settings(ctx.settings),
                                     agent=agent, limit=args.integer("limit"))


def _get_conversation(ctx: Context, args: Args) -> Any:
    agent = args.text("agent")
    if agent is not None and agent not in transcripts.AGENTS:
        raise InvalidInput("agent must be claude or codex", field="agent")
    return transcripts.get_conversation(
        transcripts.TranscriptRoots.from_settings(ctx.settings), args.text("session_id") or "", agent=agent,
        turn=args.integer("turn") if args.has("turn") else None, from_turn=args.integer("from_turn"),
        max_turns=args.integer("limit"))


# -- the tool table --------------------------------------------------------------------

TOOLS: Final[tuple[Tool, ...]] = (
    Tool("recall",
         "Search long-term memory for what is already known about the user, the project or a topic. Call it "
         "before your first reply and whenever the topic shifts, with short noun keywords as `query`, the raw "
         "user utterance as `context`, and the active namespace. Returns ranked key clusters (concept, aliases, "
         "memory_count, is_hub, specificity) plus ONE passive Top-1 memory under the best key, with validity, "
         "matched_key and connected_keys -- answer from it, or continue read_key(key_id, query) -> "
         "read_memory(memory_id, via_key_id). Decompose multi-fact questions into several recalls. On "
         "{status:'no_match'} retry with a nearest_keys concept or browse_keys(namespace).",
         {"query": {"type": "string", "description": "Short noun keywords (e.g. '배포 일정', 'editor preference')."},
          "top_k": limits.RECALL_TOP_K.schema(),
          "namespace": _NS,
          "context": {"type": "string", "description": "The raw user utterance; sharpens which memory is shown."},
          "explain": {"type": "boolean", "description": "Also report the namespace's memory count."},
          "max_chars": {**limits.INJECT_MAX_CHARS.schema(), "default": Settings().inject_max_chars}},
         ("query",), _recall),
    Tool("browse_keys",
         "Browse the key vocabulary of one namespace when recall has no hit or you need an entry point: active "
         "key clusters, hubs first, then by memory count. Index metadata only; continue with read_key.",
         {"namespace": _NS, "hubs_only": {"type": "boolean"},
          "limit": limits.BROWSE_LIMIT.schema(), "offset": limits.OFFSET.schema()},
         (), _browse_keys),
    Tool("read_key",
         "List the memories stored under one key as ranked handles (ids, depth, validity, link weight, "
         "relevance) -- never content. Always pass the original focused query: handles are then ranked by "
         "content relevance, which matters for hubs. Then read_memory(memory_id, via_key_id=key_id). "
         "Page with limit/offset.",
         {"key_id": _KEY_ID, "query": {"type": "string"}, "namespace": _NS,
          "limit": limits.READ_KEY_LIMIT.schema(), "offset": limits.OFFSET.schema()},
         ("key_id",), _read_key),
    Tool("read_memory",
         "Read one memory in full, with every key it is linked to, so exploration can continue Key -> Memory -> "
         "Key. Pass via_key_id (the key you came from): only that edge is reinforced. Counts the access; it does "
         "NOT confirm the memory is still true -- reading is not evidence.",
         {"memory_id": _MEMORY_ID, "via_key_id": _KEY_ID, "namespace": _NS},
         ("memory_id",), _read_memory),
    Tool("confirm_memory",
         "Confirm a memory is still current because of real evidence: the user said so (user), an "
         "authoritative source shows it (authoritative_source), or you observed it directly (observation). "
         "Refreshes its freshness and deepens it. Never confirm merely because you read or recalled it.",
         {"memory_id": _MEMORY_ID,
          "evidence": {"enum": ["user", "authoritative_source", "observation"]},
          "namespace": _NS, "source": _SOURCE},
         ("memory_id", "evidence"), _confirm_memory),
    Tool("remember",
         "Save a durable fact (names, preferences, decisions, corrections, project facts, goals) before ending "
         "the turn in which it appeared -- silently. recall the topic first and reuse its canonical concepts. "
         "Use 3-6 diverse ATOMIC keys of 1-2 words ('Nexora' and 'portfolio', not 'Nexora portfolio'), "
         "registering both languages together ('배포' and 'deployment'). key_types marks people/products as "
         "name/proper_noun (matched literally). Act on hints.near_keys (reuse those concepts) and "
         "hints.language_note. An identical fact is not duplicated. Secrets are redacted before storage.",
         {"content": {"type": "string", "description": "The fact, in a self-contained sentence."},
          "keys": _KEYS, "key_types": _KEY_TYPES, "namespace": _NS, "ttl_seconds": _TTL, "decay_profile": _DECAY,
          "related_to": _RELATED, "source": _SOURCE, "observed_at": _OBSERVED},
         ("content", "keys"), _remember),
    Tool("correct",
         "Update a fact that changed or was wrong (moved cities, switched tools). The new version supersedes "
         "the old one, which stays readable by id only. Omit keys to keep the same keys; unspecified ttl, "
         "decay_profile and related_to are inherited.",
         {"memory_id": _MEMORY_ID, "content": {"type": "string"}, "keys": _KEYS, "key_types": _KEY_TYPES,
          "ttl_seconds": {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TTL_SECONDS},
                                    {"type": "null"}],
                          "description": "Expire this many seconds from now; null clears the expiry; "
                                         "omitted keeps the old one."},
          "decay_profile": _DECAY, "related_to": _RELATED,
          "source": _SOURCE, "observed_at": _OBSERVED},
         ("memory_id", "content"), _correct),
    Tool("dismiss",
         "Negative feedback: the memory is fine but should not surface under this key. Weakens that one link "
         "(floored, never severed) and cancels its pending alias learning. The memory is unchanged.",
         {"memory_id": _MEMORY_ID, "key_id": _KEY_ID, "namespace": _NS},
         ("memory_id", "key_id"), _dismiss),
    Tool("forget",
         "Permanently delete a memory that is completely wrong. For outdated facts use correct instead. "
         "Deleting a correction brings back the version it replaced.",
         {"memory_id": _MEMORY_ID}, ("memory_id",), _forget),
    Tool("remember_batch",
         "Save several durable facts revealed in one turn, in one call. Each item takes the same fields as "
         "remember. Items are checked one by one: a malformed item is reported in its own result and not "
         "stored, the others are saved together.",
         {"items": {"type": "array", "minItems": 1, "maxItems": MAX_REMEMBER_BATCH, "items": {
             "type": "object", "required": ["content", "keys"],
             "properties": {"content": {"type": "string"}, "keys": _KEYS, "key_types": _KEY_TYPES, "namespace": _NS,
                            "ttl_seconds": _TTL, "decay_profile": _DECAY, "related_to": _RELATED,
                            "source": _SOURCE, "observed_at": _OBSERVED}}}},
         ("items",), _remember_batch),
    # -- the extended surface (KEYMEM_TOOLS=full) --
    Tool("related",
         "Memories associated with one memory: through shared keys (rarer keys count more) and explicit links.",
         {"memory_id": _MEMORY_ID}, ("memory_id",), _related, "full"),
    Tool("list_memories", "List active memories, oldest first, optionally in one namespace.",
         {"namespace": _NS, "limit": limits.LIST_LIMIT.schema(), "offset": limits.LIST_OFFSET.schema()},
         (), _list_memories, "full"),
    Tool("memory_stats", "Counts of keys, memories and links, per namespace.", {}, (), _memory_stats, "full"),
    Tool("cleanup_expired", "Delete expired memories now (the daemon also does it every hour).", {}, (),
         _cleanup_expired, "full"),
    Tool("recall_memories",
         "Direct hybrid recall: memory contents ranked by how much of the query they cover (in their text or "
         "through their keys) and by meaning, weighted by depth and freshness, expanded along narrow keys for "
         "`hops`. Reinforces what it returns.",
         {"query": {"type": "string"}, "top_k": limits.HYBRID_TOP_K.schema(),
          "namespace": _NS, "hops": limits.HOPS.schema(),
          "min_rel_score": limits.MIN_REL_SCORE.schema(), "min_depth": limits.MIN_DEPTH.schema(),
          "reinforce": {"type": "boolean", "default": True}, "context": {"type": "string"}},
         ("query",), _recall_memories, "full"),
    Tool("list_sessions", "This host's own recent sessions (Claude Code / Codex transcripts), newest first.",
         {"agent": {"enum": ["claude", "codex"]},
          "limit": limits.SESSIONS_LIMIT.schema()},
         (), _list_sessions, "trusted"),
    Tool("get_conversation",
         "The turns of one host session (UUID), a page at a time: `limit` turns from `from_turn` on, or a "
         "window of turns around `turn` (e.g. a memory's host_turn). A page carries at most "
         f"{transcripts.PAGE_BYTES // 1024} KB of text; `next_from_turn` says where the next page starts.",
         {"session_id": {"type": "string"}, "agent": {"enum": ["claude", "codex"]},
          "turn": limits.TURN.schema(), "from_turn": {**limits.TURN.schema(), "default": 0},
          "limit": {**limits.TURNS_LIMIT.schema(), "default": transcripts.PAGE_TURNS}},
         ("session_id",), _get_conversation, "trusted"),
)
TOOLS_BY_NAME: Final = {t.name: t for t in TOOLS}
WRITE_TOOLS: Final = frozenset({"remember", "remember_batch", "correct", "forget"})


def transcripts_allowed(settings: Settings, host: Host) -> bool:
    """Transcript tools: the full surface, and a trusted local host (or an explicit true);
    KEYMEM_TRANSCRIPT_ACCESS=false always wins."""
    if settings.tools != "full" or settings.transcript_access == "false":
        return False
    return settings.transcript_access == "true" or bool(host.agent and host.session)


def visible_tools(settings: Settings, host: Host) -> list[Tool]:
    out = []
    for tool in TOOLS:
        if tool.surface == "full" and settings.tools != "full":
            continue
        if tool.surface == "trusted" and not transcripts_allowed(settings, host):
            continue
        out.append(tool)
    return out


def definitions(settings: Settings, host: Host) -> list[dict[str, Any]]:
    return [t.definition() for t in visible_tools(settings, host)]


def visible_tool(settings: Settings, host: Host, name: str) -> Tool:
    """The tool called ``name`` if this caller may see it; ``NotFound`` otherwise."""
    tool = TOOLS_BY_NAME.get(name)
    if tool is None or tool not in visible_tools(settings, host):
        raise NotFound(f"Unknown tool: {name}")
    return tool


def call_tool(ctx: Context, name: str, arguments: Mapping[str, Any] | None) -> Outcome:
    """Run one tool. Unknown (or not visible) tools raise ``NotFound``."""
    tool = visible_tool(ctx.settings, ctx.host, name)
    return outcome(name, arguments, lambda: tool.handler(ctx, Args(tool, arguments)))


def outcome(name: str, arguments: Mapping[str, Any] | None, run: Callable[[], Any]) -> Outcome:
    """What the shim forwards for one run of tool ``name`` (``run`` returns the engine's
    result, or raises): faults as ``is_error``, refusals as an ``{"error": ...}`` result."""
    try:
        result = run()
    except InvalidInput as exc:
        return Outcome({"error": exc.message, **({"field": exc.field} if exc.field else {})}, is_error=True)
    except (NotFound, Refused) as exc:
        body: dict[str, Any] = {"error": exc.message}
        if name == "remember" and isinstance(exc, Refused):
            body["provided_keys"] = (arguments or {}).get("keys")
        return Outcome(body)
    if isinstance(result, Replayed):
        return Outcome(result.result)
    return Outcome(render(result))
