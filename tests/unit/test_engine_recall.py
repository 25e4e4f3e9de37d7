"""Recall: the ``recall`` tool (ranked key clusters plus one passive Top-1 memory, or
``no_match`` with nearest keys), hybrid recall (lexical + key path + dense, scored on query
coverage and cosine, depth and freshness, hops, task-evidence selection, named dates) and the push path."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import (
    DAY,
    START,
    FakeClock,
    Tools,
    key_id,
    link_weight,
    memory_row,
    remember,
    state,
)

from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads import inject as push
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.query import PREDICATE_SHARE, namespaces_for_cwd, plan_query
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.reads.signals import (
    REDUNDANT_COSINE,
    bounded,
    entity_mentions,
    is_comparison,
    project_task_evidence,
    without_repeats,
)
from keymem_daemon.engine.text import TRUNCATION_MARKER

pytestmark = pytest.mark.timeout(60)

COMPACT_FIELDS = [
    "key_id",
    "concept",
    "aliases",
    "key_type",
    "score",
    "match_type",
    "memory_count",
    "is_hub",
    "specificity",
]


def seed(graph: MemoryGraph) -> dict[str, str]:
    return {
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
            graph, "The user drinks oat milk lattes every morning", ["coffee", "커피", "morning"]
        ),
    }


def ids(hits: list) -> list[str]:  # type: ignore[type-arg]
    return [h.id for h in hits]


# -- pure helpers ---------------------------------------------------------------------


def test_bounded_maps_bm25_into_zero_to_one() -> None:
    assert bounded(0.0) == 0.0 and bounded(-3.0) == 0.0
    assert bounded(1.0) == 0.5
    assert 0.99 < bounded(200.0) < 1.0


def test_a_repeat_yields_its_place_to_the_next_different_candidate() -> None:
    # 1 says what 0 says (cosine 0.97); 2 is a little weaker but different.
    sims = np.array([[1.0, 0.97, 0.3], [0.97, 1.0, 0.3], [0.3, 0.3, 1.0]], dtype=np.float32)
    assert without_repeats([1.0, 0.95, 0.9], sims, k=2) == [0, 2, 1]
    # Below REDUNDANT_COSINE nothing is a repeat and the order stands.
    sims[0, 1] = sims[1, 0] = REDUNDANT_COSINE
    assert without_repeats([1.0, 0.95, 0.9], sims, k=2) == [0, 1, 2]


@pytest.mark.parametrize(
    "query",
    [
        "Which did Alice or Bob start first?",
        "Who is older, Alice or Bob?",
        "Alice vs Bob salary",
        "Did both Alice and Bob attend?",
        "Is Alice older than Bob?",
        "앨리스와 밥 중 누가 먼저 왔어?",
        "앨리스랑 밥 둘 다 왔어?",
        "compare the two offers",
    ],
)
def test_comparison_queries_are_recognised(query: str) -> None:
    assert is_comparison(query)


@pytest.mark.parametrize(
    "query", ["What does Alice like?", "중국에서 뭐 먹었지?", "When is the deploy?"]
)
def test_plain_queries_are_not_comparisons(query: str) -> None:
    assert not is_comparison(query)


def test_entity_mentions_are_whole_words_in_order_with_korean_particles() -> None:
    entities = {
        "a": ["Alice"],
        "b": ["Bob", "Robert"],
        "k": ["앨리스"],
        "n": ["New York"],
        "y": ["York"],
    }
    assert entity_mentions("Which did Bob or Alice start first?", entities) == ["b", "a"]
    assert entity_mentions("Robert met Alicent", entities) == ["b"]
    assert entity_mentions("앨리스와 Bob은 누가 먼저야?", entities) == ["k", "b"]
    assert entity_mentions("Was the New York trip longer?", entities) == ["n"]


def test_task_evidence_projection_puts_each_entitys_best_memory_first() -> None:
    ranked = ["n1", "n2", "a1", "b2", "a2", "b1"]
    keys_of = {"a1": {"A"}, "a2": {"A"}, "b1": {"B"}, "b2": {"B"}, "n1": {"N"}, "n2": {"N"}}
    utility = {"a1": 0.2, "a2": 0.9, "b1": 0.5, "b2": 0.4, "n1": 1.0, "n2": 1.0}
    assert project_task_evidence(ranked, keys_of, ["A", "B"], utility, 2) == [
        "a2",
        "b1",
        "n1",
        "n2",
        "a1",
        "b2",
    ]
    # No-ops: top_k < 2, nothing beyond the window, or fewer than two entities.
    assert project_task_evidence(ranked, keys_of, ["A", "B"], utility, 1) == ranked
    assert project_task_evidence(ranked, keys_of, ["A", "B"], utility, 6) == ranked
    assert project_task_evidence(ranked, keys_of, ["A"], utility, 2) == ranked


def test_namespaces_for_cwd_take_the_longest_path_prefix_plus_default() -> None:
    mapping = {"/work": ["Shared"], "/work/atlas": ["atlas", "infra"], "/home/me": ["personal"]}
    assert namespaces_for_cwd(mapping, "/work/atlas/src") == frozenset(
        {"atlas", "infra", "default"}
    )
    assert namespaces_for_cwd(mapping, "/work/atlas") == frozenset({"atlas", "infra", "default"})
    assert namespaces_for_cwd(mapping, "/work/atlas-old") == frozenset({"shared", "default"})
    assert namespaces_for_cwd(mapping, "/tmp") is None
    assert namespaces_for_cwd({}, "/work") is None
    assert namespaces_for_cwd(mapping, None) is None


# -- recall: key clusters and the passive Top-1 -----------------------------------------


def test_recall_returns_compact_keys_in_the_contract_field_order(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    seed(graph)
    result = tools.ok("recall", {"query": "deployment"})
    assert (
        result["status"] == "found"
        and result["query"] == "deployment"
        and result["namespace"] is None
    )
    for key in result["keys"]:
        assert list(key) == COMPACT_FIELDS
    top = result["keys"][0]
    assert (
        top["concept"] == "deployment"
        and top["aliases"] == ["배포"]
        and top["key_type"] == "concept"
    )
    assert top["match_type"] == "concept"
    assert (top["memory_count"], top["is_hub"], top["specificity"]) == (3, True, 0.333)
    scores = [k["score"] for k in result["keys"]]
    assert scores == sorted(scores, reverse=True)


def test_recall_shows_one_passive_top_1_memory_under_the_best_key(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    ids_ = seed(graph)
    result = tools.ok(
        "recall", {"query": "deployment", "context": "which Slack channel announces deploys?"}
    )
    assert len(result["memories"]) == 1
    top = result["memories"][0]
    assert top["id"] == ids_["slack"]
    assert top["content"] == "Deploys are announced in the #releases Slack channel"
    assert top["evidence"] == "passive_preview" and top["reinforced"] is False
    assert top["matched_key"] == {"key_id": result["keys"][0]["key_id"]}
    assert top["namespace"] == "default" and top["depth"] == 0.0 and top["created_at"] == START
    assert top["validity"]["status"] == "fresh"
    assert 0 < top["content_relevance"] <= 1
    connected = top["connected_keys"]
    assert {c["concept"] for c in connected} == {"deployment", "Slack"}
    assert [c["relevance"] for c in connected] == sorted(
        (c["relevance"] for c in connected), reverse=True
    )
    assert set(connected[0]) == {"concept", "key_id", "relevance"}
    assert "content_truncated" not in top and "auto_confirmed" not in top


def test_recall_changes_nothing(graph: MemoryGraph) -> None:
    seed(graph)
    before = state(graph)
    recall(graph, "deployment", context="when do deploys go out?")
    recall(graph, "커피")
    recall(graph, "quantum chromodynamics")
    assert state(graph) == before


def test_recall_truncates_a_long_top_1_to_max_chars(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    long = "Deploy checklist: " + "run the smoke tests, " * 100 + "then announce it."
    remember(graph, long, ["checklist", "deployment"])
    top = tools.ok("recall", {"query": "checklist", "max_chars": 300})["memories"][0]
    assert len(top["content"]) <= 300 and top["content"].endswith(TRUNCATION_MARKER)
    assert top["content_truncated"] is True and top["content_chars"] == len(long)
    tiny = tools.ok("recall", {"query": "checklist", "max_chars": 10})["memories"][0]
    assert len(tiny["content"]) == 256, "max_chars is clamped to at least 256"


def test_recall_without_a_match_gives_nearest_keys_and_a_note(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    seed(graph)
    result = tools.ok("recall", {"query": "quantum chromodynamics"})
    assert result["status"] == "no_match"
    assert result["keys"] == [] and result["memories"] == []
    assert "No key cleared the recall gate" in result["note"] and "browse_keys" in result["note"]
    nearest = result["nearest_keys"]
    assert 1 <= len(nearest) <= 5
    for item in nearest:
        assert set(item) == {"key_id", "concept", "aliases", "key_type", "score", "memory_count"}
        assert item["score"] < graph.profile.key_recall
    scores = [n["score"] for n in nearest]
    assert scores == sorted(scores, reverse=True)


def test_recall_in_an_empty_namespace_says_so_with_no_nearest_keys(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    seed(graph)
    result = tools.ok("recall", {"query": "deployment", "namespace": "nowhere"})
    assert result["status"] == "empty_namespace"
    assert result["nearest_keys"] == [] and result["keys"] == [] and result["memories"] == []


def test_recall_explain_reports_the_namespace_memory_count(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    seed(graph)
    assert (
        tools.ok("recall", {"query": "deployment", "explain": True})["namespace_memory_count"] == 4
    )
    missed = tools.ok("recall", {"query": "quantum chromodynamics", "explain": True})
    assert missed["status"] == "no_match" and missed["namespace_memory_count"] == 4
    assert "namespace_memory_count" not in tools.ok("recall", {"query": "deployment"})


def test_recall_is_scoped_to_its_namespace(graph: MemoryGraph) -> None:
    home = remember(graph, "Home wifi is fast", ["wifi", "network"])
    work = remember(graph, "Office wifi needs a VPN", ["wifi", "vpn"], namespace="work")
    result = recall(graph, "wifi", namespace="Work")
    assert result.namespace == "work"
    assert result.memories[0].id == work
    assert result.keys[0].memory_count == 1
    assert "network" not in [k.concept for k in result.keys]
    assert recall(graph, "wifi", namespace="default").memories[0].id == home


def test_recall_top_k_limits_the_clusters(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    seed(graph)
    prompt = "deployment Friday CI build Slack coffee morning"
    assert len(tools.ok("recall", {"query": prompt, "top_k": 2})["keys"]) == 2
    assert len(tools.ok("recall", {"query": prompt, "top_k": 100})["keys"]) <= 20


def test_recall_never_shows_superseded_or_expired_memories(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    old = remember(graph, "The user lives in Seoul", ["residence", "Seoul"])
    new = graph.correct(
        old,
        graph.prepare(content="The user lives in Busan", keys=None, require_keys=False),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    ).new_id  # type: ignore[union-attr]
    remember(graph, "The user is visiting Jeju this week", ["residence", "trip"], ttl_seconds=3600)
    clock.advance(3601)
    result = recall(graph, "residence", context="where does the user live, Seoul?")
    assert result.memories[0].id == new
    assert result.keys[0].memory_count == 1
    assert (
        recall(graph, "Seoul").status != "found"
        or recall(graph, "Seoul").memories[0].id == new
    )


def test_recall_auto_confirms_when_the_context_restates_the_memory(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, "The user drinks oat milk lattes every morning", ["coffee", "morning"])
    clock.advance(200 * DAY)
    plain = recall(graph, "coffee", context="what coffee does the user drink?")
    assert plain.memories[0].auto_confirmed is None
    assert memory_row(graph, mid)["confirmation_count"] == 1  # type: ignore[index]
    restated = recall(
        graph, "coffee", context="  the user drinks OAT MILK lattes every morning "
    )
    top = restated.memories[0]
    assert top.id == mid and top.auto_confirmed is True
    assert top.validity.status == "fresh" and top.validity.confirmation_count == 2
    row = memory_row(graph, mid)
    assert (
        row is not None
        and row["last_confirmed_at"] == clock.now
        and row["last_confirmation_evidence"] == "user"
    )


# -- hybrid recall (recall_memories) ----------------------------------------------------


def test_hybrid_recall_fuses_lexical_key_and_dense_evidence(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    ids_ = seed(graph)
    hits = tools.ok(
        "recall_memories", {"query": "Slack deployment announcements", "reinforce": False}
    )
    top = hits[0]
    assert top["id"] == ids_["slack"]
    assert {"(bm25)", "deployment", "Slack"} <= set(top["matched_via"])
    assert top["score_kind"] == "evidence_rank" and top["rank_score"] == top["score"]
    # Relevance mixes query coverage (complete here) with the body cosine.
    assert top["hop"] == 1 and 0.8 <= top["relevance_score"] <= 1.0
    for name in (
        "id",
        "content",
        "keys",
        "matched_via",
        "hop",
        "score",
        "relevance_score",
        "depth",
        "access_count",
        "source",
        "supersedes",
        "created_at",
        "namespace",
        "validity",
    ):
        assert name in top, name
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)


def test_hybrid_recall_does_not_fill_its_places_with_one_fact_said_three_times(graph: MemoryGraph) -> None:
    keys = ["Maria", "shelter", "volunteering"]
    repeats = [remember(graph, text, keys) for text in (
        "Maria volunteers at a homeless shelter downtown.",
        "Maria volunteers at the downtown homeless shelter.",
        "Maria has been volunteering at a homeless shelter downtown.")]
    other = remember(graph, "Maria started volunteering at a dog shelter once a month.", keys)
    hits = ids(hybrid_recall(graph, "Which shelters does Maria volunteer at?", top_k=2,
                                       reinforce=False).hits)
    assert other in hits and len(set(hits) & set(repeats)) == 1


def test_hybrid_recall_finds_a_word_that_only_the_content_holds(graph: MemoryGraph) -> None:
    seed(graph)
    named = remember(
        graph, "The staging cluster is called Zephyrine", ["cluster", "infrastructure"]
    )
    anchor = remember(graph, "Staging deploys need a manual approval", ["staging", "approval"])
    hits = hybrid_recall(graph, "Zephyrine staging", reinforce=False).hits
    by_id = {h.id: h for h in hits}
    assert anchor in by_id and "staging" in by_id[anchor].matched_via
    assert named in by_id and "(bm25)" in by_id[named].matched_via
    assert "staging" not in by_id[named].matched_via


def test_hybrid_recall_without_an_anchor_returns_nothing(graph: MemoryGraph) -> None:
    seed(graph)
    result = hybrid_recall(graph, "quantum chromodynamics", reinforce=False)
    assert result.hits == [] and result.anchored is False


def test_hybrid_recall_reinforces_the_top_result_only(graph: MemoryGraph) -> None:
    ids_ = seed(graph)
    deploy = key_id(graph, "deployment")
    hits = hybrid_recall(graph, "Slack deployment announcements", top_k=1).hits
    assert ids(hits) == [ids_["slack"]]
    assert link_weight(graph, deploy, ids_["slack"]) == pytest.approx(1.1)
    assert link_weight(graph, key_id(graph, "Slack"), ids_["slack"]) == pytest.approx(1.1)
    assert memory_row(graph, ids_["slack"])["access_count"] == 1  # type: ignore[index]
    # Explored but unused members of the matched keys decay slightly; other keys are untouched.
    assert link_weight(graph, deploy, ids_["friday"]) == pytest.approx(0.995)
    assert link_weight(graph, key_id(graph, "Friday"), ids_["friday"]) == 1.0
    assert link_weight(graph, key_id(graph, "coffee"), ids_["coffee"]) == 1.0
    assert memory_row(graph, ids_["friday"])["access_count"] == 0  # type: ignore[index]


def test_hybrid_recall_without_reinforcement_changes_nothing(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    seed(graph)
    before = state(graph)
    tools.ok("recall_memories", {"query": "deployment", "reinforce": False})
    assert state(graph) == before


def test_depth_lifts_an_otherwise_equal_memory(graph: MemoryGraph) -> None:
    a = remember(graph, "Standup is at 9:30 in room Alder", ["standup", "meeting"])
    b = remember(graph, "Standup is at 9:30 in room Birch", ["standup", "meeting"])
    deep = a if ids(hybrid_recall(graph, "standup", reinforce=False).hits)[0] == b else b
    for _ in range(20):
        graph.confirm_memory(deep, "user")
    assert ids(hybrid_recall(graph, "standup", reinforce=False).hits)[0] == deep


def test_min_depth_keeps_only_deep_memories(graph: MemoryGraph) -> None:
    a = remember(graph, "Standup is at 9:30 in room Alder", ["standup", "meeting"])
    b = remember(graph, "Standup is at 9:30 in room Birch", ["standup", "meeting"])
    for _ in range(12):
        graph.confirm_memory(b, "user")
    assert set(ids(hybrid_recall(graph, "standup", reinforce=False).hits)) >= {a, b}
    assert ids(hybrid_recall(graph, "standup", reinforce=False, min_depth=0.5).hits) == [
        b
    ]


def test_hybrid_recall_is_scoped_and_skips_inactive_memories(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    home = remember(graph, "Home wifi is fast", ["wifi", "network"])
    work = remember(graph, "Office wifi needs a VPN", ["wifi", "vpn"], namespace="work")
    gone = remember(graph, "Hotel wifi code is 1234", ["wifi", "hotel"], ttl_seconds=60)
    clock.advance(61)
    assert ids(
        hybrid_recall(graph, "wifi", scope=frozenset({"work"}), reinforce=False).hits
    ) == [work]
    everywhere = ids(hybrid_recall(graph, "wifi", reinforce=False).hits)
    assert set(everywhere) == {home, work} and gone not in everywhere


CHAIN = {
    "A": ("Marie Curie studied radioactivity in Paris", ["Curie", "radioactivity", "Paris"]),
    "B": ("Paris hosts the Louvre museum", ["Paris", "Louvre"]),
    "C": ("The Louvre displays the Mona Lisa", ["Louvre", "Mona Lisa"]),
    "D": ("The Mona Lisa was painted by Leonardo", ["Mona Lisa", "Leonardo"]),
    "X": ("Our cat sleeps on the piano", ["cat", "piano"]),
}


def chain(graph: MemoryGraph) -> dict[str, str]:
    return {name: remember(graph, content, keys) for name, (content, keys) in CHAIN.items()}


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_hops_reach_exactly_n_steps_along_a_chain_of_narrow_keys(
    graph: MemoryGraph, hops: int
) -> None:
    m = chain(graph)
    hits = hybrid_recall(graph, "Curie", hops=hops, top_k=10, reinforce=False).hits
    by_id = {h.id: h for h in hits}
    expected = ["A", "B", "C", "D"][:hops]
    assert set(by_id) == {m[n] for n in expected}, [(h.content, h.hop, h.matched_via) for h in hits]
    for step, name in enumerate(expected, start=1):
        assert by_id[m[name]].hop == step
    if hops >= 2:
        assert "Paris(via)" in by_id[m["B"]].matched_via
    assert ids(hits) == [m[n] for n in expected], "a closer association ranks first"


def test_the_fourth_link_of_a_chain_is_tagged_hop_4(graph: MemoryGraph) -> None:
    m = chain(graph)
    hits = hybrid_recall(graph, "Curie", hops=5, top_k=10, reinforce=False).hits
    d = next(h for h in hits if h.id == m["D"])
    assert d.hop == 4 and "Mona Lisa(via)" in d.matched_via and d.relevance_score == 0.0


def test_an_isolated_memory_never_leaks_even_at_five_hops(graph: MemoryGraph) -> None:
    m = chain(graph)
    hits = hybrid_recall(graph, "Curie", hops=5, top_k=10, reinforce=False).hits
    assert m["X"] not in ids(hits), [
        (h.content, h.hop, h.matched_via, h.relevance_score) for h in hits
    ]


def test_an_explicit_link_carries_a_hop(graph: MemoryGraph) -> None:
    a = remember(graph, "Marie Curie studied radioactivity", ["Curie", "radioactivity"])
    b = remember(
        graph, "The user's grandmother was a chemist", ["grandmother", "chemistry"], related_to=[a]
    )
    hits = hybrid_recall(graph, "Curie", hops=2, top_k=5, reinforce=False).hits
    linked = next(h for h in hits if h.id == b)
    assert linked.hop == 2 and "(linked)" in linked.matched_via


def comparison_graph(graph: MemoryGraph) -> dict[str, str]:
    name = {"Alice": "name", "Bob": "name", "Carol": "name"}
    out = {
        "alice_birth": remember(
            graph, "Alice was born in 1990 in Lyon", ["Alice", "birth year", "age"], key_types=name
        ),
        "alice_tea": remember(graph, "Alice likes green tea", ["Alice", "tea"], key_types=name),
        "bob_birth": remember(
            graph, "Bob was born in 1985 in Oslo", ["Bob", "birth year", "age"], key_types=name
        ),
        "bob_chess": remember(
            graph, "Bob plays chess on weekends", ["Bob", "chess"], key_types=name
        ),
    }
    for i in range(3):
        out[f"carol{i}"] = remember(
            graph,
            f"Carol is older than her brother number {i}",
            ["Carol", "age", "older"],
            key_types=name,
        )
    return out


def test_a_comparison_query_gets_evidence_for_each_named_entity(graph: MemoryGraph) -> None:
    m = comparison_graph(graph)
    hits = hybrid_recall(
        graph, "Who is older, Alice or Bob?", top_k=2, reinforce=False
    ).hits
    assert set(ids(hits)) == {m["alice_birth"], m["bob_birth"]}


def test_which_did_alice_or_bob_picks_one_memory_of_each(graph: MemoryGraph) -> None:
    m = comparison_graph(graph)
    hits = hybrid_recall(
        graph, "Which did Alice or Bob take up first, tea or chess?", top_k=2, reinforce=False
    ).hits
    assert set(ids(hits)) == {m["alice_tea"], m["bob_chess"]}


# -- dates ------------------------------------------------------------------------------


def offsites(graph: MemoryGraph) -> tuple[str, str]:
    jeju = remember(
        graph,
        "The team offsite happened in Jeju",
        ["offsite", "team event"],
        observed_at="2023-05-08",
    )
    gangneung = remember(
        graph,
        "The team offsite happened in Gangneung",
        ["offsite", "team event"],
        observed_at="2022-10-14T09:00:00Z",
    )
    return jeju, gangneung


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Where was the team offsite in May 2023?", 0),
        ("Where was the team offsite on 8 May 2023?", 0),
        ("Where was the team offsite in 2022?", 1),
        ("Where was the offsite last year?", 1),
        ("작년 팀 오프사이트는 어디였지?", 1),
        ("2023년 5월 팀 오프사이트", 0),
    ],
)
def test_a_query_naming_a_date_prefers_memories_observed_then(
    graph: MemoryGraph, query: str, expected: int
) -> None:
    pair = offsites(graph)
    hits = hybrid_recall(graph, query, top_k=2, reinforce=False).hits
    assert hits[0].id == pair[expected]
    assert "(date)" in hits[0].matched_via


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Where was the team offsite in May 2023?", 0),
        ("Where was the team offsite in 2022?", 1),
    ],
)
def test_the_passive_top_1_prefers_the_memory_observed_in_the_named_period(
    graph: MemoryGraph, query: str, expected: int
) -> None:
    pair = offsites(graph)
    assert recall(graph, "offsite", context=query).memories[0].id == pair[expected]
    assert recall(graph, query).memories[0].id == pair[expected]


def test_observed_at_is_stored_and_shown(graph: MemoryGraph) -> None:
    jeju, _ = offsites(graph)
    assert graph.read_memory(jeju).memory.observed_at == 1683504000.0  # 2023-05-08T00:00:00Z


# -- the push path --------------------------------------------------------------------


def test_inject_surfaces_a_relevant_memory_passively(graph: MemoryGraph) -> None:
    ids_ = seed(graph)
    before = state(graph)
    result = push.inject(graph, "How do we announce deployment in Slack?", scope=None, top_k=2)
    assert result.memories and result.memories[0].id == ids_["slack"]
    assert result.context is not None and ids_["slack"] in result.context
    assert result.context.startswith("<keymem-surfaced>") and result.context.endswith(
        "</keymem-surfaced>"
    )
    assert len(result.memories) <= 2
    assert state(graph) == before, "injected memories are never reinforced or confirmed"


def test_inject_skips_short_prompts_slash_commands_and_irrelevant_ones(graph: MemoryGraph) -> None:
    seed(graph)
    assert push.inject(graph, "hi", scope=None).skipped == "too short"
    assert push.inject(graph, "/compact now please", scope=None).skipped == "slash command"
    nothing = push.inject(graph, "Explain quantum chromodynamics to me", scope=None)
    assert nothing.memories == [] and nothing.context is None


def test_inject_respects_its_scope(graph: MemoryGraph) -> None:
    remember(graph, "Office wifi needs a VPN", ["wifi", "vpn"], namespace="work")
    assert (
        push.inject(graph, "How do I get on the wifi?", scope=frozenset({"default"})).memories
        == []
    )
    assert push.inject(
        graph, "How do I get on the wifi?", scope=frozenset({"work", "default"})
    ).memories


CROSS_LINGUAL = [
    ("결제 서비스 배포는 금요일 저녁에는 하지 않기로 했다. 김서연 팀장이 승인한다.",
     ["배포", "deployment", "결제 서비스"]),
    ("The search cluster is reindexed every night at 2am by the ops team.", ["search", "reindex"]),
    ("팀 점심은 매주 수요일 열두 시 반에 회사 근처 국수집에서 먹는다.", ["점심", "회식"]),
    ("Code reviews need two approvals before a merge to main.", ["code review", "merge"]),
]


@pytest.mark.parametrize(("prompt", "expected"), [
    ("Can I deploy the payment service on Friday evening?", 0),  # English prompt, Korean memory
    ("코드 리뷰는 승인이 몇 개 필요해?", 3),  # Korean prompt, English memory
])
def test_inject_surfaces_a_memory_written_in_the_other_language(
        graph: MemoryGraph, prompt: str, expected: int) -> None:
    # The words of a memory in the other script cover the prompt's words through their meaning
    # (friday -> 금요일, 승인 -> approvals), not only the keys the memory was given.
    ids_ = [remember(graph, content, keys) for content, keys in CROSS_LINGUAL]
    result = push.inject(graph, prompt, scope=None)
    assert [m.id for m in result.memories][:1] == [ids_[expected]]


@pytest.mark.parametrize("prompt", ["Explain quantum chromodynamics to me", "양자 색역학을 설명해 줘"])
def test_inject_stays_silent_across_languages_when_nothing_fits(graph: MemoryGraph, prompt: str) -> None:
    for content, keys in CROSS_LINGUAL:
        remember(graph, content, keys)
    assert push.inject(graph, prompt, scope=None).memories == []


SOUND_ALIKE = [
    ("Prefers rebasing over merging when updating a feature branch.", ["rebase", "리베이스", "git"]),
    ("Uses Firefox Developer Edition for frontend debugging.", ["browser", "브라우저", "Firefox"]),
    ("도윤 인턴의 마지막 출근일은 8월 29일이고, 팀에서 송별 점심을 계획하고 있다.", ["최도윤", "인턴", "intern"]),
    ("아틀라스 대시보드의 차트는 ECharts로 그린다.", ["차트", "대시보드"]),
]


@pytest.mark.parametrize(("prompt", "expected"), [
    ("브랜치 업데이트할 때 리베이스랑 머지 중에 뭘 선호해?", 0),  # 브랜치 = branch, 머지 = merge
    ("프론트엔드 디버깅할 때 브라우저는 뭐 써?", 1),  # 프론트엔드 = frontend, 디버깅 = debugging
    ("When is intern Doyun's last day?", 2),  # Doyun = 도윤
])
def test_inject_reads_a_loanword_or_name_written_in_the_other_script_as_the_same_word(
        graph: MemoryGraph, prompt: str, expected: int) -> None:
    # The embedder puts these pairs just below the translation bar (브랜치/branch 0.53,
    # 도윤/Doyun 0.48); they sound the same, so the memory covers the prompt's words.
    ids_ = [remember(graph, content, keys) for content, keys in SOUND_ALIKE]
    result = push.inject(graph, prompt, scope=None)
    assert [m.id for m in result.memories][:1] == [ids_[expected]]


ANSWERS_IN_OTHER_WORDS = [
    ("The user's parents live in Daejeon; the family visits them every Chuseok.",
     ["parents", "부모님", "Daejeon", "대전"]),
    ("연봉 협상은 매년 3월에 하는데, 올해는 6% 인상됐다고 했다.", ["연봉", "salary", "협상"]),
    ("운전면허는 있지만 차는 없어서 주말에만 쏘카를 빌려 쓴다.", ["차", "운전", "쏘카"]),
    ("Sprints last two weeks; planning is on Monday morning.", ["sprint", "스프린트", "planning"]),
    ("To roll back, run make rollback SERVICE=<name>, which redeploys the previous Helm release.",
     ["rollback", "롤백", "Helm"]),
    ("Staging URLs follow <service>.staging.example.dev, and staging data is reset every Sunday night.",
     ["staging", "스테이징", "environment"]),
]


def test_a_korean_predicate_or_what_an_asking_word_asks_weighs_less_than_the_nouns_of_the_query(
        graph: MemoryGraph) -> None:
    plan = plan_query(graph, "부모님은 어디 사셔?")
    nouns = [w.stem for w in plan.words if w.nominal and not w.stop]
    verbs = [w.stem for w in plan.words if not w.nominal]
    assert nouns == ["부모"] and verbs
    # Neither word is in the (empty) store, so their IDFs are equal before the predicate share.
    assert plan.weights[verbs[0]] == pytest.approx(PREDICATE_SHARE * plan.weights["부모"])
    # English has no part of speech here, but a "how" names the property the answer measures.
    plan = plan_query(graph, "How long are our sprints?")
    assert plan.weights["long"] == pytest.approx(PREDICATE_SHARE * plan.weights["sprint"])
    # So does what a Korean asking word (얼마나, 어떤, 몇, 무슨, 어느) points at.
    plan = plan_query(graph, "롤백은 어떤 명령어로 해?")
    assert plan.weights["명령어"] == pytest.approx(PREDICATE_SHARE * plan.weights["롤백"])
    plan = plan_query(graph, "백업 얼마나 보관해?")
    assert plan.weights["보관"] == pytest.approx(PREDICATE_SHARE * plan.weights["백업"])


@pytest.mark.parametrize(("prompt", "expected"), [
    ("부모님은 어디 사셔?", 0),  # "live in Daejeon": the memory puts the verb in other words
    ("연봉 얼마나 올랐지?", 1),  # 올랐지 -> 인상됐다
    ("How long are our sprints?", 3),  # long -> two weeks
    ("롤백은 어떤 명령어로 해?", 4),  # 어떤 명령어 -> make rollback
    ("스테이징 데이터는 언제 초기화돼?", 5),  # 초기화 (stem 초기, "early") -> reset
])
def test_inject_surfaces_a_memory_that_answers_a_question_in_other_words(
        graph: MemoryGraph, prompt: str, expected: int) -> None:
    ids_ = [remember(graph, content, keys) for content, keys in ANSWERS_IN_OTHER_WORDS]
    result = push.inject(graph, prompt, scope=None)
    assert [m.id for m in result.memories][:1] == [ids_[expected]]


def test_inject_stays_silent_when_the_noun_a_korean_question_is_about_is_missing(graph: MemoryGraph) -> None:
    # The memory is about the user's (absent) car, not the father's: the unmatched noun still counts.
    for content, keys in ANSWERS_IN_OTHER_WORDS:
        remember(graph, content, keys)
    assert push.inject(graph, "아버지는 무슨 차를 타셔?", scope=None).memories == []


def test_min_rel_score_drops_the_weak_tail(graph: MemoryGraph) -> None:
    ids_ = seed(graph)
    everything = ids(
        hybrid_recall(
            graph, "Slack deployment announcements", top_k=10, reinforce=False
        ).hits
    )
    assert len(everything) > 1
    strict = ids(
        hybrid_recall(
            graph, "Slack deployment announcements", top_k=10, reinforce=False, min_rel_score=0.9
        ).hits
    )
    assert strict[0] == ids_["slack"] and len(strict) < len(everything)


FILLER = ["Deploys go out on Fridays", "The user drinks oat milk lattes", "Standup is at 9:30",
          "The office is on floor 3", "Invoices are due on the fifth", "The user runs on Sundays",
          "The build cache lives in S3", "Lunch is at noon", "The VPN needs a token"]


def test_a_key_surfaces_through_its_content_when_its_concept_is_far_from_the_query(
        graph: MemoryGraph) -> None:
    mid = remember(graph, "The user's cat is named Nabi", ["pet", "animal"])
    for i, text in enumerate(FILLER):
        remember(graph, text, [f"topic{i}", "misc"])
    found = recall(graph, "Nabi")
    assert found.status == "found"
    assert found.keys[0].concept in ("pet", "animal") and found.keys[0].match_type == "content"
    assert found.memories[0].id == mid
    # One memory's keys cannot flood the list through the same content hit.
    concepts = [k.concept for k in found.keys]
    assert concepts.count("pet") + concepts.count("animal") == 1


def test_the_first_memory_of_a_new_store_surfaces_for_a_related_prompt(graph: MemoryGraph) -> None:  # noqa: F811
    # With one memory, every word it holds is "in all memories"; IDF must not make the
    # words it lacks outweigh the ones it has (regression: nothing surfaced until 4 memories).
    remember(graph, "The billing service deploys every Tuesday after the 2pm standup.",
             ["billing", "deployment", "Tuesday"])
    result = push.inject(graph, "When do we deploy the billing service?", scope=None)
    assert result.context is not None and "billing service deploys" in result.context
