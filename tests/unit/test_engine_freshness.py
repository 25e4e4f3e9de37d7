"""Freshness and validity: four decay profiles, the fresh/aging/stale bands with their exact
boundaries, the rank factor, and the injectable clock driving all of it."""

from __future__ import annotations

import pytest
from engine_helpers import DAY, START, FakeClock, GraphFactory, key_id, remember

from keymem_daemon.engine.freshness import (
    HalfLives,
    freshness,
    parse_decay_profile,
    rank_factor,
    status_of,
    validity,
)
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.errors import InvalidInput

pytestmark = pytest.mark.timeout(60)

LIVES = HalfLives()


@pytest.mark.parametrize(("profile", "days"), [("transient", 7), ("standard", 90), ("stable", 365)])
def test_each_decaying_profile_halves_at_its_half_life(profile: str, days: float) -> None:
    assert freshness(profile, START, START + days * DAY, LIVES) == pytest.approx(0.5)  # type: ignore[arg-type]
    assert freshness(profile, START, START + 2 * days * DAY, LIVES) == pytest.approx(0.25)  # type: ignore[arg-type]
    assert freshness(profile, START, START, LIVES) == 1.0  # type: ignore[arg-type]


def test_a_permanent_memory_never_decays() -> None:
    assert freshness("permanent", START, START + 100 * 365 * DAY, LIVES) == 1.0


def test_standard_band_boundaries_are_exact() -> None:
    at_90 = validity("standard", START, 1, START + 90 * DAY, LIVES)
    assert (at_90.freshness, at_90.status) == (0.5, "fresh")
    at_270 = validity("standard", START, 1, START + 270 * DAY, LIVES)
    assert (at_270.freshness, at_270.status) == (0.125, "aging")
    past = validity("standard", START, 1, START + 270 * DAY + 1, LIVES)
    assert past.status == "stale"
    just_past_90 = validity("standard", START, 1, START + 90 * DAY + 1, LIVES)
    assert just_past_90.status == "aging"


def test_status_thresholds() -> None:
    assert status_of(1.0) == status_of(0.5) == "fresh"
    assert status_of(0.4999) == status_of(0.125) == "aging"
    assert status_of(0.1249) == status_of(0.0) == "stale"


def test_the_rank_factor_maps_freshness_onto_point_two_to_one() -> None:
    assert rank_factor(1.0) == 1.0
    assert rank_factor(0.5) == 0.6
    assert rank_factor(0.0) == 0.2
    assert rank_factor(2.0) == 1.0 and rank_factor(-1.0) == 0.2


def test_validity_reports_every_field() -> None:
    v = validity("stable", START, 4, START + 365 * DAY * 3, LIVES)
    assert v.freshness == 0.125 and v.status == "aging"
    assert v.age_days == pytest.approx(365 * 3)
    assert v.last_confirmed_at == START
    assert v.confirmation_count == 4
    assert v.decay_profile == "stable"
    assert v.verification_recommended is True
    assert v.verification_required is False
    stale = validity("transient", START, 1, START + 30 * DAY, LIVES)
    assert stale.status == "stale" and stale.verification_required is True
    fresh = validity("transient", START, 1, START + DAY, LIVES)
    assert fresh.verification_recommended is False and fresh.verification_required is False


def test_a_future_confirmation_counts_as_age_zero() -> None:
    v = validity("standard", START + DAY, 1, START, LIVES)
    assert v.freshness == 1.0 and v.age_days == 0.0 and v.status == "fresh"


def test_decay_profiles_parse_and_unknown_ones_are_refused() -> None:
    assert parse_decay_profile(None) == "standard"
    assert parse_decay_profile(" Stable ") == "stable"
    with pytest.raises(InvalidInput, match="Unknown decay profile") as caught:
        parse_decay_profile("forever")
    assert caught.value.field == "decay_profile"
    with pytest.raises(InvalidInput):
        parse_decay_profile(7)


def test_the_clock_drives_a_memorys_validity_through_the_bands(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, "The staging database is Postgres 15", ["staging", "database"])
    assert graph.read_memory(mid).memory.validity.status == "fresh"
    clock.set(START + 90 * DAY)
    v = graph.read_memory(mid).memory.validity
    assert (v.freshness, v.status, v.age_days) == (0.5, "fresh", 90.0)
    clock.set(START + 270 * DAY)
    assert graph.read_memory(mid).memory.validity.status == "aging"
    clock.set(START + 270 * DAY + 1)
    v = graph.read_memory(mid).memory.validity
    assert v.status == "stale" and v.verification_required


@pytest.mark.parametrize(
    ("profile", "days", "status"),
    [
        ("transient", 8, "aging"),
        ("transient", 22, "stale"),
        ("stable", 300, "fresh"),
        ("permanent", 10_000, "fresh"),
    ],
)
def test_a_memory_decays_by_its_own_profile(
    graph: MemoryGraph,
    clock: FakeClock,
    profile: str,
    days: float,  # noqa: F811
    status: str,
) -> None:
    mid = remember(graph, "The build cache lives in S3", ["build", "cache"], decay_profile=profile)
    clock.advance(days * DAY)
    v = graph.read_memory(mid).memory.validity
    assert v.decay_profile == profile and v.status == status


def test_half_lives_come_from_the_settings(graph_with: GraphFactory, clock: FakeClock) -> None:  # noqa: F811
    g = graph_with(decay_standard_days=10)
    mid = remember(g, "The build cache lives in S3", ["build", "cache"])
    clock.advance(10 * DAY)
    assert g.read_memory(mid).memory.validity.freshness == 0.5


def test_reading_a_stale_memory_does_not_refresh_it(graph: MemoryGraph, clock: FakeClock) -> None:  # noqa: F811
    mid = remember(graph, "The staging database is Postgres 15", ["staging", "database"])
    clock.advance(400 * DAY)
    kid = key_id(graph, "database")
    for _ in range(3):
        view = graph.read_memory(mid, via_key_id=kid).memory
    assert view.validity.status == "stale"
    assert view.validity.last_confirmed_at == START
    assert view.validity.confirmation_count == 1
    assert view.depth == 0.0


def test_confirming_a_stale_memory_makes_it_fresh_again(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    mid = remember(graph, "The staging database is Postgres 15", ["staging", "database"])
    clock.advance(400 * DAY)
    result = graph.confirm_memory(mid, "observation")
    assert result.confirmed and result.validity.status == "fresh"
    assert result.validity.last_confirmed_at == clock.now
    assert result.validity.confirmation_count == 2


def test_every_view_of_a_memory_carries_validity(graph: MemoryGraph, clock: FakeClock) -> None:  # noqa: F811
    mid = remember(graph, "The staging database is Postgres 15", ["staging", "database"])
    clock.advance(100 * DAY)
    kid = key_id(graph, "database")
    assert graph.read_key(kid).memories[0].validity.status == "aging"
    assert recall(graph, "database").memories[0].validity.status == "aging"
    assert (
        hybrid_recall(graph, "database", reinforce=False).hits[0].validity.status
        == "aging"
    )
    assert graph.list_memories().memories[0].validity.status == "aging"
    assert graph.read_memory(mid).memory.validity.status == "aging"


def two_under_one_key(graph: MemoryGraph, clock: FakeClock) -> tuple[str, str, str]:  # noqa: F811
    """Two equally relevant memories under one key, at equal depth: the older one never
    decays (permanent), the newer one goes stale -- so created_at order and freshness disagree."""
    old = remember(
        graph,
        "Staging deploys use the blue cluster",
        ["staging", "cluster"],
        decay_profile="permanent",
    )
    clock.advance(1)
    new = remember(graph, "Staging deploys use the green cluster", ["staging", "cluster"])
    clock.advance(400 * DAY)
    return old, new, key_id(graph, "staging")


def test_a_fresh_memory_ranks_before_a_stale_one_in_read_key(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    fresh, stale, kid = two_under_one_key(graph, clock)
    handles = graph.read_key(kid).memories
    assert [h.memory_id for h in handles] == [fresh, stale]
    assert handles[0].validity.status == "fresh" and handles[1].validity.status == "stale"
    # score = link weight x depth factor x (0.2 + 0.8 x freshness)
    assert handles[1].score < handles[0].score
    assert handles[1].score == pytest.approx(
        1.0 * 0.9 * rank_factor(handles[1].validity.freshness), abs=1e-3
    )
    queried = graph.read_key(kid, query="staging cluster").memories
    assert [h.memory_id for h in queried] == [fresh, stale]


def test_a_fresh_memory_wins_the_passive_top_1_over_a_stale_twin(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    fresh, _, _ = two_under_one_key(graph, clock)
    assert recall(graph, "staging").memories[0].id == fresh


def test_a_fresh_memory_ranks_first_in_hybrid_recall(graph: MemoryGraph, clock: FakeClock) -> None:  # noqa: F811
    fresh, stale, _ = two_under_one_key(graph, clock)
    hits = hybrid_recall(graph, "staging cluster", reinforce=False).hits
    order = [h.id for h in hits]
    assert order.index(fresh) < order.index(stale)
