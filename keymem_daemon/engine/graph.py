"""The memory graph: keys and memories linked N:M, on SQLite, with every write operation.

``MemoryGraph`` owns the store, the in-memory key index and body-vector table, and the
embedder. Each write (remember, correct, confirm, dismiss, forget, a read's reinforcement,
cleanup, import) is one ``Store.write`` transaction; the in-memory tables change in its
after-commit step. Embeddings are computed before the transaction starts, so the writer
thread never waits for a model. Retrieval (recall, hybrid recall, the push path) lives in
``retrieval.py`` and reads through the same graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import re
import secrets
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from keymem_daemon.config import Settings
from keymem_daemon.engine import autokey
from keymem_daemon.engine.autokey import PromotionRule, RecallBuffer
from keymem_daemon.engine.freshness import (
    HalfLives,
    Validity,
    freshness,
    parse_decay_profile,
    rank_factor,
    validity,
)
from keymem_daemon.engine.keys import (
    FEW_KEYS_NOTE,
    KEY_TYPES,
    LANGUAGE_NOTE,
    PHRASE_NOTE,
    PHRASE_TOKENS,
    ActiveCounts,
    KeyIndex,
    KeyInfo,
    KeyType,
    PendingKey,
    conflicting_qualifiers,
    cross_script,
    language_uniform,
    sanitize_keys,
)
from keymem_daemon.engine.limits import IDEMPOTENCY_TTL_SECONDS, MAX_TTL_SECONDS
from keymem_daemon.engine.links import (
    CORRECT_PENALTY,
    DISMISS,
    EXPLORED_DECAY,
    HOP_REINFORCE,
    LINK_DEFAULT,
    LINK_MAX,
    LINK_MIN,
    REINFORCE,
    clamp_weight,
    dismissed_weight,
    inherited_weight,
    reinforced_weight,
)
from keymem_daemon.engine.ports import KeyRow, MemoryRow, Reader, Writer
from keymem_daemon.engine.records import (
    BatchItem,
    BatchResult,
    BrowseResult,
    CleanupResult,
    ConfirmResult,
    CorrectResult,
    DismissResult,
    ForgetResult,
    Handle,
    Hints,
    IdempotencyKey,
    KeyRef,
    KeyView,
    LinkedKey,
    ListedMemory,
    ListResult,
    Memory,
    MemoryView,
    NewMemory,
    ReadKeyResult,
    ReadMemoryResult,
    Redacted,
    RelatedItem,
    RememberResult,
    Replayed,
    Stats,
    dumps,
    render,
)
from keymem_daemon.engine.redact import redact
from keymem_daemon.engine.text import (
    Analyzer,
    default_analyzer,
    has_hangul,
    normalize,
    normalize_namespace,
    script_of,
)
from keymem_daemon.engine.vectors import VectorTable, top_indices
from keymem_daemon.errors import IdempotencyKeyReused, InvalidInput, NotFound, Refused, StoreError
from keymem_daemon.inference.embedders import Embedder, ThresholdProfile

if TYPE_CHECKING:
    # Transitional: ``store`` is typed as the SQLite store while modules outside this one still
    # hand ``store.read`` callbacks typed ``sqlite3.Connection``; it becomes ``ports.Repository``.
    from keymem_daemon.store.sqlite.database import Store

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Transitional: what count_active/batch_siblings/related_ids take. retrieval.py still annotates
# the snapshot ``Store.read`` hands it as ``sqlite3.Connection``; it becomes ``ports.Reader``.
SnapshotArg = Reader | Any
Clock = Callable[[], float]

# Re-exported for retrieval.py until it imports them from engine.links.
__all__ = ["CORRECT_PENALTY", "DISMISS", "EXPLORED_DECAY", "HOP_REINFORCE", "LINK_DEFAULT", "LINK_MAX", "LINK_MIN",
           "REINFORCE", "clamp_weight"]

# How much deeper one confirmation makes a memory: twenty confirmations take it from 0 to 1.
CONFIRM_DEPTH: Final = 0.05
# A memory this deep was established; superseding it keeps most of its depth (DEEP_KEEP), so
# the history of a well-confirmed fact stays findable; a shallow one keeps little (SHALLOW_KEEP).
DEEP_DEPTH: Final = 0.7
DEEP_KEEP: Final = 0.8
SHALLOW_KEEP: Final = 0.3
EVIDENCE_KINDS: Final = ("user", "authoritative_source", "observation")
ID_PATTERN: Final = re.compile(r"^[0-9a-f]{12}$")
MAX_SOURCE_CHARS: Final = 4000
"""The provenance a caller may attach to a write (``source``), as JSON."""
MAX_STORED_SOURCE_CHARS: Final = MAX_SOURCE_CHARS + 1000
"""A stored ``source``: the caller's plus the stamp keymem adds (session, tool, time, host,
batch id: about 300 characters)."""
# The meta row listing the loanwords the store's index was cut with (``Analyzer.learn``).
VOCABULARY_META: Final = "learned_words"
# The fingerprint of a store whose re-embedding for a new model has begun but not ended.
PARTIAL: Final = "partial:"
# The meta rows of a re-embedding in progress (``reembed_keys_done``: the last rowid done).
REEMBED_META: Final = "reembed_"
# Texts embedded per re-embedding transaction: a batch the model runs efficiently, and a chunk
# small enough that a kill loses seconds of work, not minutes.
REEMBED_CHUNK: Final = 256
# Memories of a Hangul key read to tell whether it is a loanword: one that shows it suffices,
# and a hub's thousands would make opening an old store slow.
LOANWORD_EVIDENCE: Final = 20
# The shortest query autokey learns from: a single character says too little.
MIN_ALIAS_CHARS: Final = 2
# A learned alias re-indexes the key's memories; a hub's beyond this many keep the old tokens
# until their next write (the write stays one short transaction).
ALIAS_REINDEX_LIMIT: Final = 5000
# related(): the members of each shared key looked at (bounds the work on a hub).
RELATED_PER_KEY: Final = 2000
# related(): an explicit relation counts as much as a key the two memories alone share.
EXPLICIT_RELATION_SCORE: Final = 1.0


def new_id() -> str:
    return secrets.token_hex(6)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _word_list(value: str) -> list[str] | None:
    """A JSON list of words as the meta table keeps it, or None if it is not one."""
    try:
        words = json.loads(value)
    except ValueError:
        return None
    if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
        return None
    return words


def dedup_hash(content: str) -> str:
    return hashlib.sha256(normalize(content).encode()).hexdigest()[:32]


def superseded_depth_factor(depth: float) -> float:
    """How much of its depth a memory keeps when a correction supersedes it."""
    return DEEP_KEEP if depth >= DEEP_DEPTH else SHALLOW_KEEP


def _open_sqlite(path: Path, settings: Settings) -> Store:
    """The SQLite store at ``path`` (the one place the engine names a store implementation)."""
    from keymem_daemon.store.sqlite.database import Store

    return Store.open(path, backup_dir=settings.backup_dir)


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


def parse_observed_at(value: object, *, field: str = "observed_at") -> float | None:
    """An ISO-8601 date or datetime, or epoch seconds; naive times are taken as UTC."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(f"{field} must be an ISO-8601 date/time or epoch seconds", field=field)
    if isinstance(value, int | float):
        if not np.isfinite(value) or value < 0:
            raise InvalidInput(f"{field} must be a finite, non-negative epoch time", field=field)
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput(
                f"{field} is not an ISO-8601 date/time: {text[:40]!r} (e.g. 2023-05-08 or "
                "2023-05-08T13:56:00Z)", field=field) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.timestamp()
    raise InvalidInput(f"{field} must be an ISO-8601 date/time or epoch seconds", field=field)


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
class Host:
    """Who is calling: the host agent, its session, its turn and cwd (from request headers)."""

    agent: str | None = None
    session: str | None = None
    turn: int | None = None
    cwd: str | None = None

    @property
    def confirmation_id(self) -> str | None:
        if self.agent and self.session:
            return f"{self.agent}:{self.session}:{self.turn if self.turn is not None else 0}"
        return None


@dataclass(frozen=True, slots=True)
class KeyCounts:
    """Active memories of each key in a namespace (None = every namespace)."""

    counts: dict[str, int]

    def get(self, key_id: str) -> int:
        return self.counts.get(key_id, 0)


@dataclass(slots=True)
class _BatchKeys:
    """The keys one write transaction has resolved so far: those it created (not in the index
    until COMMIT), and every key text it used, normalised, with the key it landed on."""

    pending: list[PendingKey] = dataclasses.field(default_factory=list)
    by_norm: dict[str, str] = dataclasses.field(default_factory=dict)


class MemoryGraph:
    """The engine. Thread-safe: writes go through the store's writer, reads are snapshots."""

    def __init__(
        self,
        store: Store,
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
        self._namespace_codes: dict[str, int] = {}
        # The loanwords the lexical index was cut with; the analyzer may know more.
        self._vocabulary: frozenset[str] = frozenset()
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

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        embedder: Embedder,
        settings: Settings,
        *,
        clock: Clock = time.time,
        analyzer: Analyzer | None = None,
        reranker: Any = None,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> MemoryGraph:
        return cls.over(_open_sqlite(path, settings), embedder, settings, clock=clock, analyzer=analyzer,
                        reranker=reranker, progress=progress)

    @classmethod
    def over(
        cls,
        store: Store,
        embedder: Embedder,
        settings: Settings,
        *,
        clock: Clock = time.time,
        analyzer: Analyzer | None = None,
        reranker: Any = None,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> MemoryGraph:
        """The engine over an opened store (``open``'s SQLite file, or any ``ports.Repository``
        such as the fast test tier's in-memory one), once its embedding space, vocabulary,
        keys and in-memory indexes are checked and loaded; the store is closed if that fails."""
        try:
            graph = cls(store, embedder, settings, clock=clock, analyzer=analyzer, reranker=reranker)
            graph._ensure_embedding_space(progress)
            graph._load_vocabulary()
            graph._merge_duplicate_keys()
            graph._load_indexes()
        except BaseException:
            store.close()
            raise
        return graph

    def close(self) -> None:
        self.store.close()

    def namespace_code(self, namespace: str) -> int:
        code = self._namespace_codes.get(namespace)
        if code is None:
            code = self._namespace_codes[namespace] = len(self._namespace_codes) + 1
        return code

    def reload_indexes(self) -> None:
        """Rebuild the in-memory key index and body vectors from the store (after an import)."""
        self.keys = KeyIndex(self.embedder.dim)
        self.bodies = VectorTable(self.embedder.dim, quantized=True)
        self.counts = ActiveCounts()
        self._load_indexes()

    def _load_indexes(self) -> None:
        """Fill the key index, the body table and the member counts from the store.

        Rows are streamed straight into the preallocated matrices: holding every vector
        blob at once (fetchall) doubled the peak memory of a large store, and the process
        kept that peak as its resident size. A row whose vector is malformed (wrong size,
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
            for info, blob in reader.stored_keys():
                problem = vector_problem(blob, dim)
                if problem is not None:
                    bad_keys.append((info, info.concept))
                    problems.add(problem)
                    continue
                assert isinstance(blob, bytes)
                self.keys.put(info, vector_from(blob))
                keys += 1
            self.bodies.reserve(reader.live_vector_count())
            bodies = 0
            for memory_id, namespace, blob, superseded, content in reader.stored_vectors(dim * 4):
                problem = vector_problem(blob, dim)
                if problem is not None:
                    text = content if content is not None else reader.memory_content(memory_id)
                    assert text is not None
                    bad_bodies.append((memory_id, namespace, text, superseded))
                    problems.add(problem)
                elif not superseded:
                    assert isinstance(blob, bytes)
                    self.bodies.upsert(memory_id, vector_from(blob), self.namespace_code(namespace))
                    bodies += 1
            self.counts.add_counts(reader.unexpiring_counts())
            for memory_id in reader.expiring_ids():
                self.counts.apply(memory_id, None, reader.member_state(memory_id))
            return keys, bodies

        keys, bodies = self.store.read(load)
        if bad_keys or bad_bodies:
            self._quarantine(bad_keys, bad_bodies, problems)
        logger.info("loaded %d keys and %d memory vectors in %.2f s", keys, bodies, time.perf_counter() - started)

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
                f"(ids: {', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''})")
        logger.warning("%s", note)
        self.repairs.append(note)

    def _merge_duplicate_keys(self) -> None:
        """One-time repair: keys with the same normalised text become one. Before
        ``remember_batch`` resolved keys against those its own earlier items created, a batch
        whose items shared a new key made one key per item. The oldest key stays; the others'
        links (the stronger weight wins), aliases and alias candidates move to it."""
        groups = self.store.read(lambda reader: reader.duplicate_key_norms())
        if not groups:
            return

        def merge(writer: Writer) -> tuple[int, int]:
            merged = 0
            memories: set[str] = set()
            for norm in groups:
                removed, relinked = writer.merge_keys_named(norm)
                merged += removed
                memories |= relinked
            self._reindex_keys_of(writer, sorted(memories))
            return merged, len(memories)

        merged, relinked = self.store.write(merge)
        note = (f"merged {merged} duplicate key(s) into {len(groups)} (keys with the same text, as remember_batch "
                f"made them before it shared new keys between its items); {relinked} memories relinked")
        logger.warning("%s", note)
        self.repairs.append(note)

    def _ensure_embedding_space(self, progress: Callable[[str, int, int], None] | None) -> None:
        """Stamp a new store with the embedder's fingerprint; re-embed when it changed."""
        stored = self.store.read(lambda reader: reader.meta())
        fingerprint = stored.get("embedder_fingerprint")
        if fingerprint == self.embedder.fingerprint:
            return
        count = self.store.read(lambda reader: reader.key_count())
        if fingerprint is not None and count:
            if not self.settings.auto_migrate:
                was = (f"half re-embedded for {fingerprint.removeprefix(PARTIAL)}"
                       if fingerprint.startswith(PARTIAL) else f"embedded with {fingerprint}")
                raise StoreError(
                    f"the store was {was} but the embedder is now "
                    f"{self.embedder.fingerprint}; set KEYMEM_AUTO_MIGRATE=true to re-embed its "
                    f"{count} keys once (a backup is taken first), or switch the model back"
                )
            self._reembed(fingerprint, stored, progress)

        def stamp(writer: Writer) -> None:
            writer.set_meta({"embedder_fingerprint": self.embedder.fingerprint,
                             "embedder_dim": str(self.embedder.dim)})
            writer.delete_meta_prefixed(REEMBED_META)

        self.store.write(stamp)

    def _reembed(self, old: str, stored: Mapping[str, str],
                 progress: Callable[[str, int, int], None] | None) -> None:
        """Embed every key and memory body again, a chunk per transaction. Before the first
        chunk the store is marked as half re-embedded (``PARTIAL`` + the new fingerprint), so
        a start that is interrupted -- a kill, a crash -- is never taken for a store in one
        embedding space: the next start with the same model resumes after the last chunk
        written, and one with any other model (the old one too) embeds everything again."""
        fingerprint = self.embedder.fingerprint
        done_at = {kind: int(stored.get(f"{REEMBED_META}{kind}_done", "0")) for kind in ("keys", "memories")}
        if old == PARTIAL + fingerprint:
            logger.info("resuming the re-embedding for %s where it stopped", fingerprint)
        else:
            done_at = dict.fromkeys(done_at, 0)
            tag = re.sub(r"[^A-Za-z0-9._-]", "_", old)
            backup = self.settings.backup_dir / f"keymem-before-reembed-{tag}-{int(self.clock())}.db"
            self.store.backup_to(backup)
            logger.info("embedder changed (%s -> %s): backed up to %s, re-embedding", old, fingerprint, backup)
            self.store.write(lambda writer: writer.set_meta({
                "embedder_fingerprint": PARTIAL + fingerprint, f"{REEMBED_META}keys_done": "0",
                f"{REEMBED_META}memories_done": "0"}))

        work = {
            "keys": self.store.read(lambda reader: reader.keys_after(done_at["keys"])),
            "memories": self.store.read(lambda reader: reader.vectors_after(done_at["memories"])),
        }
        total = sum(len(rows) for rows in work.values())
        done = 0
        for kind, rows in work.items():
            for start in range(0, len(rows), REEMBED_CHUNK):
                chunk = rows[start:start + REEMBED_CHUNK]
                vectors = self.embedder.embed([r[2] for r in chunk])
                pairs = [(vector_bytes(v), r[1]) for r, v in zip(chunk, vectors, strict=True)]

                def update(writer: Writer, pairs: list[tuple[bytes, str]] = pairs, kind: str = kind,
                           last: int = chunk[-1][0]) -> None:
                    if kind == "keys":
                        writer.set_key_vectors(pairs)
                    else:
                        writer.set_memory_vectors(pairs)
                    writer.set_meta({f"{REEMBED_META}{kind}_done": str(last)})

                self.store.write(update)
                done += len(chunk)
                if progress is not None:
                    progress(kind, done, total)
            logger.info("re-embedded %d %s", len(rows), kind)

    def _load_vocabulary(self) -> None:
        """Teach the analyzer the loanwords this store learned. A store that never listed
        them (made before keymem learned loanwords) is searched for them once."""
        value = self.store.read(lambda reader: reader.meta_value(VOCABULARY_META))
        listed = _word_list(value) if value is not None else None
        if listed is None:
            if value is not None:
                logger.warning("the store's list of learned loanwords is unreadable; looking for them again")
            self.analyzer.learn(self.store.read(self._stored_loanwords))
        else:
            self._vocabulary = frozenset(listed)
            self.analyzer.learn(self._vocabulary)
        if listed is None or self.analyzer.learned - self._vocabulary:
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
        missing = learned - self._vocabulary
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
        self._reindex_keys_of(writer, linked - memory_ids)
        writer.set_meta({VOCABULARY_META: json.dumps(sorted(learned), ensure_ascii=False)})
        infos = [writer.key_info(key_id) for key_id in touched]
        if memory_ids or linked or touched:
            logger.info("re-indexed %d memories and %d keys holding learned word(s): %s",
                        len(memory_ids | linked), len(touched), ", ".join(sorted(missing)))

        def apply() -> None:
            self._vocabulary = learned
            for info in infos:
                self.keys.put(info)

        writer.after_commit(apply)

    # -- small shared reads ---------------------------------------------------------------

    def validity_of(self, memory: Memory) -> Validity:
        return validity(memory.decay_profile, memory.last_confirmed_at, memory.confirmation_count,
                        self.clock(), self.lives)

    def rank_factor_of(self, memory: Memory, now: float) -> float:
        return rank_factor(freshness(memory.decay_profile, memory.last_confirmed_at, now, self.lives))

    def key_counts(self, key_ids: Iterable[str], namespaces: Iterable[str] | str | None, now: float) -> KeyCounts:
        """Active memories of each key in a namespace, a set of them, or all (None)."""
        return KeyCounts(self.counts.get_many(key_ids, namespaces, now))

    @contextlib.contextmanager
    def _counting(self, writer: Writer, memory_ids: Sequence[str]) -> Iterator[list[str]]:
        """Report how the listed memories' key contributions change inside this block (more
        ids may be appended to the yielded list while it runs; they count from empty)."""
        ids = list(memory_ids)
        before = {mid: writer.member_state(mid) for mid in ids}
        yield ids
        for mid in dict.fromkeys(ids):
            old, new = before.get(mid), writer.member_state(mid)
            if old != new:
                writer.after_commit(functools.partial(self.counts.apply, mid, old, new))

    def count_active(self, reader: SnapshotArg, namespace: str | None, now: float) -> int:
        """Active memories in a namespace (None: in all of them)."""
        return reader.count_active(namespace, now)

    def key_view(self, info: KeyInfo, count: int, learned: Sequence[str] = ()) -> KeyView:
        return KeyView(
            key_id=info.id, concept=info.concept, aliases=list(info.aliases),
            learned_aliases=list(learned), key_type=info.key_type, memory_count=count,
            is_hub=count >= self.settings.hub_min_links,
            specificity=round(1.0 / count, 3) if count else 0.0,
        )

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
        if info is None:
            return 0.0
        value = 1.0 if info.link_count <= 1 else 1.0 / info.link_count
        return value * 0.5 if info.is_entity else value

    def batch_siblings(self, reader: SnapshotArg, memory: Memory, now: float) -> list[str] | None:
        batch = memory.batch_id
        if batch is None:
            return None
        return reader.batch_siblings(batch, memory, now) or None

    def related_ids(self, reader: SnapshotArg, memory_id: str) -> list[str]:
        return reader.related_ids(memory_id)

    def resolve_namespace(self, namespace: object, *, field: str = "namespace") -> str | None:
        if namespace is None:
            return None
        if not isinstance(namespace, str):
            raise InvalidInput(f"{field} must be a string", field=field)
        return normalize_namespace(namespace) if namespace.strip() else None

    def active_memory(self, reader: Reader, memory_id: str, namespace: str | None,
                      now: float) -> Memory:
        """The memory, if it is active and in ``namespace``; ``NotFound``/``Refused`` otherwise."""
        memory = reader.memory(memory_id) if isinstance(memory_id, str) else None
        if memory is None or memory.expired(now) or (namespace is not None and memory.namespace != namespace):
            raise NotFound(f"Memory {memory_id} not found")
        if memory.superseded_by is not None:
            raise Refused(f"Memory {memory_id} was superseded by {memory.superseded_by}")
        return memory

    # -- provenance -----------------------------------------------------------------------

    def stamp(self, tool: str, host: Host | None, caller: Mapping[str, Any] | None,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{session, tool, saved_at, [host_*], ...}``; the caller's own fields win."""
        source: dict[str, Any] = {"session": self.instance, "tool": tool, "saved_at": iso(self.clock())}
        if host is not None and host.agent and host.session:
            source.update(host_agent=host.agent, host_session=host.session, host_turn=host.turn or 0)
        if extra:
            source.update(extra)
        if caller:
            source.update(caller)
        return source

    # -- validation of write requests -----------------------------------------------------

    def prepare(
        self,
        *,
        content: object,
        keys: object,
        key_types: object = None,
        namespace: object = None,
        ttl_seconds: object = None,
        decay_profile: object = None,
        related_to: object = None,
        source: object = None,
        observed_at: object = None,
        require_keys: bool = True,
    ) -> NewMemory:
        """Validate one write request; every failure names its field and changes nothing."""
        if not isinstance(content, str):
            raise InvalidInput("content must be a string", field="content")
        if not content.strip():
            raise InvalidInput("content is empty", field="content")
        if len(content) > self.settings.max_content_chars:
            raise InvalidInput(
                f"content is {len(content)} characters; the limit is {self.settings.max_content_chars} "
                "(store the gist, or split it into several memories)", field="content")
        clean, found = redact(content)
        sanitized = sanitize_keys(keys) if keys is not None else None
        clean_keys = [redact(k)[0] for k in sanitized.keys] if sanitized is not None else []
        if require_keys and not clean_keys:
            raise Refused(
                "keys required: no usable key survived sanitizing (need 1+ CJK character, or 2+ "
                "visible characters otherwise). Nothing was saved -- a keyless memory can never be recalled.")
        types: dict[str, KeyType] = {}
        if key_types is not None:
            if isinstance(key_types, str):
                try:
                    key_types = json.loads(key_types)
                except json.JSONDecodeError:
                    raise InvalidInput("key_types is not a JSON object", field="key_types") from None
            if not isinstance(key_types, dict):
                raise InvalidInput("key_types must be an object mapping a key to its type", field="key_types")
            norms = {normalize(k): k for k in clean_keys}
            for name, kind in key_types.items():
                if kind not in KEY_TYPES:
                    raise InvalidInput(f"key_types[{name!r}] must be one of {', '.join(KEY_TYPES)}",
                                       field="key_types")
                target = norms.get(normalize(str(name)))
                if target is not None:
                    types[target] = kind
        ns = normalize_namespace(namespace if isinstance(namespace, str) else None)
        if namespace is not None and not isinstance(namespace, str):
            raise InvalidInput("namespace must be a string", field="namespace")
        ttl = None
        if ttl_seconds is not None:
            if isinstance(ttl_seconds, str):
                try:
                    ttl_seconds = float(ttl_seconds)
                except ValueError:
                    raise InvalidInput("ttl_seconds must be a number of seconds", field="ttl_seconds") from None
            if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float) \
                    or (isinstance(ttl_seconds, float) and not math.isfinite(ttl_seconds)):
                raise InvalidInput("ttl_seconds must be a finite number of seconds", field="ttl_seconds")
            # Compared as given: a huge int never passes through float (which would overflow).
            if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
                raise InvalidInput(
                    f"ttl_seconds must be more than 0 and at most {MAX_TTL_SECONDS} (100 years); omit it "
                    "for a memory that never expires", field="ttl_seconds")
            ttl = float(ttl_seconds)
        profile = parse_decay_profile(decay_profile)
        related: list[str] = []
        if related_to is not None:
            if isinstance(related_to, str):
                try:
                    related_to = json.loads(related_to) if related_to.strip().startswith("[") else [related_to]
                except json.JSONDecodeError:
                    raise InvalidInput("related_to is not a JSON array", field="related_to") from None
            if not isinstance(related_to, list) or not all(isinstance(r, str) for r in related_to):
                raise InvalidInput("related_to must be an array of memory ids", field="related_to")
            related = list(dict.fromkeys(related_to))
        if source is not None:
            if isinstance(source, str):
                try:
                    source = json.loads(source)
                except json.JSONDecodeError:
                    raise InvalidInput("source is not a JSON object", field="source") from None
            if not isinstance(source, dict):
                raise InvalidInput("source must be an object", field="source")
            if len(json.dumps(source)) > MAX_SOURCE_CHARS:
                raise InvalidInput(f"source is larger than {MAX_SOURCE_CHARS} characters", field="source")
        return NewMemory(
            content=clean, keys=clean_keys, key_types=types, namespace=ns, ttl_seconds=ttl,
            decay_profile=profile, related_to=related, source=source,
            observed_at=parse_observed_at(observed_at), redacted=[Redacted(r.kind, r.count) for r in found],
            dropped_keys=sanitized.dropped if sanitized is not None else [],
        )

    # -- writes: remember -----------------------------------------------------------------

    def remember(self, request: NewMemory, *, host: Host | None = None,
                 idempotency_key: IdempotencyKey | None = None) -> RememberResult | Replayed:
        prepared = self._embed_request(request)
        source = self.stamp("remember", host, request.source)

        def write(writer: Writer) -> RememberResult | Replayed:
            replay = self._replay(writer, idempotency_key)
            if replay is not None:
                return replay
            saved, deduplicated, refs = self._store_memory(writer, request, prepared, source)
            result = RememberResult(
                saved=saved,
                deduplicated=True if deduplicated else None,
                note=(f"Identical memory already existed (id: {saved}) -- linked your keys to it and "
                      "counted it as confirmed instead of storing a duplicate.") if deduplicated else None,
                redacted=request.redacted or None,
                dropped_keys=request.dropped_keys or None,
                keys=refs,
            )
            self._record(writer, idempotency_key, result)
            return result

        result = self.store.write(write)
        saved = result.result.get("saved") if isinstance(result, Replayed) else result.saved
        # Hints are read-only advice computed after the commit, so a replayed write (the shim's
        # retry after a daemon restart) gets them too, from the graph as it is now.
        hints = self.write_hints(saved, request.keys) if isinstance(saved, str) else None
        if hints is None:
            return result
        if isinstance(result, Replayed):
            return Replayed({**result.result, "hints": render(hints)})
        return dataclasses.replace(result, hints=hints)

    def remember_batch(self, items: Sequence[NewMemory | InvalidInput], *, host: Host | None = None,
                       idempotency_key: IdempotencyKey | None = None) -> BatchResult | Replayed:
        """Store every valid item in one transaction; an invalid item is reported, not stored."""
        batch_id = str(uuid.uuid4()) if len(items) > 1 else None
        prepared = [None if isinstance(i, InvalidInput) else self._embed_request(i) for i in items]

        def write(writer: Writer) -> BatchResult | Replayed:
            replay = self._replay(writer, idempotency_key)
            if replay is not None:
                return replay
            out: list[BatchItem] = []
            # Keys an earlier item created are not in the index before COMMIT: share them.
            batch_keys = _BatchKeys()
            for index, (item, vectors) in enumerate(zip(items, prepared, strict=True)):
                if isinstance(item, InvalidInput) or vectors is None:
                    error = item if isinstance(item, InvalidInput) else InvalidInput("invalid item")
                    out.append(BatchItem(index=index, error=error.message, field=error.field))
                    continue
                source = self.stamp("remember_batch", host, item.source,
                                    {"batch_id": batch_id} if batch_id else None)
                try:
                    saved, dedup, _ = self._store_memory(writer, item, vectors, source, batch_keys)
                except InvalidInput as exc:
                    # Raised before the item wrote anything (its references are checked first).
                    out.append(BatchItem(index=index, error=exc.message, field=exc.field))
                    continue
                out.append(BatchItem(index=index, saved=saved, deduplicated=dedup,
                                     redacted=item.redacted or None))
            ok = sum(1 for i in out if i.saved)
            result = BatchResult(saved=ok, failed=len(out) - ok, items=out, batch_id=batch_id if ok else None)
            self._record(writer, idempotency_key, result)
            return result

        return self.store.write(write)

    def _replay(self, reader: Reader, idempotency: IdempotencyKey | None) -> Replayed | None:
        """The stored answer of the request this key first came with; the same key on a
        different request is refused (replaying would drop that request silently)."""
        if idempotency is None:
            return None
        found = reader.idempotent_result(idempotency.key)
        if found is None:
            return None
        answer, fingerprint = found
        # A row recorded before fingerprints were stored (NULL) can only be replayed.
        if fingerprint is not None and fingerprint != idempotency.fingerprint:
            raise IdempotencyKeyReused(
                f"Idempotency-Key {idempotency.key[:80]!r} was already used for a different request "
                "(another tool or other arguments); nothing was done. Send a fresh key with every "
                "new request and reuse a key only to retry exactly the same call.")
        return Replayed(answer)

    def _record(self, writer: Writer, idempotency: IdempotencyKey | None, result: object) -> None:
        if idempotency is not None:
            writer.record_idempotent(idempotency.key, dumps(result), self.clock(), idempotency.fingerprint)

    @dataclass(frozen=True, slots=True)
    class _Vectors:
        keys: dict[str, npt.NDArray[np.float32]]
        body: npt.NDArray[np.float32]
        content_tokens: str
        # The loanwords the analyzer knew when it cut the text (``indexable``).
        vocabulary: frozenset[str]

        def indexable(self, analyzer: Analyzer) -> str | None:
            """The tokens, unless another request taught the analyzer a word since."""
            return self.content_tokens if self.vocabulary == analyzer.learned else None

    def _embed_request(self, request: NewMemory) -> MemoryGraph._Vectors:
        # Before the text is cut: a loanword its keys teach is read whole from now on.
        self.analyzer.learn(self.analyzer.loanwords(request.keys, request.content))
        vocabulary = self.analyzer.learned
        texts = [*request.keys, request.content]
        vectors = self.embedder.embed(texts)
        tokens = " ".join(self.analyzer.index_tokens(request.content))
        return MemoryGraph._Vectors(dict(zip(request.keys, vectors[:-1], strict=True)), vectors[-1], tokens,
                                    vocabulary)

    def _store_memory(self, writer: Writer, request: NewMemory, vectors: MemoryGraph._Vectors,
                      source: dict[str, Any], batch: _BatchKeys | None = None) -> tuple[str, bool, list[KeyRef]]:
        """Insert one memory (or fold it into its identical twin) with its keys and links."""
        self.sync_vocabulary(writer)
        now = self.clock()
        self._check_related(writer, request.related_to, now)
        digest = dedup_hash(request.content)
        expires = None if request.ttl_seconds is None else now + request.ttl_seconds
        twin = writer.active_twin(request.namespace, digest, now)
        if twin is not None:
            with self._counting(writer, [twin]):
                writer.fold_into_twin(twin, now=now, source=source, expires_at=expires)
                refs = self._link_keys(writer, twin, request.keys, request.key_types, vectors.keys, batch=batch)
            writer.add_relations(twin, request.related_to)
            self._reindex_keys_of(writer, [twin])
            return twin, True, refs
        memory_id = new_id()
        with self._counting(writer, [memory_id]):
            writer.insert_memory(MemoryRow(
                id=memory_id, content=request.content, dedup_hash=digest, namespace=request.namespace, at=now,
                observed_at=request.observed_at, decay_profile=request.decay_profile, source=source,
                expires_at=expires, vector=vector_bytes(vectors.body)))
            refs = self._link_keys(writer, memory_id, request.keys, request.key_types, vectors.keys, batch=batch)
        writer.add_relations(memory_id, request.related_to)
        self.index_memory(writer, memory_id, vectors.indexable(self.analyzer))
        body, code = vectors.body, self.namespace_code(request.namespace)
        writer.after_commit(lambda: self.bodies.upsert(memory_id, body, code))
        return memory_id, False, refs

    def _check_related(self, reader: Reader, related: Sequence[str], now: float) -> None:
        if not related:
            return
        found = reader.memories(related)
        missing = [r for r in related if r not in found or not found[r].active(now)]
        if missing:
            raise InvalidInput(f"related_to names unknown or inactive memories: {', '.join(missing[:5])}",
                               field="related_to")

    def _link_keys(self, writer: Writer, memory_id: str, keys: Sequence[str], key_types: Mapping[str, KeyType],
                   vectors: Mapping[str, npt.NDArray[np.float32]], weight: float = LINK_DEFAULT,
                   auto: bool = False, batch: _BatchKeys | None = None) -> list[KeyRef]:
        """Resolve each key (reuse, merge or create) and link it to the memory. ``batch``:
        the keys earlier writes of the same transaction resolved, which the index does not
        hold before COMMIT."""
        batch = batch if batch is not None else _BatchKeys()
        pending = batch.pending
        touched: set[str] = set()
        linked: list[str] = []
        pairs = self._translation_pairs(keys, key_types, vectors)
        near = dict(zip(keys, self.keys.neighbours_of(np.stack([vectors[k] for k in keys]), self.profile),
                        strict=True)) if keys else {}
        resolved: dict[str, str] = {}
        for key in keys:
            kind = key_types.get(key, "concept")
            partner = pairs.get(key)
            earlier = batch.by_norm.get(normalize(key))
            if earlier is not None:
                key_id = earlier
                touched.add(key_id)
            elif partner is not None and partner in resolved and self.keys.by_norm(normalize(key)) is None \
                    and not any(normalize(p.concept) == normalize(key) for p in pending):
                key_id = resolved[partner]
                self._add_alias(writer, key_id, key, learned=False)
                touched.add(key_id)
            else:
                match = self.keys.resolve(key, kind, vectors[key], self.profile, pending, near[key])
                if match.key_id is None:
                    key_id = new_id()
                    writer.insert_key(KeyRow(
                        id=key_id, concept=key, norm=normalize(key), compact=self.analyzer.compact(key),
                        key_type=kind, vector=vector_bytes(vectors[key]), created_at=self.clock()))
                    pending.append(PendingKey(key_id, key, kind, vectors[key]))
                else:
                    key_id = match.key_id
                    if match.promote_to is not None:
                        writer.set_key_type(key_id, match.promote_to)
                    if match.add_alias:
                        self._add_alias(writer, key_id, key, learned=False)
                touched.add(key_id)
            resolved[key] = key_id
            batch.by_norm[normalize(key)] = key_id
            if key_id not in linked:
                linked.append(key_id)
        new_links = []
        for key_id in linked:
            if writer.link(key_id, memory_id, weight, auto):
                new_links.append(key_id)
        infos = {kid: writer.key_info(kid) for kid in touched}
        vectors_of = {p.id: p.vector for p in pending}

        def apply() -> None:
            for kid, info in infos.items():
                self.keys.put(info, vectors_of.get(kid))

        writer.after_commit(apply)
        # Key infos above already carry fresh link counts; only untouched keys need deltas.
        for kid in new_links:
            if kid not in touched:
                writer.after_commit(functools.partial(self.keys.add_links, kid, 1))
        return [KeyRef(concept=infos[k].concept if k in infos else self.concept(k), key_id=k) for k in linked]

    def concept(self, key_id: str) -> str:
        info = self.keys.get(key_id)
        return info.concept if info is not None else key_id

    def _translation_pairs(self, keys: Sequence[str], key_types: Mapping[str, KeyType],
                           vectors: Mapping[str, npt.NDArray[np.float32]]) -> dict[str, str]:
        """Hangul and Latin concept keys of one write that are each other's closest
        cross-script key are taken as one concept in two languages (partner -> earlier key)."""
        concepts = [k for k in keys if key_types.get(k, "concept") == "concept"]
        hangul = [k for k in concepts if script_of(k) == "hangul"]
        latin = [k for k in concepts if script_of(k) == "latin"]
        if not hangul or not latin:
            return {}
        sims = np.stack([vectors[h] for h in hangul]) @ np.stack([vectors[w] for w in latin]).T
        pairs: dict[str, str] = {}
        order = {k: i for i, k in enumerate(keys)}
        for i, h in enumerate(hangul):
            j = int(np.argmax(sims[i]))
            if int(np.argmax(sims[:, j])) == i and sims[i, j] >= self.profile.translation_pair \
                    and not conflicting_qualifiers(h, latin[j]):
                first, second = sorted((h, latin[j]), key=order.__getitem__)
                pairs[second] = first
        return pairs

    def _add_alias(self, writer: Writer, key_id: str, alias: str, *, learned: bool) -> bool:
        concept = writer.key_concept(key_id)
        if concept is None or normalize(concept) == normalize(alias) or len(alias.strip()) < 1:
            return False
        return writer.add_alias(key_id, alias, norm=normalize(alias), compact=self.analyzer.compact(alias),
                                learned=learned, added_at=self.clock())

    def _key_tokens_of(self, reader: Reader, memory_id: str) -> str:
        return " ".join(t for text in reader.key_texts_of(memory_id) for t in self.analyzer.key_tokens(text))

    def index_memory(self, writer: Writer, memory_id: str, content_tokens: str | None = None) -> None:
        if content_tokens is None:
            content = writer.memory_content(memory_id)
            assert content is not None
            content_tokens = " ".join(self.analyzer.index_tokens(content))
        writer.index_memory(memory_id, content_tokens, self._key_tokens_of(writer, memory_id))

    def _reindex_keys_of(self, writer: Writer, memory_ids: Iterable[str]) -> None:
        for memory_id in memory_ids:
            if writer.is_current(memory_id):
                writer.set_key_tokens(memory_id, self._key_tokens_of(writer, memory_id))

    def _unindex(self, writer: Writer, memory: Memory) -> None:
        writer.unindex(memory.rowid)
        writer.after_commit(lambda: self.bodies.remove(memory.id))

    # -- write hints ----------------------------------------------------------------------

    def write_hints(self, memory_id: str, provided: Sequence[str]) -> Hints | None:
        """Near-duplicate keys, missing-language and phrase-key advice (read-only)."""
        linked = set(self.store.read(lambda reader: reader.key_ids_of(memory_id)))
        provided_norms = {normalize(k) for k in provided}
        mine: list[tuple[KeyInfo, npt.NDArray[np.float32]]] = []
        for key_id in linked:
            info, vector = self.keys.get(key_id), self.keys.vectors.get(key_id)
            if info is not None and vector is not None and normalize(info.concept) in provided_norms:
                mine.append((info, vector))
        near: list[dict[str, Any]] = []
        snap = self.keys.snapshot()
        if mine and snap.ids:
            all_sims = snap.similarities(np.stack([vector for _, vector in mine]))
            for (info, _), sims in zip(mine, all_sims, strict=True):
                for row in top_indices(sims, 20):
                    other, sim = self.keys.get(snap.ids[row]), float(sims[row])
                    if other is None or other.id in linked or other.is_entity:
                        continue
                    merge_at = (self.profile.cross_script_merge if cross_script(info.concept, other.concept)
                                else self.profile.short_key_merge)
                    if self.profile.key_recall <= sim < merge_at:
                        near.append({"your_key": info.concept, "existing_concept": other.concept,
                                     "key_id": other.id, "similarity": round(sim, 3)})
                        break
        phrases = [k for k in provided if len(k.split()) >= PHRASE_TOKENS]
        language = LANGUAGE_NOTE if provided and language_uniform(provided) else None
        few = FEW_KEYS_NOTE if len(provided) < 3 else None
        if not near and language is None and not phrases and few is None:
            return None
        return Hints(near_keys=near, language_note=language, phrase_keys=phrases or None,
                     phrase_note=PHRASE_NOTE if phrases else None, few_keys_note=few)

    # -- writes: correct ------------------------------------------------------------------

    def correct(self, memory_id: object, request: NewMemory, *, keys_given: bool, related_given: bool,
                ttl_given: bool, decay_given: bool, host: Host | None = None,
                idempotency_key: IdempotencyKey | None = None) -> CorrectResult | Replayed:
        """One-step versioning: the correction supersedes the memory, which stays readable by
        id only; the memory it had itself superseded is deleted."""
        if not isinstance(memory_id, str):
            raise InvalidInput("memory_id must be a string", field="memory_id")
        prepared = self._embed_request(request)
        source = self.stamp("correct", host, request.source)

        def write(writer: Writer) -> CorrectResult | Replayed:
            replay = self._replay(writer, idempotency_key)
            if replay is not None:
                return replay
            now = self.clock()
            old = writer.memory(memory_id)
            # Follow the chain to its live head, so two corrections in a row form one chain.
            while old is not None and old.superseded_by is not None:
                old = writer.memory(old.superseded_by)
            if old is None or old.expired(now):
                raise NotFound(f"Memory {memory_id} not found")
            self.sync_vocabulary(writer)
            if old.supersedes is not None:
                grandparent = writer.memory(old.supersedes)
                if grandparent is not None:
                    self._delete(writer, grandparent)
                writer.clear_supersedes(old.id)
            self._check_related(writer, request.related_to, now)
            new = new_id()
            with self._counting(writer, [old.id, new]):
                expires = (now + request.ttl_seconds if request.ttl_seconds is not None else None) \
                    if ttl_given else old.expires_at
                profile = request.decay_profile if decay_given else old.decay_profile
                writer.insert_memory(MemoryRow(
                    id=new, content=request.content, dedup_hash=dedup_hash(request.content),
                    namespace=old.namespace, at=now, observed_at=request.observed_at, decay_profile=profile,
                    source=source, expires_at=expires, vector=vector_bytes(prepared.body), supersedes=old.id))
                writer.supersede(old.id, new, depth_factor=superseded_depth_factor(old.depth), now=now)
                self._unindex(writer, old)
                related = request.related_to if related_given else writer.related_ids(old.id)
                writer.add_relations(new, related)
                note = None
                if keys_given and request.keys:
                    self._link_keys(writer, new, request.keys, request.key_types, prepared.keys)
                else:
                    inherited = writer.links_of(old.id)
                    writer.add_links([(kid, new, inherited_weight(weight), auto) for kid, weight, auto in inherited])
                    for kid, _, _ in inherited:
                        writer.after_commit(functools.partial(self.keys.add_links, kid, 1))
                    concepts = [writer.key_concept(kid) or kid for kid, _, _ in inherited]
                    if concepts:
                        note = (f"Reused {len(concepts)} prior key(s) [{', '.join(concepts)}] -- pass `keys` to "
                                "retag if the correction changed the topic.")
            self.index_memory(writer, new, prepared.indexable(self.analyzer))
            body, code = prepared.body, self.namespace_code(old.namespace)
            writer.after_commit(lambda: self.bodies.upsert(new, body, code))
            result = CorrectResult(new_id=new, superseded=memory_id, note=note,
                                   redacted=request.redacted or None)
            self._record(writer, idempotency_key, result)
            return result

        return self.store.write(write)

    # -- writes: deletion -----------------------------------------------------------------

    def _delete(self, writer: Writer, memory: Memory) -> str | None:
        """Hard-delete one memory; if it was a correction, its predecessor becomes active
        again (undo). Keys left without any link are deleted too. Returns the restored id."""
        predecessor = writer.predecessor_of(memory.id)
        affected = [memory.id] + ([predecessor] if predecessor is not None else [])
        with self._counting(writer, affected):
            return self._delete_counted(writer, memory)

    def _delete_counted(self, writer: Writer, memory: Memory) -> str | None:
        key_ids = writer.key_ids_of(memory.id)
        writer.unindex(memory.rowid)
        writer.delete_memory(memory.id)
        restored = writer.predecessor_of(memory.id)
        if restored is not None:
            writer.restore(restored)
            self.index_memory(writer, restored)
            blob, namespace = writer.memory_vector(restored)
            if blob is not None and vector_problem(blob, self.embedder.dim) is None:
                vec, code = vector_from(blob), self.namespace_code(namespace)
                writer.after_commit(lambda: self.bodies.upsert(restored, vec, code))
        for kid in key_ids:
            if not writer.has_links(kid):
                writer.delete_key(kid)
                writer.after_commit(functools.partial(self.keys.remove, kid))
            else:
                writer.after_commit(functools.partial(self.keys.add_links, kid, -1))
        memory_id = memory.id
        writer.after_commit(lambda: self.bodies.remove(memory_id))
        return restored

    def forget(self, memory_id: object, *, idempotency_key: IdempotencyKey | None = None) -> ForgetResult | Replayed:
        if not isinstance(memory_id, str):
            raise InvalidInput("memory_id must be a string", field="memory_id")

        def write(writer: Writer) -> ForgetResult | Replayed:
            replay = self._replay(writer, idempotency_key)
            if replay is not None:
                return replay
            memory = writer.memory(memory_id)
            result = ForgetResult(deleted=False)
            if memory is not None:
                result = ForgetResult(deleted=True, restored=self._delete(writer, memory))
            self._record(writer, idempotency_key, result)
            return result

        return self.store.write(write)

    def cleanup_expired(self) -> CleanupResult:
        """Delete expired memories, prune never-used learned aliases and stale candidates."""

        def write(writer: Writer) -> CleanupResult:
            now = self.clock()
            expired = writer.expired_memories(now)
            keys_before = writer.key_count()
            for memory in expired:
                if writer.memory(memory.id) is not None:
                    self._delete(writer, memory)
            cutoff = now - self.settings.autokey_prune_age
            stale = writer.stale_learned_aliases(cutoff)
            writer.delete_aliases(stale)
            for kid in {kid for kid, _ in stale}:
                if writer.key_concept(kid) is not None:
                    info = writer.key_info(kid)
                    writer.after_commit(functools.partial(self.keys.put, info))
                    # The pruned alias was indexed with the key's memories: take it out.
                    self._reindex_keys_of(writer, writer.memories_linked_to([kid]))
            candidates = writer.prune_alias_candidates(cutoff)
            writer.prune_idempotency(now - IDEMPOTENCY_TTL_SECONDS)
            keys_after = writer.key_count()
            return CleanupResult(deleted=len(expired), pruned_aliases=len(stale),
                                 pruned_candidates=candidates, pruned_keys=keys_before - keys_after)

        result = self.store.write(write)
        if result.deleted or result.pruned_aliases or result.pruned_candidates:
            logger.info("cleanup: %d expired memories deleted, %d learned aliases and %d candidates pruned",
                        result.deleted, result.pruned_aliases, result.pruned_candidates)
        return result

    # -- writes: confirmation and link feedback -------------------------------------------

    def confirm_memory(self, memory_id: object, evidence: object, *, namespace: object = None,
                       source: object = None, host: Host | None = None) -> ConfirmResult:
        if not isinstance(memory_id, str):
            raise InvalidInput("memory_id must be a string", field="memory_id")
        if evidence not in EVIDENCE_KINDS:
            raise InvalidInput(f"Unknown confirmation evidence: {evidence!r} (use one of "
                               f"{', '.join(EVIDENCE_KINDS)})", field="evidence")
        if source is not None and not isinstance(source, dict):
            raise InvalidInput("source must be an object", field="source")
        ns = self.resolve_namespace(namespace)
        stamped = self.stamp("confirm_memory", host, source)
        confirmation = host.confirmation_id if host is not None else None

        def write(writer: Writer) -> ConfirmResult:
            now = self.clock()
            memory = self.active_memory(writer, memory_id, ns, now)
            if confirmation is not None and memory.last_confirmation_id == confirmation:
                return ConfirmResult(memory.id, confirmed=False, duplicate=True,
                                     validity=self.validity_of(memory))
            writer.confirm(memory.id, now=now, depth_step=CONFIRM_DEPTH, evidence=str(evidence), source=stamped,
                           confirmation_id=confirmation)
            fresh = writer.memory(memory.id)
            assert fresh is not None
            return ConfirmResult(memory.id, confirmed=True, duplicate=False, validity=self.validity_of(fresh))

        return self.store.write(write)

    def dismiss(self, memory_id: object, key_id: object, *, namespace: object = None) -> DismissResult:
        """Weaken one key->memory link (never below the floor, never severed)."""
        if not isinstance(memory_id, str):
            raise InvalidInput("memory_id must be a string", field="memory_id")
        if not isinstance(key_id, str):
            raise InvalidInput("key_id must be a string", field="key_id")
        ns = self.resolve_namespace(namespace)
        weak = self.buffer.consume(key_id)

        def write(writer: Writer) -> DismissResult:
            now = self.clock()
            memory = writer.memory(memory_id)
            if memory is None or memory.expired(now) or (ns is not None and memory.namespace != ns):
                raise NotFound(f"Memory {memory_id} not found")
            previous = writer.link_weight(key_id, memory_id)
            if previous is None:
                raise NotFound(f"Key {key_id} is not linked to memory {memory_id}")
            weight = dismissed_weight(previous)
            writer.set_link_weight(key_id, memory_id, weight)
            cleared = writer.unsee_alias_candidate(key_id, normalize(weak.query)) if weak is not None else None
            concept = writer.key_concept(key_id)
            assert concept is not None  # the link exists, so does its key
            floored = weight <= LINK_MIN
            note = ("Link is at its floor -- it ranks last under this key but is never severed; the memory "
                    "stays reachable by its other keys." if floored else
                    "Link weakened. The memory is unchanged and still reachable by its other keys.")
            return DismissResult(memory_id=memory_id, key_id=key_id, concept=concept,
                                 link_weight=round(weight, 3), previous_link_weight=round(previous, 3),
                                 floored=floored, alias_candidate_cleared=cleared, note=note)

        return self.store.write(write)

    # -- reads with effects: read_memory --------------------------------------------------

    def read_memory(self, memory_id: object, *, via_key_id: object = None,
                    namespace: object = None) -> ReadMemoryResult:
        """Full content and every key of one memory. Counts the access; reinforces only the
        traversed edge (+0.1) and lets autokey learn from it. Never confirms the memory."""
        if not isinstance(memory_id, str):
            raise InvalidInput("memory_id must be a string", field="memory_id")
        if via_key_id is not None and not isinstance(via_key_id, str):
            raise InvalidInput("via_key_id must be a string", field="via_key_id")
        ns = self.resolve_namespace(namespace)
        weak = self.buffer.consume(via_key_id) if via_key_id and self.settings.autokey else None
        query_vector = self.embedder.embed([weak.query])[0] if weak is not None else None

        def write(writer: Writer) -> None:
            now = self.clock()
            memory = self.active_memory(writer, memory_id, ns, now)
            if via_key_id is not None:
                weight = writer.link_weight(via_key_id, memory.id)
                if weight is None:
                    raise NotFound(f"Key {via_key_id} is not linked to memory {memory.id}")
                writer.set_link_weight(via_key_id, memory.id, reinforced_weight(weight))
                if weak is not None and query_vector is not None:
                    self._learn_alias(writer, via_key_id, memory.id, weak.query, weak.score, query_vector)
            writer.count_access(memory.id, now)

        self.store.write(write)
        return self.store.read(lambda reader: self._read_memory_view(reader, memory_id, via_key_id))

    def _read_memory_view(self, reader: Reader, memory_id: str, via: str | None) -> ReadMemoryResult:
        now = self.clock()
        memory = reader.memory(memory_id)
        assert memory is not None
        links = reader.links_of(memory_id)
        counts = self.key_counts([kid for kid, _, _ in links], memory.namespace, now)
        keys: list[LinkedKey] = []
        for kid, weight, auto in links:
            info = self.keys.get(kid)
            if info is None:
                continue
            view = self.key_view(info, counts.get(info.id), reader.learned_aliases(info.id))
            keys.append(LinkedKey(**{f.name: getattr(view, f.name) for f in dataclasses.fields(view)},
                                  link_weight=round(weight, 3), traversed_from=kid == via,
                                  auto=True if auto else None))
        return ReadMemoryResult(memory=self.memory_view(reader, memory), keys=keys, via_key_id=via)

    def inspect_memory(self, memory_id: str) -> ReadMemoryResult:
        """``read_memory``'s view without its effects (no access counted, no edge reinforced),
        for a person inspecting the store; superseded and expired memories show too."""

        def read(reader: Reader) -> ReadMemoryResult:
            if reader.memory(memory_id) is None:
                raise NotFound(f"Memory {memory_id} not found")
            return self._read_memory_view(reader, memory_id, None)

        return self.store.read(read)

    def memory_view(self, reader: Reader, memory: Memory) -> MemoryView:
        return MemoryView(
            id=memory.id, content=memory.content, depth=round(memory.depth, 3), access_count=memory.access_count,
            last_accessed=memory.last_accessed, created_at=memory.created_at, observed_at=memory.observed_at,
            source=memory.source, namespace=memory.namespace, expires_at=memory.expires_at,
            supersedes=memory.supersedes, superseded_by=memory.superseded_by,
            related_to=reader.related_ids(memory.id), validity=self.validity_of(memory))

    def _learn_alias(self, writer: Writer, key_id: str, memory_id: str, query: str, score: float,
                     query_vector: npt.NDArray[np.float32]) -> None:
        """Autokey: one more confirmation that ``query`` means this key; promote at N."""
        now = self.clock()
        text = query.strip()
        info = self.keys.get(key_id)
        if info is None or len(text) < MIN_ALIAS_CHARS:
            return
        norm = normalize(text)
        if norm == normalize(info.concept) or norm in {normalize(a) for a in info.aliases}:
            return
        count = writer.see_alias_candidate(key_id, norm, text, now)
        learned = writer.learned_alias_count(key_id)
        decision = autokey.decide_promotion(count, text, score, learned, self.promotion)
        if decision == "none":
            return
        writer.drop_alias_candidate(key_id, norm)
        if decision == "alias":
            if self._add_alias(writer, key_id, text, learned=True):
                logger.info("autokey: learned an alias for key %s", key_id)
                fresh = writer.key_info(key_id)
                writer.after_commit(lambda: self.keys.put(fresh))
                self._reindex_keys_of(writer, writer.memories_linked_to([key_id], limit=ALIAS_REINDEX_LIMIT))
        else:
            with self._counting(writer, [memory_id]):
                self._link_keys(writer, memory_id, [text], {}, {text: query_vector})
            self._reindex_keys_of(writer, [memory_id])
            logger.info("autokey: promoted a confirmed query to a key on memory %s", memory_id)

    def count_alias_hits(self, key_alias_pairs: Iterable[tuple[str, str]]) -> None:
        """A learned alias that matched a query literally earns a hit (kept from pruning)."""
        pairs = [(kid, normalize(alias)) for kid, alias in key_alias_pairs]
        if pairs:
            self.store.write(lambda writer: writer.count_alias_hits(pairs))

    # -- reads: keys ----------------------------------------------------------------------

    def browse_keys(self, namespace: object = None, *, hubs_only: bool = False, limit: int = 20,
                    offset: int = 0) -> BrowseResult:
        ns = self.resolve_namespace(namespace)
        now = self.clock()

        def read(reader: Reader) -> BrowseResult:
            memory_count = reader.count_active(ns, now)
            entries = []
            for key_id, n in self.key_counts((k.id for k in self.keys.all()), ns, now).counts.items():
                info = self.keys.get(key_id)
                if info is None or n <= 0 or (hubs_only and n < self.settings.hub_min_links):
                    continue
                entries.append((info, n))
            entries.sort(key=lambda e: (e[1] < self.settings.hub_min_links, -e[1], normalize(e[0].concept)))
            page = entries[offset:offset + limit]
            views = [self.key_view(info, n, reader.learned_aliases(info.id)) for info, n in page]
            return BrowseResult(
                status="ok" if memory_count else "empty_namespace", namespace=ns, memory_count=memory_count,
                key_count=len(entries), keys=views,
                next_offset=offset + limit if offset + limit < len(entries) else None)

        return self.store.read(read)

    def check_key_id(self, key_id: object) -> str:
        if not isinstance(key_id, str):
            raise InvalidInput("key_id must be a string", field="key_id")
        if not ID_PATTERN.match(key_id):
            raise InvalidInput(
                f"key_id {key_id[:40]!r} is not a key id: pass the 12-character id from recall or "
                "browse_keys (e.g. 'a1b2c3d4e5f6'), not the concept text -- call recall(query) to find it.",
                field="key_id")
        if self.keys.get(key_id) is None:
            raise NotFound(f"Key {key_id} not found")
        return key_id

    def read_key(self, key_id: object, *, query: object = None, namespace: object = None, limit: int = 10,
                 offset: int = 0) -> ReadKeyResult:
        """The memories under one key, ranked, as handles (never content)."""
        kid = self.check_key_id(key_id)
        if query is not None and not isinstance(query, str):
            raise InvalidInput("query must be a string", field="query")
        ns = self.resolve_namespace(namespace)
        from keymem_daemon.engine.retrieval import rank_key_members

        # Score enough of a hub to fill the requested page, with room to spare.
        ranked, total = rank_key_members(self, kid, query.strip() if isinstance(query, str) and query.strip()
                                         else None, ns, pool=max(100, 3 * (offset + limit)))
        now = self.clock()

        def read(reader: Reader) -> ReadKeyResult:
            info = self.keys.get(kid)
            assert info is not None
            page = ranked[offset:offset + limit]
            handles = []
            for item in page:
                memory = item.memory
                handles.append(Handle(
                    memory_id=memory.id, depth=round(memory.depth, 3), created_at=memory.created_at,
                    observed_at=memory.observed_at, namespace=memory.namespace,
                    validity=self.validity_of(memory), link_weight=round(item.weight, 3),
                    content_relevance=None if item.relevance is None else round(item.relevance, 3),
                    score_kind="within_key_rank" if item.relevance is not None else "link_rank",
                    score=round(item.score, 4), batch_sibling_ids=self.batch_siblings(reader, memory, now)))
            view = self.key_view(info, total, reader.learned_aliases(kid))
            return ReadKeyResult(key=view, memories=handles, total=total,
                                 next_offset=offset + limit if offset + limit < total else None)

        return self.store.read(read)

    # -- reads: memories ------------------------------------------------------------------

    def related(self, memory_id: object) -> list[RelatedItem]:
        """Neighbours through shared keys (rarer keys count more) and explicit links."""
        if not isinstance(memory_id, str):
            raise InvalidInput("memory_id must be a string", field="memory_id")
        now = self.clock()

        def read(reader: Reader) -> list[RelatedItem]:
            memory = reader.memory(memory_id)
            if memory is None:
                return []
            scores: dict[str, float] = {}
            shared: dict[str, list[str]] = {}
            kinds: dict[str, set[str]] = {}
            for key_id in reader.key_ids_of(memory_id):
                info = self.keys.get(key_id)
                if info is None:
                    continue
                weight = self.idf(key_id)
                for other in reader.co_members(key_id, memory_id, RELATED_PER_KEY):
                    scores[other] = scores.get(other, 0.0) + weight
                    shared.setdefault(other, []).append(info.concept)
                    kinds.setdefault(other, set()).add("key")
            for other in reader.explicit_neighbours(memory_id):
                scores[other] = scores.get(other, 0.0) + EXPLICIT_RELATION_SCORE
                kinds.setdefault(other, set()).add("explicit")
            found = reader.memories(scores)
            items = []
            for other, score in scores.items():
                m = found.get(other)
                if m is None or not m.active(now):
                    continue
                kind = kinds[other]
                items.append(RelatedItem(
                    id=m.id, content=m.content, shared_keys=shared.get(other, []),
                    link_type="both" if len(kind) == 2 else ("key" if "key" in kind else "explicit"),
                    depth=round(m.depth, 3), validity=self.validity_of(m),
                    score=round(score * self.rank_factor_of(m, now), 4)))
            items.sort(key=lambda i: (-i.score, -i.validity.freshness))
            return items[: self.settings.related_limit]

        return self.store.read(read)

    def list_memories(self, namespace: object = None, *, limit: int = 50, offset: int = 0) -> ListResult:
        ns = self.resolve_namespace(namespace)
        now = self.clock()

        def read(reader: Reader) -> ListResult:
            total, page = reader.active_page(ns, now, limit, offset)
            out = []
            for m in page:
                concepts = [self.concept(kid) for kid in reader.key_ids_of(m.id, manual_only=True)]
                out.append(ListedMemory(
                    id=m.id, content=m.content, keys=concepts, depth=round(m.depth, 3),
                    access_count=m.access_count, supersedes=m.supersedes, created_at=m.created_at,
                    observed_at=m.observed_at, namespace=m.namespace, expires_at=m.expires_at,
                    related_to=reader.related_ids(m.id), validity=self.validity_of(m)))
            return ListResult(memories=out, total=total,
                              next_offset=offset + limit if offset + limit < total else None)

        return self.store.read(read)

    def stats(self) -> Stats:
        now = self.clock()

        def read(reader: Reader) -> Stats:
            counts = reader.counts(now)
            return Stats(keys=counts.keys, memories=sum(counts.namespaces.values()), links=counts.links,
                         namespaces=counts.namespaces, superseded=counts.superseded,
                         expired_pending_cleanup=counts.expired)

        return self.store.read(read)

    def has_hangul_content(self) -> bool:
        """Whether the store holds Korean text (the daemon then loads Kiwi at start)."""
        return bool(self.store.read(lambda reader: reader.has_hangul_keys()))
