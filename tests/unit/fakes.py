"""Test doubles of the fast tier: a deterministic embedder and an in-memory repository.

They stand in for the two costly parts of the engine the way ``httpx.MockTransport`` stands
in for the network: ``HashingEmbedder`` implements ``inference.embedders.Embedder`` without a
model (equal texts give equal vectors, texts sharing words are close), and
``InMemoryRepository`` implements ``engine.ports.Repository`` with dicts and a unit of work
that commits or rolls back. ``tests/unit/fast`` runs the engine's logic on them; the
real-model tests in ``tests/unit/test_engine_*.py`` stay as they are.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, get_args

import numpy as np

from keymem_daemon.engine.freshness import DecayProfile
from keymem_daemon.engine.keys import KeyInfo, KeyType, MemberState
from keymem_daemon.engine.ports import (
    ActivityEntry,
    ActivityRow,
    Alias,
    KeyRow,
    MemoryFilter,
    MemoryRow,
    StoreCounts,
)
from keymem_daemon.engine.records import Memory
from keymem_daemon.engine.text import normalize
from keymem_daemon.errors import StoreError
from keymem_daemon.inference.embedders import ThresholdProfile, Vectors, l2_normalize
from keymem_daemon.store.sqlite.database import MIGRATIONS
from keymem_daemon.store.sqlite.search import LEXICAL_WEIGHTS
from keymem_daemon.store.sqlite.transfer import MEMORY_FIELDS

logger = logging.getLogger(__name__)

T = TypeVar("T")

# -- a deterministic embedder ------------------------------------------------------------------

_WORD: Final = re.compile(r"[^\W_]+")
# Each word counts once whole and once spread over its character trigrams, so a shared word
# moves two texts closer than shared letters do, and inflections (deploy, deploys) stay near.
_WORD_WEIGHT: Final = 1.0
_TRIGRAMS_WEIGHT: Final = 1.0

# Cosines of this embedder (measured): ``staging`` / ``staging server`` 0.68, ``Deploy
# Pipeline`` / ``deploy pipelines`` 0.70, ``staging server`` / ``production server`` 0.52,
# ``deployment`` / ``deploy`` 0.32, ``staging`` / ``certificate`` -0.06. So one shared word
# reaches a key (0.45) and only texts equal but for case and punctuation merge keys (0.88):
# the fast tier tests the engine's rules, not the real model's calibration.
HASHING_PROFILE: Final = ThresholdProfile(
    key_recall=0.45,
    key_merge=0.88,
    short_key_merge=0.88,
    cross_script_merge=0.95,
    key_autolink=0.6,
    translation_pair=0.95,
)


def _bucket(feature: str, dim: int) -> tuple[int, float]:
    """The column a feature hashes to and its sign (crc32: the same in every process)."""
    h = zlib.crc32(feature.encode("utf-8"))
    return h % dim, (1.0 if (h >> 31) & 1 else -1.0)


@dataclass(frozen=True, slots=True)
class HashingEmbedder:
    """Feature hashing of a text's words and their character trigrams into ``dim`` columns,
    L2-normalised: fast, model-free and the same on every run. A text with no word embeds to
    zero (a cosine of 0 with everything), as an unreadable text does for USE."""

    dim: int = 256
    profile: ThresholdProfile = HASHING_PROFILE

    @property
    def name(self) -> str:
        return "hashing"

    @property
    def fingerprint(self) -> str:
        return f"hashing-trigrams-v1/{self.dim}"

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(normalize(text)):
                column, sign = _bucket(f"w:{word}", self.dim)
                out[row, column] += sign * _WORD_WEIGHT
                padded = f"<{word}>"
                grams = [padded[i:i + 3] for i in range(len(padded) - 2)]
                for gram in grams:
                    column, sign = _bucket(f"g:{gram}", self.dim)
                    out[row, column] += sign * _TRIGRAMS_WEIGHT / len(grams) ** 0.5
        return l2_normalize(out)


# -- an in-memory repository -------------------------------------------------------------------

# What the SQLite schema's CHECK constraints allow.
_KEY_TYPES: Final = frozenset(get_args(KeyType))
_DECAY_PROFILES: Final = frozenset(get_args(DecayProfile))
# The lexical index's BM25 as SQLite FTS5 computes it (fts5_aux.c): its k1 and b, and the
# floor of a term's idf (a term in over half the rows); the column weights are the ones
# store/sqlite/search.py passes to bm25() (LEXICAL_WEIGHTS).
_BM25_K1: Final = 1.2
_BM25_B: Final = 0.75
_BM25_MIN_IDF: Final = 1e-6
# An export of this store records the schema of the SQLite store (its migrations, all
# applied), so an export moves between the two.
SCHEMA_VERSION: Final = len(MIGRATIONS)


# The lexical index's cut of a column, as FTS5's ``unicode61 remove_diacritics 0``: runs of
# letters and digits, lower-cased.
def _fts_tokens(text: str) -> list[str]:
    return [t.lower() for t in _WORD.findall(text)]


Scope = frozenset[str] | None


def _occurrences(phrase: Sequence[str], column: Sequence[str]) -> int:
    """How often ``phrase`` (consecutive tokens) occurs in ``column``."""
    n = len(phrase)
    return sum(1 for i in range(len(column) - n + 1) if list(column[i:i + n]) == list(phrase))


def _json_copy(value: Mapping[str, Any]) -> dict[str, Any]:
    """A provenance object as the SQLite store hands it back: through JSON."""
    copied: dict[str, Any] = json.loads(json.dumps(dict(value), ensure_ascii=False))
    return copied


@dataclass(frozen=True, slots=True)
class StoredMemory:
    """A memory row: the record the engine reads, and what only the store keeps."""

    memory: Memory
    dedup_hash: str
    vector: bytes | None


@dataclass(frozen=True, slots=True)
class StoredKey:
    row: KeyRow
    rowid: int


@dataclass(frozen=True, slots=True)
class StoredAlias:
    alias: str
    compact: str
    learned: bool
    added_at: float
    hits: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    query_text: str
    count: int
    last_seen: float


@dataclass(slots=True)
class Tables:
    """Everything the repository holds, one container per SQLite table. Values are frozen
    records, so copying each container is a snapshot a unit of work may change without
    touching the committed tables. Dicts keep SQLite's orders where the engine sees them:
    memories and keys by rowid (insertion), the keyed tables by their primary key (sorted
    where read)."""

    memories: dict[str, StoredMemory] = field(default_factory=dict)
    keys: dict[str, StoredKey] = field(default_factory=dict)
    aliases: dict[tuple[str, str], StoredAlias] = field(default_factory=dict)  # (key id, norm)
    candidates: dict[tuple[str, str], Candidate] = field(default_factory=dict)  # (key id, norm)
    links: dict[tuple[str, str], tuple[float, bool]] = field(default_factory=dict)  # (key, memory)
    relations: set[tuple[str, str]] = field(default_factory=set)  # (from, to)
    idempotency: dict[str, tuple[str, float, str | None]] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    fts: dict[int, tuple[str, str]] = field(default_factory=dict)  # memory rowid -> token columns
    activity: dict[int, ActivityEntry] = field(default_factory=dict)  # by id, oldest first

    def copy(self) -> Tables:
        return Tables(memories=dict(self.memories), keys=dict(self.keys), aliases=dict(self.aliases),
                      candidates=dict(self.candidates), links=dict(self.links), relations=set(self.relations),
                      idempotency=dict(self.idempotency), meta=dict(self.meta), fts=dict(self.fts),
                      activity=dict(self.activity))


@dataclass(slots=True)
class InMemoryReader:
    """One snapshot: the tables as they were committed when the read (or write) began. The
    sections follow ``engine.ports``; each method answers what the SQLite mixin of the same
    name answers (tests/unit/fast/test_fast_repository.py runs the engine on both)."""

    _tables: Tables

    def _active(self, now: float, namespace: str | None = None) -> list[Memory]:
        return [m.memory for m in self._tables.memories.values()
                if m.memory.active(now) and (namespace is None or m.memory.namespace == namespace)]

    def _links_of_memory(self, memory_id: str) -> list[tuple[str, float, bool]]:
        """A memory's links in key id order (SQLite's links_by_memory index)."""
        return sorted((kid, w, auto) for (kid, mid), (w, auto) in self._tables.links.items() if mid == memory_id)

    def _links_of_key(self, key_id: str) -> list[tuple[str, float, bool]]:
        """A key's links in memory id order (the links table's primary key)."""
        return sorted((mid, w, auto) for (kid, mid), (w, auto) in self._tables.links.items() if kid == key_id)

    def _aliases_of(self, key_id: str) -> list[StoredAlias]:
        """A key's aliases, oldest first."""
        return [a for (kid, norm), a in sorted(self._tables.aliases.items(), key=lambda i: (i[1].added_at, i[0]))
                if kid == key_id]

    # -- MemoryReads ----------------------------------------------------------------------

    def memory(self, memory_id: str) -> Memory | None:
        stored = self._tables.memories.get(memory_id)
        return None if stored is None else stored.memory

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        found = self._tables.memories
        return {mid: found[mid].memory for mid in dict.fromkeys(ids) if mid in found}

    def memory_content(self, memory_id: str) -> str | None:
        memory = self.memory(memory_id)
        return None if memory is None else memory.content

    def is_current(self, memory_id: str) -> bool:
        memory = self.memory(memory_id)
        return memory is not None and memory.superseded_by is None

    def active_twin(self, namespace: str, digest: str, now: float) -> str | None:
        return next((m.memory.id for m in self._tables.memories.values() if m.memory.namespace == namespace
                     and m.dedup_hash == digest and m.memory.active(now)), None)

    def predecessor_of(self, memory_id: str) -> str | None:
        return next((m.memory.id for m in self._tables.memories.values() if m.memory.superseded_by == memory_id),
                    None)

    def member_state(self, memory_id: str) -> MemberState | None:
        memory = self.memory(memory_id)
        if memory is None or memory.superseded_by is not None:
            return None
        keys = tuple(kid for kid, _, _ in self._links_of_memory(memory_id))
        return MemberState(memory.namespace, keys, memory.expires_at)

    def count_active(self, namespace: str | None, now: float) -> int:
        return len(self._active(now, namespace))

    def memory_rows(self) -> int:
        return len(self._tables.memories)

    def active_page(self, namespace: str | None, now: float, limit: int, offset: int) -> tuple[int, list[Memory]]:
        active = self._active(now, namespace)
        return len(active), active[offset:offset + limit]

    def expired_memories(self, now: float) -> list[Memory]:
        expired = [m.memory for m in self._tables.memories.values()
                   if m.memory.expires_at is not None and m.memory.expires_at < now]
        return sorted(expired, key=lambda m: (m.expires_at, m.rowid))

    def batch_siblings(self, batch_id: str, memory: Memory, now: float) -> list[str]:
        return [m.id for m in self._active(now, memory.namespace) if m.batch_id == batch_id and m.id != memory.id]

    def related_ids(self, memory_id: str) -> list[str]:
        return sorted(b for a, b in self._tables.relations if a == memory_id)

    def explicit_neighbours(self, memory_id: str) -> list[str]:
        return self.related_ids(memory_id) + sorted(a for a, b in self._tables.relations if b == memory_id)

    def counts(self, now: float) -> StoreCounts:
        namespaces: dict[str, int] = {}
        for m in self._active(now):
            namespaces[m.namespace] = namespaces.get(m.namespace, 0) + 1
        every = [m.memory for m in self._tables.memories.values()]
        return StoreCounts(keys=len(self._tables.keys), links=len(self._tables.links),
                           namespaces=dict(sorted(namespaces.items())),
                           superseded=sum(1 for m in every if m.superseded_by is not None),
                           expired=sum(1 for m in every if m.expires_at is not None and m.expires_at < now))

    def stored_vectors(self, expected_bytes: int) -> Iterator[tuple[str, str, bytes | None, bool, str | None]]:
        for m in list(self._tables.memories.values()):
            if m.vector is not None:
                content = m.memory.content if len(m.vector) != expected_bytes else None
                yield m.memory.id, m.memory.namespace, m.vector, m.memory.superseded_by is not None, content

    def live_vector_count(self) -> int:
        return sum(1 for m in self._tables.memories.values() if m.memory.superseded_by is None and m.vector is not None)

    def expiring_ids(self) -> list[str]:
        return [m.memory.id for m in self._tables.memories.values()
                if m.memory.superseded_by is None and m.memory.expires_at is not None]

    def vectors_after(self, rowid: int) -> list[tuple[int, str, str]]:
        return [(m.memory.rowid, m.memory.id, m.memory.content) for m in self._tables.memories.values()
                if m.vector is not None and m.memory.rowid > rowid]

    def memory_vector(self, memory_id: str) -> tuple[bytes | None, str]:
        stored = self._tables.memories[memory_id]
        return stored.vector, stored.memory.namespace

    def memory_states(self, memory_ids: Sequence[str]) -> dict[str, tuple[bytes | None, list[str], MemberState | None]]:
        return {mid: (self._tables.memories[mid].vector, [kid for kid, _, _ in self._links_of_memory(mid)],
                      self.member_state(mid)) for mid in dict.fromkeys(memory_ids) if mid in self._tables.memories}

    def idempotent_result(self, key: str) -> tuple[dict[str, Any], str | None] | None:
        row = self._tables.idempotency.get(key)
        return None if row is None else (json.loads(row[0]), row[2])

    def meta(self) -> dict[str, str]:
        return dict(self._tables.meta)

    def meta_value(self, name: str) -> str | None:
        return self._tables.meta.get(name)

    def indexed_holding(self, forms: Sequence[str]) -> set[str]:
        return {m.memory.id for m in self._tables.memories.values()
                if m.memory.rowid in self._tables.fts and any(f in m.memory.content for f in forms)}

    def document_frequencies(self, tokens: Sequence[str]) -> dict[str, int]:
        wanted, out = set(tokens), dict[str, int]()
        for content, keys in self._tables.fts.values():
            for token in set(_fts_tokens(content)) | set(_fts_tokens(keys)):
                if token in wanted:
                    out[token] = out.get(token, 0) + 1
        return out

    # -- KeyReads -------------------------------------------------------------------------

    def key_info(self, key_id: str) -> KeyInfo:
        row = self._tables.keys[key_id].row
        aliases = self._aliases_of(key_id)
        return KeyInfo(id=row.id, concept=row.concept, key_type=row.key_type,  # type: ignore[arg-type]
                       compact=row.compact, aliases=tuple(a.alias for a in aliases),
                       alias_compacts=tuple(a.compact for a in aliases),
                       link_count=len(self._links_of_key(key_id)))

    def keys_named(self, norms: Sequence[str]) -> dict[str, str]:
        wanted = set(norms)
        out: dict[str, str] = {}
        for stored in sorted(self._tables.keys.values(), key=lambda k: k.row.id, reverse=True):
            if stored.row.norm in wanted:
                out[stored.row.norm] = stored.row.id
        return out

    def key_concept(self, key_id: str) -> str | None:
        stored = self._tables.keys.get(key_id)
        return None if stored is None else stored.row.concept

    def key_count(self) -> int:
        return len(self._tables.keys)

    def has_hangul_keys(self) -> bool:
        return any(_HANGUL_SYLLABLE.search(k.row.concept) for k in self._tables.keys.values())

    def stored_keys(self) -> Iterator[tuple[KeyInfo, bytes | None]]:
        for key_id, stored in list(self._tables.keys.items()):
            yield self.key_info(key_id), stored.row.vector

    def key_concepts(self) -> list[tuple[str, str]]:
        return [(k.row.id, k.row.concept) for k in self._tables.keys.values()]

    def key_rows(self, key_ids: Sequence[str]) -> dict[str, tuple[KeyInfo, bytes]]:
        return {key_id: (self.key_info(key_id), self._tables.keys[key_id].row.vector)
                for key_id in dict.fromkeys(key_ids) if key_id in self._tables.keys}

    def keys_after(self, rowid: int) -> list[tuple[int, str, str]]:
        return [(k.rowid, k.row.id, k.row.concept) for k in self._tables.keys.values() if k.rowid > rowid]

    def keys_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        return [(k.row.id, k.row.concept) for k in self._tables.keys.values() if any(f in k.row.concept for f in forms)]

    def aliases_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        return [(kid, a.alias) for (kid, _), a in sorted(self._tables.aliases.items())
                if any(f in a.alias for f in forms)]

    def duplicate_key_norms(self) -> list[str]:
        norms = [k.row.norm for k in self._tables.keys.values()]
        return sorted({n for n in norms if norms.count(n) > 1})

    def learned_aliases(self, key_id: str) -> list[str]:
        return [a.alias for a in self._aliases_of(key_id) if a.learned]

    def learned_alias_count(self, key_id: str) -> int:
        return len(self.learned_aliases(key_id))

    def stale_learned_aliases(self, cutoff: float) -> list[tuple[str, str]]:
        return [pair for pair, a in sorted(self._tables.aliases.items())
                if a.learned and a.hits == 0 and a.added_at <= cutoff]

    def key_texts_of(self, memory_id: str, *, likely: Sequence[str] | None = None) -> list[str]:
        texts: list[str] = []
        for kid, _, _ in self._links_of_memory(memory_id):
            texts.append(self._tables.keys[kid].row.concept)
            texts.extend(a.alias for (k, _), a in sorted(self._tables.aliases.items()) if k == kid)
        return texts

    def key_ids_of(self, memory_id: str, *, manual_only: bool = False) -> list[str]:
        return [kid for kid, _, auto in self._links_of_memory(memory_id) if not (manual_only and auto)]

    def links_of(self, memory_id: str) -> list[tuple[str, float, bool]]:
        return sorted(self._links_of_memory(memory_id), key=lambda link: -link[1])

    def link_weight(self, key_id: str, memory_id: str) -> float | None:
        link = self._tables.links.get((key_id, memory_id))
        return None if link is None else link[0]

    def has_links(self, key_id: str) -> bool:
        return any(kid == key_id for kid, _ in self._tables.links)

    def memories_linked_to(self, key_ids: Sequence[str], *, limit: int | None = None) -> list[str]:
        if limit is not None and len(key_ids) == 1:
            return [mid for mid, _, _ in self._links_of_key(key_ids[0])][:limit]
        wanted = set(key_ids)
        return sorted({mid for kid, mid in self._tables.links if kid in wanted})

    def co_members(self, key_id: str, memory_id: str, limit: int) -> list[str]:
        return [mid for mid, _, _ in self._links_of_key(key_id) if mid != memory_id][:limit]

    def link_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for kid, _ in sorted(self._tables.links):
            counts[kid] = counts.get(kid, 0) + 1
        return counts

    def unexpiring_counts(self, of: Sequence[str] | None = None) -> list[tuple[str, str, int]]:
        counts: dict[tuple[str, str], int] = {}
        for kid, mid in self._tables.links:
            if of is not None and kid not in of:
                continue
            m = self._tables.memories[mid].memory
            if m.superseded_by is None and m.expires_at is None:
                counts[kid, m.namespace] = counts.get((kid, m.namespace), 0) + 1
        return [(kid, ns, n) for (kid, ns), n in sorted(counts.items())]

    def loanword_evidence(self, key_id: str, limit: int) -> list[tuple[str, list[str]]]:
        out = []
        for mid, _, _ in self._links_of_key(key_id):
            m = self._tables.memories[mid].memory
            if m.superseded_by is None:
                out.append((m.content, [self._tables.keys[k].row.concept for k, _, _ in self._links_of_memory(mid)]))
        return out[:limit]

    # -- SearchReads ----------------------------------------------------------------------

    def _live(self, memory_id: str, now: float, scope: Scope) -> Memory | None:
        stored = self._tables.memories.get(memory_id)
        if stored is None or not stored.memory.active(now):
            return None
        return stored.memory if scope is None or stored.memory.namespace in scope else None

    def lexical_hits(self, tokens: Sequence[str], scope: Scope, now: float, limit: int
                     ) -> list[tuple[str, float]]:
        """FTS5's ``bm25()`` over the whole index, the distinct tokens ORed (each a phrase):
        the best ``limit`` active memories in scope, as (id, score >= 0)."""
        phrases = [p for p in (_fts_tokens(t) for t in dict.fromkeys(tokens) if t) if p]
        if not phrases or not self._tables.fts:
            return []
        columns = {rowid: (_fts_tokens(content), _fts_tokens(keys)) for rowid, (content, keys) in
                   self._tables.fts.items()}
        avgdl = sum(len(c) + len(k) for c, k in columns.values()) / len(columns)
        freqs = {rowid: [sum(w * _occurrences(p, col) for w, col in zip(LEXICAL_WEIGHTS, cols, strict=True))
                         for p in phrases] for rowid, cols in columns.items()}
        idf = []
        for i in range(len(phrases)):
            hits = sum(1 for f in freqs.values() if f[i] > 0)
            value = math.log((len(columns) - hits + 0.5) / (hits + 0.5))
            idf.append(value if value > 0 else _BM25_MIN_IDF)
        by_rowid = {m.memory.rowid: m.memory.id for m in self._tables.memories.values()}
        scored = []
        for rowid, f in freqs.items():
            mid = by_rowid.get(rowid)
            if not any(f) or mid is None or self._live(mid, now, scope) is None:
                continue
            norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * sum(len(c) for c in columns[rowid]) / avgdl)
            scored.append((sum(idf[i] * f[i] * (_BM25_K1 + 1.0) / (f[i] + norm) for i in range(len(phrases))),
                           rowid, mid))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [(mid, score) for score, _, mid in scored[:limit]]

    def indexed_tokens(self, memory_ids: Iterable[str]) -> dict[str, tuple[list[str], list[str]]]:
        out = {}
        for mid in dict.fromkeys(memory_ids):
            stored = self._tables.memories.get(mid)
            row = None if stored is None else self._tables.fts.get(stored.memory.rowid)
            if row is not None:
                out[mid] = (row[0].split(), row[1].split())
        return out

    def key_members(self, key_ids: Sequence[str], scope: Scope, now: float, per_key: int
                    ) -> dict[str, list[tuple[str, float]]]:
        return {kid: sorted(((mid, w) for mid, w, _ in self._links_of_key(kid)
                             if self._live(mid, now, scope) is not None), key=lambda m: -m[1])[:per_key]
                for kid in key_ids}

    def key_links(self, key_id: str, *, among: Sequence[str] | None = None, strongest: int | None = None
                  ) -> list[tuple[str, float]]:
        links = [(mid, w) for mid, w, _ in self._links_of_key(key_id)]
        if among is None and strongest is None:
            return links
        wanted = set(among or ())
        return [link for link in links if link[0] in wanted] + (
            sorted(links, key=lambda link: -link[1])[:strongest] if strongest is not None else [])

    def links_by_memory(self, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
        out: dict[str, dict[str, tuple[float, bool]]] = {}
        for mid in dict.fromkeys(memory_ids):
            for kid, w, auto in self._links_of_memory(mid):
                out.setdefault(mid, {})[kid] = (w, auto)
        return out

    def observed_between(self, start: float, end: float, scope: Scope, now: float, limit: int) -> list[str]:
        inside = [m for m in (self._live(mid, now, scope) for mid in self._tables.memories)
                  if m is not None and start <= m.when < end]
        return [m.id for m in sorted(inside, key=lambda m: -m.when)[:limit]]

    def related_either_way(self, memory_id: str) -> list[str]:
        return list(dict.fromkeys(self.explicit_neighbours(memory_id)))

    # -- TransferReads --------------------------------------------------------------------

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def export_rows(self, *, include_vectors: bool) -> dict[str, list[dict[str, Any]]]:
        t = self._tables
        aliases: dict[str, list[dict[str, Any]]] = {}
        for (kid, _), a in sorted(t.aliases.items()):
            aliases.setdefault(kid, []).append(
                {"alias": a.alias, "learned": a.learned, "added_at": a.added_at, "hits": a.hits})
        keys = []
        for kid, k in sorted(t.keys.items()):
            item: dict[str, Any] = {"id": kid, "concept": k.row.concept, "key_type": k.row.key_type,
                                    "created_at": k.row.created_at, "aliases": aliases.get(kid, [])}
            if include_vectors:
                item["vector"] = k.row.vector
            keys.append(item)
        memories = []
        for _, stored in sorted(t.memories.items()):
            item = {name: getattr(stored.memory, name) for name in MEMORY_FIELDS}
            if include_vectors:
                item["vector"] = stored.vector
            memories.append(item)
        return {
            "keys": keys,
            "memories": memories,
            "links": [{"key_id": kid, "memory_id": mid, "weight": w, "auto": auto}
                      for (kid, mid), (w, auto) in sorted(t.links.items())],
            "relations": [{"from": a, "to": b} for a, b in sorted(t.relations)],
            "alias_candidates": [{"key_id": kid, "query_text": c.query_text, "count": c.count,
                                  "last_seen": c.last_seen} for (kid, _), c in sorted(t.candidates.items())],
        }

    # -- InspectReads ---------------------------------------------------------------------

    def newest_memories(self, where: MemoryFilter, *, now: float, limit: int) -> list[Memory]:
        def keeps(m: Memory) -> bool:
            source = m.source or {}
            return all(want is None or have == want for have, want in (
                (m.namespace, where.namespace), (m.decay_profile, where.decay_profile),
                (source.get("host_agent"), where.agent), (source.get("host_session"), where.session))) \
                and (where.since is None or m.created_at >= where.since) \
                and (where.until is None or m.created_at <= where.until) \
                and (where.key_id is None or (where.key_id, m.id) in self._tables.links)

        return sorted((m for m in self._active(now) if keeps(m)), key=lambda m: -m.created_at)[:limit]

    def strongest_links(self, memory_ids: Sequence[str], *, per_memory: int | None = None
                        ) -> dict[str, list[tuple[str, float]]]:
        out: dict[str, list[tuple[str, float]]] = {}
        for mid in dict.fromkeys(memory_ids):
            links = [(kid, w) for kid, w, _ in self.links_of(mid)]
            if per_memory is not None or links:
                out[mid] = links[:per_memory]
        return out

    def aliases_of(self, key_id: str) -> list[Alias]:
        aliases = sorted(self._aliases_of(key_id), key=lambda a: a.learned)
        return [Alias(a.alias, a.learned, a.hits) for a in aliases]

    def co_occurring_keys(self, key_id: str, *, sample: int, limit: int) -> list[tuple[str, int]]:
        counts: dict[str, int] = {}
        for mid, _, _ in self._links_of_key(key_id)[:sample]:
            for kid, _, _ in self._links_of_memory(mid):
                if kid != key_id:
                    counts[kid] = counts.get(kid, 0) + 1
        return sorted(counts.items(), key=lambda c: -c[1])[:limit]

    def strongest_members(self, key_id: str, *, now: float, limit: int) -> list[Memory]:
        members = [(w, self._tables.memories[mid].memory) for mid, w, _ in self._links_of_key(key_id)]
        live = [(w, m) for w, m in members if m.active(now)]
        return [m for _, m in sorted(live, key=lambda wm: (-wm[0], -wm[1].depth))][:limit]

    def activity_entries(self, *, after: int = 0, before: int | None = None, kind: str | None = None,
                         memory_id: str | None = None, limit: int) -> list[ActivityEntry]:
        entries = [e for e in reversed(self._tables.activity.values()) if e.id > after
                   and (before is None or e.id < before) and (kind is None or e.kind == kind)
                   and (memory_id is None or e.memory_id == memory_id)]
        return entries[:limit]

    def latest_activity_id(self) -> int:
        return max(self._tables.activity, default=0)


_HANGUL_SYLLABLE: Final = re.compile("[가-힣]")


@dataclass(slots=True)
class InMemoryWriter(InMemoryReader):
    """A unit of work on a private copy of the tables, committed by swapping it in. Deleting
    a memory or a key removes what refers to it, as the schema's ON DELETE CASCADE does."""

    _after: list[Callable[[], object]] = field(default_factory=list)

    def after_commit(self, callback: Callable[[], object]) -> None:
        self._after.append(callback)

    def _change(self, memory_id: str, **changes: Any) -> None:
        stored = self._tables.memories.get(memory_id)
        if stored is not None:
            self._tables.memories[memory_id] = replace(stored, memory=replace(stored.memory, **changes))

    # -- MemoryWrites ---------------------------------------------------------------------

    def insert_memory(self, row: MemoryRow) -> None:
        if row.id in self._tables.memories:
            raise StoreError("the store refused the write: UNIQUE constraint failed: memories.id")
        source = _json_copy(row.source)
        memory = Memory(
            id=row.id, content=row.content, namespace=row.namespace, depth=0.0, access_count=0,
            created_at=row.at, updated_at=row.at, last_accessed=None, observed_at=row.observed_at,
            last_confirmed_at=row.at, confirmation_count=1, decay_profile=row.decay_profile,  # type: ignore[arg-type]
            last_confirmation_evidence="user", last_confirmation_source=source, last_confirmation_id=None,
            expires_at=row.expires_at, supersedes=row.supersedes, superseded_by=None, source=_json_copy(row.source),
            rowid=self._next_memory_rowid())
        self._tables.memories[row.id] = StoredMemory(memory, row.dedup_hash, row.vector)

    def _next_memory_rowid(self) -> int:
        """INTEGER PRIMARY KEY, as in SQLite: one past the largest row id in the table."""
        return max((m.memory.rowid for m in self._tables.memories.values()), default=0) + 1

    def fold_into_twin(self, memory_id: str, *, now: float, source: Mapping[str, Any],
                       expires_at: float | None) -> None:
        memory = self._tables.memories[memory_id].memory
        changes: dict[str, Any] = {"last_confirmed_at": now, "updated_at": now, "last_confirmation_evidence": "user",
                                   "last_confirmation_source": _json_copy(source),
                                   "confirmation_count": memory.confirmation_count + 1}
        if expires_at is not None:
            changes["expires_at"] = expires_at
        self._change(memory_id, **changes)

    def supersede(self, old_id: str, new_id: str, *, depth_factor: float, now: float) -> None:
        old = self._tables.memories[old_id].memory
        self._change(old_id, superseded_by=new_id, depth=old.depth * depth_factor, updated_at=now)

    def clear_supersedes(self, memory_id: str) -> None:
        self._change(memory_id, supersedes=None)

    def restore(self, memory_id: str) -> None:
        self._change(memory_id, superseded_by=None)

    def delete_memory(self, memory_id: str) -> None:
        t = self._tables
        t.memories.pop(memory_id, None)
        t.links = {pair: link for pair, link in t.links.items() if pair[1] != memory_id}
        t.relations = {pair for pair in t.relations if memory_id not in pair}

    def confirm(self, memory_id: str, *, now: float, depth_step: float, evidence: str,
                source: Mapping[str, Any], confirmation_id: str | None) -> None:
        memory = self._tables.memories[memory_id].memory
        self._change(memory_id, last_confirmed_at=now, confirmation_count=memory.confirmation_count + 1,
                     depth=min(1.0, memory.depth + depth_step), last_confirmation_evidence=evidence,
                     last_confirmation_source=_json_copy(source), last_confirmation_id=confirmation_id,
                     updated_at=now)

    def count_access(self, memory_id: str, now: float) -> None:
        memory = self._tables.memories[memory_id].memory
        self._change(memory_id, access_count=memory.access_count + 1, last_accessed=now)

    def set_memory_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        for vector, mid in pairs:
            if mid in self._tables.memories:
                self._tables.memories[mid] = replace(self._tables.memories[mid], vector=vector)

    def add_relations(self, memory_id: str, related: Sequence[str]) -> None:
        self._tables.relations.update((memory_id, r) for r in related if r != memory_id)

    def record_idempotent(self, key: str, result: str, created_at: float, fingerprint: str) -> None:
        if key in self._tables.idempotency:
            raise StoreError("the store refused the write: UNIQUE constraint failed: idempotency.key")
        self._tables.idempotency[key] = (result, created_at, fingerprint)

    def prune_idempotency(self, before: float) -> None:
        t = self._tables
        t.idempotency = {k: v for k, v in t.idempotency.items() if v[1] > before}

    def set_meta(self, values: Mapping[str, str]) -> None:
        self._tables.meta.update(values)

    def delete_meta_prefixed(self, prefix: str) -> None:
        t = self._tables
        t.meta = {k: v for k, v in t.meta.items() if not k.startswith(prefix)}

    def index_memory(self, memory_id: str, content_tokens: str, key_tokens: str) -> None:
        self._tables.fts[self._tables.memories[memory_id].memory.rowid] = (content_tokens, key_tokens)

    def set_key_tokens(self, memory_id: str, key_tokens: str) -> None:
        stored = self._tables.memories.get(memory_id)
        if stored is not None and stored.memory.rowid in self._tables.fts:
            content, _ = self._tables.fts[stored.memory.rowid]
            self._tables.fts[stored.memory.rowid] = (content, key_tokens)

    def unindex(self, rowid: int) -> None:
        self._tables.fts.pop(rowid, None)

    # -- KeyWrites ------------------------------------------------------------------------

    def insert_key(self, row: KeyRow) -> None:
        if row.id in self._tables.keys:
            raise StoreError("the store refused the write: UNIQUE constraint failed: keys.id")
        rowid = max((k.rowid for k in self._tables.keys.values()), default=0) + 1
        self._tables.keys[row.id] = StoredKey(row, rowid)

    def _change_key(self, key_id: str, **changes: Any) -> None:
        stored = self._tables.keys.get(key_id)
        if stored is not None:
            self._tables.keys[key_id] = replace(stored, row=replace(stored.row, **changes))

    def set_key_type(self, key_id: str, key_type: str) -> None:
        self._change_key(key_id, key_type=key_type)

    def set_key_compact(self, key_id: str, compact: str) -> None:
        self._change_key(key_id, compact=compact)

    def set_alias_compact(self, key_id: str, alias: str, compact: str) -> None:
        for pair, a in list(self._tables.aliases.items()):
            if pair[0] == key_id and a.alias == alias:
                self._tables.aliases[pair] = replace(a, compact=compact)

    def set_key_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        for vector, kid in pairs:
            self._change_key(kid, vector=vector)

    def delete_key(self, key_id: str) -> None:
        t = self._tables
        t.keys.pop(key_id, None)
        t.links = {pair: link for pair, link in t.links.items() if pair[0] != key_id}
        t.aliases = {pair: a for pair, a in t.aliases.items() if pair[0] != key_id}
        t.candidates = {pair: c for pair, c in t.candidates.items() if pair[0] != key_id}

    def merge_keys_named(self, norm: str) -> tuple[int, set[str]]:
        t = self._tables
        rows = sorted((k for k in t.keys.values() if k.row.norm == norm), key=lambda k: (k.row.created_at, k.rowid))
        keep, duplicates = rows[0].row.id, [k.row.id for k in rows[1:]]
        entity = next((k.row.key_type for k in rows if k.row.key_type != "concept"), None)
        if entity is not None and rows[0].row.key_type == "concept":
            self.set_key_type(keep, entity)
        memories: set[str] = set()
        for dup in duplicates:
            for mid, weight, auto in self._links_of_key(dup):
                memories.add(mid)
                old = t.links.get((keep, mid))
                t.links[keep, mid] = (weight, auto) if old is None else (max(old[0], weight), old[1] and auto)
            for (kid, alias_norm), a in list(t.aliases.items()):
                if kid == dup and alias_norm != norm:
                    old_alias = t.aliases.get((keep, alias_norm))
                    t.aliases[keep, alias_norm] = a if old_alias is None else replace(
                        old_alias, hits=old_alias.hits + a.hits, learned=old_alias.learned and a.learned)
            for (kid, cand_norm), c in list(t.candidates.items()):
                if kid == dup:
                    old_c = t.candidates.get((keep, cand_norm))
                    t.candidates[keep, cand_norm] = c if old_c is None else replace(
                        old_c, count=old_c.count + c.count, last_seen=max(old_c.last_seen, c.last_seen))
            self.delete_key(dup)
        return len(duplicates), memories

    def add_alias(self, key_id: str, alias: str, *, norm: str, compact: str, learned: bool,
                  added_at: float) -> bool:
        if (key_id, norm) in self._tables.aliases:
            return False
        self._tables.aliases[key_id, norm] = StoredAlias(alias, compact, learned, added_at)
        return True

    def delete_aliases(self, pairs: Sequence[tuple[str, str]]) -> None:
        for pair in pairs:
            self._tables.aliases.pop(pair, None)

    def count_alias_hits(self, pairs: Sequence[tuple[str, str]]) -> None:
        for pair in pairs:
            a = self._tables.aliases.get(pair)
            if a is not None and a.learned:
                self._tables.aliases[pair] = replace(a, hits=a.hits + 1)

    def see_alias_candidate(self, key_id: str, norm: str, text: str, now: float) -> int:
        old = self._tables.candidates.get((key_id, norm))
        count = 1 if old is None else old.count + 1
        self._tables.candidates[key_id, norm] = Candidate(text, count, now)
        return count

    def drop_alias_candidate(self, key_id: str, norm: str) -> None:
        self._tables.candidates.pop((key_id, norm), None)

    def unsee_alias_candidate(self, key_id: str, norm: str) -> str | None:
        c = self._tables.candidates.get((key_id, norm))
        if c is None:
            return None
        if c.count <= 1:
            self.drop_alias_candidate(key_id, norm)
        else:
            self._tables.candidates[key_id, norm] = replace(c, count=c.count - 1)
        return c.query_text

    def prune_alias_candidates(self, cutoff: float) -> int:
        t = self._tables
        kept = {pair: c for pair, c in t.candidates.items() if c.last_seen > cutoff}
        gone, t.candidates = len(t.candidates) - len(kept), kept
        return gone

    def link(self, key_id: str, memory_id: str, weight: float, auto: bool) -> bool:
        if (key_id, memory_id) in self._tables.links:
            return False
        if key_id not in self._tables.keys or memory_id not in self._tables.memories:
            raise StoreError("the store refused the write: FOREIGN KEY constraint failed")
        self._tables.links[key_id, memory_id] = (float(weight), bool(auto))
        return True

    def link_all(self, key_ids: Sequence[str], memory_id: str, weight: float, auto: bool) -> list[str]:
        return [key_id for key_id in key_ids if self.link(key_id, memory_id, weight, auto)]

    def add_links(self, links: Sequence[tuple[str, str, float, bool]]) -> None:
        for kid, mid, weight, auto in links:
            self.link(kid, mid, weight, auto)

    def set_link_weight(self, key_id: str, memory_id: str, weight: float) -> None:
        if (key_id, memory_id) in self._tables.links:
            self._tables.links[key_id, memory_id] = (float(weight), self._tables.links[key_id, memory_id][1])

    # -- SearchWrites ---------------------------------------------------------------------

    def mark_accessed(self, memory_ids: Iterable[str], now: float) -> None:
        for mid in memory_ids:
            if mid in self._tables.memories:
                self.count_access(mid, now)

    def bump_links(self, bumps: Sequence[tuple[float, str, str]], *, ceiling: float) -> None:
        for amount, kid, mid in bumps:
            link = self._tables.links.get((kid, mid))
            if link is not None:
                self._tables.links[kid, mid] = (min(float(ceiling), link[0] + amount), link[1])

    def decay_links(self, key_ids: Iterable[str], sparing: Iterable[str], by: float, *, floor: float) -> None:
        keys, spared, links = set(key_ids), set(sparing), self._tables.links
        for (kid, mid), (w, auto) in list(links.items()):
            if kid in keys and mid not in spared:
                links[kid, mid] = (max(float(floor), w - by), auto)

    # -- TransferWrites: a row the schema refuses raises ValueError --------------------------

    def key_named(self, key_id: str, norm: str) -> str | None:
        if key_id in self._tables.keys:
            return key_id
        return next((k.row.id for k in sorted(self._tables.keys.values(), key=lambda k: k.row.id)
                     if k.row.norm == norm), None)

    def import_key(self, key_id: str, concept: str, norm: str, compact: str, key_type: str, vector: bytes,
                   created_at: float) -> None:
        if key_type not in _KEY_TYPES:
            raise ValueError("CHECK constraint failed: key_type IN ('concept', 'name', 'proper_noun')")
        try:
            self.insert_key(KeyRow(key_id, concept, norm, compact, key_type, vector, created_at))
        except StoreError as exc:
            raise ValueError("UNIQUE constraint failed: keys.id") from exc

    def import_alias(self, key_id: str, alias: str, norm: str, compact: str, *, learned: bool, added_at: float,
                     hits: int) -> None:
        self._require("keys", key_id)
        self._tables.aliases.setdefault((key_id, norm), StoredAlias(alias, compact, learned, added_at, hits))

    def import_memory(self, fields: Mapping[str, Any], dedup_hash: str, vector: bytes) -> None:
        values = {name: fields[name] for name in MEMORY_FIELDS}
        if values["id"] in self._tables.memories:
            raise ValueError("UNIQUE constraint failed: memories.id")
        if values["decay_profile"] not in _DECAY_PROFILES:
            raise ValueError("CHECK constraint failed: decay_profile")
        for name in ("source", "last_confirmation_source"):
            values[name] = None if values[name] is None else _json_copy(values[name])
        memory = Memory(**values, rowid=self._next_memory_rowid())
        self._tables.memories[memory.id] = StoredMemory(memory, dedup_hash, vector)

    def import_link(self, key_id: str, memory_id: str, weight: float, *, auto: bool) -> int:
        self._require("keys", key_id)
        self._require("memories", memory_id)
        if (key_id, memory_id) in self._tables.links:
            return 0
        self._tables.links[key_id, memory_id] = (float(weight), bool(auto))
        return 1

    def import_relation(self, from_id: str, to_id: str) -> int:
        self._require("memories", from_id)
        self._require("memories", to_id)
        if (from_id, to_id) in self._tables.relations:
            return 0
        self._tables.relations.add((from_id, to_id))
        return 1

    def import_alias_candidate(self, key_id: str, norm: str, query_text: str, count: int, last_seen: float) -> None:
        self._require("keys", key_id)
        self._tables.candidates.setdefault((key_id, norm), Candidate(query_text, count, last_seen))

    def drop_dangling_supersessions(self) -> None:
        for mid, stored in list(self._tables.memories.items()):
            if stored.memory.superseded_by is not None and stored.memory.superseded_by not in self._tables.memories:
                self._change(mid, superseded_by=None)

    def _require(self, table: Literal["keys", "memories"], row_id: str) -> None:
        if row_id not in (self._tables.keys if table == "keys" else self._tables.memories):
            raise ValueError("FOREIGN KEY constraint failed")

    # -- InspectWrites --------------------------------------------------------------------

    def add_activity(self, rows: Sequence[ActivityRow], *, keep: int) -> None:
        log = self._tables.activity
        for row in rows:
            entry_id = max(log, default=0) + 1
            log[entry_id] = ActivityEntry(entry_id, row.at, row.kind, row.memory_id, row.summary,
                                          json.loads(row.detail_json))
        newest = max(log, default=0)
        self._tables.activity = {i: e for i, e in log.items() if i > newest - keep}

    def prune_activity(self, *, before: float) -> int:
        log = self._tables.activity
        self._tables.activity = {i: e for i, e in log.items() if e.at >= before}
        return len(log) - len(self._tables.activity)


class InMemoryRepository:
    """``engine.ports.Repository`` on dicts. Writes are serialised and each is one unit of
    work: ``fn`` changes a copy of the tables, which replaces the committed ones only if
    ``fn`` returns; then the ``after_commit`` callbacks run in order (a failing one is
    logged, as the SQLite writer does). Reads see the last committed tables."""

    found: Literal["store", "missing", "empty"]
    lost: str | None

    def __init__(self) -> None:
        self.shared = False  # one engine writes to it, as to a SQLite file
        self.found = "missing"  # a new, empty store, as SQLite reports a file it created
        self.lost = None
        self._tables = Tables()
        self._write_lock = threading.Lock()
        self._writing: threading.Thread | None = None
        self._closed = False

    def read(self, fn: Callable[[InMemoryReader], T]) -> T:
        self._check_open()
        return fn(InMemoryReader(self._tables))

    def load(self, fn: Callable[[InMemoryReader], T]) -> T:
        return self.read(fn)

    def write(self, fn: Callable[[InMemoryWriter], T]) -> T:
        if self._writing is threading.current_thread():
            raise RuntimeError("InMemoryRepository.write called from inside a write transaction")
        self._check_open()
        with self._write_lock:
            self._writing = threading.current_thread()
            try:
                tx = InMemoryWriter(self._tables.copy())
                result = fn(tx)
                self._tables = tx._tables
            finally:
                self._writing = None
        for callback in tx._after:
            try:
                callback()
            except Exception:
                logger.exception("an after-commit step failed; the in-memory index may lag")
        return result

    def wait_for_commits(self) -> None:
        """Nothing to wait for: no change log is followed."""

    def check_files(self) -> str | None:
        return None  # no file can be replaced under it

    def checkpoint(self) -> None:
        """Nothing to fold: every commit is already the whole state."""

    def backup_to(self, dest: Path) -> None:
        """The committed tables, pickled to ``dest``."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(pickle.dumps(self._tables))

    def integrity_check(self) -> str:
        """"ok", or the rows that refer to nothing (what SQLite's foreign keys prevent)."""
        t = self._tables
        dangling = [("link", *pair) for pair in t.links if pair[0] not in t.keys or pair[1] not in t.memories]
        dangling += [("relation", *pair) for pair in t.relations if not set(pair) <= t.memories.keys()]
        dangling += [("alias", *pair) for pair in [*t.aliases, *t.candidates] if pair[0] not in t.keys]
        return "ok" if not dangling else f"rows referring to nothing: {sorted(dangling)}"

    def analyze(self) -> None:
        """Nothing to do: dicts have no query planner."""

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")
