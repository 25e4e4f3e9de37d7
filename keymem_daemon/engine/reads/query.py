"""A query analysed once (``plan_query``) and the namespaces a read may see (``Scope``).

A query's words, lexical tokens, the literal forms a key could take in it, and its
candidate terms -- content words, nouns inside compounds and adjacent pairs -- embedded in
one batch (keys are 1-2 words, so they are matched with those terms, not with the whole
question's vector), each token weighted by its IDF in the store.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import PurePath
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from keymem_daemon.engine import limits
from keymem_daemon.engine.dates import Window, find_window
from keymem_daemon.engine.ports import Scope
from keymem_daemon.engine.text import (
    Word,
    index_tokens_of,
    literal_candidates,
    normalize_namespace,
    query_terms,
)

if TYPE_CHECKING:
    from keymem_daemon.engine.graph import MemoryGraph

# Words most memories share (above this share of them) say little about which memory is
# meant: the dense channel embeds the rest, and the channels search for the rarer ones.
COMMON_SHARE: Final = 0.2
# A young store counts as at least this many memories when it weighs tokens.
MIN_CORPUS: Final = 100
# A Korean predicate or adverb of the query, or what an asking word asks for, weighs this
# share of its IDF in coverage (Korean/English set, push path: R@5 .693 -> .740 with
# not-found unchanged, and -> .807 with Korean's asking words; see plan_query).
PREDICATE_SHARE: Final = 0.25
# Words that ask for the property or kind the next word names (how long, 얼마나 보관해,
# 몇 시간, 어떤 명령어): 얼마나 is Korean's "how".
ASKING_WORDS: Final = frozenset({"how", "얼마나", "몇", "어떤", "무슨", "어느"})


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


def scope_of(namespace: str | None) -> Scope:
    return None if namespace is None else frozenset({namespace})


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
