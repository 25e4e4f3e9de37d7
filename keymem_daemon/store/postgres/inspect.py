"""The inspector's reads and the activity log on PostgreSQL: ``engine.ports.InspectReads``/
``InspectWrites`` as ``store/sqlite/inspect.py`` does them on SQLite. The activity log is each
role's own (row-level security, schema.py): reading, bounding and pruning it touch only the
connecting role's entries, which are what one daemon wrote."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from keymem_daemon.engine.ports import ActivityEntry, ActivityRow, Alias, MemoryFilter
from keymem_daemon.engine.records import Memory
from keymem_daemon.store.postgres.memories import ACTIVE
from keymem_daemon.store.postgres.pipeline import affected
from keymem_daemon.store.sqlite.memories import MEMORY_COLUMNS, memory_from_row


class PgInspectRows:
    """The inspector's and the activity log's reads."""

    _conn: psycopg.Connection[Any]

    def newest_memories(self, where: MemoryFilter, *, now: float, limit: int) -> list[Memory]:
        clauses, params = [ACTIVE], [now]
        for sql, value in (("m.namespace = %s", where.namespace), ("m.decay_profile = %s", where.decay_profile),
                           ("m.created_at >= %s", where.since), ("m.created_at <= %s", where.until),
                           ("m.source::jsonb ->> 'host_agent' = %s", where.agent),
                           ("m.source::jsonb ->> 'host_session' = %s", where.session)):
            if value is not None:
                clauses.append(sql)
                params.append(value)  # type: ignore[arg-type]
        join = ""
        if where.key_id is not None:
            join = "JOIN links fk ON fk.memory_id = m.id AND fk.key_id = %s"
            params.insert(0, where.key_id)  # type: ignore[arg-type]
        sql = (f"SELECT {MEMORY_COLUMNS} FROM memories m {join} WHERE {' AND '.join(clauses)} "
               "ORDER BY m.created_at DESC LIMIT %s")
        return [memory_from_row(r) for r in self._conn.execute(sql.encode(),
                                                                                          [*params, limit])]

    def strongest_links(self, memory_ids: Sequence[str], *, per_memory: int | None = None
                        ) -> dict[str, list[tuple[str, float]]]:
        out: dict[str, list[tuple[str, float]]] = {}
        wanted = list(dict.fromkeys(memory_ids))
        if per_memory is not None:
            for mid in wanted:
                out[mid] = [(r[0], float(r[1])) for r in self._conn.execute(
                    "SELECT key_id, weight FROM links WHERE memory_id = %s ORDER BY weight DESC LIMIT %s",
                    (mid, per_memory))]
            return out
        for mid, kid, weight in self._conn.execute(
                "SELECT memory_id, key_id, weight FROM links WHERE memory_id = ANY(%s) ORDER BY weight DESC",
                (wanted,)):
            out.setdefault(mid, []).append((kid, float(weight)))
        return out

    def aliases_of(self, key_id: str) -> list[Alias]:
        return [Alias(r[0], bool(r[1]), int(r[2])) for r in self._conn.execute(
            "SELECT alias, learned, hits FROM aliases WHERE key_id = %s ORDER BY learned, added_at", (key_id,))]

    def co_occurring_keys(self, key_id: str, *, sample: int, limit: int) -> list[tuple[str, int]]:
        # Ties by key id, so the order is defined (SQLite leaves it to its sorter).
        return [(r[0], int(r[1])) for r in self._conn.execute(
            "SELECT l2.key_id, COUNT(*) AS n FROM (SELECT memory_id FROM links WHERE key_id = %s "
            "ORDER BY memory_id LIMIT %s) l1 JOIN links l2 ON l2.memory_id = l1.memory_id AND l2.key_id != %s "
            "GROUP BY l2.key_id ORDER BY n DESC, l2.key_id LIMIT %s", (key_id, sample, key_id, limit))]

    def strongest_members(self, key_id: str, *, now: float, limit: int) -> list[Memory]:
        return [memory_from_row(r) for r in self._conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM links l JOIN memories m ON m.id = l.memory_id "
            f"WHERE l.key_id = %s AND {ACTIVE} ORDER BY l.weight DESC, m.depth DESC LIMIT %s".encode(),
            (key_id, now, limit))]

    def activity_entries(self, *, after: int = 0, before: int | None = None, kind: str | None = None,
                         memory_id: str | None = None, limit: int) -> list[ActivityEntry]:
        where, params = ["actor = current_user", "id > %s"], [after]
        for sql, value in (("id < %s", before), ("kind = %s", kind), ("memory_id = %s", memory_id)):
            if value is not None:
                where.append(sql)
                params.append(value)  # type: ignore[arg-type]
        rows = self._conn.execute(
            f"SELECT id, at, kind, memory_id, summary, detail FROM activity WHERE {' AND '.join(where)} "
            "ORDER BY id DESC LIMIT %s".encode(), [*params, limit]).fetchall()
        return [ActivityEntry(int(r[0]), r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    def latest_activity_id(self) -> int:
        row = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM activity WHERE actor = current_user").fetchone()
        return int(row[0]) if row else 0


class PgInspectWriteRows:
    """The activity log's writes."""

    _conn: psycopg.Connection[Any]
    _pipeline: psycopg.Pipeline

    def add_activity(self, rows: Sequence[ActivityRow], *, keep: int) -> None:
        self._conn.cursor().executemany(
            "INSERT INTO activity(at, kind, memory_id, summary, detail, namespace) "
            "VALUES (%s, %s, %s, %s, %s, (SELECT namespace FROM memories WHERE id = %s))",
            [(r.at, r.kind, r.memory_id, r.summary, r.detail_json, r.memory_id) for r in rows])
        # All but this role's newest ``keep`` (ids interleave with other roles' entries).
        self._conn.execute("DELETE FROM activity WHERE id IN (SELECT id FROM activity WHERE actor = current_user "
                           "ORDER BY id DESC OFFSET %s)", (keep,))

    def prune_activity(self, *, before: float) -> int:
        return affected(self._conn, self._pipeline, "DELETE FROM activity WHERE actor = current_user AND at < %s",
                        (before,))
