"""The read path's pure scoring functions (engine/reads/signals.py) and channel tags
(engine/reads/channels.py), on plain numbers: no store, model or daemon."""
from __future__ import annotations

import math

import numpy as np
import pytest

from keymem_daemon.engine.reads import signals
from keymem_daemon.engine.reads.channels import UNANCHORED, Candidate, Channel, Via
from keymem_daemon.engine.records import Memory

pytestmark = pytest.mark.timeout(10)


def _memory(memory_id: str, *, namespace: str = "default", observed_at: float | None = None,
            created_at: float = 1000.0) -> Memory:
    return Memory(rowid=1, id=memory_id, content="x", namespace=namespace, depth=0.0, access_count=0,
                  created_at=created_at, updated_at=created_at, last_accessed=None, observed_at=observed_at,
                  last_confirmed_at=created_at, confirmation_count=1, decay_profile="standard",
                  last_confirmation_evidence=None, last_confirmation_source=None, last_confirmation_id=None,
                  expires_at=None, supersedes=None, superseded_by=None, source=None)


def test_relevance_mixes_coverage_with_the_positive_part_of_the_cosine() -> None:
    assert signals.relevance(1.0, 1.0) == pytest.approx(1.0)
    assert signals.relevance(0.0, 0.0) == 0.0
    # A negative cosine says nothing: it counts as zero, not against the coverage.
    assert signals.relevance(0.5, -0.8) == signals.relevance(0.5, 0.0) == pytest.approx(0.5 / 1.6)


def test_bounded_sigmoid_and_depth_factor_map_onto_their_ranges() -> None:
    assert signals.bounded(0.0) == 0.0
    assert signals.bounded(-3.0) == 0.0
    assert signals.bounded(1.0) == 0.5
    assert signals.sigmoid(0.0) == 0.5
    assert signals.sigmoid(40.0) == pytest.approx(1.0)
    assert signals.depth_factor(0.0) == pytest.approx(0.9)
    assert signals.depth_factor(1.0) == pytest.approx(1.0)


def test_coverage_share_weighs_each_token_by_how_well_it_is_matched() -> None:
    weights = [2.0, 1.0, 1.0]
    assert signals.coverage_share(weights, [1.0, 0.0, 0.0], 4.0) == 0.5
    assert signals.coverage_share(weights, [1.0, 0.5, 1.0], 4.0) == pytest.approx(0.875)
    assert signals.best_of([1.0, 0.0, 0.3], [0.2, 0.8, 0.1]) == [1.0, 0.8, 0.3]


def test_a_named_date_multiplies_only_memories_observed_then() -> None:
    assert signals.temporal_factor(True) == signals.TEMPORAL_BOOST
    assert signals.temporal_factor(False) == 1.0


def test_a_key_on_few_memories_says_more_than_a_hub() -> None:
    assert signals.key_weight(1, 100) == pytest.approx(math.log(101.0))
    assert signals.key_weight(1, 100) > signals.key_weight(50, 100) > 0
    assert signals.key_weight(0, 100) == signals.key_weight(1, 100)


def test_association_bonus_is_the_share_of_the_seeds_key_weight_shared() -> None:
    weight = {"a": 3.0, "b": 1.0, "c": 5.0}.__getitem__
    assert signals.association_bonus(2.0, ["a", "b"], ["b", "c"], weight) == pytest.approx(
        signals.PRF_WEIGHT * 2.0 * 1.0 / 4.0)
    assert signals.association_bonus(2.0, ["a", "b"], ["c"], weight) == 0.0
    assert signals.episode_bonus(2.0) == pytest.approx(signals.EPISODE_BONUS * 2.0)


def test_a_seeds_key_weight_summed_once_gives_the_same_bonus_to_every_memory() -> None:
    weight = {"a": 3.0, "b": 1.0, "c": 5.0}.__getitem__
    mass = signals.seed_mass(["a", "b"], weight)
    assert mass == 4.0
    assert signals.seed_mass([], weight) == 1.0
    for keys in (["b", "c"], ["a"], ["a", "b"], ["c"]):
        assert signals.association_bonus(2.0, ["a", "b"], keys, weight, mass=mass) == \
            signals.association_bonus(2.0, ["a", "b"], keys, weight)


def test_memories_of_one_sitting_in_one_namespace_are_one_episode() -> None:
    a = _memory("a", observed_at=10_000.0)
    assert signals.same_episode(a, _memory("b", observed_at=10_000.0 + signals.EPISODE_GAP))
    assert not signals.same_episode(a, _memory("c", observed_at=10_000.0 + signals.EPISODE_GAP + 1))
    assert not signals.same_episode(a, _memory("d", namespace="work", observed_at=10_000.0))


def test_a_repeat_yields_its_place_to_the_next_different_memory() -> None:
    sims = np.eye(3, dtype=np.float32)
    sims[0, 1] = sims[1, 0] = 0.99
    assert signals.without_repeats([1.0, 0.95, 0.9], sims, 2) == [0, 2, 1]
    # Unrelated candidates keep their order.
    assert signals.without_repeats([1.0, 0.95, 0.9], np.eye(3, dtype=np.float32), 3) == [0, 1, 2]


def test_a_candidate_shows_its_channels_as_the_labels_hits_always_had() -> None:
    c = Candidate("m")
    c.tag(Via(Channel.LEXICAL))
    c.tag(Via(Channel.KEY, "deploy"))
    c.tag(Via(Channel.LEXICAL))
    c.tag(Via(Channel.HOP, "staging"))
    c.tag(Via(Channel.LINKED))
    assert c.labels == ["(bm25)", "deploy", "staging(via)", "(linked)"]
    assert c.reached_by(frozenset({Channel.LEXICAL}))
    only_lexical = Candidate("n", via=[Via(Channel.LEXICAL), Via(Channel.DATE)])
    assert not only_lexical.reached_by(frozenset({Channel.LEXICAL, Channel.DATE}))
    assert {Channel.KEY, Channel.DENSE}.isdisjoint(UNANCHORED)
