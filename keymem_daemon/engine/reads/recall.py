"""The read tools' ranking: recall (key clusters for a query and the best memory under the
best key, the passive Top-1) and the ranking of one key's members (read_key, the Top-1).

A key is a candidate when the query's terms reach it (its text at or above the profile's
``key_recall``), the query names it (a literal match: entities only this way), or one of its
members answers the query on its content (``channels.content_signal``). A key's members are
ranked by relevance x link weight x depth x freshness; a large hub's only among a cheap
prefilter's best.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from keymem_daemon.engine import limits
from keymem_daemon.engine.ports import Reader, Scope
from keymem_daemon.engine.reads.channels import (
    CHANNEL_DEPTH,
    KeyScores,
    content_signal,
    coverage_scores,
    key_members,
    lexical,
    score_keys,
)
from keymem_daemon.engine.reads.query import QueryPlan, plan_query, scope_of
from keymem_daemon.engine.reads.signals import TEMPORAL_BOOST, depth_factor, relevance, sigmoid
from keymem_daemon.engine.records import (
    CompactKey,
    ConnectedKey,
    MatchedKey,
    Memory,
    NearestKey,
    Preview,
    RecallResult,
)
from keymem_daemon.engine.text import normalize, truncate
from keymem_daemon.engine.vectors import top_indices
from keymem_daemon.errors import InvalidInput

if TYPE_CHECKING:
    from keymem_daemon.engine.graph import MemoryGraph
    from keymem_daemon.engine.writes.remember import Host

# Above this many members a key's memories are found through the query's own candidates.
HUB_SCAN: Final = 500
# A key's members ranked at most when all of them are asked for (read_key of a hub).
ALL_MEMBERS: Final = 1_000_000
NEAREST_KEYS: Final = 5
NO_MATCH_NOTE: Final = (
    "No key cleared the recall gate. If a nearest_keys concept matches the topic, retry recall with that "
    "concept (or read_key it directly); otherwise browse_keys(namespace) to see the vocabulary."
)


# -- ranking a key's members (read_key and the passive Top-1) ---------------------------


@dataclass(frozen=True, slots=True)
class Member:
    memory: Memory
    weight: float
    relevance: float | None
    score: float


def member_relevance(graph: MemoryGraph, reader: Reader, plan: QueryPlan,
                     memories: Sequence[Memory]) -> dict[str, float]:
    """Content relevance in [0, 1] of each memory to the query: its query coverage mixed
    with its body cosine (the cross-encoder's, for the best members, in ``_reranked``)."""
    if not memories:
        return {}
    cover = coverage_scores(graph, reader, plan, memories)
    cosines = graph.bodies.cosines([m.id for m in memories], plan.focus_vector)
    return {m.id: relevance(cover.get(m.id, 0.0), float(cosines[m.id][0]) if m.id in cosines else 0.0)
            for m in memories}


def rank_key_members(graph: MemoryGraph, key_id: str, query: str | None, namespace: str | None,
                     *, pool: int | None, plan: QueryPlan | None = None,
                     near: Sequence[str] | None = None) -> tuple[list[Member], int]:
    """A key's active memories ranked by relevance x link weight x depth x freshness, and
    how many it has. With ``pool``, only the best ``pool`` by a cheap signal are ranked;
    ``near`` (the query's lexical candidates, when the caller has them) spares a search."""

    now = graph.clock()
    if query is not None and plan is None:
        plan = plan_query(graph, query)

    scope = scope_of(namespace)
    total = graph.key_counts([key_id], scope, now).get(key_id)

    def read(reader: Reader) -> tuple[list[Member], int]:
        if plan is not None and pool is not None and total > HUB_SCAN:
            # A very large hub: its best members for this query are among the query's own
            # lexical candidates (or its strongest links); a scan of all its links would
            # cost tens of milliseconds.
            close = list(near) if near is not None else [
                m for m, _ in lexical(reader, plan.match_tokens, scope, now, limit=2 * CHANNEL_DEPTH)]
            rows = reader.key_links(key_id, among=close, strongest=pool)
            weights = dict(rows)
            ids = _prefilter(graph, plan, list(weights), weights, 2 * pool, scope)
        elif plan is not None and pool is not None and total > pool:
            # A hub: rank its members on a cheap signal (body cosine x link weight) straight
            # from the link index and the body table, then score only the best ones properly.
            weights = dict(reader.key_links(key_id))
            ids = _prefilter(graph, plan, list(weights), weights, 2 * pool, scope)
        else:
            members = key_members(reader, [key_id], scope, now, per_key=ALL_MEMBERS)[key_id]
            weights = dict(members)
            ids = list(weights)
        # The first ``pool`` usable ids are all that is ranked: read them a pool at a time
        # rather than every member of a hub (a 3,000-member key's page read 3,000 rows for 150).
        memories: list[Memory] = []
        step = pool or len(ids) or 1
        for start in range(0, len(ids), step):
            chunk = ids[start:start + step]
            found = reader.memories(chunk)
            memories += [found[m] for m in chunk if m in found and found[m].active(now)
                         and (scope is None or found[m].namespace in scope)]
            if pool is not None and len(memories) >= pool:
                break
        memories = memories[: pool or None]
        relevance: dict[str, float] = {}
        if plan is not None:
            relevance = member_relevance(graph, reader, plan, memories)

        def member(m: Memory, rel: float | None) -> Member:
            base = (rel if rel is not None else 1.0) * weights[m.id]
            score = base * depth_factor(m.depth) * graph.rank_factor_of(m, now)
            if plan is not None and plan.window is not None and plan.window.contains(m.when):
                score *= TEMPORAL_BOOST
            return Member(m, weights[m.id], rel, score)

        ranked = sorted((member(m, relevance.get(m.id)) for m in memories), key=_member_order)
        if plan is not None:
            ranked = _reranked(graph, plan, ranked, member)
        return ranked, total

    return graph.store.read(read)


def _member_order(m: Member) -> tuple[float, float]:
    return -m.score, -m.memory.created_at


def _reranked(graph: MemoryGraph, plan: QueryPlan, ranked: list[Member],
              member: Callable[[Memory, float], Member]) -> list[Member]:
    """A key's best members scored again with the cross-encoder's relevance in place of
    the fused one, as many as it scores within the tools' budget; they are reordered among
    themselves and the rest keep their places (a sigmoid and a fused relevance are not on
    one scale)."""
    if graph.reranker is None or len(ranked) < 2:
        return ranked
    pool = ranked[:graph.settings.rerank_pool]
    logits = graph.reranker.score(plan.text, [m.memory.content for m in pool],
                                  budget=graph.settings.rerank_budget_ms / 1000)
    if logits is None or len(logits) < 2:
        return ranked
    head = sorted((member(m.memory, sigmoid(float(x))) for m, x in zip(pool, logits, strict=False)),
                  key=_member_order)
    return head + ranked[len(logits):]


def _prefilter(graph: MemoryGraph, plan: QueryPlan, ids: Sequence[str], weights: Mapping[str, float],
               pool: int, scope: Scope) -> list[str]:
    """The ``pool`` ids with the best body cosine x link weight; superseded memories and
    other namespaces (known from the body table) are left out before any SQL."""
    snap = graph.bodies.snapshot()
    codes = None if scope is None else {graph.namespace_code(ns) for ns in scope}
    known: list[str] = []
    rows: list[int] = []
    for memory_id in ids:
        row = graph.bodies.row_of(memory_id)
        if row is not None and row < len(snap.ids) and snap.alive[row] \
                and (codes is None or int(snap.groups[row]) in codes):
            known.append(memory_id)
            rows.append(row)
    if not known:
        return []
    scored = snap.dot_rows(rows, plan.focus_vector) * np.array([weights[m] for m in known], dtype=np.float32)
    return [known[i] for i in top_indices(scored, pool)]


# -- recall: key clusters and the passive Top-1 -----------------------------------------


@dataclass(frozen=True, slots=True)
class KeyCandidate:
    key_id: str
    score: float
    match_type: str
    literal: bool
    content_memory: str | None
    similarity: float = 0.0


def recall(graph: MemoryGraph, query: object, *, namespace: object = None, top_k: int = limits.RECALL_TOP_K.default,
           context: object = None, explain: bool = False, max_chars: int = 2000,
           host: Host | None = None) -> RecallResult:
    """Ranked key clusters for the query, and the best memory under the best key."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("query must be a non-empty string", field="query")
    if context is not None and not isinstance(context, str):
        context = None
    ns = graph.resolve_namespace(namespace)
    top_k = limits.RECALL_TOP_K.clamp(top_k)
    query = query.strip()[:limits.MAX_RECALL_QUERY_CHARS]
    # Every read of the recall runs in this one (ports.py): one snapshot and, on a server,
    # one transaction on one connection instead of one per step. Its writes wait for the end.
    result, alias_hits, confirm = graph.store.read(
        lambda _: _recall(graph, query, ns, top_k, context, explain, max_chars))
    if alias_hits:
        graph.count_alias_hits(alias_hits)
    if confirm is None or not result.memories:
        return result
    preview = result.memories[0]
    confirmed = graph.confirm_memory(preview.id, "user", namespace=preview.namespace, host=host,
                                     source={"tool": "recall_auto_confirm"})
    return replace(result, memories=[replace(preview, auto_confirmed=True, validity=confirmed.validity),
                                     *result.memories[1:]])


def _recall(graph: MemoryGraph, query: str, ns: str | None, top_k: int, context: object, explain: bool,
            max_chars: int) -> tuple[RecallResult, list[tuple[str, str]], str | None]:
    """``recall``'s reads: its result, the learned aliases the query matched (their hits to
    count) and the memory to confirm (the context repeats it), both written after the read."""
    plan = plan_query(graph, query)
    cue_text = context.strip() if isinstance(context, str) and context.strip() else query
    cue = plan if cue_text == query else plan_query(graph, cue_text[:limits.MAX_QUERY_CHARS])
    now = graph.clock()
    scores = score_keys(graph, plan)
    candidates, weak, near = _key_candidates(graph, plan, cue, scores, ns, now)
    graph.buffer.push(query, weak)
    alias_hits = _alias_hits(graph, plan, scores)

    def shown() -> list[CompactKey]:
        out: list[CompactKey] = []
        claimed: set[str] = set()
        counts: dict[str, int] = {}
        for index, c in enumerate(candidates):
            if c.key_id not in counts:
                # Count in small batches, best first: a hub's count is a join over its links,
                # and most candidates are never shown.
                batch = [x.key_id for x in candidates[index:index + 2 * top_k]]
                counts.update({k: 0 for k in batch})
                counts.update(graph.key_counts(batch, ns, now).counts)
            n = counts.get(c.key_id)
            info = graph.keys.get(c.key_id)
            if not n or info is None:
                continue
            if c.match_type == "content" and c.content_memory in claimed:
                continue
            if c.content_memory is not None and c.match_type == "content":
                claimed.add(c.content_memory)
            view = graph.key_view(info, n)
            out.append(CompactKey(
                key_id=info.id, concept=info.concept, aliases=list(info.aliases), key_type=info.key_type,
                score=round(c.score, 3), match_type=c.match_type,  # type: ignore[arg-type]
                memory_count=n, is_hub=view.is_hub, specificity=view.specificity))
            if len(out) >= top_k:
                break
        return out

    # The keys' counts are the in-memory index's: the store is asked only for the total.
    keys = shown()
    ns_total = graph.store.read(lambda reader: reader.count_active(ns, now)) if explain or not keys else 0
    previews: list[Preview] = []
    confirm = None
    if keys:
        top = _top_memory(graph, keys[0].key_id, cue, ns, max_chars, near)
        if top is not None:
            preview, content = top
            previews.append(preview)
            if graph.settings.auto_confirm and isinstance(context, str) and context.strip() \
                    and normalize(context) == normalize(content):
                confirm = preview.id
    status = "found" if keys else ("no_match" if ns_total else "empty_namespace")
    if not keys:
        nearest = nearest_keys(graph, plan, scores, ns, now)
        return RecallResult(status=status, query=query, namespace=ns, keys=[], memories=[],  # type: ignore[arg-type]
                            namespace_memory_count=ns_total if explain else None,
                            nearest_keys=nearest, note=NO_MATCH_NOTE), alias_hits, None
    return RecallResult(status=status, query=query, namespace=ns, keys=keys, memories=previews,  # type: ignore[arg-type]
                        namespace_memory_count=ns_total if explain else None), alias_hits, confirm


def _alias_hits(graph: MemoryGraph, plan: QueryPlan, scores: KeyScores) -> list[tuple[str, str]]:
    """The learned aliases of the keys the query named literally, which it matched."""
    pairs = []
    for kid in scores.literal:
        info = graph.keys.get(kid)
        if info is None:
            continue
        for alias, compact in zip(info.aliases, info.alias_compacts, strict=True):
            if compact in plan.literal_forms:
                pairs.append((kid, alias))
    return pairs


def _key_candidates(graph: MemoryGraph, plan: QueryPlan, cue: QueryPlan, scores: KeyScores, ns: str | None,
                    now: float) -> tuple[list[KeyCandidate], dict[str, float], list[str]]:
    """Candidate keys best first, the weak matches autokey may learn from, and the query's
    lexical memory candidates (reused for the Top-1 under a large hub)."""
    threshold = graph.profile.key_recall
    content, near = content_signal(graph, cue, ns, now)
    pool: dict[str, KeyCandidate] = {}
    weak: dict[str, float] = {}
    sims = {scores.ids[i]: float(scores.sims[i]) for i in top_indices(scores.sims, 200)} if scores.ids else {}
    floor = graph.settings.autokey_confirm_floor
    for kid in set(sims) | scores.literal | set(content):
        info = graph.keys.get(kid)
        if info is None:
            continue
        literal = kid in scores.literal
        sim = sims.get(kid, 0.0)
        content_score, content_mid = content.get(kid, (0.0, None))
        if info.is_entity:
            if not literal:
                continue
            score, match = 1.0, _literal_type(info, plan)
        else:
            if not (literal or sim >= threshold or content_score > 0):
                if floor <= sim < threshold:
                    weak[kid] = round(sim, 3)
                continue
            score = max(sim, content_score)
            if literal:
                match = _literal_type(info, plan)
            else:
                # Reached without being named: a read through this key teaches autokey.
                match = "content" if content_score > sim else "semantic"
                if sim >= floor:
                    weak[kid] = round(sim, 3)
        pool[kid] = KeyCandidate(kid, score, match, literal, content_mid, sim)
    # Ties (several keys of one memory reached through its content) go to the key whose own
    # text is closest to the query, then to the more specific key.
    ranked = sorted(pool.values(), key=lambda c: (-round(c.score, 3), not c.literal, -c.similarity,
                                                  -graph.idf(c.key_id)))
    return ranked, weak, near


def _literal_type(info: Any, plan: QueryPlan) -> str:
    return "concept" if info.compact in plan.literal_forms else "alias"


def nearest_keys(graph: MemoryGraph, plan: QueryPlan, scores: KeyScores, ns: str | None,
                 now: float) -> list[NearestKey]:
    """The closest keys with active memories in the namespace, below any gate."""
    if not scores.ids:
        return []
    order = top_indices(scores.sims, 50)

    def read(reader: Reader) -> list[NearestKey]:
        ids = [scores.ids[i] for i in order]
        counts = graph.key_counts(ids, ns, now)
        out = []
        for i in order:
            kid = scores.ids[i]
            info = graph.keys.get(kid)
            n = counts.get(kid)
            if info is None or not n:
                continue
            out.append(NearestKey(key_id=kid, concept=info.concept, aliases=list(info.aliases),
                                  key_type=info.key_type, score=round(float(scores.sims[i]), 3), memory_count=n))
            if len(out) >= NEAREST_KEYS:
                break
        return out

    return graph.store.read(read)


def _top_memory(graph: MemoryGraph, key_id: str, cue: QueryPlan, ns: str | None, max_chars: int,
                near: Sequence[str]) -> tuple[Preview, str] | None:
    """The best memory under ``key_id`` as recall previews it, and its whole text."""
    ranked, _ = rank_key_members(graph, key_id, cue.text, ns, pool=graph.settings.rerank_pool, plan=cue,
                                 near=near)
    if not ranked:
        return None
    best = ranked[0]
    memory = best.memory
    now = graph.clock()

    def read(reader: Reader) -> tuple[list[ConnectedKey], list[str] | None]:
        connected = []
        for kid, (_, auto) in reader.links_by_memory([memory.id]).get(memory.id, {}).items():
            info = graph.keys.get(kid)
            vector = graph.keys.vectors.get(kid)
            if info is None or auto:
                continue
            relevance = float(vector @ cue.vector) if vector is not None else 0.0
            connected.append(ConnectedKey(concept=info.concept, key_id=kid, relevance=round(relevance, 3)))
        connected.sort(key=lambda c: -c.relevance)
        return connected, graph.batch_siblings(reader, memory, now)

    connected, siblings = graph.store.read(read)
    content, cut = truncate(memory.content, limits.INJECT_MAX_CHARS.clamp(max_chars))
    return Preview(
        id=memory.id, content=content, namespace=memory.namespace, depth=round(memory.depth, 3),
        created_at=memory.created_at, observed_at=memory.observed_at, validity=graph.validity_of(memory),
        content_relevance=round(best.relevance or 0.0, 3), connected_keys=connected,
        matched_key=MatchedKey(key_id), batch_sibling_ids=siblings,
        content_truncated=True if cut else None, content_chars=len(memory.content) if cut else None), \
        memory.content
