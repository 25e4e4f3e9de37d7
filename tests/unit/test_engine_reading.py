"""The read side of the walk: browse_keys, read_key, read_memory, and the feedback tools
confirm_memory and dismiss -- each through the engine and through the MCP tool layer."""

from __future__ import annotations

import re

import pytest
from engine_helpers import (
    DAY,
    START,
    FakeClock,
    Tools,
    db_read,
    key_id,
    link_weight,
    memory_row,
    remember,
    state,
)

from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput, NotFound, Refused

pytestmark = pytest.mark.timeout(60)

HOST = Host(agent="claude", session="4f1c2d3e-5a6b-4c7d-8e9f-0a1b2c3d4e5f", turn=2)


def seed_deploys(graph: MemoryGraph) -> dict[str, str]:
    ids = {
        "friday": remember(
            graph, "Deploys go out on Fridays after the standup", ["deployment", "배포", "Friday"]
        ),
        "green": remember(
            graph, "A deploy needs a green CI build first", ["deployment", "CI", "build"]
        ),
        "slack": remember(
            graph, "Deploys are announced in the #releases Slack channel", ["deployment", "Slack"]
        ),
        "coffee": remember(
            graph, "The user drinks oat milk lattes", ["coffee", "커피", "preference"]
        ),
    }
    return ids


# -- browse_keys ------------------------------------------------------------------------


def test_browse_keys_lists_hubs_first_then_by_memory_count_then_concept(graph: MemoryGraph) -> None:
    seed_deploys(graph)
    result = graph.browse_keys()
    assert result.status == "ok"
    assert result.memory_count == 4
    order = [k.concept for k in result.keys]
    assert order[0] == "deployment" and result.keys[0].is_hub
    rest = result.keys[1:]
    assert all(not k.is_hub for k in rest)
    assert [(k.memory_count, k.concept.casefold()) for k in rest] == sorted(
        (k.memory_count, k.concept.casefold()) for k in rest
    )
    assert result.key_count == len(order)
    assert {"deployment", "CI", "build", "Slack", "Friday", "coffee", "preference"} == set(order)


def test_browse_keys_is_scoped_to_a_namespace(graph: MemoryGraph) -> None:
    seed_deploys(graph)
    remember(graph, "Atlas uses Alembic for migrations", ["Atlas", "migration"], namespace="Work")
    work = graph.browse_keys("work")
    assert work.namespace == "work"
    assert {k.concept for k in work.keys} == {"Atlas", "migration"}
    assert work.memory_count == 1
    assert "Atlas" not in {k.concept for k in graph.browse_keys("default").keys}
    assert {"Atlas", "deployment"} <= {k.concept for k in graph.browse_keys().keys}


def test_browse_keys_pages_with_next_offset(graph: MemoryGraph) -> None:
    seed_deploys(graph)
    everything = [k.key_id for k in graph.browse_keys(limit=100).keys]
    first = graph.browse_keys(limit=3)
    assert first.next_offset == 3 and len(first.keys) == 3
    second = graph.browse_keys(limit=3, offset=3)
    last = graph.browse_keys(limit=3, offset=6)
    assert last.next_offset is None
    assert [k.key_id for k in first.keys + second.keys + last.keys] == everything


def test_browse_keys_can_list_only_hubs(graph: MemoryGraph) -> None:
    seed_deploys(graph)
    assert [k.concept for k in graph.browse_keys(hubs_only=True).keys] == ["deployment"]


def test_browse_keys_of_an_empty_namespace_says_so(graph: MemoryGraph) -> None:
    seed_deploys(graph)
    empty = graph.browse_keys("nowhere")
    assert empty.status == "empty_namespace" and empty.keys == [] and empty.memory_count == 0


def test_browse_keys_hides_keys_whose_memories_expired(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    remember(graph, "A short-lived note", ["ephemeral", "note"], ttl_seconds=60)
    assert {k.concept for k in graph.browse_keys().keys} == {"ephemeral", "note"}
    clock.advance(61)
    assert graph.browse_keys().status == "empty_namespace"


# -- read_key ---------------------------------------------------------------------------


def test_read_key_returns_ranked_handles_and_never_content(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    ids = seed_deploys(graph)
    kid = key_id(graph, "deployment")
    result = tools.ok("read_key", {"key_id": kid, "query": "Slack announcement channel"})
    assert result["key"]["concept"] == "deployment" and result["key"]["is_hub"] is True
    assert result["total"] == 3 and result["next_offset"] is None
    assert result["memories"][0]["memory_id"] == ids["slack"]
    for handle in result["memories"]:
        assert "content" not in handle
        assert handle["evidence"] == "unread" and handle["suggested_tool"] == "read_memory"
        assert handle["score_kind"] == "within_key_rank"
        assert 0 <= handle["content_relevance"] <= 1
        assert handle["validity"]["status"] == "fresh"
    scores = [h["score"] for h in result["memories"]]
    assert scores == sorted(scores, reverse=True)
    text = str(result)
    for content in ("Fridays after the standup", "green CI build", "#releases"):
        assert content not in text


def test_read_key_without_a_query_ranks_by_link_weight(graph: MemoryGraph) -> None:
    ids = seed_deploys(graph)
    kid = key_id(graph, "deployment")
    for _ in range(2):
        graph.read_memory(ids["green"], via_key_id=kid)
    result = graph.read_key(kid)
    assert result.memories[0].memory_id == ids["green"]
    assert result.memories[0].link_weight == pytest.approx(1.2)
    assert all(h.content_relevance is None and h.score_kind == "link_rank" for h in result.memories)


def test_read_key_pages_with_total_and_next_offset(graph: MemoryGraph) -> None:
    seed_deploys(graph)
    kid = key_id(graph, "deployment")
    everything = [h.memory_id for h in graph.read_key(kid).memories]
    first = graph.read_key(kid, limit=2)
    assert (first.total, first.next_offset, len(first.memories)) == (3, 2, 2)
    second = graph.read_key(kid, limit=2, offset=2)
    assert (second.total, second.next_offset, len(second.memories)) == (3, None, 1)
    assert [h.memory_id for h in first.memories + second.memories] == everything


def test_read_key_is_read_only(graph: MemoryGraph) -> None:
    seed_deploys(graph)
    kid = key_id(graph, "deployment")
    before = state(graph)
    graph.read_key(kid, query="deploys")
    graph.read_key(kid)
    assert state(graph) == before


def test_read_key_is_scoped_to_a_namespace(graph: MemoryGraph) -> None:
    home = remember(graph, "Home wifi is fast", ["wifi", "network"])
    work = remember(graph, "Office wifi needs a VPN", ["wifi", "vpn"], namespace="work")
    kid = key_id(graph, "wifi")
    assert [h.memory_id for h in graph.read_key(kid, namespace="work").memories] == [work]
    assert [h.memory_id for h in graph.read_key(kid, namespace="default").memories] == [home]
    assert graph.read_key(kid).total == 2


def test_read_key_with_concept_text_instead_of_an_id_explains_the_12_character_id(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    seed_deploys(graph)
    with pytest.raises(InvalidInput, match="12-character") as caught:
        graph.read_key("deployment")
    assert "recall(query)" in caught.value.message
    outcome = tools("read_key", {"key_id": "deployment"})
    assert outcome.is_error
    assert "12-character" in outcome.result["error"] and outcome.result["field"] == "key_id"


def test_read_key_of_an_unknown_well_formed_id_is_not_found(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    with pytest.raises(NotFound, match=r"^Key 0123456789ab not found$"):
        graph.read_key("0123456789ab")
    assert tools("read_key", {"key_id": "0123456789ab"}).result == {
        "error": "Key 0123456789ab not found"
    }


# -- read_memory ------------------------------------------------------------------------


def test_read_memory_returns_full_content_and_keys_sorted_by_link_weight(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    long = "Deploy checklist: " + "run the smoke tests, " * 200 + "then announce it."
    mid = remember(graph, long, ["deployment", "checklist", "smoke test"])
    checklist = key_id(graph, "checklist")
    graph.read_memory(mid, via_key_id=checklist)
    result = tools.ok("read_memory", {"memory_id": mid})
    assert result["memory"]["content"] == long
    assert (
        result["evidence"] == "read"
        and result["grounded"] is True
        and result["suggested_tool"] is None
    )
    assert result["via_key_id"] is None
    weights = [k["link_weight"] for k in result["keys"]]
    assert weights == sorted(weights, reverse=True)
    assert result["keys"][0]["key_id"] == checklist and result["keys"][0]["link_weight"] == 1.1
    assert {
        "key_id",
        "concept",
        "aliases",
        "key_type",
        "memory_count",
        "is_hub",
        "specificity",
        "link_weight",
        "traversed_from",
    } <= set(result["keys"][0])
    for name in (
        "id",
        "content",
        "depth",
        "access_count",
        "last_accessed",
        "created_at",
        "source",
        "namespace",
        "expires_at",
        "supersedes",
        "superseded_by",
        "related_to",
        "validity",
    ):
        assert name in result["memory"], name


def test_read_memory_reinforces_only_the_traversed_edge(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(
        graph, "Deploys go out on Fridays after the standup", ["deployment", "Friday", "standup"]
    )
    other = remember(graph, "Standup starts at 9:30", ["standup", "meeting"])
    deploy, friday, standup = (key_id(graph, k) for k in ("deployment", "Friday", "standup"))
    clock.advance(60)
    result = graph.read_memory(mid, via_key_id=friday)
    assert result.via_key_id == friday
    assert link_weight(graph, friday, mid) == pytest.approx(1.1)
    assert link_weight(graph, deploy, mid) == pytest.approx(1.0)
    assert link_weight(graph, standup, mid) == pytest.approx(1.0)
    assert link_weight(graph, standup, other) == pytest.approx(1.0)
    traversed = {k.key_id: k.traversed_from for k in result.keys}
    assert traversed == {friday: True, deploy: False, standup: False}
    assert result.memory.access_count == 1
    assert result.memory.last_accessed == clock.now


def test_read_memory_counts_the_access_but_never_confirms(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    clock.advance(10 * DAY)
    for n in (1, 2, 3):
        view = graph.read_memory(mid, via_key_id=key_id(graph, "deployment")).memory
        assert view.access_count == n
    assert view.depth == 0.0
    assert view.validity.last_confirmed_at == START
    assert view.validity.confirmation_count == 1


def test_read_memory_edge_reinforcement_is_capped_at_three(graph: MemoryGraph) -> None:
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    kid = key_id(graph, "deployment")
    for _ in range(25):
        graph.read_memory(mid, via_key_id=kid)
    assert link_weight(graph, kid, mid) == pytest.approx(3.0)


def test_read_memory_via_a_key_that_is_not_linked_is_refused_and_changes_nothing(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    remember(graph, "The user drinks oat milk lattes", ["coffee", "preference"])
    coffee = key_id(graph, "coffee")
    before = state(graph)
    with pytest.raises(NotFound, match=f"Key {coffee} is not linked to memory {mid}"):
        graph.read_memory(mid, via_key_id=coffee)
    assert state(graph) == before
    outcome = tools("read_memory", {"memory_id": mid, "via_key_id": coffee})
    assert "not linked" in outcome.result["error"]
    assert state(graph) == before


def test_read_memory_of_unknown_expired_or_foreign_ids_is_not_found(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    short = remember(graph, "A short-lived note", ["ephemeral", "note"], ttl_seconds=60)
    work = remember(graph, "Office wifi needs a VPN", ["wifi", "vpn"], namespace="work")
    with pytest.raises(NotFound, match="Memory 0123456789ab not found"):
        graph.read_memory("0123456789ab")
    with pytest.raises(NotFound, match=f"Memory {work} not found"):
        graph.read_memory(work, namespace="home")
    assert graph.read_memory(work, namespace="WORK").memory.id == work
    clock.advance(61)
    with pytest.raises(NotFound, match=f"Memory {short} not found"):
        graph.read_memory(short)


def test_read_memory_of_a_superseded_id_names_its_successor(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    old = remember(graph, "The user lives in Seoul", ["residence", "거주지", "Seoul"])
    new = graph.correct(
        old,
        graph.prepare(content="The user lives in Busan", keys=None, require_keys=False),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    ).new_id  # type: ignore[union-attr]
    with pytest.raises(Refused, match=f"Memory {old} was superseded by {new}"):
        graph.read_memory(old)
    assert tools("read_memory", {"memory_id": old}).result == {
        "error": f"Memory {old} was superseded by {new}"
    }


def test_read_memory_shows_the_source_it_was_saved_with(graph: MemoryGraph) -> None:
    mid = remember(
        graph,
        "Deploys go out on Fridays",
        ["deployment", "Friday"],
        source={"origin": "standup notes"},
    )
    source = graph.read_memory(mid).memory.source
    assert (
        source is not None and source["origin"] == "standup notes" and source["tool"] == "remember"
    )


# -- confirm_memory ---------------------------------------------------------------------


def test_confirm_memory_deepens_refreshes_and_counts(
    graph: MemoryGraph, clock: FakeClock, tools: Tools
) -> None:  # noqa: F811
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    clock.advance(200 * DAY)
    assert graph.read_memory(mid).memory.validity.status == "aging"
    result = tools.ok("confirm_memory", {"memory_id": mid, "evidence": "user"})
    assert (
        result["memory_id"] == mid and result["confirmed"] is True and result["duplicate"] is False
    )
    assert result["validity"]["status"] == "fresh" and result["validity"]["confirmation_count"] == 2
    assert result["validity"]["last_confirmed_at"] == clock.now
    row = memory_row(graph, mid)
    assert row is not None
    assert row["depth"] == pytest.approx(0.05)
    assert row["last_confirmation_evidence"] == "user"
    tools.ok("confirm_memory", {"memory_id": mid, "evidence": "observation"})
    row = memory_row(graph, mid)
    assert (
        row is not None and row["depth"] == pytest.approx(0.10) and row["confirmation_count"] == 3
    )


def test_confirm_memory_depth_is_capped_at_one(graph: MemoryGraph) -> None:
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    for _ in range(25):
        graph.confirm_memory(mid, "authoritative_source")
    assert graph.read_memory(mid).memory.depth == 1.0


def test_confirm_memory_requires_known_evidence(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    before = state(graph)
    outcome = tools("confirm_memory", {"memory_id": mid, "evidence": "vibes"})
    assert outcome.is_error and "Unknown confirmation evidence" in outcome.result["error"]
    assert outcome.result["field"] == "evidence"
    missing = tools("confirm_memory", {"memory_id": mid})
    assert missing.is_error and missing.result["field"] == "evidence"
    assert state(graph) == before


def test_confirm_memory_is_idempotent_for_one_host_turn(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    first = tools.ok("confirm_memory", {"memory_id": mid, "evidence": "user"}, host=HOST)
    assert first["confirmed"] is True
    before = state(graph)
    again = tools.ok("confirm_memory", {"memory_id": mid, "evidence": "user"}, host=HOST)
    assert again["confirmed"] is False and again["duplicate"] is True
    assert again["validity"]["confirmation_count"] == 2
    assert state(graph) == before
    row = memory_row(graph, mid)
    assert row is not None and row["last_confirmation_id"] == f"claude:{HOST.session}:2"
    next_turn = Host(agent="claude", session=HOST.session, turn=3)
    assert (
        tools.ok("confirm_memory", {"memory_id": mid, "evidence": "user"}, host=next_turn)[
            "confirmed"
        ]
        is True
    )


def test_confirm_memory_rejects_missing_expired_superseded_and_foreign_ids(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    short = remember(graph, "A short-lived note", ["ephemeral", "note"], ttl_seconds=60)
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    graph.correct(
        old,
        graph.prepare(content="The user lives in Busan", keys=None, require_keys=False),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    )
    work = remember(graph, "Office wifi needs a VPN", ["wifi", "vpn"], namespace="work")
    clock.advance(61)
    before = state(graph)
    for memory_id, namespace in (
        ("0123456789ab", None),
        (short, None),
        (old, None),
        (work, "home"),
    ):
        with pytest.raises((NotFound, Refused)) as caught:
            graph.confirm_memory(memory_id, "user", namespace=namespace)
        assert memory_id in caught.value.message
    assert state(graph) == before


# -- dismiss ----------------------------------------------------------------------------


def test_dismiss_weakens_only_the_named_link(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday", "schedule"])
    deploy, friday = key_id(graph, "deployment"), key_id(graph, "Friday")
    before = memory_row(graph, mid)
    result = tools.ok("dismiss", {"memory_id": mid, "key_id": friday})
    assert result["link_weight"] == pytest.approx(0.7) and result["previous_link_weight"] == 1.0
    assert result["floored"] is False and result["concept"] == "Friday"
    assert "weakened" in result["note"]
    assert link_weight(graph, deploy, mid) == 1.0
    assert link_weight(graph, friday, mid) == pytest.approx(0.7)
    assert memory_row(graph, mid) == before, "the memory itself is never touched"


def test_dismiss_floors_at_point_one_and_never_severs(graph: MemoryGraph) -> None:
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    friday = key_id(graph, "Friday")
    for _ in range(5):
        result = graph.dismiss(mid, friday)
    assert result.link_weight == pytest.approx(0.1) and result.floored
    assert "floor" in result.note
    assert link_weight(graph, friday, mid) == pytest.approx(0.1)
    assert [h.memory_id for h in graph.read_key(friday).memories] == [mid]


def test_a_read_raises_a_dismissed_link_again(graph: MemoryGraph) -> None:
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    friday = key_id(graph, "Friday")
    for _ in range(4):
        graph.dismiss(mid, friday)
    graph.read_memory(mid, via_key_id=friday)
    assert link_weight(graph, friday, mid) == pytest.approx(0.2)


def test_a_dismissed_memory_ranks_below_its_sibling_under_that_key(graph: MemoryGraph) -> None:
    ids = seed_deploys(graph)
    kid = key_id(graph, "deployment")
    top = graph.read_key(kid, query="deploy").memories[0].memory_id
    graph.dismiss(top, kid)
    handles = graph.read_key(kid, query="deploy").memories
    assert handles[-1].memory_id == top
    assert recall(graph, "deployment").memories[0].id != top
    assert set(ids) and top in ids.values()


def test_dismiss_cancels_a_pending_alias_candidate(graph: MemoryGraph) -> None:
    mid = remember(graph, "The user grew up in Busan near the sea", ["hometown", "Busan"])
    hometown = key_id(graph, "hometown")
    recall(graph, "birthplace")
    graph.read_memory(mid, via_key_id=hometown)
    recall(graph, "birthplace")
    result = graph.dismiss(mid, hometown)
    assert result.alias_candidate_cleared == "birthplace"
    assert (
        db_read(graph.store, lambda c: c.execute("SELECT COUNT(*) FROM alias_candidates").fetchone()[0])
        == 0
    )
    # The cancelled confirmation does not count toward promotion any more.
    for _ in range(2):
        recall(graph, "birthplace")
        graph.read_memory(mid, via_key_id=hometown)
    assert "birthplace" not in graph.keys.get(hometown).aliases  # type: ignore[union-attr]


def test_dismiss_errors_name_the_missing_memory_or_link(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"], ttl_seconds=60)
    other = remember(graph, "The user drinks oat milk lattes", ["coffee", "preference"])
    coffee = key_id(graph, "coffee")
    with pytest.raises(NotFound, match=f"Key {coffee} is not linked to memory {mid}"):
        graph.dismiss(mid, coffee)
    with pytest.raises(NotFound, match="Memory 0123456789ab not found"):
        graph.dismiss("0123456789ab", coffee)
    with pytest.raises(NotFound, match=f"Memory {other} not found"):
        graph.dismiss(other, coffee, namespace="work")
    clock.advance(61)
    with pytest.raises(NotFound, match=f"Memory {mid} not found"):
        graph.dismiss(mid, key_id(graph, "Friday"))


def test_a_tool_error_message_never_leaks_a_python_repr(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    outcome = tools("read_memory", {"memory_id": 42})
    assert outcome.is_error and outcome.result["field"] == "memory_id"
    assert not re.search(r"<class|Traceback", outcome.result["error"])


def test_a_superseded_memory_can_still_be_dismissed(graph: MemoryGraph) -> None:
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    graph.correct(
        old,
        graph.prepare(content="The user lives in Busan", keys=None, require_keys=False),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    )
    seoul = key_id(graph, "Seoul")
    assert graph.dismiss(old, seoul).link_weight == pytest.approx(0.7)
