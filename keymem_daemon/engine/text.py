"""Text: the one normalisation, and the analysis that turns text into words for the
lexical index, literal key matching and query terms.

``normalize`` (NFKC, casefold, collapsed whitespace) is the only normalisation: dedup,
exact key matches, namespaces and auto-confirm all go through it.

``Analyzer.analyze`` splits normalised text into words. A Latin word becomes its Snowball
stem (``deployments`` -> ``deploy``). A Korean eojeol goes through Kiwi: its leading run of
nominal morphemes becomes one stem, so the particle or ending that follows never fuses
with the noun (``배포를``, ``배포가``, ``배포했다`` -> ``배포``); the nouns inside a compound
are kept as sub-words (``코드리뷰`` -> ``코드리뷰``, ``코드``, ``리뷰``). Kiwi is loaded on the
first Hangul text, because it costs about 240 MB; an English-only store never pays it.
Loanwords Kiwi misreads (커버리지 as a verb) are taught to it as nouns (``Analyzer.learn``);
the store keeps that list and re-indexes what holds a new word.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Literal

logger = logging.getLogger(__name__)

_SPACE = re.compile(r"\s+")
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]")
_LATIN_WORD = re.compile(r"[^\W_]+")
_HANGUL_RUN = re.compile(r"[\uac00-\ud7a3]+")
_LATIN = re.compile(r"[a-zA-Z]")
_CJK_SINGLE = re.compile(r"^[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3\u3040-\u30ff\u4e00-\u9fff]$")

# Words of one script a memory offers to cross-script matching (``Analyzer.latin_words``,
# retrieval's Hangul words): each may cost an embedding.
CONTENT_WORDS: Final = 24

TRUNCATION_MARKER: Final = "\n…[truncated; use read_memory for full content]"


def normalize(text: str) -> str:
    """NFKC, casefold, whitespace collapsed and stripped: the one comparison form."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def normalize_namespace(value: str | None) -> str:
    """A namespace as stored and compared, without invisible characters (a bidi override or a
    zero-width space would make two namespaces that look the same); empty means ``default``."""
    if value is None:
        return "default"
    text = normalize(strip_invisible(value))
    return text or "default"


# Characters that show nothing although their category is a letter, a mark or a symbol: the
# Hangul fillers, the braille blank, the combining grapheme joiner and the variation selectors.
_BLANKS: Final = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u180b\u180c\u180d") | frozenset(
    map(chr, [*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)]))


def is_invisible(char: str) -> bool:
    """A character that renders as nothing: format controls (zero-width spaces and joiners,
    bidi marks, embeddings, overrides and isolates, the BOM, tags), other controls, and
    ``_BLANKS``."""
    return unicodedata.category(char) in ("Cf", "Cc") or char in _BLANKS


def strip_invisible(text: str) -> str:
    """``text`` without the characters ``is_invisible`` names."""
    return "".join(c for c in text if not is_invisible(c))


def has_hangul(text: str) -> bool:
    return _HANGUL.search(text) is not None


def script_of(text: str) -> Literal["hangul", "latin", "other"]:
    if has_hangul(text):
        return "hangul"
    if _LATIN.search(text):
        return "latin"
    return "other"


# Consonant classes of a word's sound, shared by both scripts so that a loanword or a name
# written in Hangul and in Latin letters reduce to the same skeleton (아틀라스, atlas -> TLS).
# Hangul: the 19 leading and 27 trailing consonants of a syllable in Unicode order (a lead
# ㅇ is silent; a trailing ㅅ renders a final t in loanwords: 로봇, robot).
_LEAD_SOUNDS: Final = ("K", "K", "N", "T", "T", "L", "M", "P", "P", "S", "S", "", "J", "J", "J", "K", "T", "P", "H")
_TAIL_SOUNDS: Final = ("", "K", "K", "K", "N", "N", "N", "T", "L", "L", "L", "L", "L", "L", "L", "L", "M", "P", "P",
                       "T", "T", "N", "T", "T", "K", "T", "P", "T")
# Latin: spellings as Korean loanwords render them. Korean has no f, v, z or th (ㅍ, ㅂ, ㅈ,
# ㅅ), writes no r after a vowel (server -> 서버) and no h but at the start; c and g soften
# before e, i, y; vowels, w and y carry no consonant.
_LATIN_SOUNDS: Final = re.compile(r"gg|ph|th|sh|ch|ck|ng|qu|x|r(?=[aeiouy])|^h|[cgjzvfbpdtkqlmns]")
_LATIN_CLASS: Final = {"gg": "K", "ph": "P", "th": "S", "sh": "S", "ch": "J", "ck": "K", "ng": "N", "qu": "K",
                       "x": "KS", "r": "L", "h": "H", "j": "J", "z": "J", "v": "P", "f": "P", "b": "P", "p": "P",
                       "d": "T", "t": "T", "k": "K", "q": "K", "l": "L", "m": "M", "n": "N", "s": "S"}
_RUNS: Final = re.compile(r"(.)\1+")


# Only word pairs the embedder already puts near each other are compared, a few per query.
@lru_cache(maxsize=4096)
def sound_skeleton(word: str) -> str:
    """The consonants of how a (normalised) word sounds, in classes both scripts share, so a
    loanword or name reads the same in Hangul and in Latin letters: 스테이징 and staging are
    STJN, 하나 and hana HN, 프론트엔드 and frontend PLNTNT. Empty for other scripts."""
    out: list[str] = []
    if has_hangul(word):
        for ch in word:
            code = ord(ch) - 0xAC00
            if 0 <= code < 11172:
                out.append(_LEAD_SOUNDS[code // 588] + _TAIL_SOUNDS[code % 28])
    else:
        for m in _LATIN_SOUNDS.finditer(word):
            form = m.group()
            if form in ("c", "g"):
                soft = word[m.end():m.end() + 1] in ("e", "i", "y")
                out.append(("S" if form == "c" else "J") if soft else "K")
            else:
                out.append(_LATIN_CLASS[form])
    return _RUNS.sub(r"\1", "".join(out))


# A skeleton this short (one consonant) is shared by too many unrelated words.
SOUND_ALIKE_CONSONANTS: Final = 2


def sound_alike(a: str, b: str) -> bool:
    """The two words have the same sound skeleton, of at least SOUND_ALIKE_CONSONANTS."""
    skeleton = sound_skeleton(a)
    return len(skeleton) >= SOUND_ALIKE_CONSONANTS and skeleton == sound_skeleton(b)


def is_single_cjk(text: str) -> bool:
    """One Hangul/Han/Kana character: a meaningful key (집, 돈, 車) although one char long."""
    return _CJK_SINGLE.match(text) is not None


def is_short_concept(text: str) -> bool:
    """At most two words, or at most 15 characters (upstream's isShortConcept)."""
    stripped = text.strip()
    return len(stripped.split()) <= 2 or len(stripped) <= 15


def truncate(content: str, max_chars: int) -> tuple[str, bool]:
    """Cut ``content`` to ``max_chars`` including the marker; returns (text, was_cut)."""
    if len(content) <= max_chars:
        return content, False
    keep = max(0, max_chars - len(TRUNCATION_MARKER))
    return content[:keep].rstrip() + TRUNCATION_MARKER, True


# Words that carry no topic. English: function words, auxiliaries and question words.
# Korean: pronouns, dependent nouns and light verbs that survive morpheme tagging.
# (A word list reads best as text, hence the split.)
STOPWORDS: Final = frozenset(
    """a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can could did didn't do does doesn't doing don't
    down during each few for from further had has have having he her here hers herself him
    himself his how i if in into is isn't it it's its itself just let me more most my myself
    no nor not now of off on once only or other our ours ourselves out over own same she
    should so some such than that the their theirs them themselves then there these they this
    those through to too under until up very was wasn't we were weren't what when where which
    while who whom why will with would you your yours yourself yourselves also ever tell
    please know anything something thing things get got ok okay yes yeah hey hi hello s t d ll
    ve re m
    것 거 수 등 때 중 우리 저희 나 저 너 그 이 저것 이것 그것 뭐 무엇 무슨 어디 언제 누구 왜 어떻게
    어느 하 있 없 되 않 좀 잘 더 또 다 너무 정말 진짜 그냥 알리 주 보 말하 대하 관하 관련 대한
    내 제 네 혹시 그거 이거 저거 아무 얼마 얼마나 몇 뭘 어떤 이번 지난 다음 저번 many much""".split()  # noqa: SIM905
)

# Kiwi tags whose morphemes form the nominal stem of an eojeol.
_NOMINAL_TAGS: Final = frozenset(
    {"NNG", "NNP", "NNB", "NR", "NP", "SL", "SH", "SN", "XR", "MM", "XPN"}
)
# Nominal morphemes also indexed on their own when they sit inside a compound.
_SUBWORD_TAGS: Final = frozenset({"NNG", "NNP", "SL", "SH", "XR"})
_PREDICATE_TAGS: Final = frozenset({"VV", "VA"})
# Noun suffixes of respect and number: the word stays the word it was.
_COURTESY_SUFFIXES: Final = frozenset({"님", "들"})
# Dependent nouns, pronouns and determiners alone do not make a topic word.
_WEAK_TAGS: Final = frozenset({"NNB", "NP", "MM"})


@dataclass(frozen=True, slots=True)
class Word:
    """One word of analysed text.

    ``stem`` is the comparison form (Snowball stem, or a Korean nominal stem / predicate
    lemma); ``subs`` are the nouns inside a Korean compound; ``surface`` is the normalised
    text the word came from, with any derivational suffix (초기화, whose stem is 초기), used
    when the word is embedded as a query term.
    """

    stem: str
    surface: str
    subs: tuple[str, ...] = ()
    stop: bool = False
    nominal: bool = True


class Analyzer:
    """Turns text into ``Word``s. Thread-safe; Kiwi loads lazily on the first Hangul text."""

    def __init__(self) -> None:
        import Stemmer

        self._stemmer = Stemmer.Stemmer("english")
        self._stem_lock = threading.Lock()
        self._kiwi: Any = None
        self._kiwi_lock = threading.Lock()
        # Kiwi's dictionary changes under ``learn``; nothing may tokenize meanwhile.
        self._kiwi_use = threading.Lock()
        self._learned: frozenset[str] = frozenset()

    @property
    def kiwi_loaded(self) -> bool:
        return self._kiwi is not None

    def preload_kiwi(self) -> None:
        self._get_kiwi()

    def _get_kiwi(self) -> Any:
        if self._kiwi is None:
            with self._kiwi_lock:
                if self._kiwi is None:
                    from kiwipiepy import Kiwi

                    logger.info("loading the Kiwi Korean analyser")
                    # Only the morpheme model and its language model are loaded. The multi-word
                    # and typo dictionaries add ~180 MB and change nothing for short memory
                    # texts. The default dictionary (113k proper nouns from Wikipedia titles)
                    # adds 50 MB, an eighth of the daemon, and moved one of 192 queries of
                    # scripts/bench_korean.py; it also splits Korean names (김서연 -> 김/서/연).
                    kiwi = Kiwi(num_workers=-1, load_default_dict=False, load_multi_dict=False,
                                load_typo_dict=False)
                    kiwi.tokenize("준비")
                    self._kiwi = kiwi
        return self._kiwi

    @property
    def learned(self) -> frozenset[str]:
        """The words taught with ``learn`` so far (Kiwi's vocabulary is the process's)."""
        return self._learned

    def misread(self, keys: Sequence[str]) -> list[str]:
        """The Hangul words of ``keys``, not yet learned, that Kiwi does not read as a noun."""
        hangul = {run for key in keys for run in _HANGUL_RUN.findall(normalize(key))} - self._learned
        return [w for w in sorted(hangul) if not self._reads_as_noun(w)]

    def loanwords(self, keys: Sequence[str], text: str) -> list[str]:
        """The loanwords among ``keys`` Kiwi misreads: Hangul words it does not read as a
        noun (커버리지 as 크+어+버리+지, 지라 as 지+라, 맵 as the adjective 맵다) that sound like
        a Latin word of the same keys or ``text`` (coverage, Jira, map). Kiwi cuts such a
        word differently from one sentence to the next, or drops it, so the lexical index
        would miss it; an agent's key names a concept, so it is a noun."""
        misread = self.misread(keys)
        if not misread:
            return []
        # A plural or inflected English word sounds like its stem (hooks and 훅 are hook).
        latin = {form for word in self.latin_words(" ".join([*keys, text])) for form in (word, self.stem(word))}
        return [w for w in misread if any(sound_alike(w, other) for other in latin)]

    @lru_cache(maxsize=50_000)  # noqa: B019 - keys repeat endlessly
    def _reads_as_noun(self, word: str) -> bool:
        kiwi = self._get_kiwi()
        with self._kiwi_use:
            tokens = kiwi.tokenize(word)
        return all(t.tag in _NOMINAL_TAGS or t.tag == "XSN" for t in tokens)

    def learn(self, words: Iterable[str]) -> list[str]:
        """Teach Kiwi these words as nouns (``loanwords``); returns those it did not know.
        Every later analysis reads them whole, so a store must re-index the text that holds
        them (``MemoryGraph`` does, and keeps the list)."""
        wanted = set(words)
        if not wanted - self._learned:  # (an English-only store never loads Kiwi)
            return []
        kiwi = self._get_kiwi()
        with self._kiwi_use:
            new = sorted(wanted - self._learned)
            if not new:  # another thread taught them while this one waited for the lock
                return []
            for word in new:
                kiwi.add_user_word(word, "NNP")
            # Kiwi rebuilds its model on the first analysis after a change (about 0.25 s):
            # pay for that here, in the write or the start that taught the word, not in the
            # next prompt's read.
            kiwi.tokenize(new[0])
            self._learned = self._learned | set(new)
            # Cached analyses of keys predate the words.
            Analyzer.key_tokens.cache_clear()
            Analyzer.compact.cache_clear()
            Analyzer._reads_as_noun.cache_clear()
        logger.info("learned %d loanword(s) for the Korean analyser: %s", len(new), ", ".join(new))
        return new

    def stem(self, word: str) -> str:
        with self._stem_lock:
            return str(self._stemmer.stemWord(word))

    def _latin_words(self, text: str) -> list[Word]:
        out = []
        for match in _LATIN_WORD.finditer(text):
            surface = match.group()
            out.append(Word(self.stem(surface), surface, (), surface in STOPWORDS))
        return out

    def analyze(self, text: str) -> list[Word]:
        """The words of ``text`` (normalised first), in order."""
        norm = normalize(text)
        if not norm:
            return []
        if not has_hangul(norm):
            return self._latin_words(norm)
        kiwi = self._get_kiwi()
        with self._kiwi_use:
            tokens = kiwi.tokenize(norm)
        words: list[Word] = []
        # Group morphemes by the whitespace-delimited eojeol they start in.
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", norm)]
        groups: list[list[Any]] = [[] for _ in spans]
        span_index = 0
        for token in tokens:
            while span_index + 1 < len(spans) and token.start >= spans[span_index][1]:
                span_index += 1
            groups[span_index].append(token)
        for (start, end), morphemes in zip(spans, groups, strict=True):
            surface = norm[start:end]
            if not has_hangul(surface):
                words.extend(self._latin_words(surface))
                continue
            words.extend(self._eojeol_words(surface, start, morphemes))
        return words

    def _eojeol_words(self, surface: str, offset: int, morphemes: Sequence[Any]) -> list[Word]:
        block: list[Any] = []
        for m in morphemes:
            if m.tag in _NOMINAL_TAGS or m.tag.startswith("W_"):
                block.append(m)
            else:
                break
        words: list[Word] = []
        rest = morphemes[len(block):]
        if block:
            begin = block[0].start - offset
            finish = block[-1].start + block[-1].len - offset
            stem = surface[max(0, begin):max(begin + 1, finish)]
            weak = all(m.tag in _WEAK_TAGS for m in block)
            subs: list[str] = []
            if len(block) > 1:
                for m in block:
                    if m.tag in _SUBWORD_TAGS and len(m.form) >= 2:
                        subs.append(self.stem(m.form) if m.tag == "SL" else m.form)
            # A derivational suffix makes another word (초기 "early stage" + 화 = 초기화 "reset"):
            # the stem stays the comparison form, the whole word is what gets embedded. One
            # that only adds respect or number (마커스님, 개발자들) leaves the word, and a name's
            # sound (retrieval's sound-alike words), as it was.
            if rest and rest[0].tag == "XSN" and rest[0].form not in _COURTESY_SUFFIXES:
                finish = rest[0].start + rest[0].len - offset
            spoken = surface[max(0, begin):max(begin + 1, finish)]
            if not has_hangul(stem):
                stem = spoken = self.stem(stem)
            words.append(Word(stem, spoken, tuple(subs), weak or stem in STOPWORDS))
        for m in rest:
            if m.tag in _PREDICATE_TAGS:
                words.append(Word(m.form, m.form, (), m.form in STOPWORDS, nominal=False))
                break
            if m.tag == "MAG":
                words.append(Word(m.form, m.form, (), m.form in STOPWORDS, nominal=False))
                break
        return words

    def index_tokens(self, text: str) -> list[str]:
        """Tokens for the lexical index and BM25: stems and sub-words, stopwords dropped."""
        return index_tokens_of(self.analyze(text))

    @lru_cache(maxsize=50_000)  # noqa: B019 - one analyzer per process; keys repeat endlessly
    def key_tokens(self, text: str) -> tuple[str, ...]:
        """``index_tokens`` of a key's text, cached."""
        return tuple(self.index_tokens(text))

    # Bounded by memory as much as by time: each entry holds a memory's text.
    @lru_cache(maxsize=2048)  # noqa: B019 - the same memories meet prompt after prompt
    def latin_words(self, text: str) -> tuple[str, ...]:
        """The distinct Latin-script words of ``text`` as written (normalised, not stemmed: a
        stem is a poor thing to embed), without stopwords or anything holding a digit (v2 and
        worker12 have no translation to meet); at most CONTENT_WORDS. Never calls Kiwi."""
        out: dict[str, None] = {}
        for match in _LATIN_WORD.finditer(normalize(text)):
            form = match.group()
            if len(form) > 1 and form not in STOPWORDS and script_of(form) == "latin" and form.isalpha():
                out.setdefault(form)
        return tuple(out)[:CONTENT_WORDS]

    @lru_cache(maxsize=50_000)  # noqa: B019
    def compact(self, text: str) -> str:
        """A key's literal form: its stems concatenated (``Code Review`` -> ``codereview``)."""
        return "".join(w.stem for w in self.analyze(text))


def index_tokens_of(words: Iterable[Word]) -> list[str]:
    out: list[str] = []
    for word in words:
        if not word.stop:
            out.append(word.stem)
        out.extend(word.subs)
    return out


def literal_candidates(words: Sequence[Word], *, max_span: int = 4) -> set[str]:
    """Every compact form a key could have to occur literally in these words: runs of up to
    ``max_span`` consecutive stems, and the sub-words of compounds."""
    found: set[str] = set()
    for i in range(len(words)):
        run = ""
        for j in range(i, min(len(words), i + max_span)):
            run += words[j].stem
            found.add(run)
        found.update(words[i].subs)
    return found


def query_terms(words: Sequence[Word], *, whole: str | None = None, limit: int = 32) -> list[str]:
    """Short texts to embed against keys: content words, nouns inside compounds, adjacent
    pairs of content words, and the whole query when it is short. Keys are 1-2 words, so
    these meet them at their own length (the whole question's vector reaches almost none)."""
    terms: list[str] = []
    seen: set[str] = set()

    def add(term: str) -> None:
        if term and term not in seen and len(terms) < limit:
            seen.add(term)
            terms.append(term)

    content = [w for w in words if not w.stop]
    if whole is not None and len(content) <= 3:
        add(normalize(whole))
    for w in content:
        add(w.surface)
        for sub in w.subs:
            add(sub)
    for a, b in zip(words, words[1:], strict=False):
        if not a.stop and not b.stop and a.nominal and b.nominal:
            add(f"{a.surface} {b.surface}")
    return terms


@lru_cache(maxsize=1)
def default_analyzer() -> Analyzer:
    return Analyzer()
