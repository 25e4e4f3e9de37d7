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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from keymem_daemon.engine.records import Memory

T = TypeVar("T")


# -- memories: memory rows, relations, idempotency, meta, vocabulary (store/sqlite/memories.py)

class MemoryReads(Protocol):
    """Memory rows, their relations, idempotency records and meta values."""

    def memory(self, memory_id: str) -> Memory | None:
        """The memory with this id, active or not, or None."""

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        """The memories with these ids that exist, by id."""


class MemoryWrites(Protocol):
    ...


# -- keys: keys, aliases, links (store/sqlite/keys.py) -----------------------------------------

class KeyReads(Protocol):
    ...


class KeyWrites(Protocol):
    ...


# -- search: the lexical index and the reads of retrieval and the push path (store/sqlite/search.py)

class SearchReads(Protocol):
    ...


class SearchWrites(Protocol):
    ...


# -- transfer: export and import rows (store/sqlite/transfer.py) -------------------------------

class TransferReads(Protocol):
    ...


class TransferWrites(Protocol):
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

    def links_of(self, memory_ids: Sequence[str], *, per_memory: int | None = None
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

    def read(self, fn: Callable[[Reader], T]) -> T: ...

    def write(self, fn: Callable[[Writer], T]) -> T: ...

    def check_files(self) -> str | None: ...

    def checkpoint(self) -> None: ...

    def backup_to(self, dest: Path) -> None: ...

    def integrity_check(self) -> str: ...

    def close(self) -> None: ...
