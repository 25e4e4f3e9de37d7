"""Memory rows: reading them into ``Memory`` records, and the reads and writes of memory rows,
relations, idempotency keys and meta values (``engine.ports.MemoryReads``/``MemoryWrites``)."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from keymem_daemon.engine.keys import MemberState
from keymem_daemon.engine.ports import MemoryRow, StoreCounts
from keymem_daemon.engine.records import Memory
from keymem_daemon.store.sqlite.rows import rows_in

MEMORY_COLUMNS: Final = (
    "rowid, id, content, namespace, depth, access_count, created_at, updated_at, last_accessed, "
    "observed_at, last_confirmed_at, confirmation_count, decay_profile, last_confirmation_evidence, "
    "last_confirmation_source, last_confirmation_id, expires_at, supersedes, superseded_by, source"
)
MEMORY_FIELDS: Final = tuple(name.strip() for name in MEMORY_COLUMNS.split(","))
# A memory is active until (and including) its expiry instant, as Memory.expired says.
ACTIVE: Final = "m.superseded_by IS NULL AND (m.expires_at IS NULL OR m.expires_at >= ?)"


def _json_or_none(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def memory_from_row(row: Sequence[Any]) -> Memory:
    """A Memory from a row of MEMORY_COLUMNS, read by position: by name (``row["id"]``) a
    ``sqlite3.Row`` compares the wanted name with each column's, which cost the push path more
    than the query itself for its ~150 candidates (10k store: 9 ms against 4 ms on a loaded machine)."""
    (rowid, memory_id, content, namespace, depth, access_count, created_at, updated_at, last_accessed, observed_at,
     last_confirmed_at, confirmation_count, decay_profile, evidence, evidence_source, confirmation_id, expires_at,
     supersedes, superseded_by, source) = row
    return Memory(
        rowid=rowid,
        id=memory_id,
        content=content,
        namespace=namespace,
        depth=depth,
        access_count=access_count,
        created_at=created_at,
        updated_at=updated_at,
        last_accessed=last_accessed,
        observed_at=observed_at,
        last_confirmed_at=last_confirmed_at,
        confirmation_count=confirmation_count,
        decay_profile=decay_profile,
        last_confirmation_evidence=evidence,
        last_confirmation_source=_json_or_none(evidence_source),
        last_confirmation_id=confirmation_id,
        expires_at=expires_at,
        supersedes=supersedes,
        superseded_by=superseded_by,
        source=_json_or_none(source),
    )


def get_memory(conn: sqlite3.Connection, memory_id: str) -> Memory | None:
    row = conn.execute(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?", (memory_id,)).fetchone()
    return None if row is None else memory_from_row(row)


def get_memories(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, Memory]:
    return {row[1]: memory_from_row(row) for row in rows_in(
        conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id IN ({{marks}})", list(dict.fromkeys(ids)))}



class MemoryRows:
    """The memory-row operations of a reader/writer (a mixin of session.SqliteReader)."""

    _conn: sqlite3.Connection

    def memory(self, memory_id: str) -> Memory | None:
        """The memory with this id, active or not, or None."""
        return get_memory(self._conn, memory_id)

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        """The memories with these ids that exist, by id."""
        return get_memories(self._conn, ids)

    def memory_content(self, memory_id: str) -> str | None:
        row = self._conn.execute("SELECT content FROM memories WHERE id = ?", (memory_id,)).fetchone()
        return None if row is None else str(row[0])

    def is_current(self, memory_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM memories WHERE id = ? AND superseded_by IS NULL",
                                  (memory_id,)).fetchone() is not None

    def active_twin(self, namespace: str, digest: str, now: float) -> str | None:
        row = self._conn.execute(
            f"SELECT m.id FROM memories m WHERE m.namespace = ? AND m.dedup_hash = ? AND {ACTIVE} LIMIT 1",
            (namespace, digest, now)).fetchone()
        return None if row is None else str(row[0])

    def predecessor_of(self, memory_id: str) -> str | None:
        row = self._conn.execute("SELECT id FROM memories WHERE superseded_by = ?", (memory_id,)).fetchone()
        return None if row is None else str(row[0])

    def member_state(self, memory_id: str) -> MemberState | None:
        row = self._conn.execute("SELECT namespace, expires_at, superseded_by FROM memories WHERE id = ?",
                                 (memory_id,)).fetchone()
        if row is None or row["superseded_by"] is not None:
            return None
        keys = tuple(r[0] for r in self._conn.execute("SELECT key_id FROM links WHERE memory_id = ?",
                                                      (memory_id,)))
        return MemberState(row["namespace"], keys, row["expires_at"])

    def count_active(self, namespace: str | None, now: float) -> int:
        sql, params = f"SELECT COUNT(*) FROM memories m WHERE {ACTIVE}", [now]
        if namespace is not None:
            sql += " AND m.namespace = ?"
            params.append(namespace)  # type: ignore[arg-type]
        return int(self._conn.execute(sql, params).fetchone()[0])

    def memory_rows(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM memories").fetchone()[0])

    def active_page(self, namespace: str | None, now: float, limit: int, offset: int) -> tuple[int, list[Memory]]:
        where, params = f"WHERE {ACTIVE}", [now]
        if namespace is not None:
            where += " AND m.namespace = ?"
            params.append(namespace)  # type: ignore[arg-type]
        total = int(self._conn.execute(f"SELECT COUNT(*) FROM memories m {where}", params).fetchone()[0])
        rows = self._conn.execute(f"SELECT {MEMORY_COLUMNS} FROM memories m {where} ORDER BY m.rowid "
                                  f"LIMIT ? OFFSET ?", [*params, limit, offset]).fetchall()
        return total, [memory_from_row(r) for r in rows]

    def expired_memories(self, now: float) -> list[Memory]:
        return [memory_from_row(r) for r in self._conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE expires_at IS NOT NULL AND expires_at < ?", (now,))]

    def batch_siblings(self, batch_id: str, memory: Memory, now: float) -> list[str]:
        return [r[0] for r in self._conn.execute(
            f"SELECT m.id FROM memories m WHERE json_extract(m.source, '$.batch_id') = ? AND m.id != ? "
            f"AND m.namespace = ? AND {ACTIVE}", (batch_id, memory.id, memory.namespace, now)).fetchall()]

    def related_ids(self, memory_id: str) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT to_id FROM relations WHERE from_id = ? ORDER BY to_id", (memory_id,))]

    def explicit_neighbours(self, memory_id: str) -> list[str]:
        out: list[str] = []
        for sql in ("SELECT to_id FROM relations WHERE from_id = ?",
                    "SELECT from_id FROM relations WHERE to_id = ?"):
            out.extend(r[0] for r in self._conn.execute(sql, (memory_id,)))
        return out

    def counts(self, now: float) -> StoreCounts:
        conn = self._conn
        namespaces = dict(conn.execute(
            f"SELECT m.namespace, COUNT(*) FROM memories m WHERE {ACTIVE} GROUP BY m.namespace", (now,)).fetchall())
        return StoreCounts(
            keys=conn.execute("SELECT COUNT(*) FROM keys").fetchone()[0],
            links=conn.execute("SELECT COUNT(*) FROM links").fetchone()[0],
            namespaces=namespaces,
            superseded=conn.execute("SELECT COUNT(*) FROM memories WHERE superseded_by IS NOT NULL").fetchone()[0],
            expired=conn.execute("SELECT COUNT(*) FROM memories WHERE expires_at IS NOT NULL AND expires_at < ?",
                                 (now,)).fetchone()[0],
        )

    def stored_vectors(self, expected_bytes: int) -> Iterator[tuple[str, str, bytes | None, bool, str | None]]:
        # The text only of rows whose vector has the wrong size: reading every memory's content
        # at start would cost as much as the vectors themselves.
        for memory_id, namespace, blob, superseded, content in self._conn.execute(
                "SELECT id, namespace, vector, superseded_by IS NOT NULL, "
                "CASE WHEN length(vector) != ? THEN content END FROM memories WHERE vector IS NOT NULL",
                (expected_bytes,)):
            yield memory_id, namespace, blob, bool(superseded), content

    def live_vector_count(self) -> int:
        return int(self._conn.execute(
            "SELECT COUNT(*) FROM memories WHERE superseded_by IS NULL AND vector IS NOT NULL").fetchone()[0])

    def expiring_ids(self) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT id FROM memories WHERE superseded_by IS NULL AND expires_at IS NOT NULL").fetchall()]

    def vectors_after(self, rowid: int) -> list[tuple[int, str, str]]:
        return [(r[0], r[1], r[2]) for r in self._conn.execute(
            "SELECT rowid, id, content FROM memories WHERE vector IS NOT NULL AND rowid > ? ORDER BY rowid",
            (rowid,)).fetchall()]

    def memory_vector(self, memory_id: str) -> tuple[bytes | None, str]:
        row = self._conn.execute("SELECT vector, namespace FROM memories WHERE id = ?", (memory_id,)).fetchone()
        return row["vector"], row["namespace"]

    def memory_states(self, memory_ids: Sequence[str]) -> dict[str, tuple[bytes | None, list[str], MemberState | None]]:
        out: dict[str, tuple[bytes | None, list[str], MemberState | None]] = {}
        for memory_id in dict.fromkeys(memory_ids):
            row = self._conn.execute("SELECT vector FROM memories WHERE id = ?", (memory_id,)).fetchone()
            if row is not None:
                keys = [r[0] for r in self._conn.execute("SELECT key_id FROM links WHERE memory_id = ?", (memory_id,))]
                out[memory_id] = row["vector"], keys, self.member_state(memory_id)
        return out

    def idempotent_result(self, key: str) -> tuple[dict[str, Any], str | None] | None:
        row = self._conn.execute("SELECT result, fingerprint FROM idempotency WHERE key = ?", (key,)).fetchone()
        return None if row is None else (json.loads(row[0]), row[1])

    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT name, value FROM meta").fetchall())

    def meta_value(self, name: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    # -- writes ---------------------------------------------------------------------------

    def insert_memory(self, row: MemoryRow) -> None:
        source = json.dumps(dict(row.source), ensure_ascii=False)
        self._conn.execute(
            "INSERT INTO memories(id, content, dedup_hash, namespace, created_at, updated_at, observed_at, "
            "last_confirmed_at, confirmation_count, decay_profile, last_confirmation_evidence, "
            "last_confirmation_source, expires_at, supersedes, source, vector) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, 'user', ?, ?, ?, ?, ?)",
            (row.id, row.content, row.dedup_hash, row.namespace, row.at, row.at, row.observed_at, row.at,
             row.decay_profile, source, row.expires_at, row.supersedes, source, row.vector))

    def fold_into_twin(self, memory_id: str, *, now: float, source: Mapping[str, Any],
                       expires_at: float | None) -> None:
        updates: dict[str, Any] = {
            "last_confirmed_at": now, "updated_at": now,
            "last_confirmation_evidence": "user",
            "last_confirmation_source": json.dumps(dict(source), ensure_ascii=False),
        }
        if expires_at is not None:
            updates["expires_at"] = expires_at
        sets = ", ".join(f"{k} = ?" for k in updates)
        self._conn.execute(f"UPDATE memories SET {sets}, confirmation_count = confirmation_count + 1 "
                           f"WHERE id = ?", [*updates.values(), memory_id])

    def supersede(self, old_id: str, new_id: str, *, depth_factor: float, now: float) -> None:
        self._conn.execute("UPDATE memories SET superseded_by = ?, depth = depth * ?, updated_at = ? WHERE id = ?",
                           (new_id, depth_factor, now, old_id))

    def clear_supersedes(self, memory_id: str) -> None:
        self._conn.execute("UPDATE memories SET supersedes = NULL WHERE id = ?", (memory_id,))

    def restore(self, memory_id: str) -> None:
        self._conn.execute("UPDATE memories SET superseded_by = NULL WHERE id = ?", (memory_id,))

    def delete_memory(self, memory_id: str) -> None:
        self._conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,))

    def confirm(self, memory_id: str, *, now: float, depth_step: float, evidence: str,
                source: Mapping[str, Any], confirmation_id: str | None) -> None:
        self._conn.execute(
            "UPDATE memories SET last_confirmed_at = ?, confirmation_count = confirmation_count + 1, "
            "depth = MIN(1.0, depth + ?), last_confirmation_evidence = ?, last_confirmation_source = ?, "
            "last_confirmation_id = ?, updated_at = ? WHERE id = ?",
            (now, depth_step, evidence, json.dumps(dict(source), ensure_ascii=False), confirmation_id, now,
             memory_id))

    def count_access(self, memory_id: str, now: float) -> None:
        self._conn.execute("UPDATE memories SET access_count = access_count + 1, last_accessed = ? WHERE id = ?",
                           (now, memory_id))

    def set_memory_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        self._conn.executemany("UPDATE memories SET vector = ? WHERE id = ?", pairs)

    def add_relations(self, memory_id: str, related: Sequence[str]) -> None:
        self._conn.executemany("INSERT OR IGNORE INTO relations(from_id, to_id) VALUES (?, ?)",
                               [(memory_id, r) for r in related if r != memory_id])

    def record_idempotent(self, key: str, result: str, created_at: float, fingerprint: str) -> None:
        self._conn.execute("INSERT INTO idempotency(key, result, created_at, fingerprint) VALUES (?, ?, ?, ?)",
                           (key, result, created_at, fingerprint))

    def prune_idempotency(self, before: float) -> None:
        self._conn.execute("DELETE FROM idempotency WHERE created_at <= ?", (before,))

    def set_meta(self, values: Mapping[str, str]) -> None:
        self._conn.executemany("INSERT OR REPLACE INTO meta(name, value) VALUES (?, ?)", list(values.items()))

    def delete_meta_prefixed(self, prefix: str) -> None:
        # LIKE's wildcards in a prefix would match more than it: the prefixes are keymem's own.
        self._conn.execute("DELETE FROM meta WHERE substr(name, 1, ?) = ?", (len(prefix), prefix))
