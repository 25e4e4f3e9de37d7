"""The engine's view of storage: what a read snapshot and a write transaction offer, in the
engine's terms. ``store/sqlite`` implements it (and ``store/postgres`` next to it), as does
the in-memory fake of the fast test tier (``tests/unit/fakes.py``); nothing in ``engine/``
imports a store module or holds SQL.

The engine runs work as units: ``repository.read(fn)`` calls ``fn(reader)`` inside one
snapshot, ``repository.write(fn)`` calls ``fn(writer)`` inside one transaction that commits
when ``fn`` returns (``writer.after_commit`` callbacks run after the COMMIT, in order). Each
area's operations are one Protocol below; ``Reader`` and ``Writer`` combine them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from keymem_daemon.engine.records import Memory

T = TypeVar("T")


# -- memories: memory rows, relations, idempotency, meta, vocabulary (store/sqlite/memories.py)

class MemoryReads(Protocol):
    def memory(self, memory_id: str) -> Memory | None:
        """The memory with this id, active or not, or None."""
        ...

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        """The memories with these ids that exist, by id."""
        ...


class MemoryWrites(Protocol):
    ...


# -- keys: keys, aliases, links (store/sqlite/keys.py) -----------------------------------------

class KeyReads(Protocol):
    ...


class KeyWrites(Protocol):
    ...


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
        else its ``strongest`` few (strongest first), else all of them."""
        ...

    def links_of(self, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
        """Each memory's links: memory id -> {key id: (weight, auto)} (unlinked ones absent)."""
        ...

    def observed_between(self, start: float, end: float, scope: Scope, now: float, limit: int) -> list[str]:
        """Active memories in scope observed (else created) in [start, end), latest first."""
        ...

    def related_either_way(self, memory_id: str) -> list[str]:
        """Memories an explicit relation joins to this one, in either direction."""
        ...

    def related_ids(self, memory_id: str) -> list[str]:
        """The memories this one's own relations point to, by id."""
        ...

    def batch_siblings(self, memory: Memory, now: float) -> list[str] | None:
        """The other active memories of the memory's batch in its namespace (None: no batch or none)."""
        ...

    def count_active(self, namespace: str | None, now: float) -> int:
        """Active memories in a namespace (None: in all of them)."""
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

    def add_key(self, key_id: str, concept: str, norm: str, compact: str, key_type: str, vector: bytes,
                created_at: float) -> None:
        ...

    def add_alias(self, key_id: str, alias: str, norm: str, compact: str, *, learned: bool, added_at: float,
                  hits: int) -> None:
        """Add an alias to a key, unless the key has it already."""
        ...

    def add_memory_row(self, fields: Mapping[str, Any], dedup_hash: str, vector: bytes) -> None:
        """Insert a memory as given: every field an export lists (provenance as objects)."""
        ...

    def add_link(self, key_id: str, memory_id: str, weight: float, *, auto: bool) -> int:
        """Link a memory to a key unless they are linked already: 1 if added, else 0."""
        ...

    def add_relation(self, from_id: str, to_id: str) -> int:
        """Relate two memories unless they are already: 1 if added, else 0."""
        ...

    def add_alias_candidate(self, key_id: str, norm: str, query_text: str, count: int, last_seen: float) -> None:
        """Record a pending alias candidate unless the key has it already."""
        ...

    def drop_dangling_supersessions(self) -> None:
        """Clear every supersession that names no memory of the store."""
        ...


# -- inspect: the inspector's reads and the activity log (store/sqlite/inspect.py) -------------

class InspectReads(Protocol):
    ...


class InspectWrites(Protocol):
    ...


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

    def read(self, fn: Callable[[Reader], T]) -> T: ...

    def write(self, fn: Callable[[Writer], T]) -> T: ...

    def check_files(self) -> str | None: ...

    def checkpoint(self) -> None: ...

    def backup_to(self, dest: Path) -> None: ...

    def integrity_check(self) -> str: ...

    def close(self) -> None: ...
