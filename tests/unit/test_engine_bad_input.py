"""Bad input through the MCP tool layer: every malformed argument gives a clear error that
names its field, refusals say what to fix, and none of them changes the store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from engine_helpers import FakeClock, StoreAt, Tools, key_id, open_graph, remember, state
from pg_cluster import OWNER as PG_OWNER

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import NotFound, Refused
from keymem_daemon.inference.embedders import Embedder
from keymem_daemon.mcp.tools import Context, call_tool

pytestmark = pytest.mark.timeout(60)

MID = "<mid>"
KID = "<kid>"


def fill(value: Any, mid: str, kid: str) -> Any:
    if value == MID:
        return mid
    if value == KID:
        return kid
    if isinstance(value, dict):
        return {k: fill(v, mid, kid) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, mid, kid) for v in value]
    return value


GOOD = {"content": "Deploys go out on Fridays", "keys": ["deployment", "Friday"]}

FAULTS: list[tuple[str, dict[str, Any], str]] = [
    ("remember", {"keys": ["deployment"]}, "content"),
    ("remember", {**GOOD, "content": ""}, "content"),
    ("remember", {**GOOD, "content": "   \n\t "}, "content"),
    ("remember", {**GOOD, "content": 42}, "content"),
    ("remember", {**GOOD, "content": ["a list"]}, "content"),
    ("remember", {**GOOD, "content": "x" * 20001}, "content"),
    ("remember", {"content": "Deploys go out on Fridays"}, "keys"),
    ("remember", {**GOOD, "keys": 5}, "keys"),
    ("remember", {**GOOD, "keys": ["ok", 7]}, "keys"),
    ("remember", {**GOOD, "keys": "[not json"}, "keys"),
    ("remember", {**GOOD, "keys": [f"key{i}" for i in range(13)]}, "keys"),
    ("remember", {**GOOD, "key_types": {"deployment": "person"}}, "key_types"),
    ("remember", {**GOOD, "key_types": ["name"]}, "key_types"),
    ("remember", {**GOOD, "namespace": 5}, "namespace"),
    ("remember", {**GOOD, "ttl_seconds": "soon"}, "ttl_seconds"),
    ("remember", {**GOOD, "ttl_seconds": True}, "ttl_seconds"),
    ("remember", {**GOOD, "ttl_seconds": float("nan")}, "ttl_seconds"),
    ("remember", {**GOOD, "ttl_seconds": [60]}, "ttl_seconds"),
    ("remember", {**GOOD, "decay_profile": "forever"}, "decay_profile"),
    ("remember", {**GOOD, "decay_profile": 3}, "decay_profile"),
    ("remember", {**GOOD, "related_to": 5}, "related_to"),
    ("remember", {**GOOD, "related_to": [5]}, "related_to"),
    ("remember", {**GOOD, "related_to": ["0123456789ab"]}, "related_to"),
    ("remember", {**GOOD, "source": "not json"}, "source"),
    ("remember", {**GOOD, "source": ["list"]}, "source"),
    ("remember", {**GOOD, "observed_at": "sometime last spring"}, "observed_at"),
    ("remember", {**GOOD, "colour": "blue"}, "colour"),
    ("recall", {}, "query"),
    ("recall", {"query": 5}, "query"),
    ("recall", {"query": "   "}, "query"),
    ("recall", {"query": "deployment", "top_k": "many"}, "top_k"),
    ("recall", {"query": "deployment", "explain": "maybe"}, "explain"),
    ("recall", {"query": "deployment", "max_chars": {}}, "max_chars"),
    ("browse_keys", {"limit": "all"}, "limit"),
    ("browse_keys", {"namespace": 3}, "namespace"),
    ("read_key", {}, "key_id"),
    ("read_key", {"key_id": 5}, "key_id"),
    ("read_key", {"key_id": "deployment"}, "key_id"),
    ("read_key", {"key_id": KID, "limit": "x"}, "limit"),
    ("read_key", {"key_id": KID, "query": 3}, "query"),
    ("read_memory", {}, "memory_id"),
    ("read_memory", {"memory_id": 5}, "memory_id"),
    ("read_memory", {"memory_id": MID, "via_key_id": 5}, "via_key_id"),
    ("confirm_memory", {"memory_id": MID}, "evidence"),
    ("confirm_memory", {"memory_id": MID, "evidence": "hunch"}, "evidence"),
    ("confirm_memory", {"memory_id": MID, "evidence": "user", "source": "{bad"}, "source"),
    ("confirm_memory", {"evidence": "user"}, "memory_id"),
    ("correct", {"content": "New text"}, "memory_id"),
    ("correct", {"memory_id": MID}, "content"),
    ("correct", {"memory_id": MID, "content": ""}, "content"),
    (
        "correct",
        {"memory_id": MID, "content": "New text", "decay_profile": "forever"},
        "decay_profile",
    ),
    ("correct", {"memory_id": MID, "content": "New text", "ttl_seconds": "later"}, "ttl_seconds"),
    (
        "correct",
        {"memory_id": MID, "content": "New text", "related_to": ["0123456789ab"]},
        "related_to",
    ),
    ("dismiss", {"memory_id": MID}, "key_id"),
    ("dismiss", {"key_id": KID}, "memory_id"),
    ("forget", {}, "memory_id"),
    ("forget", {"memory_id": 5}, "memory_id"),
    ("remember_batch", {}, "items"),
    ("remember_batch", {"items": []}, "items"),
    ("remember_batch", {"items": "not an array"}, "items"),
    ("remember_batch", {"items": {"content": "x"}}, "items"),
    ("remember_batch", {"items": [GOOD] * 101}, "items"),
    ("recall_memories", {"query": "deployment", "hops": "far"}, "hops"),
    ("recall_memories", {"query": ""}, "query"),
    ("list_memories", {"limit": "x"}, "limit"),
]


def seed(graph: MemoryGraph) -> tuple[str, str]:
    """One memory and its key: the ids the faults name (``MID``, ``KID``)."""
    mid = remember(
        graph, "The staging database is Postgres 15", ["staging", "database", "데이터베이스"]
    )
    return mid, key_id(graph, "database")


@pytest.fixture(scope="module")
def seeded_stores(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder, analyzer: Analyzer, request: pytest.FixtureRequest
) -> Iterator[Callable[[str], tuple[Tools, tuple[str, str]]]]:
    """``seeded_stores(backend)``: one seeded store per backend for the module's tests that
    change nothing -- each asserts that its store is as it found it, so the next one finds
    the same seeded store a fresh one would have (a store per case cost a database and an
    open, 100+ times)."""
    opened: dict[str, tuple[Tools, tuple[str, str]]] = {}
    databases: list[str] = []

    def get(backend: str) -> tuple[Tools, tuple[str, str]]:
        if backend not in opened:
            where = tmp_path_factory.mktemp("seeded")
            store: StoreAt = where / "keymem.db"
            if backend == "postgres":
                databases.append(request.getfixturevalue("pg_fresh_databases").take())
                store = request.getfixturevalue("pg_cluster").url_for(PG_OWNER, databases[-1])
            graph = open_graph(store, embedder, Settings(data_dir=where), FakeClock(), analyzer)
            opened[backend] = Tools(graph, Settings(data_dir=where, tools="full"), Host()), seed(graph)
        return opened[backend]

    yield get
    for tools, _ in opened.values():
        tools.graph.close()
    for database in databases:
        request.getfixturevalue("pg_fresh_databases").give_back(database)


@pytest.fixture
def unchanged(
    backend: str, seeded_stores: Callable[[str], tuple[Tools, tuple[str, str]]]
) -> tuple[Tools, tuple[str, str]]:
    """The module's seeded store of the test's backend (``seeded_stores``): for tests that
    assert they leave it unchanged."""
    return seeded_stores(backend)


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    FAULTS,
    ids=[f"{t}-{f}-{i}" for i, (t, _, f) in enumerate(FAULTS)],
)
def test_a_malformed_argument_is_an_error_naming_its_field_and_changes_nothing(
    unchanged: tuple[Tools, tuple[str, str]],
    tool: str,
    arguments: dict[str, Any],
    field: str,
) -> None:
    tools, seeded = unchanged
    graph = tools.graph
    before = state(graph)
    outcome = tools(tool, fill(arguments, *seeded))
    assert outcome.is_error, outcome.result
    assert outcome.result["field"] == field
    message = outcome.result["error"]
    assert isinstance(message, str)
    assert field in message or field.replace("_", " ") in message, message
    assert "Traceback" not in message
    assert state(graph) == before


@pytest.mark.parametrize("keys", [["a"], [], ["x", "y", " "], "b"])
def test_no_usable_key_is_a_refusal_that_saves_nothing(
    graph: MemoryGraph, tools: Tools, keys: Any
) -> None:  # noqa: F811
    before = state(graph)
    outcome = tools("remember", {"content": "A fact with no usable key", "keys": keys})
    assert not outcome.is_error
    assert outcome.result["error"].startswith("keys required: no usable key survived sanitizing")
    assert "Nothing was saved" in outcome.result["error"]
    assert outcome.result["provided_keys"] == keys
    assert state(graph) == before
    with pytest.raises(Refused, match="keys required"):
        graph.prepare(content="A fact with no usable key", keys=keys)


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("read_memory", {"memory_id": "0123456789ab"}, "Memory 0123456789ab not found"),
        ("read_memory", {"memory_id": "not-an-id"}, "Memory not-an-id not found"),
        ("read_key", {"key_id": "0123456789ab"}, "Key 0123456789ab not found"),
        (
            "correct",
            {"memory_id": "0123456789ab", "content": "New"},
            "Memory 0123456789ab not found",
        ),
        (
            "confirm_memory",
            {"memory_id": "0123456789ab", "evidence": "user"},
            "Memory 0123456789ab not found",
        ),
        ("dismiss", {"memory_id": "0123456789ab", "key_id": KID}, "Memory 0123456789ab not found"),
        (
            "dismiss",
            {"memory_id": MID, "key_id": "0123456789ab"},
            "Key 0123456789ab is not linked to memory",
        ),
        (
            "read_memory",
            {"memory_id": MID, "via_key_id": "0123456789ab"},
            "Key 0123456789ab is not linked to memory",
        ),
    ],
)
def test_an_unknown_id_gives_a_clear_error_and_changes_nothing(
    unchanged: tuple[Tools, tuple[str, str]],
    tool: str,
    arguments: dict[str, Any],
    message: str,
) -> None:
    tools, seeded = unchanged
    graph = tools.graph
    before = state(graph)
    outcome = tools(tool, fill(arguments, *seeded))
    assert message in outcome.result["error"]
    assert state(graph) == before


def test_forgetting_an_unknown_id_reports_nothing_deleted(unchanged: tuple[Tools, tuple[str, str]]) -> None:
    tools, _ = unchanged
    graph = tools.graph
    before = state(graph)
    assert tools.ok("forget", {"memory_id": "0123456789ab"}) == {"deleted": False}
    assert state(graph) == before


def test_arguments_that_are_not_an_object_are_an_error(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    outcome = tools("recall", ["deployment"])
    assert outcome.is_error and "object" in outcome.result["error"]


def test_an_unknown_tool_is_not_found(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    with pytest.raises(NotFound, match="Unknown tool: teleport"):
        tools("teleport", {})


def test_the_extended_tools_are_hidden_on_the_default_surface(
    graph: MemoryGraph, settings: Settings
) -> None:  # noqa: F811
    ctx = Context(graph, settings, Host())
    for name in ("related", "list_memories", "memory_stats", "cleanup_expired", "recall_memories"):
        with pytest.raises(NotFound, match=f"Unknown tool: {name}"):
            call_tool(ctx, name, {})
    assert call_tool(ctx, "browse_keys", {}).is_error is False


def test_arrays_and_objects_may_arrive_as_json_strings(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    result = tools.ok(
        "remember",
        {
            "content": "Mina runs the design team",
            "keys": '["Mina", "design"]',
            "key_types": '{"Mina": "name"}',
            "source": '{"origin": "chat"}',
        },
    )
    view = graph.read_memory(result["saved"])
    assert {k.concept for k in view.keys} == {"Mina", "design"}
    assert view.memory.source["origin"] == "chat"  # type: ignore[index]
    batch = tools.ok(
        "remember_batch", {"items": '[{"content": "Batch fact", "keys": ["batch", "fact"]}]'}
    )
    assert batch["saved"] == 1


def test_a_batch_with_a_bad_item_leaves_the_others_saved_and_names_the_bad_item(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    result = tools.ok(
        "remember_batch",
        {
            "items": [
                {"content": "Deploys go out on Fridays", "keys": ["deployment", "Friday"]},
                {"content": "Bad profile", "keys": ["profile", "test"], "decay_profile": "forever"},
            ]
        },
    )
    assert result["saved"] == 1 and result["failed"] == 1
    bad = result["items"][1]
    assert bad["index"] == 1 and bad["field"] == "decay_profile" and "forever" in bad["error"]
    assert graph.stats().memories == 1


def test_issue_19_every_numeric_argument_has_its_range_in_the_schema_the_handler_reads() -> None:
    """The tool layer clamps numbers into the schema's own range, so every numeric property
    carries one: an open-ended offset once let 1e300 reach SQLite as an integer."""
    from keymem_daemon.engine.limits import MAX_TTL_SECONDS
    from keymem_daemon.mcp.tools import TOOLS

    for tool in TOOLS:
        for name, schema in tool.properties.items():
            if name == "ttl_seconds":  # refused out of range (by the engine), never clamped
                ranges = [s for s in schema.get("anyOf", [schema]) if s.get("type") == "number"]
                assert ranges == [{**ranges[0], "exclusiveMinimum": 0, "maximum": MAX_TTL_SECONDS}], tool.name
            elif schema.get("type") in ("integer", "number"):
                assert {"minimum", "maximum"} <= set(schema), (tool.name, name)
                assert name == "turn" or "default" in schema, (tool.name, name)
