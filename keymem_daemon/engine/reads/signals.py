"""Pure scoring functions of the reads: how evidence becomes a score. Each takes plain numbers
(or records) and returns one, so it is testable without a store, a model or a daemon.

The weights are measured (LoCoMo conversations 0-2, checked on 3-4, and the Korean/English
set; see README): change one only with the benchmarks' figures before and after.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from keymem_daemon.engine.records import Memory
from keymem_daemon.engine.text import normalize

# The body cosine (of the query's rarer words) is added to a memory's query coverage with
# this weight.
DENSE_WEIGHT: Final = 0.6
# A memory observed inside a date window the query names scores this many times higher.
TEMPORAL_BOOST: Final = 2.0
# A memory saved again in other words (the same fact from another session) repeats one
# ranked above it: above this body cosine it yields its place among the best
# (LoCoMo R@5 .668 -> .673, multi-hop .662 -> .676; the Korean/English set unchanged).
REDUNDANT_COSINE: Final = 0.8
# Memories of one episode (observed within EPISODE_GAP of each other) share in the
# evidence of the best candidates with EPISODE_BONUS of their score.
EPISODE_BONUS: Final = 0.2
EPISODE_GAP: Final = 1800.0
# Association feedback: a candidate sharing specific keys with one of the best gains
# PRF_WEIGHT x that seed's score x the share of the seed's key weight it shares
# (LoCoMo R@5 0.656 -> 0.669; the Korean/English set unchanged).
PRF_WEIGHT: Final = 0.4


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


def relevance(coverage: float, cosine: float) -> float:
    """A memory's content relevance in [0, 1]: its query coverage and body cosine, mixed."""
    return (coverage + DENSE_WEIGHT * max(0.0, cosine)) / (1.0 + DENSE_WEIGHT)


def same_episode(a: Memory, b: Memory) -> bool:
    """Observed in one sitting: the same namespace, within EPISODE_GAP of each other."""
    return a.namespace == b.namespace and abs(a.when - b.when) <= EPISODE_GAP


def coverage_share(token_weights: Sequence[float], match: Sequence[float], total: float) -> float:
    """The share of the query's weight a memory covers: each token's weight times how well
    the memory matches it (1 lexically, a cosine through a key or a word), over ``total``."""
    return float(sum(w * x for w, x in zip(token_weights, match, strict=True))) / total


def best_of(match: Sequence[float], other: Sequence[float]) -> list[float]:
    """Token by token, the better of two matches."""
    return [max(a, b) for a, b in zip(match, other, strict=True)]


def temporal_factor(in_window: bool) -> float:
    """What a named date does to a memory's score: TEMPORAL_BOOST when it was observed then."""
    return TEMPORAL_BOOST if in_window else 1.0


def key_weight(members: int, total: int) -> float:
    """How much sharing a key says about two memories: log(1 + total / members) (a key on
    few of ``total`` memories says much, a hub little)."""
    return math.log(1.0 + total / max(1, members))


def episode_bonus(seed_score: float) -> float:
    """What a memory of the same episode as a seed gains: EPISODE_BONUS of the seed's score."""
    return EPISODE_BONUS * seed_score


def seed_mass(seed_keys: Iterable[str], weight: Callable[[str], float]) -> float:
    """A seed's key weight, what association_bonus shares out (1 when it has none)."""
    return sum(weight(k) for k in seed_keys) or 1.0


def association_bonus(seed_score: float, seed_keys: Collection[str], keys: Iterable[str],
                      weight: Callable[[str], float], *, mass: float | None = None) -> float:
    """What a memory sharing keys with a seed gains: PRF_WEIGHT x the seed's score x the
    share of the seed's key weight (``mass``: seed_mass, given when one seed is weighed
    against many memories) it shares (0 when it shares none)."""
    if mass is None:
        mass = seed_mass(seed_keys, weight)
    shared = sum(weight(k) for k in keys if k in seed_keys)
    return PRF_WEIGHT * seed_score * shared / mass if shared else 0.0
