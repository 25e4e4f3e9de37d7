"""Memory rows: reading them into ``Memory`` records (and, as the engine's SQL moves here, the
writes of memory rows, relations, idempotency keys and meta)."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any, Final

from keymem_daemon.engine.records import Memory
from keymem_daemon.store.sqlite.rows import rows_in

_MEMORY_COLUMNS: Final = (
    "rowid, id, content, namespace, depth, access_count, created_at, updated_at, last_accessed, "
    "observed_at, last_confirmed_at, confirmation_count, decay_profile, last_confirmation_evidence, "
    "last_confirmation_source, last_confirmation_id, expires_at, supersedes, superseded_by, source"
)
# A memory is active until (and including) its expiry instant, as Memory.expired says.
ACTIVE: Final = "m.superseded_by IS NULL AND (m.expires_at IS NULL OR m.expires_at >= ?)"


def _json_or_none(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def memory_from_row(row: sqlite3.Row) -> Memory:
    return Memory(
        rowid=row["rowid"],
        id=row["id"],
        content=row["content"],
        namespace=row["namespace"],
        depth=row["depth"],
        access_count=row["access_count"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        last_accessed=row["last_accessed"],
        observed_at=row["observed_at"],
        last_confirmed_at=row["last_confirmed_at"],
        confirmation_count=row["confirmation_count"],
        decay_profile=row["decay_profile"],
        last_confirmation_evidence=row["last_confirmation_evidence"],
        last_confirmation_source=_json_or_none(row["last_confirmation_source"]),
        last_confirmation_id=row["last_confirmation_id"],
        expires_at=row["expires_at"],
        supersedes=row["supersedes"],
        superseded_by=row["superseded_by"],
        source=_json_or_none(row["source"]),
    )


def get_memory(conn: sqlite3.Connection, memory_id: str) -> Memory | None:
    row = conn.execute(f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id = ?", (memory_id,)).fetchone()
    return None if row is None else memory_from_row(row)


def get_memories(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, Memory]:
    return {row["id"]: memory_from_row(row) for row in rows_in(
        conn, f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id IN ({{marks}})", list(dict.fromkeys(ids)))}



class MemoryRows:
    """The memory-row operations of a reader/writer (a mixin of session.SqliteReader)."""

    _conn: sqlite3.Connection

    def memory(self, memory_id: str) -> Memory | None:
        """The memory with this id, active or not, or None."""
        return get_memory(self._conn, memory_id)

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        """The memories with these ids that exist, by id."""
        return get_memories(self._conn, ids)
