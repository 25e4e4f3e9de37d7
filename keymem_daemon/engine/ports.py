"""The engine's view of storage: what a read snapshot and a write transaction offer, in the
engine's terms. ``store/sqlite`` implements it (and ``store/postgres`` next to it), as does
the in-memory fake of the fast test tier (``tests/unit/fakes.py``); nothing in ``engine/``
imports a store module or holds SQL.

The engine runs work as units: ``repository.read(fn)`` calls ``fn(reader)`` inside one
snapshot, ``repository.write(fn)`` calls ``fn(writer)`` inside one transaction that commits
when ``fn`` returns (``writer.after_commit`` callbacks run after the COMMIT, in order). A read
run inside a read of the same thread runs in that one's snapshot: work made of several reads
(a recall) reads one state of the store, in one transaction. Each
area's operations are one Protocol below; ``Reader`` and ``Writer`` combine them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from keymem_daemon.engine.keys import KeyInfo, MemberState
from keymem_daemon.engine.records import Memory

T = TypeVar("T")


# -- memories: memory rows, relations, idempotency, meta, vocabulary (store/sqlite/memories.py)

@dataclass(frozen=True, slots=True)
class MemoryRow:
    """A memory as a write inserts it: new (confirmed once, by the user, at ``at``)."""

    id: str
    content: str
    dedup_hash: str
    namespace: str
    at: float
    observed_at: float | None
    decay_profile: str
    source: Mapping[str, Any]
    expires_at: float | None
    vector: bytes
    """float32 values, as ``engine.indexes.vector_bytes`` packs them."""
    supersedes: str | None = None


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """How big the store is (``stats``)."""

    keys: int
    links: int
    namespaces: dict[str, int]
    superseded: int
    expired: int


class MemoryReads(Protocol):
    """Memory rows, their relations, idempotency records and meta values."""

    def memory(self, memory_id: str) -> Memory | None:
        """The memory with this id, active or not, or None."""

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        """The memories with these ids that exist, by id."""

    def memory_content(self, memory_id: str) -> str | None:
        """The text of one memory (None: no such memory)."""

    def is_current(self, memory_id: str) -> bool:
        """Whether the memory exists and is not superseded (expired ones count)."""

    def active_twin(self, namespace: str, digest: str, now: float) -> str | None:
        """An active memory of ``namespace`` whose normalised text hashes to ``digest``."""

    def predecessor_of(self, memory_id: str) -> str | None:
        """The memory ``memory_id`` superseded (its ``superseded_by`` is ``memory_id``)."""

    def member_state(self, memory_id: str) -> MemberState | None:
        """What the memory contributes to key counts (None: gone or superseded)."""

    def count_active(self, namespace: str | None, now: float) -> int:
        """Active memories in a namespace (None: in all of them)."""

    def memory_rows(self) -> int:
        """Every memory the store holds, superseded and expired ones too."""

    def active_page(self, namespace: str | None, now: float, limit: int, offset: int) -> tuple[int, list[Memory]]:
        """How many active memories ``namespace`` (None: all) holds, and one page of them in
        insertion order."""

    def expired_memories(self, now: float) -> list[Memory]:
        """Memories whose expiry instant lies before ``now``."""

    def batch_siblings(self, batch_id: str, memory: Memory, now: float) -> list[str]:
        """Other active memories of ``memory``'s namespace written in batch ``batch_id``."""

    def related_ids(self, memory_id: str) -> list[str]:
        """The memories ``memory_id`` names as related, by id."""

    def explicit_neighbours(self, memory_id: str) -> list[str]:
        """Every memory related to ``memory_id`` either way (one entry per relation)."""

    def counts(self, now: float) -> StoreCounts:
        """How many keys, links, active memories per namespace, superseded and expired ones."""

    def stored_vectors(self, expected_bytes: int) -> Iterator[tuple[str, str, bytes | None, bool, str | None]]:
        """Every memory with a vector, streamed: ``(id, namespace, vector, superseded,
        content)``; ``content`` only where the vector is not ``expected_bytes`` long."""

    def live_vector_count(self) -> int:
        """Memories not superseded that have a vector (what the body table will hold)."""

    def expiring_ids(self) -> list[str]:
        """Memories not superseded that have an expiry."""

    def vectors_after(self, rowid: int) -> list[tuple[int, str, str]]:
        """``(rowid, id, content)`` of memories with a vector past ``rowid``, in order (re-embedding)."""

    def memory_vector(self, memory_id: str) -> tuple[bytes | None, str]:
        """The stored vector and namespace of an existing memory."""

    def memory_states(self, memory_ids: Sequence[str]) -> dict[str, tuple[bytes | None, list[str], MemberState | None]]:
        """Each stored memory of ``memory_ids`` (a deleted one is left out): its vector, the
        keys it is linked to (key order) and its ``member_state`` (None: superseded), for a
        daemon following another's writes, in one read."""

    def idempotent_result(self, key: str) -> tuple[dict[str, Any], str | None] | None:
        """The answer recorded under an Idempotency-Key and the request's fingerprint."""

    def meta(self) -> dict[str, str]:
        """Every meta value, by name."""

    def meta_value(self, name: str) -> str | None:
        """One meta value."""

    # the lexical index as the writes see it (store/sqlite/search.py ``LexicalRows``)

    def indexed_holding(self, forms: Sequence[str]) -> set[str]:
        """Indexed memories whose text contains one of ``forms``."""

    def document_frequencies(self, tokens: Sequence[str]) -> dict[str, int]:
        """How many indexed memories hold each token (those that none holds are left out)."""


class MemoryWrites(Protocol):
    """Writes of memory rows, relations, idempotency records and meta values."""

    def insert_memory(self, row: MemoryRow) -> None:
        """Store a new memory."""

    def fold_into_twin(self, memory_id: str, *, now: float, source: Mapping[str, Any],
                       expires_at: float | None) -> None:
        """A repeated memory confirms its twin (by the user, now); ``expires_at`` None keeps
        the twin's expiry."""

    def supersede(self, old_id: str, new_id: str, *, depth_factor: float, now: float) -> None:
        """Mark ``old_id`` superseded by ``new_id``, its depth scaled by ``depth_factor``."""

    def clear_supersedes(self, memory_id: str) -> None:
        """The memory no longer names a predecessor."""

    def restore(self, memory_id: str) -> None:
        """A superseded memory becomes active again (its successor was deleted)."""

    def delete_memory(self, memory_id: str) -> None:
        """Delete one memory; its links and relations cascade."""

    def confirm(self, memory_id: str, *, now: float, depth_step: float, evidence: str,
                source: Mapping[str, Any], confirmation_id: str | None) -> None:
        """One more confirmation: depth grows by ``depth_step`` (capped at 1)."""

    def count_access(self, memory_id: str, now: float) -> None:
        """The memory was read once more."""

    def set_memory_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        """Replace stored vectors: ``(vector, memory_id)`` pairs."""

    def add_relations(self, memory_id: str, related: Sequence[str]) -> None:
        """``memory_id`` names each of ``related`` as related (itself and repeats skipped)."""

    def record_idempotent(self, key: str, result: str, created_at: float, fingerprint: str) -> None:
        """Keep a write's JSON answer under its Idempotency-Key."""

    def prune_idempotency(self, before: float) -> None:
        """Forget the Idempotency-Keys recorded at or before ``before``."""

    def set_meta(self, values: Mapping[str, str]) -> None:
        """Set meta values by name."""

    def delete_meta_prefixed(self, prefix: str) -> None:
        """Delete the meta values whose name starts with ``prefix``."""

    # the lexical index rows a write keeps in step (store/sqlite/search.py ``LexicalRows``)

    def index_memory(self, memory_id: str, content_tokens: str, key_tokens: str) -> None:
        """(Re-)index a memory's text and key tokens."""

    def set_key_tokens(self, memory_id: str, key_tokens: str) -> None:
        """Replace an indexed memory's key tokens."""

    def unindex(self, rowid: int) -> None:
        """Take a memory (by its ``Memory.rowid``) out of the lexical index."""


# -- keys: keys, aliases, links (store/sqlite/keys.py) -----------------------------------------

@dataclass(frozen=True, slots=True)
class KeyRow:
    """A key as a write creates it."""

    id: str
    concept: str
    norm: str
    compact: str
    key_type: str
    vector: bytes
    """float32 values, as ``engine.indexes.vector_bytes`` packs them."""
    created_at: float


class KeyReads(Protocol):
    """Keys, their aliases and alias candidates, and the key->memory links."""

    def key_info(self, key_id: str) -> KeyInfo:
        """What the key index holds of an existing key: text, type, aliases, link count."""

    def key_concept(self, key_id: str) -> str | None:
        """A key's text (None: no such key)."""

    def keys_named(self, norms: Sequence[str]) -> dict[str, str]:
        """For each normalised key text a stored key has, that key's id (the lowest id when
        several have it): a write's new key texts looked up at once."""

    def key_count(self) -> int:
        """How many keys there are."""

    def has_hangul_keys(self) -> bool:
        """Whether any key is (partly) written in Hangul."""

    def stored_keys(self) -> Iterator[tuple[KeyInfo, bytes | None]]:
        """Every key with its aliases and link count, and its stored vector, streamed."""

    def key_concepts(self) -> list[tuple[str, str]]:
        """``(id, concept)`` of every key."""

    def key_rows(self, key_ids: Sequence[str]) -> dict[str, tuple[KeyInfo, bytes]]:
        """Each stored key of ``key_ids`` (a missing one is left out): what ``key_info`` says of
        it and its stored vector, for a daemon following another's writes and a write that
        changed keys, in one read."""

    def keys_after(self, rowid: int) -> list[tuple[int, str, str]]:
        """``(rowid, id, concept)`` of the keys past ``rowid``, in order (re-embedding)."""

    def keys_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        """``(id, concept)`` of keys whose text contains one of ``forms``."""

    def aliases_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        """``(key_id, alias)`` of aliases whose text contains one of ``forms``."""

    def duplicate_key_norms(self) -> list[str]:
        """The normalised texts more than one key has."""

    def learned_aliases(self, key_id: str) -> list[str]:
        """The aliases autokey learned for a key, oldest first."""

    def learned_alias_count(self, key_id: str) -> int:
        """How many aliases autokey learned for a key."""

    def stale_learned_aliases(self, cutoff: float) -> list[tuple[str, str]]:
        """``(key_id, norm)`` of learned aliases never matched, added at or before ``cutoff``."""

    def key_texts_of(self, memory_id: str, *, likely: Sequence[str] | None = None) -> list[str]:
        """The text of each key of a memory, each followed by its aliases (what its key
        tokens are cut from). ``likely``: those texts as the caller's key index holds them;
        a writer on a server may answer with them unread and check them before its COMMIT
        (a write whose check fails runs again, reading: store/postgres/speculation.py)."""

    def key_ids_of(self, memory_id: str, *, manual_only: bool = False) -> list[str]:
        """The keys linked to a memory (``manual_only``: not those autokey linked)."""

    def links_of(self, memory_id: str) -> list[tuple[str, float, bool]]:
        """``(key_id, weight, auto)`` of a memory's links, strongest first."""

    def link_weight(self, key_id: str, memory_id: str) -> float | None:
        """The weight of one link (None: not linked)."""

    def has_links(self, key_id: str) -> bool:
        """Whether any memory is linked to the key."""

    def memories_linked_to(self, key_ids: Sequence[str], *, limit: int | None = None) -> list[str]:
        """The memories linked to any of ``key_ids`` (each once; at most ``limit`` per key
        when a single key is asked for)."""

    def co_members(self, key_id: str, memory_id: str, limit: int) -> list[str]:
        """Up to ``limit`` other memories under ``key_id`` than ``memory_id``."""

    def link_counts(self) -> dict[str, int]:
        """How many links each key has."""

    def unexpiring_counts(self, of: Sequence[str] | None = None) -> list[tuple[str, str, int]]:
        """``(key_id, namespace, n)``: links of each key (or of the keys ``of``) to live
        memories that never expire."""

    def loanword_evidence(self, key_id: str, limit: int) -> list[tuple[str, list[str]]]:
        """Up to ``limit`` live memories under a key: ``(content, texts of all their keys)``."""


class KeyWrites(Protocol):
    """Writes of keys, aliases, alias candidates and links."""

    def insert_key(self, row: KeyRow) -> None:
        """Create a key."""

    def set_key_type(self, key_id: str, key_type: str) -> None:
        """Retype a key (a concept becomes an entity)."""

    def set_key_compact(self, key_id: str, compact: str) -> None:
        """The key's text as the analyzer cuts it now."""

    def set_alias_compact(self, key_id: str, alias: str, compact: str) -> None:
        """An alias's text as the analyzer cuts it now."""

    def set_key_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        """Replace stored key vectors: ``(vector, key_id)`` pairs."""

    def delete_key(self, key_id: str) -> None:
        """Delete a key; its links and aliases cascade."""

    def merge_keys_named(self, norm: str) -> tuple[int, set[str]]:
        """Make the keys with normalised text ``norm`` one: the oldest stays (an entity type
        wins over concept) and takes the others' links (the stronger weight), aliases and
        alias candidates. Returns how many keys went and the memories relinked."""

    def add_alias(self, key_id: str, alias: str, *, norm: str, compact: str, learned: bool,
                  added_at: float) -> bool:
        """Give a key an alias; False if it already had it."""

    def delete_aliases(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Delete aliases by ``(key_id, norm)``."""

    def count_alias_hits(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Each learned alias ``(key_id, norm)`` matched a query once more."""

    def see_alias_candidate(self, key_id: str, norm: str, text: str, now: float) -> int:
        """One more confirmation that query ``text`` means the key; how many it has now."""

    def drop_alias_candidate(self, key_id: str, norm: str) -> None:
        """Forget a candidate alias."""

    def unsee_alias_candidate(self, key_id: str, norm: str) -> str | None:
        """Take one confirmation back from a candidate alias (gone at zero); its query text,
        or None if there was no candidate."""

    def prune_alias_candidates(self, cutoff: float) -> int:
        """Forget candidates last seen at or before ``cutoff``; how many went."""

    def link(self, key_id: str, memory_id: str, weight: float, auto: bool) -> bool:
        """Link a key to a memory; False if they were linked already (left as it was)."""

    def link_all(self, key_ids: Sequence[str], memory_id: str, weight: float, auto: bool) -> list[str]:
        """Link each of the (distinct) keys to a memory, in one statement; the keys that were
        not linked before (the others' links are left as they were)."""

    def add_links(self, links: Sequence[tuple[str, str, float, bool]]) -> None:
        """``(key_id, memory_id, weight, auto)`` links; those that exist stay as they are."""

    def set_link_weight(self, key_id: str, memory_id: str, weight: float) -> None:
        """Set one link's weight."""


# -- search: the lexical index and the reads of retrieval and the push path (store/sqlite/search.py)

Scope = frozenset[str] | None
"""The namespaces a read may see (None: every namespace)."""


class SearchReads(Protocol):
    def lexical_hits(self, tokens: Sequence[str], scope: Scope, now: float, limit: int
                     ) -> list[tuple[str, float]]:
        """Lexical (BM25-like) search of memories' text and key tokens for any of ``tokens``:
        (memory id, score >= 0) of active memories in scope, best first, at most ``limit``."""
        ...

    def indexed_tokens(self, memory_ids: Iterable[str]) -> dict[str, tuple[list[str], list[str]]]:
        """The lexical index's (content tokens, key tokens) of each indexed memory, by id."""
        ...

    def key_members(self, key_ids: Sequence[str], scope: Scope, now: float, per_key: int
                    ) -> dict[str, list[tuple[str, float]]]:
        """Active members of each key in scope, strongest link first, at most ``per_key``:
        key id -> [(memory id, link weight)] (every key asked for is in the answer)."""
        ...

    def key_links(self, key_id: str, *, among: Sequence[str] | None = None, strongest: int | None = None
                  ) -> list[tuple[str, float]]:
        """A key's links, active memories or not, as (memory id, weight): those to ``among``,
        then its ``strongest`` few (strongest first; both in one request to a server); with
        neither, all of them."""
        ...

    def links_by_memory(self, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
        """Each memory's links: memory id -> {key id: (weight, auto)} (unlinked ones absent)."""
        ...

    def observed_between(self, start: float, end: float, scope: Scope, now: float, limit: int) -> list[str]:
        """Active memories in scope observed (else created) in [start, end), latest first."""
        ...

    def related_either_way(self, memory_id: str) -> list[str]:
        """Memories an explicit relation joins to this one, in either direction, each once
        (``explicit_neighbours`` lists one entry per relation)."""
        ...


class SearchWrites(Protocol):
    def mark_accessed(self, memory_ids: Iterable[str], now: float) -> None:
        """Count one more access of each memory, at ``now``."""
        ...

    def bump_links(self, bumps: Sequence[tuple[float, str, str]], *, ceiling: float) -> None:
        """Raise each (amount, key id, memory id) link's weight by its amount, up to ``ceiling``."""
        ...

    def decay_links(self, key_ids: Iterable[str], sparing: Iterable[str], by: float, *, floor: float) -> None:
        """Lower by ``by`` (down to ``floor``) the weights of these keys' links to every memory
        not in ``sparing``."""
        ...


# -- transfer: export and import rows (store/sqlite/transfer.py) -------------------------------

class TransferReads(Protocol):
    def schema_version(self) -> int:
        """The store's schema version (an export records it)."""
        ...

    def export_rows(self, *, include_vectors: bool) -> dict[str, list[dict[str, Any]]]:
        """``keys`` (each with its ``aliases``), ``memories`` (every field of a memory, provenance
        as objects), ``links``, ``relations`` and ``alias_candidates``, sorted by id; with
        ``include_vectors`` keys and memories carry their vector's bytes as ``vector``."""
        ...


class TransferWrites(Protocol):
    """An import's rows. A row the store refuses raises ValueError with the store's reason."""

    def key_named(self, key_id: str, norm: str) -> str | None:
        """The id of the key with this id, else of the one whose normalised text is ``norm``."""
        ...

    def import_key(self, key_id: str, concept: str, norm: str, compact: str, key_type: str, vector: bytes,
                created_at: float) -> None:
        ...

    def import_alias(self, key_id: str, alias: str, norm: str, compact: str, *, learned: bool, added_at: float,
                     hits: int) -> None:
        """Add an alias to a key, unless the key has it already."""
        ...

    def import_memory(self, fields: Mapping[str, Any], dedup_hash: str, vector: bytes) -> None:
        """Insert a memory as given: every field an export lists (provenance as objects)."""
        ...

    def import_link(self, key_id: str, memory_id: str, weight: float, *, auto: bool) -> int:
        """Link a memory to a key unless they are linked already: 1 if added, else 0."""
        ...

    def import_relation(self, from_id: str, to_id: str) -> int:
        """Relate two memories unless they are already: 1 if added, else 0."""
        ...

    def import_alias_candidate(self, key_id: str, norm: str, query_text: str, count: int, last_seen: float) -> None:
        """Record a pending alias candidate unless the key has it already."""
        ...

    def drop_dangling_supersessions(self) -> None:
        """Clear every supersession that names no memory of the store."""
        ...


# -- inspect: the inspector's reads and the activity log (store/sqlite/inspect.py) -------------

@dataclass(frozen=True, slots=True)
class MemoryFilter:
    """Which memories a newest-first listing keeps (``None``: any)."""

    namespace: str | None = None
    decay_profile: str | None = None
    key_id: str | None = None
    agent: str | None = None
    session: str | None = None
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True, slots=True)
class Alias:
    alias: str
    learned: bool
    hits: int


@dataclass(frozen=True, slots=True)
class ActivityEntry:
    """One entry of the activity log."""

    id: int
    at: float
    kind: str
    memory_id: str | None
    summary: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ActivityRow:
    """An entry to record; ``detail_json`` is its detail, serialised when it was recorded."""

    at: float
    kind: str
    memory_id: str | None
    summary: str
    detail_json: str


class InspectReads(Protocol):
    def newest_memories(self, where: MemoryFilter, *, now: float, limit: int) -> list[Memory]:
        """Active memories matching ``where``, newest first."""

    def strongest_links(self, memory_ids: Sequence[str], *, per_memory: int | None = None
                 ) -> dict[str, list[tuple[str, float]]]:
        """Each memory's ``(key_id, weight)`` links, strongest first (at most ``per_memory``)."""

    def aliases_of(self, key_id: str) -> list[Alias]:
        """A key's aliases: the given ones first, then the learned, each in the order added."""

    def co_occurring_keys(self, key_id: str, *, sample: int, limit: int) -> list[tuple[str, int]]:
        """``(key_id, count)`` of the keys sharing most of ``sample`` of this key's memories."""

    def strongest_members(self, key_id: str, *, now: float, limit: int) -> list[Memory]:
        """A key's active memories by link weight (then depth), at most ``limit``."""

    def activity_entries(self, *, after: int = 0, before: int | None = None, kind: str | None = None,
                         memory_id: str | None = None, limit: int) -> list[ActivityEntry]:
        """Entries newest first: newer than ``after``, older than ``before``."""

    def latest_activity_id(self) -> int:
        """The newest entry's id (0 for an empty log)."""


class InspectWrites(Protocol):
    def add_activity(self, rows: Sequence[ActivityRow], *, keep: int) -> None:
        """Append entries, then drop all but the newest ``keep``."""

    def prune_activity(self, *, before: float) -> int:
        """Drop entries recorded before ``before``; how many went."""


# -- the unit of work ---------------------------------------------------------------------------

class Reader(MemoryReads, KeyReads, SearchReads, TransferReads, InspectReads, Protocol):
    """One consistent snapshot of the store."""


class Writer(Reader, MemoryWrites, KeyWrites, SearchWrites, TransferWrites, InspectWrites, Protocol):
    """One write transaction: everything in it commits together or not at all."""

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once the transaction has committed (never if it rolls back)."""


class Repository(Protocol):
    """A store the engine reads and writes through."""

    found: Literal["store", "missing", "empty"]
    lost: str | None
    shared: bool
    """Whether other daemons write to this store too (PostgreSQL): then what the in-memory
    tables say is not the last word, and a write asks the store before it creates a key."""

    def read(self, fn: Callable[[Reader], T]) -> T:
        """``fn(reader)`` in one snapshot: this thread's open read's, when it is in one."""
        ...

    def write(self, fn: Callable[[Writer], T]) -> T: ...

    def load(self, fn: Callable[[Reader], T]) -> T:
        """Run the in-memory tables' load (``read``, unless the store keeps a local copy its
        change log brings up to date afterwards: a team store's replica, store/postgres/resume.py)."""

    def wait_for_commits(self) -> None:
        """Return once each write of this daemon that had sent its COMMIT has run its
        after-commit steps: what a read just found is applied to the in-memory tables after
        the steps of every write it saw committed (the change log's follower: a link count
        the read includes is not moved again by that write's delta after it)."""

    def check_files(self) -> str | None: ...

    def checkpoint(self) -> None: ...

    def backup_to(self, dest: Path) -> None: ...

    def integrity_check(self) -> str: ...

    def analyze(self) -> None:
        """Refresh what the store's query planner knows of its tables (after a bulk load)."""

    def close(self) -> None: ...
