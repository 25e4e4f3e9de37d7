"""The inspector's reads and the activity log's rows.

The inspector's pages read without side effects (no access counts, no reinforcement); the
activity log is the only table written here. Declared as ``engine.ports.InspectReads`` /
``InspectWrites``.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from keymem_daemon.engine.ports import ActivityEntry, ActivityRow, Alias, MemoryFilter
from keymem_daemon.engine.records import Memory
from keymem_daemon.store.sqlite.memories import ACTIVE, MEMORY_COLUMNS, memory_from_row
from keymem_daemon.store.sqlite.rows import rows_in


class InspectRows:
    """The inspector's and the activity log's reads (a mixin of session.SqliteReader)."""

    _conn: sqlite3.Connection

    # -- the inspector's reads --------------------------------------------------------------

    def newest_memories(self, where: MemoryFilter, *, now: float, limit: int) -> list[Memory]:
        """Active memories matching ``where``, newest first."""
        clauses, params = [ACTIVE], [now]
        for sql, value in (("m.namespace = ?", where.namespace), ("m.decay_profile = ?", where.decay_profile),
                           ("m.created_at >= ?", where.since), ("m.created_at <= ?", where.until),
                           ("json_extract(m.source, '$.host_agent') = ?", where.agent),
                           ("json_extract(m.source, '$.host_session') = ?", where.session)):
            if value is not None:
                clauses.append(sql)
                params.append(value)  # type: ignore[arg-type]
        join = ""
        if where.key_id is not None:
            join = "JOIN links fk ON fk.memory_id = m.id AND fk.key_id = ?"
            params.insert(0, where.key_id)  # type: ignore[arg-type]
        sql = (f"SELECT {MEMORY_COLUMNS} FROM memories m {join} WHERE {' AND '.join(clauses)} "
               "ORDER BY m.created_at DESC LIMIT ?")
        return [memory_from_row(r) for r in self._conn.execute(sql, [*params, limit])]

    def strongest_links(self, memory_ids: Sequence[str], *, per_memory: int | None = None
                 ) -> dict[str, list[tuple[str, float]]]:
        """Each memory's ``(key_id, weight)`` links, strongest first (at most ``per_memory``)."""
        out: dict[str, list[tuple[str, float]]] = {}
        if per_memory is not None:
            for mid in dict.fromkeys(memory_ids):
                out[mid] = [(r[0], r[1]) for r in self._conn.execute(
                    "SELECT key_id, weight FROM links WHERE memory_id = ? ORDER BY weight DESC LIMIT ?",
                    (mid, per_memory))]
            return out
        for mid, kid, weight in rows_in(
                self._conn, "SELECT memory_id, key_id, weight FROM links WHERE memory_id IN ({marks}) "
                            "ORDER BY weight DESC", list(dict.fromkeys(memory_ids))):
            out.setdefault(mid, []).append((kid, weight))
        return out

    def aliases_of(self, key_id: str) -> list[Alias]:
        """A key's aliases: the given ones first, then the learned, each in the order added."""
        return [Alias(r[0], bool(r[1]), r[2]) for r in self._conn.execute(
            "SELECT alias, learned, hits FROM aliases WHERE key_id = ? ORDER BY learned, added_at", (key_id,))]

    def co_occurring_keys(self, key_id: str, *, sample: int, limit: int) -> list[tuple[str, int]]:
        """``(key_id, count)`` of the keys sharing most of ``sample`` of this key's memories."""
        return [(r[0], r[1]) for r in self._conn.execute(
            "SELECT l2.key_id, COUNT(*) AS n FROM (SELECT memory_id FROM links WHERE key_id = ? LIMIT ?) l1 "
            "JOIN links l2 ON l2.memory_id = l1.memory_id AND l2.key_id != ? "
            "GROUP BY l2.key_id ORDER BY n DESC LIMIT ?", (key_id, sample, key_id, limit))]

    def strongest_members(self, key_id: str, *, now: float, limit: int) -> list[Memory]:
        """A key's active memories by link weight (then depth), at most ``limit``."""
        return [memory_from_row(r) for r in self._conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM links l JOIN memories m ON m.id = l.memory_id "
            f"WHERE l.key_id = ? AND {ACTIVE} ORDER BY l.weight DESC, m.depth DESC LIMIT ?",
            (key_id, now, limit))]

    # -- the activity log -------------------------------------------------------------------

    def activity_entries(self, *, after: int = 0, before: int | None = None, kind: str | None = None,
                         memory_id: str | None = None, limit: int) -> list[ActivityEntry]:
        """Entries newest first: newer than ``after``, older than ``before``."""
        where, params = ["id > ?"], [after]
        for sql, value in (("id < ?", before), ("kind = ?", kind), ("memory_id = ?", memory_id)):
            if value is not None:
                where.append(sql)
                params.append(value)  # type: ignore[arg-type]
        rows = self._conn.execute(
            f"SELECT id, at, kind, memory_id, summary, detail FROM activity WHERE {' AND '.join(where)} "
            "ORDER BY id DESC LIMIT ?", [*params, limit]).fetchall()
        return [ActivityEntry(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    def latest_activity_id(self) -> int:
        """The newest entry's id (0 for an empty log)."""
        return int(self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM activity").fetchone()[0])



class InspectWriteRows:
    """The activity log's writes (a mixin of session.SqliteWriter)."""

    _conn: sqlite3.Connection

    def add_activity(self, rows: Sequence[ActivityRow], *, keep: int) -> None:
        """Append entries, then drop all but the newest ``keep``."""
        self._conn.executemany("INSERT INTO activity(at, kind, memory_id, summary, detail) VALUES (?, ?, ?, ?, ?)",
                               [(r.at, r.kind, r.memory_id, r.summary, r.detail_json) for r in rows])
        self._conn.execute("DELETE FROM activity WHERE id <= (SELECT MAX(id) FROM activity) - ?", (keep,))

    def prune_activity(self, *, before: float) -> int:
        """Drop entries recorded before ``before``; how many went."""
        return self._conn.execute("DELETE FROM activity WHERE at < ?", (before,)).rowcount

