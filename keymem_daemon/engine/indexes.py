"""The in-memory key index, body-vector table and active-member counts, and how they are kept
in step with the store: filled when the store opens (a malformed stored vector is re-embedded,
``_quarantine``), changed only in a write's after-commit step (``counting``), and the lexical
index rows the writes keep in step (``index_memory``, ``reindex_keys_of``, ``sync_vocabulary``).

``GraphIndexes`` is the base of ``engine.graph.MemoryGraph``: the state every part of the engine
shares (store, embedder, settings, clock, analyzer) and these tables.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from keymem_daemon.config import Settings
from keymem_daemon.engine.autokey import PromotionRule, RecallBuffer
from keymem_daemon.engine.freshness import HalfLives
from keymem_daemon.engine.keys import ActiveCounts, KeyIndex, KeyInfo, MemberState
from keymem_daemon.engine.ports import Reader, Repository, Writer
from keymem_daemon.engine.records import Memory
from keymem_daemon.engine.text import Analyzer, default_analyzer, has_hangul
from keymem_daemon.engine.vectors import VectorTable
from keymem_daemon.inference.embedders import Embedder, ThresholdProfile

logger = logging.getLogger(__name__)

T = TypeVar("T")

Clock = Callable[[], float]

# The meta row listing the loanwords the store's index was cut with (``Analyzer.learn``).
VOCABULARY_META: Final = "learned_words"

# An entity key counts half in idf: a name says who a memory is about, not what it says.
ENTITY_IDF: Final = 0.5
# The ids a repair note names (the log and status line stay one readable line).
REPAIR_IDS_SHOWN: Final = 10
# Memories of a Hangul key read to tell whether it is a loanword: one that shows it suffices,
# and a hub's thousands would make opening an old store slow.
LOANWORD_EVIDENCE: Final = 20


def key_idf(link_count: int, *, entity: bool) -> float:
    """A key's inverse document frequency over ``link_count`` links (``GraphIndexes.idf``)."""
    value = 1.0 if link_count <= 1 else 1.0 / link_count
    return value * ENTITY_IDF if entity else value


def _word_list(value: str) -> list[str] | None:
    """A JSON list of words as the meta table keeps it, or None if it is not one."""
    try:
        words = json.loads(value)
    except ValueError:
        return None
    if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
        return None
    return words


def vector_bytes(vector: npt.NDArray[np.floating]) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def vector_from(blob: bytes) -> npt.NDArray[np.float32]:
    return np.frombuffer(blob, dtype=np.float32)

# Every stored vector is L2-normalised (or zero, for a text the embedder cannot read); float32
# rounding keeps a unit vector's squared length within about 1e-6 of 1.
_UNIT_TOLERANCE: Final = 1e-3


def vector_problem(blob: object, dim: int) -> str | None:
    """Why ``blob`` is not a vector of a ``dim``-dimensional embedder (None: it is one)."""
    if not isinstance(blob, bytes):
        return f"is a {type(blob).__name__}, not float32 bytes"
    if len(blob) != dim * 4:
        return f"is {len(blob)} bytes, but a vector of this embedder is {dim * 4} bytes ({dim} float32 values)"
    vector = np.frombuffer(blob, dtype=np.float32)
    with np.errstate(all="ignore"):
        square = float(vector @ vector)
    if not math.isfinite(square):
        return "holds values that are not finite numbers (NaN or infinity)"
    if square > _UNIT_TOLERANCE and abs(square - 1.0) > _UNIT_TOLERANCE:
        return f"has length {math.sqrt(square):.3g}, but vectors are unit length"
    return None


LOAD_BLOCK: Final = 4096
"""Rows the load checks and copies into the in-memory tables at once: 8 MB of 512-d vectors,
so the checks and the int8 quantization run as a few numpy operations per block instead of
a dozen per row (which took most of a 100k load), while the rows in hand stay a few MB."""


def _blocks(rows: Iterable[T], size: int) -> Iterator[list[T]]:
    """``rows`` in lists of ``size`` (the last one shorter)."""
    it = iter(rows)
    while block := list(itertools.islice(it, size)):
        yield block


def _checked(blobs: Sequence[object], dim: int, problems: set[str]) -> tuple[list[bool], npt.NDArray[np.float32]]:
    """Which of ``blobs`` are good vectors of a ``dim``-dimensional embedder (what
    ``vector_problem`` accepts), and the good ones as one matrix, in order; the problems of
    the others are added to ``problems``."""
    size = dim * 4
    sized = [isinstance(blob, bytes) and len(blob) == size for blob in blobs]
    matrix = np.frombuffer(b"".join(b for b, fits in zip(blobs, sized, strict=True) if fits and isinstance(b, bytes)),
                           dtype=np.float32).reshape(-1, dim)
    with np.errstate(all="ignore"):
        squares = np.einsum("ij,ij->i", matrix, matrix)
    unit = np.isfinite(squares) & ((squares <= _UNIT_TOLERANCE) | (np.abs(squares - 1.0) <= _UNIT_TOLERANCE))
    ok: list[bool] = []
    units = iter(unit.tolist())
    for blob, fits in zip(blobs, sized, strict=True):
        good = fits and next(units)
        if not good:
            problems.add(vector_problem(blob, dim) or "is not a unit vector")
        ok.append(good)
    return ok, matrix[unit]


def effective_profile(profile: ThresholdProfile, settings: Settings) -> ThresholdProfile:
    """The embedder's calibrated profile with any KEYMEM_* overrides applied."""
    changes = {
        name: getattr(settings, name)
        for name in ("key_recall", "key_merge", "short_key_merge")
        if getattr(settings, name) is not None
    }
    if not changes:
        return profile
    from dataclasses import replace

    return replace(profile, **changes)


@dataclass(frozen=True, slots=True)
class KeyCounts:
    """Active memories of each key in a namespace (None = every namespace)."""

    counts: dict[str, int]

    def get(self, key_id: str) -> int:
        return self.counts.get(key_id, 0)


class GraphIndexes:
    """The engine's shared state and its in-memory tables."""

    def __init__(
        self,
        store: Repository,
        embedder: Embedder,
        settings: Settings,
        *,
        clock: Clock = time.time,
        analyzer: Analyzer | None = None,
        reranker: Any = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self.clock = clock
        self.analyzer = analyzer or default_analyzer()
        self.reranker = reranker
        self.profile = effective_profile(embedder.profile, settings)
        self.lives = HalfLives(settings.decay_transient_days, settings.decay_standard_days,
                               settings.decay_stable_days)
        self.keys = KeyIndex(embedder.dim)
        self.bodies = VectorTable(embedder.dim, quantized=True)
        self.counts = ActiveCounts()
        self.namespace_codes: dict[str, int] = {}
        self._codes_lock = threading.Lock()
        self._tables_lock = threading.Lock()
        # The loanwords the lexical index was cut with; the analyzer may know more.
        self.indexed_vocabulary: frozenset[str] = frozenset()
        self.buffer = RecallBuffer(clock)
        self.promotion = PromotionRule(
            promote_n=settings.autokey_promote_n,
            alias_at=self.profile.short_key_merge,
            new_key_at=self.profile.key_autolink,
            confirm_floor=settings.autokey_confirm_floor,
            max_aliases=settings.autokey_max_aliases,
        )
        # Identifies this daemon run in each memory's provenance.
        self.instance = str(uuid.uuid4())
        # What opening the store repaired (duplicate keys, malformed vectors), for status.
        self.repairs: list[str] = []

    def namespace_code(self, namespace: str) -> int:
        code = self.namespace_codes.get(namespace)
        if code is None:
            # The writer's after-commit steps and a shared store's change follower both add codes.
            with self._codes_lock:
                code = self.namespace_codes.setdefault(namespace, len(self.namespace_codes) + 1)
        return code

    def reload_indexes(self) -> None:
        """Rebuild the in-memory key index and body vectors from the store (after an import).
        A change-log batch (``follow_changes``) waits for it, or it for the batch: one applied
        into the half-loaded tables would have its keys' members counted twice, once by the
        batch and once more by the load (a federated import's team half, seen as 3 for 2)."""
        with self._tables_lock:
            self.keys = KeyIndex(self.embedder.dim)
            self.bodies = VectorTable(self.embedder.dim, quantized=True)
            self.counts = ActiveCounts()
            self.load_indexes()

    def load_indexes(self) -> None:
        """Fill the key index, the body table and the member counts from the store.

        Rows are streamed into the preallocated matrices a block at a time (``LOAD_BLOCK``):
        holding every vector blob at once (fetchall) doubled the peak memory of a large
        store, and the process kept that peak as its resident size. A row whose vector is malformed (wrong size,
        NaN, not unit length: an import before imports checked them) is not loaded as it
        is -- it would stop the start or poison every cosine -- but re-embedded from its text
        (``_quarantine``)."""
        started = time.perf_counter()
        dim = self.embedder.dim
        bad_keys: list[tuple[KeyInfo, str]] = []
        bad_bodies: list[tuple[str, str, str, bool]] = []
        problems: set[str] = set()

        def load(reader: Reader) -> tuple[int, int]:
            self.keys.vectors.reserve(reader.key_count())
            keys = 0
            for block in _blocks(reader.stored_keys(), LOAD_BLOCK):
                infos = [info for info, _ in block]
                ok, matrix = _checked([blob for _, blob in block], dim, problems)
                bad_keys.extend((info, info.concept) for info, good in zip(infos, ok, strict=True) if not good)
                self.keys.put_many([info for info, good in zip(infos, ok, strict=True) if good], matrix)
                keys += len(matrix)
            self.bodies.reserve(reader.live_vector_count())
            bodies = 0
            for rows in _blocks(reader.stored_vectors(dim * 4), LOAD_BLOCK):
                ok, matrix = _checked([row[2] for row in rows], dim, problems)
                kept, live = [], []
                for (memory_id, namespace, _, superseded, content), good in zip(rows, ok, strict=True):
                    if not good:
                        text = content if content is not None else reader.memory_content(memory_id)
                        assert text is not None
                        bad_bodies.append((memory_id, namespace, text, superseded))
                        continue
                    live.append(not superseded)
                    if not superseded:
                        kept.append((memory_id, self.namespace_code(namespace)))
                self.bodies.upsert_many([memory_id for memory_id, _ in kept], matrix[np.array(live, dtype=bool)],
                                        np.array([code for _, code in kept], dtype=np.int32))
                bodies += len(kept)
            self.counts.add_counts(reader.unexpiring_counts())
            for memory_id in reader.expiring_ids():
                self.counts.apply(memory_id, None, reader.member_state(memory_id))
            return keys, bodies

        keys, bodies = self.store.load(load)
        if bad_keys or bad_bodies:
            self._quarantine(bad_keys, bad_bodies, problems)
        logger.info("loaded %d keys and %d memory vectors in %.2f s", keys, bodies, time.perf_counter() - started)

    def follow_changes(self, memory_ids: Iterable[str], key_ids: Iterable[str], *, removals: bool) -> None:
        """Bring the in-memory tables in step with writes another daemon committed to a shared
        store (its change log names the memories and keys they touched): each named memory's
        vector is served while it is current and dropped once it is superseded or deleted,
        each named key (and every key of a named memory, whose link count changed) is read
        again, and so are those keys' member counts -- all of them when the writes removed
        memories or links (``removals``), whose keys the log cannot name. Idempotent, so a
        change this daemon made itself, already applied after its commit, does no harm."""
        with self._tables_lock:  # not into tables reload_indexes is filling
            dim = self.embedder.dim
            memory_ids, key_ids = list(dict.fromkeys(memory_ids)), set(key_ids)

            def read(reader: Reader) -> tuple[list[tuple[str, npt.NDArray[np.float32] | None, str]],
                                              list[tuple[str, KeyInfo | None, bytes | None]],
                                              ActiveCounts | Callable[[ActiveCounts], None]]:
                everything = removals
                bodies: list[tuple[str, npt.NDArray[np.float32] | None, str]] = []
                states: dict[str, MemberState | None] = {}
                rows = reader.memory_states(memory_ids)
                for memory_id in memory_ids:
                    if memory_id not in rows:
                        bodies.append((memory_id, None, ""))
                        everything = True  # deleted since: its keys are unknown
                        continue
                    blob, linked, state = rows[memory_id]
                    # Current (not superseded) with a vector of the right size: served.
                    current = state is not None and blob is not None and vector_problem(blob, dim) is None
                    bodies.append((memory_id, vector_from(blob) if current and blob is not None else None,
                                   state.namespace if state is not None else ""))
                    key_ids.update(linked)
                    states[memory_id] = state
                stored = reader.key_rows(sorted(key_ids))
                keys: list[tuple[str, KeyInfo | None, bytes | None]] = [
                    (key_id, *stored.get(key_id, (None, None))) for key_id in sorted(key_ids)]
                if not everything:
                    unexpiring = reader.unexpiring_counts(sorted(key_ids))
                    return bodies, keys, lambda tracked: tracked.recount(key_ids, unexpiring, states)
                counts = ActiveCounts()
                counts.add_counts(reader.unexpiring_counts())
                for memory_id in reader.expiring_ids():
                    counts.apply(memory_id, None, reader.member_state(memory_id))
                return bodies, keys, counts

            bodies, keys, counts = self.store.read(read)
            # Each write of this daemon the read saw committed moves the tables first: these
            # counts replace what it did, and no delta of its lands on them after.
            self.store.wait_for_commits()
            for memory_id, vector, namespace in bodies:
                if vector is None:
                    self.bodies.remove(memory_id)
                else:
                    self.bodies.upsert(memory_id, vector, self.namespace_code(namespace))
            for key_id, info, blob in keys:
                if info is None:
                    self.keys.remove(key_id)
                elif blob is not None and vector_problem(blob, dim) is None:
                    self.keys.put(info, vector_from(blob))
                else:
                    self.keys.put(info)
            if isinstance(counts, ActiveCounts):
                self.counts = counts
            else:
                counts(self.counts)

    def _quarantine(self, bad_keys: Sequence[tuple[KeyInfo, str]], bad_bodies: Sequence[tuple[str, str, str, bool]],
                    problems: set[str]) -> None:
        """Re-embed the keys and memories whose stored vector is malformed, from their text,
        and say so (log and ``repairs``)."""
        vectors = self.embedder.embed([text for _, text in bad_keys] + [text for _, _, text, _ in bad_bodies])
        key_vectors, body_vectors = vectors[:len(bad_keys)], vectors[len(bad_keys):]
        key_rows = [(vector_bytes(v), info.id) for (info, _), v in zip(bad_keys, key_vectors, strict=True)]
        body_rows = [(vector_bytes(v), mid) for (mid, *_), v in zip(bad_bodies, body_vectors, strict=True)]

        def update(writer: Writer) -> None:
            writer.set_key_vectors(key_rows)
            writer.set_memory_vectors(body_rows)

        self.store.write(update)
        for (info, _), vector in zip(bad_keys, key_vectors, strict=True):
            self.keys.put(info, vector)
        for (memory_id, namespace, _, superseded), vector in zip(bad_bodies, body_vectors, strict=True):
            if not superseded:
                self.bodies.upsert(memory_id, vector, self.namespace_code(namespace))
        ids = [info.id for info, _ in bad_keys] + [mid for mid, *_ in bad_bodies]
        note = (f"{len(bad_keys)} key vector(s) and {len(bad_bodies)} memory vector(s) in the store were malformed "
                f"(a vector {'; another '.join(sorted(problems))}); they were re-embedded from their text "
                f"(ids: {', '.join(ids[:REPAIR_IDS_SHOWN])}{' ...' if len(ids) > REPAIR_IDS_SHOWN else ''})")
        logger.warning("%s", note)
        self.repairs.append(note)

    def load_vocabulary(self) -> None:
        """Teach the analyzer the loanwords this store learned. A store that never listed
        them (made before keymem learned loanwords) is searched for them once."""
        value = self.store.read(lambda reader: reader.meta_value(VOCABULARY_META))
        listed = _word_list(value) if value is not None else None
        if listed is None:
            if value is not None:
                logger.warning("the store's list of learned loanwords is unreadable; looking for them again")
            self.analyzer.learn(self.store.read(self._stored_loanwords))
        else:
            self.indexed_vocabulary = frozenset(listed)
            self.analyzer.learn(self.indexed_vocabulary)
        if listed is None or self.analyzer.learned - self.indexed_vocabulary:
            self.store.write(lambda writer: self.sync_vocabulary(writer, save=True))

    def _stored_loanwords(self, reader: Reader) -> list[str]:
        found: set[str] = set()
        for key_id, concept in reader.key_concepts():
            if not has_hangul(concept) or not self.analyzer.misread([concept]):
                continue
            # A few of its memories tell whether a Latin word beside it sounds the same.
            for content, keys in reader.loanword_evidence(key_id, LOANWORD_EVIDENCE):
                words = self.analyzer.loanwords(keys, content)
                if words:
                    found.update(words)
                    break
        return sorted(found)

    def sync_vocabulary(self, writer: Writer, *, save: bool = False) -> None:
        """Bring the lexical index up to the analyzer's vocabulary: the text of memories and
        keys holding a word it learned since (in this store, or in another one this process
        opened) is cut differently now, so it is indexed again."""
        learned = self.analyzer.learned
        missing = learned - self.indexed_vocabulary
        if not missing and not save:
            return
        forms = sorted({form for w in missing for form in (w, unicodedata.normalize("NFD", w))})
        memory_ids = writer.indexed_holding(forms)
        touched: set[str] = set()
        for key_id, concept in writer.keys_holding(forms):
            writer.set_key_compact(key_id, self.analyzer.compact(concept))
            touched.add(key_id)
        for key_id, alias in writer.aliases_holding(forms):
            writer.set_alias_compact(key_id, alias, self.analyzer.compact(alias))
            touched.add(key_id)
        for memory_id in memory_ids:
            self.index_memory(writer, memory_id)
        linked = set(writer.memories_linked_to(sorted(touched)))
        self.reindex_keys_of(writer, linked - memory_ids)
        writer.set_meta({VOCABULARY_META: json.dumps(sorted(learned), ensure_ascii=False)})
        infos = [writer.key_info(key_id) for key_id in touched]
        if memory_ids or linked or touched:
            logger.info("re-indexed %d memories and %d keys holding learned word(s): %s",
                        len(memory_ids | linked), len(touched), ", ".join(sorted(missing)))

        def apply() -> None:
            self.indexed_vocabulary = learned
            for info in infos:
                self.keys.put_written(info, 0)

        writer.after_commit(apply)

    def key_counts(self, key_ids: Iterable[str], namespaces: Iterable[str] | str | None, now: float) -> KeyCounts:
        """Active memories of each key in a namespace, a set of them, or all (None)."""
        return KeyCounts(self.counts.get_many(key_ids, namespaces, now))

    @contextlib.contextmanager
    def counting(self, writer: Writer, memory_ids: Sequence[str]) -> Iterator[list[str]]:
        """Report how the listed memories' key contributions change inside this block (more
        ids may be appended to the yielded list while it runs; they count from empty)."""
        ids = list(memory_ids)
        before = {mid: writer.member_state(mid) for mid in ids}
        yield ids
        for mid in dict.fromkeys(ids):
            old, new = before.get(mid), writer.member_state(mid)
            if old != new:
                writer.after_commit(functools.partial(self.counts.apply, mid, old, new))

    def token_stats(self, tokens: Iterable[str]) -> tuple[dict[str, int], int]:
        """How many active memories contain each token, and how many there are."""
        unique = list(dict.fromkeys(tokens))
        if not unique:
            return {}, len(self.bodies)
        return self.store.read(lambda reader: reader.document_frequencies(unique)), len(self.bodies)

    def idf(self, key_id: str) -> float:
        """1 for a key on one memory, 1/n on n (all namespaces, history included); entities
        count half, since a name key says who, not what."""
        info = self.keys.get(key_id)
        return 0.0 if info is None else key_idf(info.link_count, entity=info.is_entity)

    def concept(self, key_id: str) -> str:
        info = self.keys.get(key_id)
        return info.concept if info is not None else key_id

    def _key_tokens_of(self, reader: Reader, memory_id: str, likely: Sequence[str] | None = None) -> str:
        return " ".join(t for text in reader.key_texts_of(memory_id, likely=likely)
                        for t in self.analyzer.key_tokens(text))

    def index_memory(self, writer: Writer, memory_id: str, content_tokens: str | None = None,
                     likely_key_texts: Sequence[str] | None = None) -> None:
        """``likely_key_texts``: the memory's key texts as the caller knows them (``key_texts_of``)."""
        if content_tokens is None:
            content = writer.memory_content(memory_id)
            assert content is not None
            content_tokens = " ".join(self.analyzer.index_tokens(content))
        writer.index_memory(memory_id, content_tokens, self._key_tokens_of(writer, memory_id, likely_key_texts))

    def reindex_keys_of(self, writer: Writer, memory_ids: Iterable[str]) -> None:
        for memory_id in memory_ids:
            if writer.is_current(memory_id):
                writer.set_key_tokens(memory_id, self._key_tokens_of(writer, memory_id))

    def unindex(self, writer: Writer, memory: Memory) -> None:
        writer.unindex(memory.rowid)
        writer.after_commit(lambda: self.bodies.remove(memory.id))
