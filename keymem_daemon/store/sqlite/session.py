"""What a read or write transaction on the SQLite store offers the engine: domain operations
(``memories_under(key_ids, scope)``, ``bump_links(pairs)``), never SQL. ``Store.read`` hands
its callback a ``SqliteReader``, ``Store.write`` a ``SqliteWriter``; both are built from one
mixin per area so the SQL of an area lives in one module:

- ``memories.py``  memory rows, relations, idempotency, meta, vocabulary
- ``keys.py``      keys, aliases, links
- ``search.py``    FTS5 and the reads retrieval and the push path make
- ``transfer.py``  export and import rows
- ``inspect.py``   the inspector's and the activity log's reads and writes
- ``replica.py``   rows copied from a shared store into a local read replica (not the engine's)

The engine sees them only as ``engine.ports.Reader`` / ``engine.ports.Writer``.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

from keymem_daemon.store.sqlite.inspect import InspectRows, InspectWriteRows
from keymem_daemon.store.sqlite.keys import KeyRows
from keymem_daemon.store.sqlite.memories import MemoryRows
from keymem_daemon.store.sqlite.replica import ReplicaWriteRows
from keymem_daemon.store.sqlite.search import LexicalRows, SearchRows, SearchWriteRows, Vocabulary
from keymem_daemon.store.sqlite.transfer import TransferRows, TransferWriteRows


@dataclass(slots=True)
class SqliteReader(
    MemoryRows,
    KeyRows,
    LexicalRows,
    SearchRows,
    TransferRows,
    InspectRows,
):
    """One snapshot of the database, on the calling thread's read connection."""

    _conn: sqlite3.Connection
    _vocabulary: Vocabulary | None = None
    _vocabulary_seen: int | None = None

    def integrity_check(self) -> str:
        """SQLite's verdict on the whole file: ``ok``, or the first problem it found."""
        return str(self._conn.execute("PRAGMA integrity_check").fetchone()[0])


@dataclass(slots=True)
class SqliteWriter(SqliteReader,
                   SearchWriteRows,
                   TransferWriteRows,
                   InspectWriteRows,
                   ReplicaWriteRows):
    """A write transaction in progress: its operations, and work to do after COMMIT."""

    _after: list[Callable[[], object]] = field(default_factory=list)

    def after_commit(self, callback: Callable[[], object]) -> None:
        self._after.append(callback)

    def run_after_commit(self) -> list[Callable[[], object]]:
        return self._after
