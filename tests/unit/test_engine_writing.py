"""The write side: remember and remember_batch (key types, namespaces, TTL, decay,
related_to, provenance, write hints, exact dedup, concurrency), correct (one-step
versioning), forget, cleanup_expired, and the extended list/related/stats tools."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
from daemon_helpers import scaled
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
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.records import ForgetResult
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput, NotFound, Refused

pytestmark = pytest.mark.timeout(60)

HOST = Host(agent="codex", session="0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", turn=7)


def correct(graph: MemoryGraph, memory_id: str, content: str, **fields: object) -> str:
    """Correct through the MCP tool layer's rules (omitted fields are inherited)."""
    request = graph.prepare(
        content=content,
        keys=fields.get("keys"),
        key_types=fields.get("key_types"),
        ttl_seconds=fields.get("ttl_seconds"),
        decay_profile=fields.get("decay_profile"),
        related_to=fields.get("related_to"),
        source=fields.get("source"),
        require_keys=False,
    )
    result = graph.correct(
        memory_id,
        request,
        keys_given=fields.get("keys") is not None,
        related_given=fields.get("related_to") is not None,
        ttl_given="ttl_seconds" in fields,
        decay_given=fields.get("decay_profile") is not None,
    )
    return result.new_id  # type: ignore[union-attr]


def active_ids(graph: MemoryGraph, namespace: str | None = None) -> list[str]:
    return [m.id for m in graph.list_memories(namespace).memories]


# -- remember ---------------------------------------------------------------------------


def test_remember_saves_a_memory_with_its_keys(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    result = tools.ok(
        "remember",
        {"content": "Deploys go out on Fridays", "keys": ["deployment", "배포", "Friday"]},
    )
    mid = result["saved"]
    assert len(mid) == 12 and int(mid, 16) >= 0
    assert "deduplicated" not in result
    assert [k["concept"] for k in result["keys"]] == ["deployment", "Friday"]
    row = memory_row(graph, mid)
    assert row is not None
    assert row["content"] == "Deploys go out on Fridays"
    assert (row["depth"], row["access_count"], row["confirmation_count"]) == (0.0, 0, 1)
    assert row["created_at"] == row["last_confirmed_at"] == START
    assert row["decay_profile"] == "standard" and row["last_confirmation_evidence"] == "user"
    assert row["namespace"] == "default" and row["expires_at"] is None


def test_remember_stores_content_verbatim(graph: MemoryGraph) -> None:
    text = "  Indented\n\tline with  double  spaces  "
    mid = remember(graph, text, ["formatting", "whitespace"])
    assert graph.read_memory(mid).memory.content == text


def test_a_namespace_is_normalized_on_write_and_on_read(graph: MemoryGraph) -> None:
    mid = remember(graph, "Atlas uses Alembic", ["Atlas", "migration"], namespace="  Work ")
    assert memory_row(graph, mid)["namespace"] == "work"  # type: ignore[index]
    assert active_ids(graph, "WORK") == [mid]
    assert active_ids(graph, "default") == []


def test_ttl_seconds_sets_an_absolute_expiry(graph: MemoryGraph) -> None:
    mid = remember(graph, "The demo link is valid today", ["demo", "link"], ttl_seconds=3600)
    assert graph.read_memory(mid).memory.expires_at == START + 3600


def test_ttl_seconds_as_a_numeric_string_is_accepted(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = tools.ok(
        "remember",
        {"content": "The demo link is valid today", "keys": ["demo", "link"], "ttl_seconds": "120"},
    )["saved"]
    assert graph.read_memory(mid).memory.expires_at == START + 120


@pytest.mark.parametrize("ttl", [-1, 0, 0.0, "-5", 10**20, pytest.param(10**400, id="10**400"), "1e999", "inf"])
def test_issue_19_a_ttl_that_is_not_positive_or_beyond_a_century_is_refused(graph: MemoryGraph, ttl: object) -> None:
    # Before: -1 was "saved" and then never found; 10**20 crashed the write (HTTP 500).
    with pytest.raises(InvalidInput) as refused:
        remember(graph, "Already outdated", ["outdated", "note"], ttl_seconds=ttl)
    assert refused.value.field == "ttl_seconds"
    assert graph.stats().memories == 0


def test_decay_profile_is_stored(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = tools.ok(
        "remember",
        {
            "content": "The user is allergic to peanuts",
            "keys": ["allergy", "peanut"],
            "decay_profile": "permanent",
        },
    )["saved"]
    assert graph.read_memory(mid).memory.validity.decay_profile == "permanent"


def test_related_to_links_memories_both_ways_for_traversal(graph: MemoryGraph) -> None:
    a = remember(graph, "Atlas uses Alembic for migrations", ["Atlas", "Alembic"])
    b = remember(graph, "Migrations run in CI before deploy", ["CI", "pipeline"], related_to=[a, a])
    assert graph.read_memory(b).memory.related_to == [a]
    assert graph.read_memory(a).memory.related_to == []
    assert [r.id for r in graph.related(a)] == [b]
    assert graph.related(a)[0].link_type == "explicit"


def test_related_to_an_unknown_id_is_refused_and_nothing_is_saved(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    before = state(graph)
    outcome = tools(
        "remember",
        {"content": "Orphan relation", "keys": ["orphan", "test"], "related_to": ["0123456789ab"]},
    )
    assert outcome.is_error and outcome.result["field"] == "related_to"
    assert "0123456789ab" in outcome.result["error"]
    assert state(graph) == before


def test_a_name_key_type_is_applied_by_exact_key_string(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    tools.ok(
        "remember",
        {
            "content": "Mina runs the design team",
            "keys": ["Mina", "design", "team"],
            "key_types": {"Mina": "name", "team": "concept"},
        },
    )
    assert graph.keys.get(key_id(graph, "Mina")).key_type == "name"  # type: ignore[union-attr]
    assert graph.keys.get(key_id(graph, "design")).key_type == "concept"  # type: ignore[union-attr]


def test_key_types_may_arrive_as_a_json_string(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    tools.ok(
        "remember",
        {
            "content": "Mina runs the design team",
            "keys": '["Mina", "design"]',
            "key_types": '{"Mina": "proper_noun"}',
        },
    )
    assert graph.keys.get(key_id(graph, "Mina")).key_type == "proper_noun"  # type: ignore[union-attr]


def test_provenance_is_stamped_from_the_host(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = tools.ok(
        "remember",
        {"content": "Deploys go out on Fridays", "keys": ["deployment", "Friday"]},
        host=HOST,
    )["saved"]
    source = graph.read_memory(mid).memory.source
    assert source is not None
    assert source["tool"] == "remember"
    assert (
        source["host_agent"] == "codex"
        and source["host_session"] == HOST.session
        and source["host_turn"] == 7
    )
    assert source["session"] == graph.instance
    assert datetime.fromisoformat(source["saved_at"].replace("Z", "+00:00")).timestamp() == START


def test_the_callers_source_fields_win_over_the_stamp(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = tools.ok(
        "remember",
        {
            "content": "Deploys go out on Fridays",
            "keys": ["deployment", "Friday"],
            "source": {"host_turn": 99, "tool": "import-script", "ticket": "OPS-12"},
        },
        host=HOST,
    )["saved"]
    source = graph.read_memory(mid).memory.source
    assert source is not None
    assert (source["host_turn"], source["tool"], source["ticket"]) == (
        99,
        "import-script",
        "OPS-12",
    )
    assert source["host_session"] == HOST.session


def test_no_host_means_no_host_fields(graph: MemoryGraph) -> None:
    mid = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    source = graph.read_memory(mid).memory.source
    assert source is not None and not any(k.startswith("host_") for k in source)


# -- write hints ------------------------------------------------------------------------


def test_hints_point_at_a_near_existing_key_and_missing_languages(graph: MemoryGraph) -> None:
    remember(graph, "The user drinks oat milk lattes", ["coffee", "커피", "drink"])
    result = graph.remember(
        graph.prepare(content="The user likes espresso", keys=["espresso", "taste", "morning"])
    )
    hints = result.hints  # type: ignore[union-attr]
    assert hints is not None
    near = {h["your_key"]: h for h in hints.near_keys}
    assert near["espresso"]["existing_concept"] == "coffee"
    assert (
        graph.profile.key_recall <= near["espresso"]["similarity"] < graph.profile.short_key_merge
    )
    assert hints.language_note is not None and "cross-lingual" in hints.language_note
    assert hints.phrase_keys is None


def test_bilingual_distant_keys_get_no_hints(graph: MemoryGraph) -> None:
    result = graph.remember(
        graph.prepare(
            content="The user plays the cello on Sundays", keys=["cello", "첼로", "music", "음악"]
        )
    )
    assert result.hints is None  # type: ignore[union-attr]


def test_phrase_keys_are_flagged_but_two_word_keys_are_not(graph: MemoryGraph) -> None:
    result = graph.remember(
        graph.prepare(
            content="Quarterly review of the Nexora portfolio",
            keys=["Nexora portfolio review meeting", "portfolio review", "리뷰"],
        )
    )
    hints = result.hints  # type: ignore[union-attr]
    assert hints is not None and hints.phrase_keys == ["Nexora portfolio review meeting"]
    assert hints.phrase_note is not None


# -- dedup ------------------------------------------------------------------------------


def test_the_same_text_with_other_case_and_spacing_is_one_memory(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    first = tools.ok(
        "remember", {"content": "The user drinks oat milk lattes", "keys": ["coffee", "drink"]}
    )
    again = tools.ok(
        "remember", {"content": "  the USER drinks   oat milk LATTES ", "keys": ["latte", "coffee"]}
    )
    assert again["saved"] == first["saved"] and again["deduplicated"] is True
    assert first["saved"] in again["note"]
    assert graph.stats().memories == 1
    read = graph.read_memory(first["saved"])
    assert read.memory.content == "The user drinks oat milk lattes"
    assert {k.concept for k in read.keys} >= {"coffee", "drink", "latte"}
    assert read.memory.validity.confirmation_count == 2


def test_the_same_text_in_another_namespace_is_a_second_memory(graph: MemoryGraph) -> None:
    a = remember(graph, "Standup is at 9:30", ["standup", "meeting"], namespace="alpha")
    b = remember(graph, "Standup is at 9:30", ["standup", "meeting"], namespace="beta")
    assert a != b
    assert graph.stats().namespaces == {"alpha": 1, "beta": 1}


def test_a_paraphrase_is_stored_separately(graph: MemoryGraph) -> None:
    a = remember(graph, "Standup is at 9:30", ["standup", "meeting"])
    b = remember(graph, "The standup starts at half past nine", ["standup", "meeting"])
    assert a != b and graph.stats().memories == 2


def test_eight_concurrent_identical_remembers_leave_exactly_one_memory(graph: MemoryGraph) -> None:
    barrier = threading.Barrier(8)

    def write(_: int) -> str:
        barrier.wait(timeout=scaled(10))
        return remember(
            graph,
            "The release train leaves every second Tuesday",
            ["release", "schedule", "릴리스"],
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(write, range(8), timeout=scaled(30)))
    assert len(set(ids)) == 1
    assert graph.stats().memories == 1
    assert graph.read_memory(ids[0]).memory.validity.confirmation_count == 8


def test_concurrent_distinct_remembers_lose_no_update(graph: MemoryGraph) -> None:
    def write(i: int) -> str:
        return remember(
            graph, f"Service number {i} owns port {8000 + i}", ["service", "port", f"svc{i}"]
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(write, range(24), timeout=scaled(30)))
    assert len(set(ids)) == 24
    assert graph.stats().memories == 24
    service = key_id(graph, "service")
    assert graph.read_key(service, limit=50).total == 24
    assert graph.keys.get(service).link_count == 24  # type: ignore[union-attr]
    links = db_read(graph.store,
        lambda c: c.execute(
            "SELECT COUNT(*) FROM links l JOIN memories m ON m.id = l.memory_id"
        ).fetchone()[0]
    )
    assert links == graph.stats().links


# -- remember_batch ---------------------------------------------------------------------


def test_a_batch_stores_every_item_with_a_shared_batch_id(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    result = tools.ok(
        "remember_batch",
        {
            "items": [
                {"content": "The user lives in Busan", "keys": ["residence", "Busan"]},
                {
                    "content": "The user works remotely",
                    "keys": ["work", "remote"],
                    "namespace": "job",
                },
                {
                    "content": "The user's cat is Nabi",
                    "keys": ["cat", "Nabi"],
                    "key_types": {"Nabi": "name"},
                    "decay_profile": "stable",
                    "ttl_seconds": 3600,
                },
            ]
        },
        host=HOST,
    )
    assert result["saved"] == 3 and result["failed"] == 0
    ids = [item["saved"] for item in result["items"]]
    assert [item["index"] for item in result["items"]] == [0, 1, 2]
    sources = [graph.read_memory(mid).memory.source for mid in ids]
    assert {s["batch_id"] for s in sources} == {result["batch_id"]}  # type: ignore[index]
    assert all(s["tool"] == "remember_batch" and s["host_turn"] == 7 for s in sources)  # type: ignore[index]
    assert memory_row(graph, ids[1])["namespace"] == "job"  # type: ignore[index]
    cat = graph.read_memory(ids[2]).memory
    assert cat.validity.decay_profile == "stable" and cat.expires_at == START + 3600
    assert graph.keys.get(key_id(graph, "Nabi")).key_type == "name"  # type: ignore[union-attr]


def test_a_single_item_batch_gets_no_batch_id(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    result = tools.ok(
        "remember_batch", {"items": [{"content": "The user lives in Busan", "keys": ["residence"]}]}
    )
    assert "batch_id" not in result
    assert "batch_id" not in graph.read_memory(result["items"][0]["saved"]).memory.source  # type: ignore[operator]


def test_a_batch_with_bad_items_stores_the_others_and_reports_each_bad_one(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    result = tools.ok(
        "remember_batch",
        {
            "items": [
                {"content": "The user lives in Busan", "keys": ["residence", "Busan"]},
                {"content": "", "keys": ["empty"]},
                {"content": "Keyless", "keys": ["x"]},
                {"content": "Bad decay", "keys": ["decay", "test"], "decay_profile": "forever"},
                {"content": "Bad ttl", "keys": ["ttl", "test"], "ttl_seconds": "soon"},
                "not an object",
                {"content": "Unknown field", "keys": ["field", "test"], "colour": "blue"},
                {"content": "The user works remotely", "keys": ["work", "remote"]},
            ]
        },
    )
    assert result["saved"] == 2 and result["failed"] == 6
    items = result["items"]
    assert [i["index"] for i in items] == list(range(8))
    assert "saved" in items[0] and "saved" in items[7]
    fields = {i["index"]: i.get("field") for i in items if "error" in i}
    assert fields == {
        1: "content",
        2: "keys",
        3: "decay_profile",
        4: "ttl_seconds",
        5: "items[5]",
        6: "items[6].colour",
    }
    assert "keys required" in items[2]["error"]
    assert "Unknown decay profile" in items[3]["error"]
    assert sorted(active_ids(graph)) == sorted([items[0]["saved"], items[7]["saved"]])


def test_a_batch_item_duplicating_an_earlier_one_is_folded_into_it(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    result = tools.ok(
        "remember_batch",
        {
            "items": [
                {"content": "The user lives in Busan", "keys": ["residence"]},
                {"content": "the user lives in busan", "keys": ["home"]},
            ]
        },
    )
    first, second = result["items"]
    assert second["saved"] == first["saved"] and second["deduplicated"] is True
    assert graph.stats().memories == 1


# -- correct ----------------------------------------------------------------------------


def test_a_correction_supersedes_the_old_memory(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    old = remember(graph, "The user lives in Seoul", ["residence", "거주지", "Seoul"])
    result = tools.ok("correct", {"memory_id": old, "content": "The user lives in Busan"})
    new = result["new_id"]
    assert result["superseded"] == old
    assert graph.read_memory(new).memory.supersedes == old
    row = memory_row(graph, old)
    assert row is not None and row["superseded_by"] == new, "the old record still exists"
    with pytest.raises(Refused, match=f"superseded by {new}"):
        graph.read_memory(old)
    assert active_ids(graph) == [new]
    found = recall(graph, "residence")
    assert found.memories[0].id == new
    assert old not in [
        h.id for h in hybrid_recall(graph, "Seoul residence", reinforce=False).hits
    ]
    assert old not in [h.memory_id for h in graph.read_key(key_id(graph, "residence")).memories]


def test_omitted_keys_are_inherited_with_a_penalty_and_a_note(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    old = remember(graph, "The user lives in Seoul", ["residence", "거주지", "Seoul"])
    residence, seoul = key_id(graph, "residence"), key_id(graph, "Seoul")
    for _ in range(3):
        graph.read_memory(old, via_key_id=residence)
    result = tools.ok("correct", {"memory_id": old, "content": "The user lives in Busan"})
    new = result["new_id"]
    assert link_weight(graph, residence, new) == pytest.approx(1.3 - 0.15)
    assert link_weight(graph, seoul, new) == pytest.approx(0.85)
    assert result["note"].startswith("Reused 2 prior key(s) [")
    assert (
        "residence" in result["note"] and "Seoul" in result["note"] and "`keys`" in result["note"]
    )
    assert link_weight(graph, residence, old) == pytest.approx(1.3), (
        "the old memory keeps its links"
    )


def test_an_inherited_weight_never_drops_below_the_floor(graph: MemoryGraph) -> None:
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    seoul = key_id(graph, "Seoul")
    for _ in range(4):
        graph.dismiss(old, seoul)
    new = correct(graph, old, "The user lives in Busan")
    assert link_weight(graph, seoul, new) == pytest.approx(0.1)


def test_explicit_keys_replace_the_old_ones(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    result = tools.ok(
        "correct",
        {"memory_id": old, "content": "The user lives in Busan", "keys": ["residence", "Busan"]},
    )
    assert "note" not in result
    keys = {k.concept: k.link_weight for k in graph.read_memory(result["new_id"]).keys}
    assert keys == {"residence": 1.0, "Busan": 1.0}


def test_related_to_is_kept_when_omitted_and_replaced_when_given(graph: MemoryGraph) -> None:
    a = remember(graph, "Atlas uses Alembic", ["Atlas", "Alembic"])
    b = remember(graph, "Atlas deploys on Fridays", ["Atlas", "deployment"])
    c = remember(graph, "The user lives in Seoul", ["residence", "Seoul"], related_to=[a])
    kept = correct(graph, c, "The user lives in Busan")
    assert graph.read_memory(kept).memory.related_to == [a]
    replaced = correct(graph, kept, "The user lives in Daegu", related_to=[b])
    assert graph.read_memory(replaced).memory.related_to == [b]


def test_ttl_and_decay_are_inherited_unless_given(graph: MemoryGraph, clock: FakeClock) -> None:  # noqa: F811
    old = remember(
        graph,
        "The demo link is valid this week",
        ["demo", "link"],
        ttl_seconds=7 * DAY,
        decay_profile="transient",
    )
    clock.advance(DAY)
    inherited = correct(graph, old, "The demo link is valid until Friday")
    view = graph.read_memory(inherited).memory
    assert view.expires_at == START + 7 * DAY and view.validity.decay_profile == "transient"
    clock.advance(DAY)
    explicit = correct(
        graph,
        inherited,
        "The demo link is valid for one more hour",
        ttl_seconds=3600,
        decay_profile="stable",
    )
    view = graph.read_memory(explicit).memory
    assert view.expires_at == clock.now + 3600, "an explicit TTL counts from the correction"
    assert view.validity.decay_profile == "stable"


def test_a_null_ttl_in_a_correction_clears_the_expiry(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    old = remember(graph, "The demo link is valid this week", ["demo", "link"], ttl_seconds=3600)
    new = tools.ok(
        "correct",
        {"memory_id": old, "content": "The demo link is permanent now", "ttl_seconds": None},
    )["new_id"]
    assert graph.read_memory(new).memory.expires_at is None


def test_a_correction_starts_fresh_and_weakens_the_old_depth(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    for _ in range(4):
        graph.confirm_memory(old, "user")
    clock.advance(200 * DAY)
    new = correct(graph, old, "The user lives in Busan")
    view = graph.read_memory(new).memory
    assert (
        view.depth == 0.0
        and view.validity.status == "fresh"
        and view.validity.confirmation_count == 1
    )
    assert memory_row(graph, old)["depth"] == pytest.approx(0.2 * 0.3)  # type: ignore[index]
    deep = remember(graph, "The user's blood type is A", ["blood type", "health"])
    for _ in range(16):
        graph.confirm_memory(deep, "user")
    correct(graph, deep, "The user's blood type is AB")
    assert memory_row(graph, deep)["depth"] == pytest.approx(0.8 * 0.8)  # type: ignore[index]


def test_a_second_correction_deletes_the_grandparent(graph: MemoryGraph) -> None:
    first = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    second = correct(graph, first, "The user lives in Busan")
    third = correct(graph, second, "The user lives in Daegu")
    assert memory_row(graph, first) is None
    assert memory_row(graph, second)["superseded_by"] == third  # type: ignore[index]
    assert graph.read_memory(third).memory.supersedes == second
    assert key_id(graph, "Seoul"), "keys still linked to the live chain survive"


def test_correcting_a_superseded_id_extends_the_live_chain(graph: MemoryGraph) -> None:
    first = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    second = correct(graph, first, "The user lives in Busan")
    third = correct(graph, first, "The user lives in Daegu")
    assert graph.read_memory(third).memory.supersedes == second
    assert active_ids(graph) == [third]


def test_a_correction_keeps_the_namespace(graph: MemoryGraph) -> None:
    old = remember(graph, "Atlas uses Alembic", ["Atlas", "Alembic"], namespace="work")
    new = correct(graph, old, "Atlas uses Flyway")
    assert active_ids(graph, "work") == [new]


def test_correcting_a_missing_or_expired_memory_is_not_found(
    graph: MemoryGraph,
    clock: FakeClock,  # noqa: F811
    tools: Tools,
) -> None:  # noqa: F811
    short = remember(graph, "A short-lived note", ["ephemeral", "note"], ttl_seconds=60)
    clock.advance(61)
    before = state(graph)
    for memory_id in ("0123456789ab", short):
        outcome = tools("correct", {"memory_id": memory_id, "content": "New text"})
        assert outcome.result["error"] == f"Memory {memory_id} not found"
    assert state(graph) == before


# -- forget -----------------------------------------------------------------------------


def test_forget_hard_deletes_and_prunes_orphan_keys(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    a = remember(graph, "Atlas uses Alembic", ["Atlas", "Alembic"])
    b = remember(graph, "Atlas deploys on Fridays", ["Atlas", "deployment"], related_to=[a])
    atlas, alembic = key_id(graph, "Atlas"), key_id(graph, "Alembic")
    assert tools.ok("forget", {"memory_id": a}) == {"deleted": True}
    assert memory_row(graph, a) is None
    assert graph.keys.get(alembic) is None
    assert (
        db_read(graph.store,
            lambda c: c.execute("SELECT COUNT(*) FROM keys WHERE id = ?", (alembic,)).fetchone()[0]
        )
        == 0
    )
    assert graph.keys.get(atlas) is not None and graph.keys.get(atlas).link_count == 1  # type: ignore[union-attr]
    assert graph.read_memory(b).memory.related_to == []
    assert (
        db_read(graph.store, lambda c: c.execute("SELECT COUNT(*) FROM relations").fetchone()[0]) == 0
    )
    assert tools.ok("forget", {"memory_id": a}) == {"deleted": False}


def test_forgetting_a_correction_restores_its_predecessor(graph: MemoryGraph) -> None:
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    new = correct(graph, old, "The user lives in Busan")
    result = graph.forget(new)
    assert isinstance(result, ForgetResult)
    assert result.deleted and result.restored == old
    assert active_ids(graph) == [old]
    assert graph.read_memory(old).memory.superseded_by is None
    assert recall(graph, "residence").memories[0].id == old


# -- TTL and cleanup --------------------------------------------------------------------


def test_cleanup_deletes_expired_memories_and_their_orphan_keys(
    graph: MemoryGraph,
    clock: FakeClock,  # noqa: F811
    tools: Tools,
) -> None:  # noqa: F811
    keep = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    gone = remember(graph, "The demo link is valid today", ["demo", "deployment"], ttl_seconds=60)
    assert tools.ok("cleanup_expired") == {
        "deleted": 0,
        "pruned_aliases": 0,
        "pruned_candidates": 0,
        "pruned_keys": 0,
    }
    clock.advance(61)
    assert graph.stats().expired_pending_cleanup == 1
    assert memory_row(graph, gone) is not None, "expiry hides; only cleanup deletes"
    result = tools.ok("cleanup_expired")
    assert result["deleted"] == 1 and result["pruned_keys"] == 1
    assert memory_row(graph, gone) is None
    assert graph.keys.by_norm("demo") is None
    assert active_ids(graph) == [keep]
    assert graph.stats().expired_pending_cleanup == 0


def test_cleaning_up_an_expired_correction_reactivates_its_predecessor(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    old = remember(graph, "The office is on floor 3", ["office", "floor"])
    temp = correct(graph, old, "The office is on floor 5 during renovation", ttl_seconds=3600)
    clock.advance(3601)
    assert active_ids(graph) == []
    assert graph.cleanup_expired().deleted == 1
    assert active_ids(graph) == [old]
    assert memory_row(graph, temp) is None


# -- the extended tools ---------------------------------------------------------------


def test_related_ranks_rare_shared_keys_above_hub_neighbours(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    seed = remember(graph, "Atlas uses Alembic for migrations", ["Atlas", "Alembic", "project"])
    rare = remember(graph, "Alembic needs a revision per schema change", ["Alembic", "schema"])
    hubs = [
        remember(graph, f"Project note {i}: keep the changelog current", ["project", f"note{i}"])
        for i in range(4)
    ]
    linked = remember(graph, "The user likes tea", ["tea", "drink"])
    graph.correct(
        linked,
        graph.prepare(
            content="The user likes green tea", keys=None, related_to=[seed], require_keys=False
        ),
        keys_given=False,
        related_given=True,
        ttl_given=False,
        decay_given=False,
    )
    result = tools.ok("related", {"memory_id": seed})
    order = [r["id"] for r in result]
    assert set(hubs) <= set(order)
    assert order.index(rare) < min(order.index(h) for h in hubs)
    assert linked not in order, "superseded neighbours are not shown"
    by_id = {r["id"]: r for r in result}
    assert by_id[rare]["shared_keys"] == ["Alembic"] and by_id[rare]["link_type"] == "key"
    assert by_id[hubs[0]]["shared_keys"] == ["project"]
    # An explicit link scores +1, above a key shared with one other memory (idf 1/2).
    explicit = result[0]
    assert explicit["link_type"] == "explicit" and explicit["content"] == "The user likes green tea"
    scores = [r["score"] for r in result]
    assert scores == sorted(scores, reverse=True)
    assert all("validity" in r for r in result)
    assert tools.ok("related", {"memory_id": "0123456789ab"}) == []


def test_list_memories_lists_active_memories_in_insertion_order(
    graph: MemoryGraph,
    tools: Tools,  # noqa: F811
    clock: FakeClock,
) -> None:  # noqa: F811
    a = remember(graph, "First", ["first", "order"])
    b = remember(graph, "Second", ["second", "order"], namespace="work")
    c = remember(graph, "Third", ["third", "order"], ttl_seconds=10)
    d = remember(graph, "Fourth", ["fourth", "order"])
    clock.advance(11)
    result = tools.ok("list_memories", {})
    assert [m["id"] for m in result["memories"]] == [a, b, d]
    assert result["total"] == 3
    assert set(result["memories"][0]) >= {
        "id",
        "content",
        "keys",
        "depth",
        "access_count",
        "supersedes",
        "created_at",
        "namespace",
        "expires_at",
        "validity",
    }
    assert set(result["memories"][0]["keys"]) == {"first", "order"}
    assert [m["id"] for m in tools.ok("list_memories", {"namespace": "work"})["memories"]] == [b]
    page = tools.ok("list_memories", {"limit": 2})
    assert page["next_offset"] == 2 and len(page["memories"]) == 2
    assert c not in [m["id"] for m in result["memories"]]


def test_memory_stats_counts_keys_memories_and_links(
    graph: MemoryGraph,
    tools: Tools,  # noqa: F811
    clock: FakeClock,
) -> None:  # noqa: F811
    a = remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    remember(graph, "Atlas uses Alembic", ["Atlas", "Alembic"], namespace="work")
    remember(graph, "A short-lived note", ["ephemeral", "note"], ttl_seconds=10)
    correct(graph, a, "Deploys go out on Thursdays", keys=["deployment", "Thursday"])
    clock.advance(11)
    stats = tools.ok("memory_stats")
    assert stats["memories"] == 2
    assert stats["keys"] == 7
    assert stats["links"] == 8
    assert stats["namespaces"] == {"default": 1, "work": 1}
    assert stats["superseded"] == 1 and stats["expired_pending_cleanup"] == 1
    assert graph.stats().summary() == "7 keys, 2 memories, 8 links"


def test_a_batch_item_naming_an_unknown_related_memory_is_reported_and_the_others_are_saved(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    anchor = remember(graph, "Atlas uses Alembic", ["Atlas", "Alembic"])
    result = tools(
        "remember_batch",
        {
            "items": [
                {
                    "content": "Atlas deploys on Fridays",
                    "keys": ["Atlas", "deployment"],
                    "related_to": [anchor],
                },
                {
                    "content": "Atlas has a staging cluster",
                    "keys": ["Atlas", "staging"],
                    "related_to": ["0123456789ab"],
                },
                {"content": "Atlas owns the billing schema", "keys": ["Atlas", "billing"]},
            ]
        },
    )
    assert not result.is_error, result.result
    items = result.result["items"]
    assert result.result["saved"] == 2 and result.result["failed"] == 1
    assert items[1]["field"] == "related_to" and "0123456789ab" in items[1]["error"]
    assert "saved" in items[0] and "saved" in items[2]
    assert graph.read_memory(items[0]["saved"]).memory.related_to == [anchor]
    assert graph.stats().memories == 3


@pytest.mark.parametrize("keys", [[], ["x"]])
def test_a_correction_whose_keys_are_empty_or_all_dropped_inherits_the_old_keys(
    graph: MemoryGraph,
    tools: Tools,  # noqa: F811
    keys: list[str],
) -> None:
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    result = tools.ok(
        "correct", {"memory_id": old, "content": "The user lives in Busan", "keys": keys}
    )
    new = result["new_id"]
    assert {k.concept for k in graph.read_memory(new).keys} == {"residence", "Seoul"}
    assert result["note"].startswith("Reused 2 prior key(s)")
    assert recall(graph, "residence").memories[0].id == new


def test_remembering_a_superseded_text_again_stores_a_new_memory(graph: MemoryGraph) -> None:
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    new = correct(graph, old, "The user lives in Busan")
    again = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    assert again not in (old, new)
    assert sorted(active_ids(graph)) == sorted([new, again])


def test_remembering_an_expired_text_again_stores_a_new_memory(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    old = remember(graph, "The demo link is valid today", ["demo", "link"], ttl_seconds=60)
    clock.advance(61)
    again = remember(graph, "The demo link is valid today", ["demo", "link"])
    assert again != old and active_ids(graph) == [again]


def test_a_dedup_with_a_new_ttl_updates_the_expiry(graph: MemoryGraph, clock: FakeClock) -> None:  # noqa: F811
    mid = remember(graph, "The demo link is valid today", ["demo", "link"], ttl_seconds=60)
    clock.advance(30)
    assert remember(graph, "The demo link is valid today", ["demo"], ttl_seconds=3600) == mid
    assert graph.read_memory(mid).memory.expires_at == clock.now + 3600


def test_a_memory_is_alive_at_its_expiry_instant_on_every_path_and_gone_a_second_later(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, "The demo link is valid for an hour", ["demo", "link"], ttl_seconds=3600)
    demo = key_id(graph, "demo")
    clock.set(START + 3600)  # now == expires_at: not expired yet (expired means now > expires_at)
    assert graph.read_memory(mid).memory.id == mid
    assert active_ids(graph) == [mid]
    assert graph.stats().memories == 1 and graph.stats().expired_pending_cleanup == 0
    assert [k.concept for k in graph.browse_keys().keys] and graph.browse_keys().status == "ok"
    assert [h.memory_id for h in graph.read_key(demo).memories] == [mid]
    assert recall(graph, "demo link").memories[0].id == mid
    assert graph.cleanup_expired().deleted == 0
    clock.advance(1)
    assert active_ids(graph) == [] and graph.stats().memories == 0
    assert graph.stats().expired_pending_cleanup == 1
    with pytest.raises(NotFound):
        graph.read_memory(mid)
    assert graph.cleanup_expired().deleted == 1


def test_two_concurrent_corrections_of_one_memory_form_one_chain(graph: MemoryGraph) -> None:
    first = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    barrier = threading.Barrier(2)

    def fix(i: int) -> str:
        barrier.wait(timeout=scaled(10))
        return correct(graph, first, f"The user lives in city number {i}")

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(fix, range(2), timeout=scaled(30)))
    assert len(set(results)) == 2
    live = active_ids(graph)
    assert len(live) == 1 and live[0] in results
    head = graph.read_memory(live[0]).memory
    assert head.supersedes in results, "the second correction superseded the first one's result"
    assert memory_row(graph, first) is None, "the original became the grandparent and was deleted"


def test_many_concurrent_corrections_keep_one_step_of_history(graph: MemoryGraph) -> None:
    first = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    barrier = threading.Barrier(4)

    def fix(i: int) -> str | None:
        barrier.wait(timeout=scaled(10))
        try:
            return correct(graph, first, f"The user lives in city number {i}")
        except NotFound as exc:
            # Once the original is two versions back it is deleted; it can no longer be named.
            assert first in exc.message
            return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = [r for r in pool.map(fix, range(4), timeout=scaled(30)) if r is not None]
    assert len(results) >= 2
    live = active_ids(graph)
    assert len(live) == 1 and live[0] in results
    assert graph.stats().superseded == 1, "only one step of history is kept"
