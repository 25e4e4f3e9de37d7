"""Hybrid recall: memories for a query, best first (the recall_memories tool and the push
path's pool).

Candidates come from the channels (``channels.py``): lexical BM25 over text and keys, the
key path (keys the query's terms reach), body cosine and, when the query names a date, the
memories observed then. Each is scored on the evidence it holds (``signals.py``): how much
of the query it covers plus its body cosine; a date match multiplies, depth and freshness
modulate, and memories of the same episode as the best ones, or sharing their specific keys,
share a little of their score. Hops along narrow keys and explicit links add associated
memories. A memory that says again, in other words, what a better-ranked one says yields its
place; a ready cross-encoder then reorders the best it can score within its budget. What was
returned is reinforced through the writer (``bump_links``, ``decay_links``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np

from keymem_daemon.engine import limits
from keymem_daemon.engine.links import EXPLORED_DECAY, HOP_REINFORCE, LINK_MAX, LINK_MIN, REINFORCE
from keymem_daemon.engine.ports import Reader, Scope, Writer
from keymem_daemon.engine.reads.channels import (
    DATE,
    DENSE,
    LEXICAL,
    Candidate,
    Channel,
    Via,
    coverage_scores,
    dense,
    expand,
    key_members,
    lexical,
    matched_keys,
    score_keys,
)
from keymem_daemon.engine.reads.query import QueryPlan, plan_query
from keymem_daemon.engine.reads.signals import (
    DENSE_WEIGHT,
    association_bonus,
    depth_factor,
    entity_mentions,
    episode_bonus,
    is_comparison,
    key_weight,
    project_task_evidence,
    relevance,
    same_episode,
    seed_mass,
    sigmoid,
    temporal_factor,
    without_repeats,
)
from keymem_daemon.engine.records import Hit, Memory
from keymem_daemon.engine.text import truncate
from keymem_daemon.errors import StoreBusy, StoreUnavailable

if TYPE_CHECKING:
    from keymem_daemon.engine.graph import MemoryGraph

logger = logging.getLogger(__name__)

KEY_PATH_KEYS: Final = 10
# A matched key adds its members as candidates only when it has at most this many; keys
# add theirs strongest first until the key path has brought KEY_PATH_POOL candidates (a
# query near many sibling names -- auth-api, auth-batch, ... -- would otherwise score all
# of their memories: 10k store, 450 candidates and 25 ms for a push-path prompt).
KEY_PATH_MEMBERS: Final = 100
KEY_PATH_POOL: Final = 200
# At most this many memories join the pool for being observed in a named period.
WINDOW_MEMBERS: Final = 200
CANDIDATE_DEPTH: Final = 50
# Body cosine at which the dense channel alone admits a memory as a candidate; below it a
# memory must come through another channel (or a hop), so hops still mean something.
DENSE_ADMIT: Final = 0.3
# Below this relevance nothing anchors a hybrid recall: it answers nothing rather than noise.
MIN_ANCHOR: Final = 0.35
# Repeats yield their place among this many of the best (signals.REDUNDANT_COSINE says when).
REPEAT_POOL: Final = 20
# The best candidates whose evidence memories of their episode share (EPISODE_BONUS), and
# the fewer whose specific keys do (PRF_WEIGHT).
EPISODE_SEEDS: Final = 5
PRF_SEEDS: Final = 3
# Reached only lexically or by a date, a candidate shares the query's script already: the
# words of its text in the other script are not weighed for it.
_SAME_SCRIPT: Final = frozenset({Channel.LEXICAL, Channel.DATE})

Links = dict[str, dict[str, tuple[float, bool]]]


@dataclass(frozen=True, slots=True)
class HybridResult:
    hits: list[Hit]
    matched_keys: list[str]
    anchored: bool
    reached: dict[str, tuple[Via, ...]] = field(default_factory=dict)
    """How each hit was reached (by memory id): what ``Hit.matched_via`` shows, typed."""
    links: Links = field(default_factory=dict)
    """Each hit's links as the recall read them (``Reader.links_by_memory``)."""
    tokens: dict[str, list[str]] = field(default_factory=dict)
    """Each hit's lexical-index content tokens as the recall read them (``Reader.indexed_tokens``)."""


@dataclass(slots=True)
class _Pool:
    """One recall's candidates, the memories read for them and their links."""

    cands: dict[str, Candidate]
    found: dict[str, Memory]
    link_map: Links
    indexed: dict[str, tuple[list[str], list[str]]]


def hybrid_recall(graph: MemoryGraph, query: str, *, scope: Scope = None, top_k: int = 5, hops: int = 2,
                  min_rel_score: float = 0.0, min_depth: float = 0.0, reinforce: bool = True,
                  context: str | None = None, max_chars: int | None = None,
                  plan: QueryPlan | None = None, rerank_budget_ms: int | None = None) -> HybridResult:
    """Memories for a query, best first: ``top_k`` of them; ``hops`` within ``limits.HOPS``
    (1: the direct channels only); ``min_rel_score`` keeps those scoring at least that share of
    the best (at most ``limits.MIN_REL_SCORE.high``); ``min_depth`` those at least that deep;
    ``context`` (when it is not the query) is what the channels search with; ``plan`` spares
    analysing the query again; a ready cross-encoder reorders within ``rerank_budget_ms``
    (default: the tools' budget; the push path passes its own); ``reinforce`` writes what was
    returned back to its links."""
    now = graph.clock()
    plan = plan or plan_query(graph, query)
    cue = plan if not context or context == query else plan_query(graph, context[:limits.MAX_QUERY_CHARS])
    keys = matched_keys(graph, score_keys(graph, plan), KEY_PATH_KEYS)
    matched = [k for k, _, _ in keys]
    hops = limits.HOPS.clamp(hops)
    pool = graph.store.read(lambda reader: _gather(graph, reader, plan, cue, matched, scope, now, hops))
    # Anchored when some memory is relevant on its content, or the query reaches a key:
    # keys are how a query in one language reaches memories written in the other.
    if not (matched or any(c.raw >= MIN_ANCHOR for c in pool.cands.values())):
        return HybridResult([], matched, False)
    ranked = _filtered(pool, min_rel_score, min_depth)
    # Before the cross-encoder, which judges each memory alone: its order, when it runs, wins.
    ranked = _skip_repeats(graph, ranked, top_k)
    budget = graph.settings.rerank_budget_ms if rerank_budget_ms is None else rerank_budget_ms
    ranked = _rerank(graph, cue.text, ranked, pool.found, top_k, budget / 1000)
    if graph.settings.task_evidence and is_comparison(query):
        ranked = _project(graph, query, ranked, pool.link_map, top_k)
    chosen = ranked[:top_k]
    if reinforce and chosen:
        _reinforce(graph, chosen, matched, pool.link_map)
    hits = _hits(graph, chosen, pool.found, pool.link_map, max_chars)
    # What the push path's evidence reads of its hits, from this recall's snapshot: reading
    # them again cost it a second transaction per prompt.
    ids = [c.memory_id for c in chosen]
    return HybridResult(hits, matched, True, {c.memory_id: tuple(c.via) for c in chosen},
                        links={mid: pool.link_map[mid] for mid in ids if mid in pool.link_map},
                        tokens={mid: pool.indexed[mid][0] for mid in ids if mid in pool.indexed})


def _gather(graph: MemoryGraph, reader: Reader, plan: QueryPlan, cue: QueryPlan, matched: Sequence[str],
            scope: Scope, now: float, hops: int) -> _Pool:
    """The candidates of every channel, scored on their evidence, then the hops' additions."""
    cands = _candidates(graph, reader, plan, cue, matched, scope, now)
    found = reader.memories(cands)
    live = [found[mid] for mid in cands if mid in found and found[mid].active(now)
            and (scope is None or found[mid].namespace in scope)]
    for mid in set(cands) - {m.id for m in live}:
        del cands[mid]
    link_map = reader.links_by_memory(cands)
    indexed = reader.indexed_tokens([m.id for m in live])
    _score(graph, reader, plan, cue, live, cands, link_map, indexed, now)
    _share_evidence(graph, live, cands, link_map, scope, now)
    if hops >= 2 and cands:
        expand(graph, reader, cands, found, link_map, scope, now, hops)
    return _Pool(cands, found, link_map, indexed)


def _candidates(graph: MemoryGraph, reader: Reader, plan: QueryPlan, cue: QueryPlan, matched: Sequence[str],
                scope: Scope, now: float) -> dict[str, Candidate]:
    """Every channel's candidates, tagged with how they were reached (not yet filtered)."""
    cands: dict[str, Candidate] = {}

    def cand(mid: str) -> Candidate:
        c = cands.get(mid)
        if c is None:
            c = cands[mid] = Candidate(mid)
        return c

    for mid, _ in lexical(reader, cue.match_tokens, scope, now, limit=CANDIDATE_DEPTH):
        cand(mid).tag(LEXICAL)
    for mid, cos in dense(graph, cue.focus_vector, scope, limit=CANDIDATE_DEPTH):
        if cos >= DENSE_ADMIT:
            cand(mid).tag(DENSE)
    # A hub names a topic, not a memory: its members come through the other channels
    # (its text is in their lexical index) or not at all.
    sizes = graph.key_counts(matched, scope, now).counts
    narrow: list[str] = []
    budget = KEY_PATH_POOL
    for kid in matched:
        if budget <= 0:
            break
        if 0 < sizes.get(kid, 0) <= KEY_PATH_MEMBERS:
            narrow.append(kid)
            budget -= sizes[kid]
    members = key_members(reader, narrow, scope, now)
    for kid in narrow:
        info = graph.keys.get(kid)
        for mid, _ in members.get(kid, []):
            c = cand(mid)
            if info is not None:
                c.tag(Via(Channel.KEY, info.concept))
    if plan.window is not None:
        # A memory observed in the named period joins the pool even if no channel saw it.
        for mid in reader.observed_between(plan.window.start, plan.window.end, scope, now, WINDOW_MEMBERS):
            cand(mid).tag(DATE)
    return cands


def _score(graph: MemoryGraph, reader: Reader, plan: QueryPlan, cue: QueryPlan, live: Sequence[Memory],
           cands: Mapping[str, Candidate], link_map: Links, indexed: Mapping[str, tuple[list[str], list[str]]],
           now: float) -> None:
    """Each live candidate's coverage, body cosine, relevance and score."""
    # Words of a memory written in the other script can cover the query's words only
    # through its meaning; that is weighed for the memories the key path or the dense
    # channel reached (a lexical-only candidate shares the query's script already).
    # As Python floats once: reading numpy scalars one by one cost more than the product.
    cosines = {mid: pair.tolist() for mid, pair in
               graph.bodies.cosines([m.id for m in live], np.stack([cue.focus_vector, cue.vector])).items()}
    cross = {m.id: max(cosines[m.id]) if m.id in cosines else 0.0 for m in live
             if cands[m.id].reached_by(_SAME_SCRIPT)}
    cover = coverage_scores(graph, reader, cue, live, link_map, cross, indexed=indexed)
    for m in live:
        c = cands[m.id]
        c.coverage = cover.get(m.id, 0.0)
        focused, whole = cosines.get(m.id, (0.0, 0.0))
        c.dense = focused
        # Relevance (what the push path's floor reads) takes the better of the focused and
        # the whole-query cosine: either can be the one that says "this answers it".
        c.raw = relevance(c.coverage, max(c.dense, whole))
        score = c.coverage + DENSE_WEIGHT * max(0.0, c.dense)
        score *= temporal_factor(plan.window is not None and plan.window.contains(m.when))
        c.score = score * depth_factor(m.depth) * graph.rank_factor_of(m, now)


def _share_evidence(graph: MemoryGraph, live: Sequence[Memory], cands: Mapping[str, Candidate],
                    link_map: Links, scope: Scope, now: float) -> None:
    """Memories of the best candidates' episodes, and those sharing their specific keys,
    gain a share of their score (the larger of the two bonuses)."""
    seeds = sorted(live, key=lambda m: -cands[m.id].score)[:EPISODE_SEEDS]
    bonus: dict[str, float] = {}
    for seed in seeds:
        share = episode_bonus(cands[seed.id].score)
        for m in live:
            if m.id != seed.id and same_episode(m, seed):
                bonus[m.id] = max(bonus.get(m.id, 0.0), share)
    sizes = graph.key_counts({k for keys in link_map.values() for k in keys}, scope, now).counts
    total = max(1, len(graph.bodies))
    weights: dict[str, float] = {}

    def weight(kid: str) -> float:
        value = weights.get(kid)
        if value is None:
            value = weights[kid] = key_weight(sizes.get(kid, 1), total)
        return value

    # Only a memory sharing one of the seed's keys gains (association_bonus is 0 for the rest).
    holders: dict[str, set[str]] = {}
    for mid, keys in link_map.items():
        for kid in keys:
            holders.setdefault(kid, set()).add(mid)
    for seed in seeds[:PRF_SEEDS]:
        seed_keys = link_map.get(seed.id, {})
        sharing = set().union(*(holders.get(kid, ()) for kid in seed_keys))
        mass = seed_mass(seed_keys, weight)
        for m in live:
            if m.id == seed.id or m.id not in sharing:
                continue
            extra = association_bonus(cands[seed.id].score, seed_keys, link_map.get(m.id, {}), weight, mass=mass)
            if extra:
                bonus[m.id] = max(bonus.get(m.id, 0.0), extra)
    for mid, extra in bonus.items():
        cands[mid].score += extra


def _filtered(pool: _Pool, min_rel_score: float, min_depth: float) -> list[Candidate]:
    """The candidates best first, less those under the caller's floors."""
    ranked = sorted(pool.cands.values(), key=lambda c: -c.score)
    if min_rel_score > 0 and ranked:
        floor = ranked[0].score * min(limits.MIN_REL_SCORE.high, min_rel_score)
        ranked = [c for c in ranked if c.score >= floor]
    if min_depth > 0:
        ranked = [c for c in ranked if pool.found[c.memory_id].depth >= min_depth]
    return ranked


def _skip_repeats(graph: MemoryGraph, ranked: list[Candidate], top_k: int) -> list[Candidate]:
    pool = ranked[:REPEAT_POOL]
    if len(pool) < 2:
        return ranked
    bodies = graph.bodies.stack([c.memory_id for c in pool])
    order = without_repeats([c.score for c in pool], bodies @ bodies.T, top_k)
    return [pool[i] for i in order] + ranked[len(pool):]


def _rerank(graph: MemoryGraph, query: str, ranked: list[Candidate], found: Mapping[str, Memory],
            top_k: int, budget: float) -> list[Candidate]:
    """The best candidates in the cross-encoder's order: as many as it scores within
    ``budget`` seconds (the rest keep their fused order behind them)."""
    if graph.reranker is None or len(ranked) < 2:
        return ranked
    pool = ranked[: max(top_k, graph.settings.rerank_pool)]
    logits = graph.reranker.score(query, [found[c.memory_id].content for c in pool], budget=budget)
    if logits is None or len(logits) < 2:  # one candidate scored alone has nothing to be ordered against
        return ranked
    order = sorted(range(len(logits)), key=lambda i: -float(logits[i]))
    for i in order:
        pool[i].raw = max(pool[i].raw, sigmoid(float(logits[i])))
    return [pool[i] for i in order] + ranked[len(logits):]


def _project(graph: MemoryGraph, query: str, ranked: list[Candidate],
             link_map: Mapping[str, Mapping[str, tuple[float, bool]]], top_k: int) -> list[Candidate]:
    entities = {info.id: [info.concept, *info.aliases] for info in graph.keys.all() if info.is_entity}
    mentioned = entity_mentions(query, entities)
    if len(mentioned) < 2:
        return ranked
    order = project_task_evidence(
        [c.memory_id for c in ranked], {mid: set(keys) for mid, keys in link_map.items()}, mentioned,
        {c.memory_id: c.score for c in ranked}, top_k)
    by_id = {c.memory_id: c for c in ranked}
    return [by_id[m] for m in order]


def _reinforce(graph: MemoryGraph, chosen: Sequence[Candidate], matched: Sequence[str],
               link_map: Mapping[str, Mapping[str, tuple[float, bool]]]) -> None:
    """Access +1 for what was returned; the top result's links to the matched keys +0.1;
    a returned hop's connecting link +0.05; unreturned members of the matched keys -0.005."""
    now = graph.clock()
    top = chosen[0].memory_id
    returned = {c.memory_id for c in chosen}
    matched_set = set(matched)
    bumps: list[tuple[float, str, str]] = [
        (REINFORCE, kid, top) for kid in link_map.get(top, {}) if kid in matched_set]
    bumps += [(HOP_REINFORCE, c.hop_key, c.memory_id) for c in chosen[1:] if c.hop >= 2 and c.hop_key]

    def write(writer: Writer) -> None:
        writer.mark_accessed(returned, now)
        writer.bump_links(bumps, ceiling=LINK_MAX)
        writer.decay_links(matched_set, returned, EXPLORED_DECAY, floor=LINK_MIN)

    try:
        graph.store.write(write)
    except (StoreUnavailable, StoreBusy):
        # A shared store's server that does not answer (or a daemon whose connections to it
        # are all busy): the recall is served (from the local replica) without its
        # reinforcement, which is bookkeeping, not the answer.
        logger.debug("recall not reinforced: the store does not answer")


def _hits(graph: MemoryGraph, chosen: Sequence[Candidate], found: Mapping[str, Memory],
          link_map: Mapping[str, Mapping[str, tuple[float, bool]]], max_chars: int | None) -> list[Hit]:
    now = graph.clock()

    def read(reader: Reader) -> list[Hit]:

        fresh = reader.memories([c.memory_id for c in chosen])
        out = []
        for c in chosen:
            m = fresh.get(c.memory_id) or found[c.memory_id]
            content, cut = (m.content, False) if max_chars is None else truncate(m.content, max_chars)
            keys = [graph.concept(k) for k, (_, auto) in link_map.get(m.id, {}).items() if not auto]
            out.append(Hit(
                id=m.id, content=content, keys=keys, matched_via=c.labels, hop=c.hop,
                score=round(c.score, 6), rank_score=round(c.score, 6), relevance_score=round(c.raw, 3),
                depth=round(m.depth, 3), access_count=m.access_count, source=m.source, supersedes=m.supersedes,
                created_at=m.created_at, observed_at=m.observed_at, namespace=m.namespace,
                related_to=reader.related_ids(m.id), validity=graph.validity_of(m),
                batch_sibling_ids=graph.batch_siblings(reader, m, now),
                content_truncated=True if cut else None, content_chars=len(m.content) if cut else None))
        return out

    return graph.store.read(read)
