"""The channels that find a query's candidate memories, and the evidence each is scored on.

Channels: lexical (BM25 over content and key tokens, through the store), dense (cosine of
the query with memory bodies), the key path (keys the query's terms reach, and their
members), a date window, the content signal of recall (keys reached through a member that
answers the query) and expansion (hops along narrow keys and explicit links). Every
candidate records how it was reached as ``Via`` values tagged with a ``Channel``; the
strings a hit shows (``(bm25)``, ``deploy(via)``) are rendered from them, never parsed.

Evidence: ``coverage_scores`` -- how much of the query a memory covers, in its text, through
its keys, or through words of its text in the other script.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from keymem_daemon.engine.ports import Reader, Scope
from keymem_daemon.engine.reads.query import QueryPlan, scope_of
from keymem_daemon.engine.reads.signals import best_of, coverage_share, relevance
from keymem_daemon.engine.records import Memory
from keymem_daemon.engine.text import CONTENT_WORDS, script_of, sound_alike
from keymem_daemon.engine.vectors import top_indices

if TYPE_CHECKING:
    from keymem_daemon.engine.graph import MemoryGraph

CHANNEL_DEPTH: Final = 50
# Members a key brings at most (strongest links first) when the key path asks for them.
MEMBERS_PER_KEY: Final = 2000
# Evidence scoring (measured on LoCoMo conversations 0-2, checked on 3-4; see README): a
# query token is covered by a memory through one of its keys at this cosine or above.
SOFT_KEY_MATCH: Final = 0.7
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
# Content-only admission of a key in recall(): a member whose relevance (coverage mixed
# with body cosine) reaches this lets its key in although the key text is far from the query.
CONTENT_GATE: Final = 0.5
# A hop along a narrow key or a link carries this share of its source's score (times the
# key's IDF and link weight); the memories it adds rank at EXPAND_HOP_FACTOR of that.
HOP_DECAY: Final = 0.3
HOP_KEY_MAX_MEMBERS: Final = 5
EXPAND_HOP_FACTOR: Final = 0.7
# Hops start from this many of the best candidates.
HOP_FRONTIER: Final = 10


class Channel(enum.Enum):
    """How a candidate memory was reached."""

    LEXICAL = "(bm25)"
    DENSE = "(content)"
    KEY = "key"
    DATE = "(date)"
    HOP = "(via)"
    LINKED = "(linked)"


# Reached only this way, a memory has no evidence of its own (lexical, date) -- or, with a
# hop, only its source's.
UNANCHORED: Final = frozenset({Channel.LEXICAL, Channel.DATE, Channel.HOP, Channel.LINKED})


@dataclass(frozen=True, slots=True)
class Via:
    """One way a candidate was reached: a channel, and the key's concept for the key path
    and hops along a key."""

    channel: Channel
    concept: str = ""

    @property
    def label(self) -> str:
        """What a hit's ``matched_via`` shows: the key's concept, ``concept(via)`` for a hop
        along it, else the channel's name in parentheses."""
        if self.channel is Channel.KEY:
            return self.concept
        if self.channel is Channel.HOP:
            return f"{self.concept}(via)"
        return str(self.channel.value)


LEXICAL: Final = Via(Channel.LEXICAL)
DENSE: Final = Via(Channel.DENSE)
DATE: Final = Via(Channel.DATE)
LINKED: Final = Via(Channel.LINKED)


@dataclass(slots=True)
class Candidate:
    """A memory a channel found, and its evidence and score so far."""

    memory_id: str
    score: float = 0.0
    coverage: float = 0.0
    dense: float = 0.0
    raw: float = 0.0
    hop: int = 1
    via: list[Via] = field(default_factory=list)
    hop_key: str | None = None

    def tag(self, via: Via) -> None:
        if all(v.label != via.label for v in self.via):
            self.via.append(via)

    def reached_by(self, channels: frozenset[Channel]) -> bool:
        """Whether some way it was reached is outside ``channels``."""
        return any(v.channel not in channels for v in self.via)

    @property
    def labels(self) -> list[str]:
        return [v.label for v in self.via]


# -- lexical and dense -------------------------------------------------------------------


def lexical(reader: Reader, tokens: Sequence[str], scope: Scope, now: float,
            limit: int = CHANNEL_DEPTH) -> list[tuple[str, float]]:
    """BM25 over content and key tokens: (memory id, score >= 0), best first."""
    return reader.lexical_hits(tokens, scope, now, limit)


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


# -- the key path ------------------------------------------------------------------------


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


def key_members(reader: Reader, key_ids: Sequence[str], scope: Scope, now: float,
                per_key: int = MEMBERS_PER_KEY) -> dict[str, list[tuple[str, float]]]:
    """Active members of each key in scope: key -> [(memory id, link weight)]."""
    return reader.key_members(key_ids, scope, now, per_key)


# -- evidence: query coverage ------------------------------------------------------------


def coverage_scores(graph: MemoryGraph, reader: Reader, plan: QueryPlan,
                    memories: Sequence[Memory],
                    link_map: Mapping[str, Mapping[str, tuple[float, bool]]] | None = None,
                    cross: Mapping[str, float] | None = None, *,
                    indexed: Mapping[str, tuple[list[str], list[str]]] | None = None) -> dict[str, float]:
    """The IDF-weighted share of the query's tokens each memory covers: a token counts when
    it occurs in the memory's text or keys, or -- at its cosine -- when one of the memory's
    keys means it (``hurt`` is covered by a memory keyed ``injury``). For the CROSS_POOL
    memories of ``cross`` (id -> body cosine) with the most evidence so far, a token also
    counts -- at its cosine, from the translation bar up -- when a content word of the
    memory's text written in the other script means it (``friday`` is covered by a memory
    that says ``금요일``), and fully when that word is the token spelled in the other script
    (``atlas`` and ``아틀라스``). ``indexed`` (``Reader.indexed_tokens``) and ``link_map``, when the
    caller read them already, are not read again."""
    tokens = [t for t in plan.weights if plan.weights[t] > 0]
    if not memories or not tokens:
        return {m.id: 0.0 for m in memories}
    total = sum(plan.weights[t] for t in tokens)
    weights = np.array([plan.weights[t] for t in tokens])
    if indexed is None:
        indexed = reader.indexed_tokens([m.id for m in memories])
    if link_map is None:
        link_map = reader.links_by_memory([m.id for m in memories])
    texts = {mid: {*content, *keys} for mid, (content, keys) in indexed.items()}
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
        return coverage_share(token_weights, match, total)

    matches: dict[str, list[float]] = {}
    for m in memories:
        words = texts.get(m.id, set())
        match = [1.0 if t in words else 0.0 for t in tokens]
        for kid in link_map.get(m.id, {}):
            key_sims = soft_of.get(kid)
            if key_sims is not None:
                match = best_of(match, key_sims)
        matches[m.id] = match
    if cross and with_vectors:
        pool = sorted((m for m in memories if m.id in cross),
                      key=lambda m: -relevance(share(matches[m.id]), cross[m.id]))[:CROSS_POOL]
        hangul = {m.id: _hangul_words(indexed.get(m.id, ([], []))[0]) for m in pool}
        _cross_script_words(graph, plan, tokens, pool, matches, hangul)
    return {mid: share(match) for mid, match in matches.items()}


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


# -- recall's content signal -------------------------------------------------------------


def content_signal(graph: MemoryGraph, cue: QueryPlan, ns: str | None, now: float
                    ) -> tuple[dict[str, tuple[float, str]], list[str]]:
    """Best content relevance of each key through its members: key -> (score, memory id).

    A key whose text is far from the query still surfaces when one of its memories answers
    it (relevance at or above CONTENT_GATE, the same measure the push path uses)."""

    def read(reader: Reader) -> tuple[dict[str, tuple[float, str]], list[str]]:

        # Lexical candidates only: a scan of every body vector here cost a large store ~15 ms
        # per recall and changed no result on the benchmarks (the key sims cover semantics).
        near = [mid for mid, _ in lexical(reader, cue.match_tokens, scope_of(ns), now, limit=2 * CHANNEL_DEPTH)]
        found = reader.memories(near[:CHANNEL_DEPTH])
        live = [m for m in found.values() if m.active(now)]
        # Read once: the coverage's key matches and the keys the relevant memories lift.
        link_map = reader.links_by_memory([m.id for m in live]) if live else {}
        cover = coverage_scores(graph, reader, cue, live, link_map)
        per_memory: dict[str, float] = {}
        cosines = graph.bodies.cosines([m.id for m in live], np.stack([cue.focus_vector, cue.vector]))
        for m in live:
            cosine = float(cosines[m.id].max()) if m.id in cosines else 0.0
            value = relevance(cover.get(m.id, 0.0), cosine)
            if value >= CONTENT_GATE:
                per_memory[m.id] = value * graph.rank_factor_of(m, now)
        out: dict[str, tuple[float, str]] = {}
        for mid in sorted(per_memory):  # ties go to the first id, as they always have
            for kid, (_, auto) in link_map.get(mid, {}).items():
                if not auto and per_memory[mid] > out.get(kid, (0.0, ""))[0]:
                    out[kid] = (per_memory[mid], mid)
        return out, near

    return graph.store.read(read)


# -- expansion: hops along narrow keys and explicit links --------------------------------


def expand(graph: MemoryGraph, reader: Reader, cands: dict[str, Candidate], found: dict[str, Memory],
            link_map: dict[str, dict[str, tuple[float, bool]]], scope: Scope, now: float, hops: int) -> None:
    """Spread activation along narrow keys and explicit links, hop by hop. A wide (hub) key
    says little about association, so only keys with few members carry a hop."""

    # A hop from a memory reached by more than the lexical channel shows how it was made.
    anchored = {mid for mid, c in cands.items() if c.reached_by(frozenset({Channel.LEXICAL}))}
    frontier = sorted(cands, key=lambda m: -cands[m].score)[:HOP_FRONTIER]
    for hop in range(2, hops + 1):
        gains: dict[str, tuple[float, str | None, Via | None]] = {}
        key_ids = {kid for mid in frontier for kid, (_, auto) in link_map.get(mid, {}).items() if not auto}
        sizes = graph.key_counts(key_ids, scope, now).counts
        members = key_members(reader, sorted(k for k in key_ids if sizes.get(k, 0) <= HOP_KEY_MAX_MEMBERS), scope,
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
                    label = Via(Channel.HOP, info.concept) if info is not None and mid in anchored else None
                    prev = gains.get(other)
                    gains[other] = ((prev[0] if prev else 0.0) + gain, kid, label)
            for other in reader.related_either_way(mid):
                if other in cands:
                    continue
                prev = gains.get(other)
                gains[other] = ((prev[0] if prev else 0.0) + source.score * HOP_DECAY, None,
                                LINKED if mid in anchored else None)
        if not gains:
            return
        more = reader.memories(gains)
        frontier = []
        for other, (gain, via_key, label) in gains.items():
            m = more.get(other)
            if m is None or not m.active(now) or (scope is not None and m.namespace not in scope):
                continue
            found[other] = m
            c = Candidate(other, score=gain * graph.rank_factor_of(m, now) * EXPAND_HOP_FACTOR, hop=hop,
                          hop_key=via_key)
            if label is not None:
                c.tag(label)
                anchored.add(other)
            cands[other] = c
            frontier.append(other)
        link_map.update(reader.links_by_memory(frontier))
