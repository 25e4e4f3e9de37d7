"""Retrieval: finding keys for a query, ranking a key's memories, hybrid recall, and the
namespaces a cwd may see (the push path's decision is ``push.py``).

A query is analysed once (``plan_query``): its words, lexical tokens, the literal forms a
key could take in it, and its candidate terms -- content words, nouns inside compounds
and adjacent pairs -- embedded in one batch. Keys are 1-2 words, so they are matched with
those terms, not with the whole question's vector.

Three channels find candidates: lexical (SQLite FTS5 BM25 over content and key tokens), the
key path (keys the query reaches, weighted by how specific they are) and dense cosine over
memory bodies. Each candidate is then scored on its own evidence: the IDF-weighted share of
the query it covers (in its text, through its keys, or through words of its text in the
other script) plus its body cosine; depth and freshness modulate the result; a named date or
period favours memories observed then; hops along narrow keys and explicit links add
associated memories when the direct evidence is thin.

The scoring helpers at the top are pure functions; the rest read through a ``MemoryGraph``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from keymem_daemon.engine import limits
from keymem_daemon.engine.dates import Window, find_window
from keymem_daemon.engine.records import (
    CompactKey,
    ConnectedKey,
    Hit,
    MatchedKey,
    Memory,
    NearestKey,
    Preview,
    RecallResult,
)
from keymem_daemon.engine.text import (
    CONTENT_WORDS,
    Word,
    index_tokens_of,
    literal_candidates,
    normalize,
    query_terms,
    script_of,
    sound_alike,
    truncate,
)
from keymem_daemon.engine.vectors import top_indices
from keymem_daemon.errors import InvalidInput
from keymem_daemon.store.sqlite.memories import ACTIVE, get_memories
from keymem_daemon.store.sqlite.rows import rows_in

if TYPE_CHECKING:
    from keymem_daemon.engine.graph import Host, MemoryGraph

logger = logging.getLogger(__name__)

CHANNEL_DEPTH: Final = 50
KEY_PATH_KEYS: Final = 10
# A matched key adds its members as candidates only when it has at most this many; keys
# add theirs strongest first until the key path has brought KEY_PATH_POOL candidates (a
# query near many sibling names -- auth-api, auth-batch, ... -- would otherwise score all
# of their memories: 10k store, 450 candidates and 25 ms for a push-path prompt).
KEY_PATH_MEMBERS: Final = 100
KEY_PATH_POOL: Final = 200
# At most this many memories join the pool for being observed in a named period.
WINDOW_MEMBERS: Final = 200
HOP_DECAY: Final = 0.3
HOP_KEY_MAX_MEMBERS: Final = 5
EXPAND_HOP_FACTOR: Final = 0.7
# A memory observed inside a date window the query names scores this many times higher.
TEMPORAL_BOOST: Final = 2.0
# Evidence scoring (measured on LoCoMo conversations 0-2, checked on 3-4; see README):
# a query token is covered by a memory lexically, or through one of its keys at this
# cosine or above; the body cosine (of the query's rarer words) is added with this weight.
SOFT_KEY_MATCH: Final = 0.7
DENSE_WEIGHT: Final = 0.6
COMMON_SHARE: Final = 0.2
MIN_CORPUS: Final = 100
# A Korean predicate or adverb of the query, or what an asking word asks for, weighs this
# share of its IDF in coverage (Korean/English set, push path: R@5 .693 -> .740 with
# not-found unchanged, and -> .807 with Korean's asking words; see plan_query).
PREDICATE_SHARE: Final = 0.25
# Words that ask for the property or kind the next word names (how long, 얼마나 보관해,
# 몇 시간, 어떤 명령어): 얼마나 is Korean's "how".
ASKING_WORDS: Final = frozenset({"how", "얼마나", "몇", "어떤", "무슨", "어느"})
# Memories of one episode (observed within EPISODE_GAP of each other) share in the
# evidence of the EPISODE_SEEDS best candidates, with this share of their score.
EPISODE_SEEDS: Final = 5
EPISODE_BONUS: Final = 0.2
EPISODE_GAP: Final = 1800.0
CANDIDATE_DEPTH: Final = 50
# Association feedback: a candidate sharing specific keys with one of the PRF_SEEDS best
# gains PRF_WEIGHT x that seed's score x the share of the seed's key weight it shares
# (LoCoMo R@5 0.656 -> 0.669; the Korean/English set unchanged).
PRF_WEIGHT: Final = 0.4
PRF_SEEDS: Final = 3
# Body cosine at which the dense channel alone admits a memory as a candidate; below it a
# memory must come through another channel (or a hop), so hops still mean something.
DENSE_ADMIT: Final = 0.3
# Below this relevance nothing anchors a hybrid recall: it answers nothing rather than noise.
MIN_ANCHOR: Final = 0.35
# A memory saved again in other words (the same fact from another session) repeats one
# ranked above it: above this body cosine it yields its place among the REPEAT_POOL best
# (LoCoMo R@5 .668 -> .673, multi-hop .662 -> .676; the Korean/English set unchanged).
REDUNDANT_COSINE: Final = 0.8
REPEAT_POOL: Final = 20
# FTS5 bm25() weights for (content_tokens, key_tokens).
LEXICAL_WEIGHTS: Final = (1.0, 0.6)
LEXICAL_OVERFETCH: Final = 4
# Above this many members a key's memories are found through the query's own candidates.
HUB_SCAN: Final = 500
# Content-only admission of a key in recall(): a member whose relevance (coverage mixed
# with body cosine) reaches this lets its key in although the key text is far from the query.
CONTENT_GATE: Final = 0.5
NEAREST_KEYS: Final = 5
RERANK_POOL: Final = 30
NO_MATCH_NOTE: Final = (
    "No key cleared the recall gate. If a nearest_keys concept matches the topic, retry recall with that "
    "concept (or read_key it directly); otherwise browse_keys(namespace) to see the vocabulary."
)

Scope = frozenset[str] | None


# -- pure scoring helpers --------------------------------------------------------------


def bounded(score: float) -> float:
    """Map a non-negative BM25 score into [0, 1): s / (1 + s)."""
    return score / (1.0 + score) if score > 0 else 0.0


def sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit))


def depth_factor(depth: float) -> float:
    return 0.9 + 0.1 * depth


def without_repeats(scores: Sequence[float], sims: npt.NDArray[np.float32], k: int) -> list[int]:
    """The order of candidates (best first, ``scores`` descending) once repeats yield: each of
    the first ``k`` places goes to the candidate whose score, relative to the best, less how
    far its body cosine with one already placed exceeds REDUNDANT_COSINE, is highest; the
    rest follow in their order. ``sims`` holds the candidates' pairwise body cosines."""
    values = np.asarray(scores, dtype=np.float64) / (scores[0] or 1.0)
    repeat = np.zeros(len(values))
    left = np.ones(len(values), dtype=bool)
    placed: list[int] = []
    for _ in range(min(k, len(values))):
        gain = np.where(left, values - np.maximum(0.0, repeat - REDUNDANT_COSINE), -np.inf)
        best = int(np.argmax(gain))  # the first of equals: ties keep their order
        placed.append(best)
        left[best] = False
        repeat = np.maximum(repeat, sims[best])
    return placed + np.flatnonzero(left).tolist()


def fts_query(tokens: Iterable[str]) -> str | None:
    """An FTS5 MATCH expression that ORs the distinct tokens, each quoted."""
    quoted = ['"' + t.replace('"', '""') + '"' for t in dict.fromkeys(tokens) if t]
    return " OR ".join(quoted) if quoted else None


# -- comparison queries (task-evidence selection) ---------------------------------------

_COMPARISON_EN = re.compile(
    r"\b(?:vs\.?|versus|both|compare[ds]?|comparison|differen(?:ce|t)|differ|earlier|later|first|"
    r"same)\b|\b(?:which|who)\b.*\bor\b|\b(?:higher|lower|older|younger|more|less|bigger|smaller|"
    r"better|worse)\b.*\bthan\b", re.I)
_COMPARISON_KO = re.compile(
    r"둘 다|(?:^|\s)중(?:\s|$|에)|보다|비교|차이|동일|같(?:은|다|나요|습니까)|먼저|나중|누가|어느")
_ENTITY_TAIL = re.compile(r"^(?:과|와|은|는|이|가|을|를|의|보다|중|랑|이랑|하고)?(?:$|[^\w])")


def is_comparison(query: str) -> bool:
    return bool(_COMPARISON_EN.search(query) or _COMPARISON_KO.search(query))


def entity_mentions(query: str, entities: Mapping[str, Sequence[str]]) -> list[str]:
    """Entity key ids whose concept or alias occurs in ``query`` as a whole word (a Korean
    particle may follow), in order of first mention; overlapping mentions keep the longer."""
    text = " " + re.sub(r"[^\w\s]", " ", unicodedata.normalize("NFKC", query).casefold()) + " "
    spans: list[tuple[int, int, str]] = []
    for key_id, forms in entities.items():
        for form in forms:
            needle = normalize(re.sub(r"[^\w\s]", " ", form))
            if len(needle) < 2:
                continue
            start = 0
            while (pos := text.find(needle, start)) >= 0:
                start = pos + 1
                if text[pos - 1].isalnum():
                    continue
                if _ENTITY_TAIL.match(text[pos + len(needle):]) is None:
                    continue
                spans.append((pos, pos + len(needle), key_id))
    spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
    chosen: list[str] = []
    end = -1
    for start, stop, key_id in spans:
        if start < end:
            continue
        end = stop
        if key_id not in chosen:
            chosen.append(key_id)
    return chosen


def project_task_evidence(ranked: Sequence[str], keys_of: Mapping[str, set[str]], entities: Sequence[str],
                          utility: Mapping[str, float], top_k: int) -> list[str]:
    """For a comparison between entities, put the most useful memory of each entity first
    (ties keep rank order); everything else keeps its order. Never drops a candidate."""
    if top_k < 2 or len(ranked) <= top_k or len(entities) < 2:
        return list(ranked)
    picks: list[str] = []
    for entity in entities[:top_k]:
        best: tuple[float, int, str] | None = None
        for rank, mid in enumerate(ranked):
            if entity in keys_of.get(mid, set()) and mid not in picks:
                candidate = (utility.get(mid, 0.0), -rank, mid)
                if best is None or candidate > best:
                    best = candidate
        if best is not None:
            picks.append(best[2])
    if len(picks) < 2:
        return list(ranked)
    return picks + [m for m in ranked if m not in picks]


# -- query analysis -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryPlan:
    """A query analysed once: its words and tokens, the literal forms a key could take in
    it, its candidate terms and their vectors, each token's weight (IDF in the store), the
    vector of its rarer words (``focus_vector``) and any date window it names."""

    text: str
    words: list[Word]
    tokens: list[str]
    match_tokens: list[str]
    literal_forms: set[str]
    terms: list[str]
    term_vectors: npt.NDArray[np.float32]
    vector: npt.NDArray[np.float32]
    focus_vector: npt.NDArray[np.float32]
    token_vectors: dict[str, npt.NDArray[np.float32]]
    weights: dict[str, float]
    window: Window | None


def plan_query(graph: MemoryGraph, text: str) -> QueryPlan:
    words = graph.analyzer.analyze(text)
    terms = query_terms(words, whole=text)
    tokens = index_tokens_of(words)
    df, total = graph.token_stats(tokens)
    # A young store would make every word it holds look common and every word it lacks look
    # precious (one memory: its own words weigh less than absent ones); count at least
    # MIN_CORPUS memories so its first facts can still be found.
    total = max(total, MIN_CORPUS)
    # A Korean predicate or adverb says how a question asks (어디 사셔? 얼마나 올랐지?), its
    # nouns what it asks about: the memory that answers puts the former in other words
    # ("live in Daejeon", "6% 인상"), so it weighs PREDICATE_SHARE of a noun. So does the
    # word an asking word points at (how long, 어떤 명령어, 어느 저장소), as the answer
    # gives the measure or the thing ("two weeks", "make rollback") without naming it.
    # English words carry no part of speech here; an English "which" or "what" is left
    # alone, as the word after it often starts a compound (which push provider).
    asked = {b.stem for a, b in pairwise(words) if a.surface in ASKING_WORDS}
    nouns = {t for w in words if w.nominal and w.stem not in asked for t in (w.stem, *w.subs)}
    predicates = ({w.stem for w in words if not w.nominal} | asked) - nouns
    weights = {t: math.log(1.0 + (total - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5))
               * (PREDICATE_SHARE if t in predicates else 1.0) for t in dict.fromkeys(tokens)}
    content = [w for w in words if not w.stop]
    # Words most memories share (a speaker's name, "project") say little about which
    # memory is meant; the dense channel embeds the rest.
    focus = [w.surface for w in content if df.get(w.stem, 0) < COMMON_SHARE * max(1, total)]
    focus_text = " ".join(focus or [w.surface for w in content]) or text
    vectors = graph.embedder.embed([text[:limits.EMBED_MAX_CHARS], focus_text[:limits.EMBED_MAX_CHARS], *terms])
    by_term = dict(zip(terms, vectors[2:], strict=True))
    token_vectors: dict[str, npt.NDArray[np.float32]] = {}
    for w in content:
        if w.surface in by_term:
            token_vectors.setdefault(w.stem, by_term[w.surface])
        for sub in w.subs:
            if sub in by_term:
                token_vectors.setdefault(sub, by_term[sub])
    # Candidates come from the query's rarer tokens: BM25 over a token most memories hold
    # ranks thousands of rows and tells little; such tokens still count in coverage.
    rare = [t for t in dict.fromkeys(tokens) if df.get(t, 0) <= COMMON_SHARE * total]
    return QueryPlan(
        text=text, words=words, tokens=tokens, match_tokens=rare or tokens,
        literal_forms=literal_candidates(words), terms=terms,
        term_vectors=vectors[2:], vector=vectors[0], focus_vector=vectors[1], token_vectors=token_vectors,
        weights=weights, window=find_window(text, graph.clock()),
    )


def scope_clause(scope: Scope) -> tuple[str, list[Any]]:
    if scope is None:
        return "", []
    marks = ",".join("?" * len(scope))
    return f" AND m.namespace IN ({marks})", sorted(scope)


def scope_of(namespace: str | None) -> Scope:
    return None if namespace is None else frozenset({namespace})


# -- channels -------------------------------------------------------------------------


@dataclass(slots=True)
class KeyScores:
    """How strongly the query reaches each key: best term cosine, and literal matches."""

    ids: list[str]
    sims: npt.NDArray[np.float32]
    literal: set[str]


def score_keys(graph: MemoryGraph, plan: QueryPlan) -> KeyScores:
    snap = graph.keys.snapshot()
    literal = graph.keys.literal_ids(plan.literal_forms)
    if not snap.ids or len(plan.term_vectors) == 0:
        return KeyScores(list(snap.ids), np.zeros(len(snap.ids), dtype=np.float32), literal)
    return KeyScores(snap.ids, snap.similarities(plan.term_vectors).max(axis=0), literal)


def matched_keys(graph: MemoryGraph, scores: KeyScores, limit: int) -> list[tuple[str, float, bool]]:
    """(key id, strength, literal) for keys the query reaches: literal matches (entities only
    this way) and concept keys at or above ``key_recall``; strongest first."""
    out: dict[str, tuple[float, bool]] = {}
    threshold = graph.profile.key_recall
    if scores.ids:
        for row in top_indices(scores.sims, max(limit * 4, 40)):
            sim = float(scores.sims[row])
            if sim < threshold:
                break
            kid = scores.ids[row]
            info = graph.keys.get(kid)
            if info is not None and not info.is_entity:
                out[kid] = (sim, False)
    for kid in scores.literal:
        if graph.keys.get(kid) is not None:
            out[kid] = (1.0, True)
    ranked = sorted(out.items(), key=lambda item: (-item[1][0], -graph.idf(item[0])))
    return [(kid, strength, lit) for kid, (strength, lit) in ranked[:limit]]


def lexical(conn: sqlite3.Connection, tokens: Sequence[str], scope: Scope, now: float,
            limit: int = CHANNEL_DEPTH) -> list[tuple[str, float]]:
    """BM25 over content and key tokens: (memory id, score >= 0), best first."""
    match = fts_query(tokens)
    if match is None:
        return []
    bm25 = f"bm25(memory_fts, {LEXICAL_WEIGHTS[0]}, {LEXICAL_WEIGHTS[1]})"
    fetch = LEXICAL_OVERFETCH * limit
    try:
        # The index alone first: joining every match to ``memories`` before the LIMIT costs
        # about three times as much on a large store.
        ranked = conn.execute(f"SELECT rowid, {bm25} AS s FROM memory_fts WHERE memory_fts MATCH ? "
                              f"ORDER BY s LIMIT ?", (match, fetch)).fetchall()
        if not ranked:
            return []
        marks = ",".join("?" * len(ranked))
        rows = {r[0]: r for r in conn.execute(
            f"SELECT rowid, id, namespace, expires_at, superseded_by FROM memories WHERE rowid IN ({marks})",
            [r[0] for r in ranked])}
        out = []
        for rowid, score in ranked:
            row = rows.get(rowid)
            if row is None or row[4] is not None or (row[3] is not None and now > row[3]) \
                    or (scope is not None and row[2] not in scope):
                continue
            out.append((row[1], -float(score)))
        if len(out) >= limit or len(ranked) < fetch:
            return out[:limit]
        # Most matches lie outside the scope (a small namespace): let SQLite filter them.

        where, params = scope_clause(scope)
        rows_scoped = conn.execute(
            f"SELECT m.id, {bm25} AS s FROM memory_fts JOIN memories m ON m.rowid = memory_fts.rowid "
            f"WHERE memory_fts MATCH ? AND {ACTIVE}{where} ORDER BY s LIMIT ?",
            [match, now, *params, limit]).fetchall()
    except sqlite3.OperationalError as exc:
        logger.warning("lexical search skipped: %s", exc)
        return []
    return [(r[0], -float(r[1])) for r in rows_scoped]


def dense(graph: MemoryGraph, vector: npt.NDArray[np.float32], scope: Scope,
          limit: int = CHANNEL_DEPTH) -> list[tuple[str, float]]:
    """Cosine of the query with memory bodies: (memory id, cosine), best first."""
    snap = graph.bodies.snapshot()
    if not snap.ids:
        return []
    sims = snap.similarities(vector[None, :])[0]
    if scope is not None:
        codes = [graph.namespace_code(ns) for ns in scope]
        sims[~np.isin(snap.groups, codes)] = -1.0
    return [(snap.ids[i], float(sims[i])) for i in top_indices(sims, limit) if sims[i] > 0]


def key_members(conn: sqlite3.Connection, key_ids: Sequence[str], scope: Scope, now: float,
                per_key: int = 2000) -> dict[str, list[tuple[str, float]]]:
    """Active members of each key in scope: key -> [(memory id, link weight)]."""

    where, params = scope_clause(scope)
    out: dict[str, list[tuple[str, float]]] = {}
    for kid in key_ids:
        rows = conn.execute(
            f"SELECT l.memory_id, l.weight FROM links l JOIN memories m ON m.id = l.memory_id "
            f"WHERE l.key_id = ? AND {ACTIVE}{where} ORDER BY l.weight DESC LIMIT ?",
            [kid, now, *params, per_key]).fetchall()
        out[kid] = [(r[0], float(r[1])) for r in rows]
    return out


def links_of(conn: sqlite3.Connection, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
    """memory -> {key id: (weight, auto)}."""
    out: dict[str, dict[str, tuple[float, bool]]] = {}
    for mid, kid, weight, auto in rows_in(conn, "SELECT memory_id, key_id, weight, auto FROM links "
                                                "WHERE memory_id IN ({marks})", list(dict.fromkeys(memory_ids))):
        out.setdefault(mid, {})[kid] = (float(weight), bool(auto))
    return out


# -- ranking a key's members (read_key and the passive Top-1) ---------------------------


@dataclass(frozen=True, slots=True)
class Member:
    memory: Memory
    weight: float
    relevance: float | None
    score: float


def member_relevance(graph: MemoryGraph, conn: sqlite3.Connection, plan: QueryPlan,
                     memories: Sequence[Memory]) -> dict[str, float]:
    """Content relevance in [0, 1] of each memory to the query: its query coverage mixed
    with its body cosine (the cross-encoder's, for the best members, in ``_reranked``)."""
    if not memories:
        return {}
    cover = coverage_scores(graph, conn, plan, memories)
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

    def read(conn: sqlite3.Connection) -> tuple[list[Member], int]:
        if plan is not None and pool is not None and total > HUB_SCAN:
            # A very large hub: its best members for this query are among the query's own
            # lexical candidates (or its strongest links); a scan of all its links would
            # cost tens of milliseconds.
            close = list(near) if near is not None else [
                m for m, _ in lexical(conn, plan.match_tokens, scope, now, limit=2 * CHANNEL_DEPTH)]
            marks = ",".join("?" * len(close))
            rows = conn.execute(f"SELECT memory_id, weight FROM links WHERE key_id = ? AND memory_id IN ({marks})",
                                [key_id, *close]).fetchall() if close else []
            rows += conn.execute("SELECT memory_id, weight FROM links WHERE key_id = ? ORDER BY weight DESC "
                                 "LIMIT ?", (key_id, pool)).fetchall()
            weights = {r[0]: float(r[1]) for r in rows}
            ids = _prefilter(graph, plan, list(weights), weights, 2 * pool, scope)
        elif plan is not None and pool is not None and total > pool:
            # A hub: rank its members on a cheap signal (body cosine x link weight) straight
            # from the link index and the body table, then score only the best ones properly.
            links = conn.execute("SELECT memory_id, weight FROM links WHERE key_id = ?", (key_id,)).fetchall()
            weights = {r[0]: float(r[1]) for r in links}
            ids = _prefilter(graph, plan, list(weights), weights, 2 * pool, scope)
        else:
            members = key_members(conn, [key_id], scope, now, per_key=1_000_000)[key_id]
            weights = dict(members)
            ids = list(weights)
        found = get_memories(conn, ids)
        memories = [found[m] for m in ids if m in found and found[m].active(now)
                    and (scope is None or found[m].namespace in scope)][: pool or None]
        relevance: dict[str, float] = {}
        if plan is not None:
            relevance = member_relevance(graph, conn, plan, memories)

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
    plan = plan_query(graph, query)
    cue_text = context.strip() if isinstance(context, str) and context.strip() else query
    cue = plan if cue_text == query else plan_query(graph, cue_text[:limits.MAX_QUERY_CHARS])
    now = graph.clock()
    scores = score_keys(graph, plan)
    candidates, weak, near = _key_candidates(graph, plan, cue, scores, ns, now)
    graph.buffer.push(query, weak)
    _count_alias_hits(graph, plan, scores)

    def read(conn: sqlite3.Connection) -> tuple[list[CompactKey], int]:
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
        total = graph.count_active(conn, ns, now) if explain or not out else 0
        return out, total

    keys, ns_total = graph.store.read(read)
    previews: list[Preview] = []
    if keys:
        preview = _top_memory(graph, keys[0].key_id, cue, ns, max_chars, context, host, near)
        if preview is not None:
            previews.append(preview)
    status = "found" if keys else ("no_match" if ns_total else "empty_namespace")
    if not keys:
        nearest = nearest_keys(graph, plan, scores, ns, now)
        return RecallResult(status=status, query=query, namespace=ns, keys=[], memories=[],  # type: ignore[arg-type]
                            namespace_memory_count=ns_total if explain else None,
                            nearest_keys=nearest, note=NO_MATCH_NOTE)
    return RecallResult(status=status, query=query, namespace=ns, keys=keys, memories=previews,  # type: ignore[arg-type]
                        namespace_memory_count=ns_total if explain else None)


def _count_alias_hits(graph: MemoryGraph, plan: QueryPlan, scores: KeyScores) -> None:
    pairs = []
    for kid in scores.literal:
        info = graph.keys.get(kid)
        if info is None:
            continue
        for alias, compact in zip(info.aliases, info.alias_compacts, strict=True):
            if compact in plan.literal_forms:
                pairs.append((kid, alias))
    if pairs:
        graph.count_alias_hits(pairs)


def _content_signal(graph: MemoryGraph, cue: QueryPlan, ns: str | None, now: float
                    ) -> tuple[dict[str, tuple[float, str]], list[str]]:
    """Best content relevance of each key through its members: key -> (score, memory id).

    A key whose text is far from the query still surfaces when one of its memories answers
    it (relevance at or above CONTENT_GATE, the same measure the push path uses)."""

    def read(conn: sqlite3.Connection) -> tuple[dict[str, tuple[float, str]], list[str]]:

        # Lexical candidates only: a scan of every body vector here cost a large store ~15 ms
        # per recall and changed no result on the benchmarks (the key sims cover semantics).
        near = [mid for mid, _ in lexical(conn, cue.match_tokens, scope_of(ns), now, limit=2 * CHANNEL_DEPTH)]
        found = get_memories(conn, near[:CHANNEL_DEPTH])
        live = [m for m in found.values() if m.active(now)]
        cover = coverage_scores(graph, conn, cue, live)
        per_memory: dict[str, float] = {}
        cosines = graph.bodies.cosines([m.id for m in live], np.stack([cue.focus_vector, cue.vector]))
        for m in live:
            cosine = float(cosines[m.id].max()) if m.id in cosines else 0.0
            value = relevance(cover.get(m.id, 0.0), cosine)
            if value >= CONTENT_GATE:
                per_memory[m.id] = value * graph.rank_factor_of(m, now)
        out: dict[str, tuple[float, str]] = {}
        for mid, keys in links_of(conn, per_memory).items():
            for kid, (_, auto) in keys.items():
                if not auto and per_memory[mid] > out.get(kid, (0.0, ""))[0]:
                    out[kid] = (per_memory[mid], mid)
        return out, near

    return graph.store.read(read)


def _key_candidates(graph: MemoryGraph, plan: QueryPlan, cue: QueryPlan, scores: KeyScores, ns: str | None,
                    now: float) -> tuple[list[KeyCandidate], dict[str, float], list[str]]:
    """Candidate keys best first, the weak matches autokey may learn from, and the query's
    lexical memory candidates (reused for the Top-1 under a large hub)."""
    threshold = graph.profile.key_recall
    content, near = _content_signal(graph, cue, ns, now)
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

    def read(conn: sqlite3.Connection) -> list[NearestKey]:
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
                context: object, host: Host | None, near: Sequence[str]) -> Preview | None:
    ranked, _ = rank_key_members(graph, key_id, cue.text, ns, pool=graph.settings.rerank_pool, plan=cue,
                                 near=near)
    if not ranked:
        return None
    best = ranked[0]
    memory = best.memory
    now = graph.clock()

    def read(conn: sqlite3.Connection) -> tuple[list[ConnectedKey], list[str] | None]:
        connected = []
        for kid, (_, auto) in links_of(conn, [memory.id]).get(memory.id, {}).items():
            info = graph.keys.get(kid)
            vector = graph.keys.vectors.get(kid)
            if info is None or auto:
                continue
            relevance = float(vector @ cue.vector) if vector is not None else 0.0
            connected.append(ConnectedKey(concept=info.concept, key_id=kid, relevance=round(relevance, 3)))
        connected.sort(key=lambda c: -c.relevance)
        return connected, graph.batch_siblings(conn, memory, now)

    connected, siblings = graph.store.read(read)
    content, cut = truncate(memory.content, limits.INJECT_MAX_CHARS.clamp(max_chars))
    auto_confirmed = None
    validity = graph.validity_of(memory)
    if graph.settings.auto_confirm and isinstance(context, str) and context.strip() \
            and normalize(context) == normalize(memory.content):
        confirmed = graph.confirm_memory(memory.id, "user", namespace=memory.namespace, host=host,
                                         source={"tool": "recall_auto_confirm"})
        auto_confirmed, validity = True, confirmed.validity
    return Preview(
        id=memory.id, content=content, namespace=memory.namespace, depth=round(memory.depth, 3),
        created_at=memory.created_at, observed_at=memory.observed_at, validity=validity,
        content_relevance=round(best.relevance or 0.0, 3), connected_keys=connected,
        matched_key=MatchedKey(key_id), batch_sibling_ids=siblings,
        content_truncated=True if cut else None, content_chars=len(memory.content) if cut else None,
        auto_confirmed=auto_confirmed)


# -- evidence scoring -------------------------------------------------------------------


@dataclass(slots=True)
class Candidate:
    memory_id: str
    score: float = 0.0
    coverage: float = 0.0
    dense: float = 0.0
    raw: float = 0.0
    hop: int = 1
    via: list[str] = field(default_factory=list)
    hop_key: str | None = None

    def tag(self, label: str) -> None:
        if label not in self.via:
            self.via.append(label)


def relevance(coverage: float, cosine: float) -> float:
    """A memory's content relevance in [0, 1]: its query coverage and body cosine, mixed."""
    return (coverage + DENSE_WEIGHT * max(0.0, cosine)) / (1.0 + DENSE_WEIGHT)


def coverage_scores(graph: MemoryGraph, conn: sqlite3.Connection, plan: QueryPlan,
                    memories: Sequence[Memory],
                    link_map: Mapping[str, Mapping[str, tuple[float, bool]]] | None = None,
                    cross: Mapping[str, float] | None = None) -> dict[str, float]:
    """The IDF-weighted share of the query's tokens each memory covers: a token counts when
    it occurs in the memory's text or keys, or -- at its cosine -- when one of the memory's
    keys means it (``hurt`` is covered by a memory keyed ``injury``). For the CROSS_POOL
    memories of ``cross`` (id -> body cosine) with the most evidence so far, a token also
    counts -- at its cosine, from the translation bar up -- when a content word of the
    memory's text written in the other script means it (``friday`` is covered by a memory
    that says ``금요일``), and fully when that word is the token spelled in the other script
    (``atlas`` and ``아틀라스``)."""
    tokens = [t for t in plan.weights if plan.weights[t] > 0]
    if not memories or not tokens:
        return {m.id: 0.0 for m in memories}
    total = sum(plan.weights[t] for t in tokens)
    weights = np.array([plan.weights[t] for t in tokens])
    indexed = {rowid: (content.split(), keys.split()) for rowid, content, keys in rows_in(
        conn, "SELECT rowid, content_tokens, key_tokens FROM memory_fts WHERE rowid IN ({marks})",
        [m.rowid for m in memories])}
    texts = {rowid: {*content, *keys} for rowid, (content, keys) in indexed.items()}
    if link_map is None:
        link_map = links_of(conn, [m.id for m in memories])
    key_ids = sorted({k for keys in link_map.values() for k in keys})
    column = {k: i for i, k in enumerate(key_ids)}
    with_vectors = [i for i, t in enumerate(tokens) if t in plan.token_vectors]
    soft = np.zeros((len(tokens), len(key_ids)), dtype=np.float32)
    if with_vectors and key_ids:
        matrix = graph.keys.vectors.stack(key_ids)
        sims = np.stack([plan.token_vectors[tokens[i]] for i in with_vectors]) @ matrix.T
        # A translation sits lower than a same-language synonym (see the embedder profile),
        # so a query word meets a key in the other script at the profile's translation bar.
        token_script = np.array([script_of(tokens[i]) == "hangul" for i in with_vectors])
        key_script = np.array([script_of(graph.concept(k)) == "hangul" for k in key_ids])
        bar = np.where(token_script[:, None] != key_script[None, :], graph.profile.translation_pair,
                       SOFT_KEY_MATCH)
        soft[with_vectors] = np.where(sims >= bar, sims, 0.0)
    # Per memory the work is a handful of tokens by a handful of keys: plain Python beats
    # numpy's per-call overhead there, so the soft matches go to lists first.
    touched = set(np.flatnonzero(soft.any(axis=0)).tolist())
    soft_of: dict[str, list[float]] = {k: soft[:, column[k]].tolist() for k in key_ids if column[k] in touched}
    token_weights = weights.tolist()

    def share(match: Sequence[float]) -> float:
        return float(sum(w * x for w, x in zip(token_weights, match, strict=True))) / total

    matches: dict[str, list[float]] = {}
    for m in memories:
        words = texts.get(m.rowid, set())
        match = [1.0 if t in words else 0.0 for t in tokens]
        for kid in link_map.get(m.id, {}):
            key_sims = soft_of.get(kid)
            if key_sims is not None:
                match = [max(a, b) for a, b in zip(match, key_sims, strict=True)]
        matches[m.id] = match
    if cross and with_vectors:
        pool = sorted((m for m in memories if m.id in cross),
                      key=lambda m: -relevance(share(matches[m.id]), cross[m.id]))[:CROSS_POOL]
        hangul = {m.id: _hangul_words(indexed.get(m.rowid, ([], []))[0]) for m in pool}
        _cross_script_words(graph, plan, tokens, pool, matches, hangul)
    return {mid: share(match) for mid, match in matches.items()}


# Cross-script words are weighed for at most this many candidates (those with the most
# evidence from text, keys and body cosine): a word first seen costs an embedding.
CROSS_POOL: Final = 10
# A memory's text read for its Latin words: enough for a memory, bounded for the word cache.
CROSS_TEXT_CHARS: Final = 1000
# A query word and a memory's word in the other script that sound alike (the same sound
# skeleton of at least two consonants), and at least this cosine, are one word
# (Korean/English set: the push path across languages .478 -> .631, not-found unchanged;
# with a floor of .25, 다음 "next" met team, both TM, and an unanswerable prompt got an answer).
SOUND_ALIKE_FLOOR: Final = 0.4


def _hangul_words(content_tokens: Sequence[str]) -> tuple[str, ...]:
    """A memory's Hangul words, from its lexical index tokens: Kiwi already cut them out of its
    text at write time (nominal stems, compound parts, predicate lemmas), and analysing the
    text again cost more than the rest of hybrid recall's coverage step."""
    words = dict.fromkeys(t for t in content_tokens if script_of(t) == "hangul" and not any(c.isdigit() for c in t))
    return tuple(words)[:CONTENT_WORDS]


def _cross_script_words(graph: MemoryGraph, plan: QueryPlan, tokens: Sequence[str], memories: Sequence[Memory],
                        matches: dict[str, list[float]], hangul_words: Mapping[str, tuple[str, ...]]) -> None:
    """Raise each memory's match of a query token it does not hold lexically to the best
    cosine between the token and a word of its text in the other script, when that reaches
    the profile's translation bar (the same bar a key in the other script must clear), or
    to a full match when the word sounds the same (a loanword or name, ``sound_skeleton``)."""
    bar = graph.profile.translation_pair
    scripts = [script_of(t) if t in plan.token_vectors else "other" for t in tokens]
    wanted: dict[str, list[tuple[int, tuple[str, ...]]]] = {}
    vocab: dict[str, None] = {}
    for m in memories:
        match = matches[m.id]
        open_tokens = [i for i, t in enumerate(tokens) if match[i] < 1.0 and scripts[i] in ("hangul", "latin")]
        if not open_tokens:
            continue
        hangul, latin = hangul_words[m.id], graph.analyzer.latin_words(m.content[:CROSS_TEXT_CHARS])
        todo = []
        for i in open_tokens:
            other = latin if scripts[i] == "hangul" else hangul
            if other:
                todo.append((i, other))
                vocab.update(dict.fromkeys(other))
        if todo:
            wanted[m.id] = todo
    if not vocab:
        return
    words = list(vocab)
    row = {w: j for j, w in enumerate(words)}
    asked = sorted({i for todo in wanted.values() for i, _ in todo})
    sims = np.stack([plan.token_vectors[tokens[i]] for i in asked]) @ graph.embedder.embed(words).T
    token_row = {i: r for r, i in enumerate(asked)}
    # A word that sounds the same in the other script is the same word (a loanword or a
    # name: 아틀라스 and Atlas), although the embedder may put it below the translation bar;
    # it counts as fully matched when the two also share some meaning (SOUND_ALIKE_FLOOR).
    surface = {t: t for t in tokens} | {w.stem: w.surface for w in reversed(plan.words)}
    met = np.where(sims >= bar, sims, 0.0)
    for r, j in zip(*np.nonzero((sims >= SOUND_ALIKE_FLOOR) & (sims < bar)), strict=True):
        if sound_alike(surface[tokens[asked[r]]], words[j]):
            met[r, j] = 1.0
    sims = met.tolist()
    for mid, todo in wanted.items():
        match = matches[mid]
        for i, other in todo:
            line = sims[token_row[i]]
            best = max(line[row[w]] for w in other)
            if best > match[i]:
                match[i] = best


def same_episode(a: Memory, b: Memory) -> bool:
    """Observed in one sitting: the same namespace, within EPISODE_GAP of each other."""
    return a.namespace == b.namespace and abs(a.when - b.when) <= EPISODE_GAP


# -- hybrid recall ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HybridResult:
    hits: list[Hit]
    matched_keys: list[str]
    anchored: bool


def hybrid_recall(graph: MemoryGraph, query: str, *, scope: Scope = None, top_k: int = 5, hops: int = 2,
                  min_rel_score: float = 0.0, min_depth: float = 0.0, reinforce: bool = True,
                  context: str | None = None, max_chars: int | None = None,
                  plan: QueryPlan | None = None, rerank_budget_ms: int | None = None) -> HybridResult:
    """Memories for a query, best first.

    Candidates come from three channels -- lexical BM25 over text and keys, the key path
    (keys the query's terms reach) and body cosine -- plus, when the query names a date,
    the memories observed then. Each is scored on the evidence it holds: how much of the
    query it covers (lexically or through its keys) plus its body cosine; a date match
    multiplies, depth and freshness modulate, and memories of the same episode as the best
    ones, or sharing their specific keys, share a little of their score. Hops along narrow
    keys and explicit links add associated memories. A memory that says again, in other
    words, what a better-ranked one says yields its place to the next different one. A
    ready cross-encoder then reorders the best candidates it can score within
    ``rerank_budget_ms`` (default: the tools' budget; the push path passes its own)."""
    now = graph.clock()
    plan = plan or plan_query(graph, query)
    cue = plan if not context or context == query else plan_query(graph, context[:limits.MAX_QUERY_CHARS])
    scores = score_keys(graph, plan)
    keys = matched_keys(graph, scores, KEY_PATH_KEYS)
    hops = limits.HOPS.clamp(hops)

    def read(conn: sqlite3.Connection) -> tuple[dict[str, Candidate], dict[str, Memory],
                                                 dict[str, dict[str, tuple[float, bool]]]]:

        cands: dict[str, Candidate] = {}

        def cand(mid: str) -> Candidate:
            c = cands.get(mid)
            if c is None:
                c = cands[mid] = Candidate(mid)
            return c

        for mid, _ in lexical(conn, cue.match_tokens, scope, now, limit=CANDIDATE_DEPTH):
            cand(mid).tag("(bm25)")
        for mid, cos in dense(graph, cue.focus_vector, scope, limit=CANDIDATE_DEPTH):
            if cos >= DENSE_ADMIT:
                cand(mid).tag("(content)")
        # A hub names a topic, not a memory: its members come through the other channels
        # (its text is in their lexical index) or not at all.
        sizes = graph.key_counts([k for k, _, _ in keys], scope, now).counts
        narrow: list[str] = []
        budget = KEY_PATH_POOL
        for kid, _, _ in keys:
            if budget <= 0:
                break
            if 0 < sizes.get(kid, 0) <= KEY_PATH_MEMBERS:
                narrow.append(kid)
                budget -= sizes[kid]
        members = key_members(conn, narrow, scope, now)
        for kid in narrow:
            info = graph.keys.get(kid)
            for mid, _ in members.get(kid, []):
                c = cand(mid)
                if info is not None:
                    c.tag(info.concept)
        if plan.window is not None:
            where, params = scope_clause(scope)
            rows = conn.execute(
                f"SELECT m.id FROM memories m WHERE COALESCE(m.observed_at, m.created_at) >= ? AND "
                f"COALESCE(m.observed_at, m.created_at) < ? AND {ACTIVE}{where} "
                f"ORDER BY COALESCE(m.observed_at, m.created_at) DESC LIMIT {WINDOW_MEMBERS}",
                [plan.window.start, plan.window.end, now, *params]).fetchall()
            # A memory observed in the named period joins the pool even if no channel saw it.
            for (mid,) in rows:
                cand(mid).tag("(date)")
        found = get_memories(conn, cands)
        live = [found[mid] for mid in cands if mid in found and found[mid].active(now)
                and (scope is None or found[mid].namespace in scope)]
        for mid in set(cands) - {m.id for m in live}:
            del cands[mid]
        link_map = links_of(conn, cands)
        # Words of a memory written in the other script can cover the query's words only
        # through its meaning; that is weighed for the memories the key path or the dense
        # channel reached (a lexical-only candidate shares the query's script already).
        cosines = graph.bodies.cosines([m.id for m in live], np.stack([cue.focus_vector, cue.vector]))
        cross = {m.id: float(max(cosines[m.id])) if m.id in cosines else 0.0 for m in live
                 if any(v != "(bm25)" and v != "(date)" for v in cands[m.id].via)}
        cover = coverage_scores(graph, conn, cue, live, link_map, cross)
        for m in live:
            c = cands[m.id]
            c.coverage = cover.get(m.id, 0.0)
            focused, whole = (float(x) for x in cosines[m.id]) if m.id in cosines else (0.0, 0.0)
            c.dense = focused
            # Relevance (what the push path's floor reads) takes the better of the focused and
            # the whole-query cosine: either can be the one that says "this answers it".
            c.raw = relevance(c.coverage, max(c.dense, whole))
            score = c.coverage + DENSE_WEIGHT * max(0.0, c.dense)
            if plan.window is not None and plan.window.contains(m.when):
                score *= TEMPORAL_BOOST
            c.score = score * depth_factor(m.depth) * graph.rank_factor_of(m, now)
        seeds = sorted(live, key=lambda m: -cands[m.id].score)[:EPISODE_SEEDS]
        bonus: dict[str, float] = {}
        for seed in seeds:
            share = EPISODE_BONUS * cands[seed.id].score
            for m in live:
                if m.id != seed.id and same_episode(m, seed):
                    bonus[m.id] = max(bonus.get(m.id, 0.0), share)
        if PRF_WEIGHT > 0:
            sizes = graph.key_counts({k for keys in link_map.values() for k in keys}, scope, now).counts
            total = max(1, len(graph.bodies))

            def weight(kid: str) -> float:
                return math.log(1.0 + total / max(1, sizes.get(kid, 1)))

            for seed in seeds[:PRF_SEEDS]:
                seed_keys = link_map.get(seed.id, {})
                mass = sum(weight(k) for k in seed_keys) or 1.0
                for m in live:
                    if m.id == seed.id:
                        continue
                    shared = sum(weight(k) for k in link_map.get(m.id, {}) if k in seed_keys)
                    if shared:
                        extra = PRF_WEIGHT * cands[seed.id].score * shared / mass
                        bonus[m.id] = max(bonus.get(m.id, 0.0), extra)
        for mid, extra in bonus.items():
            cands[mid].score += extra
        if hops >= 2 and cands:
            _expand(graph, conn, cands, found, link_map, scope, now, hops)
        return cands, found, link_map

    cands, found, link_map = graph.store.read(read)
    # Anchored when some memory is relevant on its content, or the query reaches a key:
    # keys are how a query in one language reaches memories written in the other.
    anchored = bool(keys) or any(c.raw >= MIN_ANCHOR for c in cands.values())
    if not anchored:
        return HybridResult([], [k for k, _, _ in keys], False)
    ranked = sorted(cands.values(), key=lambda c: -c.score)
    if min_rel_score > 0 and ranked:
        floor = ranked[0].score * min(limits.MIN_REL_SCORE.high, min_rel_score)
        ranked = [c for c in ranked if c.score >= floor]
    if min_depth > 0:
        ranked = [c for c in ranked if found[c.memory_id].depth >= min_depth]
    # Before the cross-encoder, which judges each memory alone: its order, when it runs, wins.
    ranked = _skip_repeats(graph, ranked, top_k)
    budget = graph.settings.rerank_budget_ms if rerank_budget_ms is None else rerank_budget_ms
    ranked = _rerank(graph, cue.text, ranked, found, top_k, budget / 1000)
    if graph.settings.task_evidence and is_comparison(query):
        ranked = _project(graph, query, ranked, link_map, top_k)
    chosen = ranked[:top_k]
    if reinforce and chosen:
        _reinforce(graph, chosen, [k for k, _, _ in keys], link_map)
    hits = _hits(graph, chosen, found, link_map, max_chars)
    return HybridResult(hits, [k for k, _, _ in keys], True)


def _expand(graph: MemoryGraph, conn: sqlite3.Connection, cands: dict[str, Candidate], found: dict[str, Memory],
            link_map: dict[str, dict[str, tuple[float, bool]]], scope: Scope, now: float, hops: int) -> None:
    """Spread activation along narrow keys and explicit links, hop by hop. A wide (hub) key
    says little about association, so only keys with few members carry a hop."""

    anchored = {mid for mid, c in cands.items() if any(v != "(bm25)" for v in c.via)}
    frontier = sorted(cands, key=lambda m: -cands[m].score)[:10]
    for hop in range(2, hops + 1):
        gains: dict[str, tuple[float, str | None, str]] = {}
        key_ids = {kid for mid in frontier for kid, (_, auto) in link_map.get(mid, {}).items() if not auto}
        sizes = graph.key_counts(key_ids, scope, now).counts
        members = key_members(conn, sorted(k for k in key_ids if sizes.get(k, 0) <= HOP_KEY_MAX_MEMBERS), scope,
                              now)
        for mid in frontier:
            source = cands[mid]
            for kid, (_, auto) in link_map.get(mid, {}).items():
                group = members.get(kid, [])
                if auto or len(group) > HOP_KEY_MAX_MEMBERS:
                    continue
                info = graph.keys.get(kid)
                for other, weight in group:
                    if other == mid or other in cands:
                        continue
                    gain = source.score * HOP_DECAY * graph.idf(kid) * weight
                    label = f"{info.concept}(via)" if info is not None and mid in anchored else ""
                    prev = gains.get(other)
                    gains[other] = ((prev[0] if prev else 0.0) + gain, kid, label)
            for (other,) in conn.execute(
                    "SELECT to_id FROM relations WHERE from_id = ? UNION SELECT from_id FROM relations WHERE to_id = ?",
                    (mid, mid)):
                if other in cands:
                    continue
                prev = gains.get(other)
                gains[other] = ((prev[0] if prev else 0.0) + source.score * HOP_DECAY, None,
                                "(linked)" if mid in anchored else "")
        if not gains:
            return
        more = get_memories(conn, gains)
        frontier = []
        for other, (gain, via_key, label) in gains.items():
            m = more.get(other)
            if m is None or not m.active(now) or (scope is not None and m.namespace not in scope):
                continue
            found[other] = m
            c = Candidate(other, score=gain * graph.rank_factor_of(m, now) * EXPAND_HOP_FACTOR, hop=hop,
                          hop_key=via_key)
            if label:
                c.tag(label)
                anchored.add(other)
            cands[other] = c
            frontier.append(other)
        link_map.update(links_of(conn, frontier))


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
    from keymem_daemon.engine.graph import EXPLORED_DECAY, HOP_REINFORCE, LINK_MAX, LINK_MIN, REINFORCE

    now = graph.clock()
    top = chosen[0].memory_id
    returned = {c.memory_id for c in chosen}
    matched_set = set(matched)
    bumps: list[tuple[float, str, str]] = [
        (REINFORCE, kid, top) for kid in link_map.get(top, {}) if kid in matched_set]
    bumps += [(HOP_REINFORCE, c.hop_key, c.memory_id) for c in chosen[1:] if c.hop >= 2 and c.hop_key]

    def write(tx: Any) -> None:
        conn = tx.conn
        conn.executemany("UPDATE memories SET access_count = access_count + 1, last_accessed = ? WHERE id = ?",
                         [(now, mid) for mid in returned])
        conn.executemany(f"UPDATE links SET weight = MIN({LINK_MAX}, weight + ?) WHERE key_id = ? AND memory_id = ?",
                         bumps)
        if matched_set:
            marks = ",".join("?" * len(matched_set))
            skip = ",".join("?" * len(returned))
            conn.execute(f"UPDATE links SET weight = MAX({LINK_MIN}, weight - ?) WHERE key_id IN ({marks}) "
                         f"AND memory_id NOT IN ({skip})", [EXPLORED_DECAY, *matched_set, *returned])

    graph.store.write(write)


def _hits(graph: MemoryGraph, chosen: Sequence[Candidate], found: Mapping[str, Memory],
          link_map: Mapping[str, Mapping[str, tuple[float, bool]]], max_chars: int | None) -> list[Hit]:
    now = graph.clock()

    def read(conn: sqlite3.Connection) -> list[Hit]:

        fresh = get_memories(conn, [c.memory_id for c in chosen])
        out = []
        for c in chosen:
            m = fresh.get(c.memory_id) or found[c.memory_id]
            content, cut = (m.content, False) if max_chars is None else truncate(m.content, max_chars)
            keys = [graph.concept(k) for k, (_, auto) in link_map.get(m.id, {}).items() if not auto]
            out.append(Hit(
                id=m.id, content=content, keys=keys, matched_via=list(c.via), hop=c.hop,
                score=round(c.score, 6), rank_score=round(c.score, 6), relevance_score=round(c.raw, 3),
                depth=round(m.depth, 3), access_count=m.access_count, source=m.source, supersedes=m.supersedes,
                created_at=m.created_at, observed_at=m.observed_at, namespace=m.namespace,
                related_to=graph.related_ids(conn, m.id), validity=graph.validity_of(m),
                batch_sibling_ids=graph.batch_siblings(conn, m, now),
                content_truncated=True if cut else None, content_chars=len(m.content) if cut else None))
        return out

    return graph.store.read(read)


# -- the push path's namespaces (the decision is in push.py) ----------------------------


def parse_namespaces_file(text: str) -> dict[str, list[str]]:
    """``namespaces.json``: {"<directory prefix>": ["namespace", ...]}."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("namespaces.json must be an object")
    out: dict[str, list[str]] = {}
    for prefix, names in data.items():
        if isinstance(names, str):
            names = [names]
        if isinstance(prefix, str) and isinstance(names, list):
            out[prefix] = [n for n in names if isinstance(n, str)]
    return out


def namespaces_for_cwd(mapping: Mapping[str, Sequence[str]], cwd: str | None) -> Scope:
    """The namespaces the push path may surface for ``cwd``: those of the longest directory
    prefix that contains it (path-segment aware), plus ``default``; None = every namespace."""
    if not cwd or not mapping:
        return None
    from pathlib import PurePath

    from keymem_daemon.engine.text import normalize_namespace

    target = PurePath(cwd)
    best: tuple[int, Sequence[str]] | None = None
    for prefix, names in mapping.items():
        base = PurePath(prefix.rstrip("/") or "/")
        if target == base or base in target.parents:
            depth = len(base.parts)
            if best is None or depth > best[0]:
                best = (depth, names)
    if best is None:
        return None
    return frozenset({"default", *(normalize_namespace(n) for n in best[1])})

