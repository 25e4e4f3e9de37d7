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

from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol, TypeVar

T = TypeVar("T")


# -- memories: memory rows, relations, idempotency, meta, vocabulary (store/sqlite/memories.py)

class MemoryReads(Protocol):
    ...


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
