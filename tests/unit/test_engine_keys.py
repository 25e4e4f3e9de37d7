"""Key semantics: sanitising, concept keys by similarity and entity keys only literally,
merging on write (exact and alias first, then similarity, never across a qualifier or a
weekday), cross-lingual aliases on one canonical key, IDF and hub metadata, and autokey
alias learning (promote-N, confirm floor, alias cap, prune age)."""

from __future__ import annotations

import pytest
from engine_helpers import DAY, FakeClock, GraphFactory, db_read, key_id, remember

from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.keys import conflicting_qualifiers, sanitize_keys
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.text import normalize
from keymem_daemon.errors import InvalidInput
from keymem_daemon.inference.embedders import Embedder

pytestmark = pytest.mark.timeout(60)


def concepts(graph: MemoryGraph) -> dict[str, tuple[str, ...]]:
    return {k.concept: k.aliases for k in graph.keys.all()}


def recalled(graph: MemoryGraph, query: str, namespace: str | None = None) -> list[str]:
    return [k.concept for k in recall(graph, query, namespace=namespace).keys]


# -- sanitising -------------------------------------------------------------------------


def test_sanitizing_keeps_one_cjk_character_and_drops_one_latin_letter() -> None:
    result = sanitize_keys(["집", "돈", "車", "x", "ok", " spaced   key ", ""])
    assert result.keys == ["집", "돈", "車", "ok", "spaced key"]
    assert result.dropped == ["x", ""]


def test_sanitizing_accepts_a_json_array_string_or_one_string() -> None:
    assert sanitize_keys('["deploy", "배포"]').keys == ["deploy", "배포"]
    assert sanitize_keys("deployment").keys == ["deployment"]


def test_sanitizing_folds_keys_that_normalize_alike() -> None:
    assert sanitize_keys(["Python", "python", " PYTHON "]).keys == ["Python"]


def test_sanitizing_rejects_non_strings_and_too_many_keys_naming_the_field() -> None:
    with pytest.raises(InvalidInput) as caught:
        sanitize_keys(["ok", 3])
    assert caught.value.field == "keys"
    with pytest.raises(InvalidInput) as caught:
        sanitize_keys([f"key{i}" for i in range(13)])
    assert caught.value.field == "keys"
    with pytest.raises(InvalidInput) as caught:
        sanitize_keys({"a": 1})
    assert caught.value.field == "keys"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Agent A", "Agent B"),
        ("v1", "v2"),
        ("Q3", "Q4"),
        ("1팀", "2팀"),
        ("Monday", "화요일"),
        ("월요일", "화요일"),
        ("January", "February"),
        ("Python 3.11", "Python 3.12"),
    ],
)
def test_keys_naming_different_members_of_one_series_conflict(a: str, b: str) -> None:
    assert conflicting_qualifiers(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Monday", "월요일"),
        ("Agent A", "Agent A"),
        ("database", "databases"),
        ("movie", "film"),
    ],
)
def test_keys_that_are_not_a_series_do_not_conflict(a: str, b: str) -> None:
    assert not conflicting_qualifiers(a, b)


# -- merging on write -------------------------------------------------------------------


def test_cross_lingual_keys_of_one_write_land_on_one_canonical_key(graph: MemoryGraph) -> None:
    mid = remember(graph, "The user writes Python every day", ["Python", "파이썬", "programming"])
    assert concepts(graph)["Python"] == ("파이썬",)
    assert "파이썬" not in concepts(graph)
    python = key_id(graph, "Python")
    assert key_id(graph, "파이썬") == python
    for query in ("Python", "파이썬", "파이썬 코드"):
        found = recall(graph, query)
        assert found.keys[0].key_id == python, query
        assert found.memories[0].id == mid, query
    assert recall(graph, "파이썬").keys[0].match_type == "alias"


def test_a_later_key_equal_to_an_alias_reuses_the_canonical_key(graph: MemoryGraph) -> None:
    remember(graph, "The user writes Python every day", ["Python", "파이썬"])
    second = remember(graph, "파이썬 가상환경은 uv로 만든다", ["파이썬", "가상환경"])
    python = key_id(graph, "Python")
    assert second in [h.memory_id for h in graph.read_key(python).memories]
    assert [k.concept for k in graph.keys.all()].count("파이썬") == 0


def test_a_close_synonym_merges_into_the_existing_key_as_an_alias(graph: MemoryGraph) -> None:
    remember(graph, "We watched a movie on Saturday", ["movie", "weekend"])
    film = remember(graph, "The film was about space travel", ["film", "space"])
    assert concepts(graph)["movie"] == ("film",)
    movie = key_id(graph, "movie")
    assert key_id(graph, "film") == movie
    assert graph.read_key(movie).total == 2
    found = recall(graph, "film")
    assert found.keys[0].key_id == movie and found.keys[0].match_type == "alias"
    assert film in [h.memory_id for h in graph.read_key(movie, query="film").memories]


def test_an_exact_match_wins_over_a_closer_sounding_key(graph: MemoryGraph) -> None:
    remember(graph, "Holidays are planned in March", ["holiday", "planning"])
    remember(graph, "The vacation budget is 2000 dollars", ["vacation", "budget"])
    # vacation/holiday embed at ~0.9, so "vacation" joined "holiday"; a later "vacation"
    # must reuse that same key through the alias, not create or pick another.
    holiday = key_id(graph, "holiday")
    assert key_id(graph, "vacation") == holiday
    third = remember(graph, "Vacation days reset in January", ["vacation", "HR"])
    assert third in [h.memory_id for h in graph.read_key(holiday).memories]


def test_short_keys_the_embedder_cannot_read_stay_apart(graph: MemoryGraph) -> None:
    """USE knows none of 셸, 탭, 앱 and 훅: each once embedded to the same vector (cosine
    1.0), so they merged into one key, and a query about the app reached the shell."""
    shell = remember(graph, "셸은 zsh를 쓰고 프롬프트는 starship이다.", ["셸", "zsh"])
    tab = remember(graph, "들여쓰기는 탭 대신 스페이스 4칸이다.", ["탭", "들여쓰기"])
    app = remember(graph, "앱 배포는 TestFlight로 먼저 한다.", ["앱", "TestFlight"])
    hook = remember(graph, "pre-commit 훅이 gitleaks를 돌린다.", ["훅", "gitleaks"])
    ids = {concept: key_id(graph, concept) for concept in ("셸", "탭", "앱", "훅")}
    assert len(set(ids.values())) == 4
    for concept, memory in (("셸", shell), ("탭", tab), ("앱", app), ("훅", hook)):
        assert [h.memory_id for h in graph.read_key(ids[concept]).memories] == [memory]
    found = [k.key_id for k in recall(graph, "앱").keys]
    assert found[0] == ids["앱"] and not {ids["셸"], ids["탭"], ids["훅"]} & set(found)


def test_agent_a_and_agent_b_stay_two_keys_although_they_embed_close(
    graph: MemoryGraph, embedder: Embedder
) -> None:
    a, b = embedder.embed(["Agent A", "Agent B"])
    assert float(a @ b) >= graph.profile.short_key_merge, (
        "the premise: they would merge on cosine alone"
    )
    ma = remember(graph, "Agent A handles billing", ["Agent A", "billing"])
    mb = remember(graph, "Agent B handles search", ["Agent B", "search"])
    ka, kb = key_id(graph, "Agent A"), key_id(graph, "Agent B")
    assert ka != kb
    assert [h.memory_id for h in graph.read_key(ka).memories] == [ma]
    assert [h.memory_id for h in graph.read_key(kb).memories] == [mb]


def test_monday_and_화요일_never_merge_across_writes_or_within_one(
    graph: MemoryGraph, embedder: Embedder
) -> None:
    mon, tue = embedder.embed(["Monday", "화요일"])
    assert float(mon @ tue) >= graph.profile.cross_script_merge, (
        "the premise: they would merge on cosine"
    )
    remember(graph, "Standup is on Monday", ["Monday", "standup"])
    remember(graph, "회고는 화요일에 한다", ["화요일", "회고"])
    assert key_id(graph, "Monday") != key_id(graph, "화요일")
    remember(graph, "Gym on Monday and Tuesday", ["Monday", "화요일", "gym"])
    assert key_id(graph, "Monday") != key_id(graph, "화요일")
    assert "화요일" not in concepts(graph)["Monday"]


def test_a_weekday_and_its_translation_do_merge(graph: MemoryGraph) -> None:
    remember(graph, "Standup is on Monday", ["Monday", "standup"])
    remember(graph, "주간 회의는 월요일이다", ["월요일", "회의"])
    assert key_id(graph, "월요일") == key_id(graph, "Monday")


def test_entity_keys_never_merge_by_similarity(graph: MemoryGraph) -> None:
    remember(
        graph, "Newton discovered gravity", ["Newton", "gravity"], key_types={"Newton": "name"}
    )
    remember(graph, "뉴턴은 사과를 보았다", ["뉴턴", "사과"], key_types={"뉴턴": "name"})
    assert key_id(graph, "Newton") != key_id(graph, "뉴턴")


def test_a_name_request_promotes_an_existing_concept_key_in_place(graph: MemoryGraph) -> None:
    first = remember(graph, "Atlas is the internal data platform", ["Atlas", "platform"])
    atlas = key_id(graph, "Atlas")
    assert graph.keys.get(atlas).key_type == "concept"  # type: ignore[union-attr]
    second = remember(
        graph,
        "Atlas runs on Kubernetes",
        ["atlas", "kubernetes"],
        key_types={"atlas": "proper_noun"},
    )
    assert key_id(graph, "Atlas") == atlas
    assert graph.keys.get(atlas).key_type == "proper_noun"  # type: ignore[union-attr]
    assert {h.memory_id for h in graph.read_key(atlas).memories} == {first, second}


# -- matching ---------------------------------------------------------------------------


def test_동건_never_reaches_뉴턴_because_names_match_only_literally(graph: MemoryGraph) -> None:
    dong = remember(
        graph,
        "동건은 주말마다 클라이밍을 한다",
        ["동건", "클라이밍", "climbing"],
        key_types={"동건": "name"},
    )
    newton = remember(
        graph,
        "뉴턴은 사과가 떨어지는 것을 보고 중력을 생각했다",
        ["뉴턴", "중력", "gravity"],
        key_types={"뉴턴": "name"},
    )
    found = recall(graph, "동건")
    assert [k.concept for k in found.keys][:1] == ["동건"]
    assert "뉴턴" not in [k.concept for k in found.keys]
    assert found.keys[0].score == 1.0 and found.keys[0].key_type == "name"
    assert found.memories[0].id == dong
    hits = hybrid_recall(graph, "동건", reinforce=False, hops=1).hits
    assert hits[0].id == dong
    assert all("뉴턴" not in h.matched_via for h in hits)
    assert "뉴턴" not in recalled(graph, "동건이 좋아하는 운동")
    assert recalled(graph, "뉴턴")[0] == "뉴턴"
    assert recall(graph, "뉴턴").memories[0].id == newton


def test_a_name_key_is_not_reached_by_a_similar_but_different_word(
    graph: MemoryGraph, embedder: Embedder
) -> None:
    remember(
        graph,
        "Newton discovered gravity when an apple fell",
        ["Newton", "gravity"],
        key_types={"Newton": "name"},
    )
    v = embedder.embed(["Newton", "뉴턴"])
    assert float(v[0] @ v[1]) >= graph.profile.key_recall, (
        "the premise: a concept key would be reached"
    )
    assert "Newton" not in recalled(graph, "뉴턴")


def test_a_name_key_matches_only_as_a_whole_word(graph: MemoryGraph) -> None:
    remember(graph, "Ann leads the finance team", ["Ann", "finance"], key_types={"Ann": "name"})
    assert "Ann" not in recalled(graph, "annual budget review")
    assert recalled(graph, "what does Ann do")[0] == "Ann"


def test_a_name_key_matches_with_a_korean_particle_attached(graph: MemoryGraph) -> None:
    mid = remember(graph, "동건은 커피를 좋아한다", ["동건", "커피"], key_types={"동건": "name"})
    found = recall(graph, "동건이 좋아하는 음료는?")
    assert found.keys[0].concept == "동건"
    assert found.memories[0].id == mid


def test_concept_keys_match_by_similarity(graph: MemoryGraph) -> None:
    mid = remember(graph, "The user drives a red Volvo", ["car", "자동차", "vehicle"])
    found = recall(graph, "automobile")
    assert found.keys and found.keys[0].concept == "car"
    assert found.keys[0].match_type == "semantic"
    assert found.memories[0].id == mid


def test_a_long_prompt_still_finds_its_short_keys(graph: MemoryGraph) -> None:
    target = remember(
        graph,
        "We chose Alembic for the database migrations of Atlas",
        ["database", "migration", "Atlas", "Alembic"],
    )
    remember(graph, "The user likes hiking in autumn", ["hiking", "autumn"])
    remember(graph, "Lunch is usually at noon", ["lunch", "schedule"])
    prompt = (
        "Can you remind me what we decided about the database migration tooling for the Atlas "
        "project last week?"
    )
    found = recall(graph, prompt)
    reached = {k.concept for k in found.keys}
    assert {"database", "migration", "Atlas"} <= reached
    assert not reached & {"hiking", "autumn", "lunch"}
    assert found.memories[0].id == target
    hits = hybrid_recall(graph, prompt, reinforce=False).hits
    assert hits[0].id == target


# -- IDF and hubs -----------------------------------------------------------------------


def test_a_key_becomes_a_hub_at_three_memories_and_specificity_is_one_over_count(
    graph: MemoryGraph,
) -> None:
    remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    remember(graph, "Deploys need a green build", ["deployment", "CI"])
    deploy = key_id(graph, "deployment")
    view = graph.read_key(deploy).key
    assert (view.memory_count, view.is_hub, view.specificity) == (2, False, 0.5)
    assert graph.idf(deploy) == pytest.approx(0.5)
    remember(graph, "Deploys are announced in #releases", ["deployment", "Slack"])
    view = graph.read_key(deploy).key
    assert (view.memory_count, view.is_hub, view.specificity) == (3, True, 0.333)
    assert graph.idf(deploy) == pytest.approx(1 / 3)
    compact = next(k for k in recall(graph, "deployment").keys if k.key_id == deploy)
    assert (compact.memory_count, compact.is_hub, compact.specificity) == (3, True, 0.333)
    once = key_id(graph, "Friday")
    assert graph.idf(once) == 1.0
    assert graph.read_key(once).key.specificity == 1.0


def test_hub_counts_are_per_namespace_but_idf_is_global(graph: MemoryGraph) -> None:
    remember(graph, "Alpha shipped its first release", ["release"], namespace="alpha")
    remember(graph, "Beta shipped its first release", ["release"], namespace="beta")
    remember(graph, "Beta shipped a second release", ["release"], namespace="beta")
    release = key_id(graph, "release")
    assert graph.read_key(release, namespace="alpha").key.memory_count == 1
    assert graph.read_key(release, namespace="beta").key.memory_count == 2
    assert graph.read_key(release).key.memory_count == 3
    assert graph.idf(release) == pytest.approx(1 / 3)


def test_an_entity_key_counts_half_in_idf(graph: MemoryGraph) -> None:
    remember(graph, "Mina runs the design team", ["Mina", "design"], key_types={"Mina": "name"})
    assert graph.idf(key_id(graph, "Mina")) == pytest.approx(0.5)
    assert graph.idf(key_id(graph, "design")) == pytest.approx(1.0)


def test_a_custom_hub_threshold_is_honoured(graph_with: GraphFactory) -> None:  # noqa: F811
    g = graph_with(hub_min_links=2)
    remember(g, "Deploys go out on Fridays", ["deployment"])
    remember(g, "Deploys need a green build", ["deployment"])
    assert g.read_key(key_id(g, "deployment")).key.is_hub


# -- autokey ----------------------------------------------------------------------------

HOMETOWN = "The user grew up in Busan near the sea"


def weak_reads(graph: MemoryGraph, query: str, memory_id: str, key: str, times: int) -> None:
    """``times`` rounds of recall(query) -> read_memory(memory, via the key)."""
    for _ in range(times):
        recall(graph, query)
        graph.read_memory(memory_id, via_key_id=key)


def aliases_of(graph: MemoryGraph, kid: str) -> tuple[str, ...]:
    info = graph.keys.get(kid)
    assert info is not None
    return info.aliases


def candidates(graph: MemoryGraph) -> list[tuple[str, str, int]]:
    return db_read(graph.store,
        lambda c: [
            tuple(r)
            for r in c.execute(
                "SELECT key_id, query_text, count FROM alias_candidates ORDER BY key_id, norm"
            )
        ]
    )


def test_a_weak_query_confirmed_by_three_reads_becomes_a_learned_alias(graph: MemoryGraph) -> None:
    mid = remember(graph, HOMETOWN, ["hometown", "고향", "Busan"])
    hometown = key_id(graph, "hometown")
    first = recall(graph, "birthplace")
    assert first.status == "no_match", "the premise: 'birthplace' sits under the recall gate"
    assert first.nearest_keys and first.nearest_keys[0].key_id == hometown
    graph.read_memory(mid, via_key_id=hometown)
    assert candidates(graph) == [(hometown, "birthplace", 1)]
    weak_reads(graph, "birthplace", mid, hometown, 1)
    assert "birthplace" not in aliases_of(graph, hometown)
    assert candidates(graph) == [(hometown, "birthplace", 2)]
    weak_reads(graph, "birthplace", mid, hometown, 1)
    assert "birthplace" in aliases_of(graph, hometown)
    assert candidates(graph) == []
    read = graph.read_memory(mid)
    assert next(k for k in read.keys if k.key_id == hometown).learned_aliases == ["birthplace"]
    browsed = next(k for k in graph.browse_keys().keys if k.key_id == hometown)
    assert browsed.learned_aliases == ["birthplace"]
    assert set(browsed.aliases) == {"birthplace", "고향"}
    found = recall(graph, "birthplace")
    assert found.status == "found"
    assert found.keys[0].key_id == hometown and found.keys[0].match_type == "alias"
    assert found.memories[0].id == mid


def test_a_read_without_a_preceding_weak_recall_teaches_nothing(graph: MemoryGraph) -> None:
    mid = remember(graph, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(graph, "hometown")
    for _ in range(4):
        graph.read_memory(mid, via_key_id=hometown)
    assert candidates(graph) == []
    assert aliases_of(graph, hometown) == ()


def test_one_recall_confirms_at_most_once(graph: MemoryGraph) -> None:
    mid = remember(graph, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(graph, "hometown")
    recall(graph, "birthplace")
    for _ in range(3):
        graph.read_memory(mid, via_key_id=hometown)
    assert candidates(graph) == [(hometown, "birthplace", 1)]


def test_a_weak_match_older_than_five_minutes_is_not_confirmed(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(graph, "hometown")
    recall(graph, "birthplace")
    clock.advance(301)
    graph.read_memory(mid, via_key_id=hometown)
    assert candidates(graph) == []


def test_a_semantic_match_confirmed_three_times_becomes_a_key_of_its_own(
    graph: MemoryGraph,
) -> None:
    mid = remember(graph, "The user drinks espresso every morning", ["coffee", "morning"])
    coffee = key_id(graph, "coffee")
    found = recall(graph, "espresso")
    # Reached without being named (semantically, and through the memory's text).
    assert found.keys[0].key_id == coffee and found.keys[0].match_type in ("semantic", "content")
    graph.read_memory(mid, via_key_id=coffee)
    weak_reads(graph, "espresso", mid, coffee, 2)
    espresso = key_id(graph, "espresso")
    assert espresso != coffee
    assert "espresso" not in aliases_of(graph, coffee)
    assert mid in [h.memory_id for h in graph.read_key(espresso).memories]


def test_promote_n_sets_how_many_confirmations_are_needed(graph_with: GraphFactory) -> None:  # noqa: F811
    g = graph_with(autokey_promote_n=1)
    mid = remember(g, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(g, "hometown")
    weak_reads(g, "birthplace", mid, hometown, 1)
    assert "birthplace" in aliases_of(g, hometown)


def test_a_query_below_the_confirm_floor_is_never_learned(graph_with: GraphFactory) -> None:  # noqa: F811
    g = graph_with(autokey_confirm_floor=0.59)
    mid = remember(g, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(g, "hometown")
    weak_reads(g, "birthplace", mid, hometown, 4)
    assert candidates(g) == []
    assert aliases_of(g, hometown) == ()


def test_no_alias_is_learned_past_the_alias_cap(graph_with: GraphFactory) -> None:  # noqa: F811
    g = graph_with(autokey_max_aliases=0)
    mid = remember(g, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(g, "hometown")
    weak_reads(g, "birthplace", mid, hometown, 4)
    assert aliases_of(g, hometown) == ()


def test_autokey_off_learns_nothing(graph_with: GraphFactory) -> None:  # noqa: F811
    g = graph_with(autokey=False)
    mid = remember(g, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(g, "hometown")
    weak_reads(g, "birthplace", mid, hometown, 4)
    assert candidates(g) == [] and aliases_of(g, hometown) == ()


def test_a_learned_alias_never_hit_is_pruned_after_the_prune_age(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, HOMETOWN, ["hometown", "고향", "Busan"], decay_profile="permanent")
    hometown = key_id(graph, "hometown")
    weak_reads(graph, "birthplace", mid, hometown, 3)
    assert "birthplace" in aliases_of(graph, hometown)
    clock.advance(29 * DAY)
    assert graph.cleanup_expired().pruned_aliases == 0
    assert "birthplace" in aliases_of(graph, hometown)
    clock.advance(1 * DAY)
    result = graph.cleanup_expired()
    assert result.pruned_aliases == 1 and result.deleted == 0
    assert aliases_of(graph, hometown) == ("고향",), "authored aliases are never pruned"
    assert recall(graph, "birthplace").status == "no_match"


def test_a_learned_alias_that_was_hit_survives_the_prune(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, HOMETOWN, ["hometown", "Busan"], decay_profile="permanent")
    hometown = key_id(graph, "hometown")
    weak_reads(graph, "birthplace", mid, hometown, 3)
    assert recall(graph, "birthplace").keys[0].match_type == "alias"
    hits = db_read(graph.store,
        lambda c: c.execute(
            "SELECT hits FROM aliases WHERE key_id = ? AND norm = 'birthplace'", (hometown,)
        ).fetchone()[0]
    )
    assert hits == 1
    clock.advance(60 * DAY)
    assert graph.cleanup_expired().pruned_aliases == 0
    assert "birthplace" in aliases_of(graph, hometown)


def test_a_stale_alias_candidate_is_pruned(graph: MemoryGraph, clock: FakeClock) -> None:  # noqa: F811
    mid = remember(graph, HOMETOWN, ["hometown", "Busan"], decay_profile="permanent")
    hometown = key_id(graph, "hometown")
    weak_reads(graph, "birthplace", mid, hometown, 1)
    assert len(candidates(graph)) == 1
    clock.advance(30 * DAY)
    assert graph.cleanup_expired().pruned_candidates == 1
    assert candidates(graph) == []


def test_normalized_key_lookup_matches_what_the_index_holds(graph: MemoryGraph) -> None:
    remember(graph, "Tea time is at four", ["Afternoon Tea", "schedule"])
    assert graph.keys.by_norm(normalize("AFTERNOON   tea")) == key_id(graph, "afternoon tea")


def test_a_weak_match_exactly_five_minutes_old_still_counts(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, HOMETOWN, ["hometown", "Busan"])
    hometown = key_id(graph, "hometown")
    recall(graph, "birthplace")
    clock.advance(300)
    graph.read_memory(mid, via_key_id=hometown)
    assert candidates(graph) == [(hometown, "birthplace", 1)]


def test_the_recall_buffer_keeps_the_newest_32_entries() -> None:
    from keymem_daemon.engine.autokey import RecallBuffer

    clock = FakeClock()
    buffer = RecallBuffer(clock)
    for i in range(33):
        buffer.push(f"query {i}", {f"k{i}": 0.5})
    assert buffer.consume("k0") is None, "the oldest entry was evicted"
    assert buffer.consume("k1") is not None
    buffer.push("again", {"k1": 0.55})
    buffer.push("newest", {"k1": 0.56})
    match = buffer.consume("k1")
    assert match is not None and (match.query, match.score) == ("newest", 0.56)
    buffer.push("empty", {})
    assert buffer.consume("nothing") is None


@pytest.mark.parametrize(
    ("count", "query", "cosine", "learned", "expected"),
    [
        (2, "birthplace", 0.9, 0, "none"),  # below promote_n
        (3, "birthplace", 0.84, 0, "alias"),  # at the alias threshold (inclusive)
        (3, "birthplace", 0.84, 8, "none"),  # alias cap reached
        (3, "birthplace", 0.839, 0, "new_key"),  # below alias, at/above new-key
        (3, "birthplace", 0.65, 0, "new_key"),  # new-key threshold is inclusive
        (3, "birthplace", 0.649, 0, "alias"),  # confirm-floor band
        (3, "birthplace", 0.45, 0, "alias"),  # the floor is inclusive
        (3, "birthplace", 0.449, 0, "none"),  # below the floor
        (3, "birthplace", 0.5, 8, "none"),  # floor band, cap reached
        (3, "where exactly was the user born again", 0.9, 0, "none"),  # not a short concept
    ],
)
def test_promotion_decisions_and_their_inclusive_boundaries(
    count: int, query: str, cosine: float, learned: int, expected: str
) -> None:
    from keymem_daemon.engine.autokey import PromotionRule, decide_promotion

    rule = PromotionRule(
        promote_n=3, alias_at=0.84, new_key_at=0.65, confirm_floor=0.45, max_aliases=8
    )
    assert decide_promotion(count, query, cosine, learned, rule) == expected
