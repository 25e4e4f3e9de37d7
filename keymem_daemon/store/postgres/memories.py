"""Memory rows on PostgreSQL: ``engine.ports.MemoryReads``/``MemoryWrites`` and the lexical
index rows the writes keep in step, as ``store/sqlite/memories.py`` and ``search.py``
(``LexicalRows``) do them on SQLite -- the same statements in PostgreSQL's dialect. Row-level
security narrows every statement to the namespaces the connecting role was granted."""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import psycopg

from keymem_daemon.engine.keys import MemberState
from keymem_daemon.engine.ports import MemoryRow, StoreCounts
from keymem_daemon.engine.records import Memory
from keymem_daemon.store.sqlite.memories import MEMORY_COLUMNS, memory_from_row

# A memory is active until (and including) its expiry instant, as Memory.expired says.
ACTIVE: Final = "m.superseded_by IS NULL AND (m.expires_at IS NULL OR m.expires_at >= %s)"
# One stored token as a tsquery lexeme, quoted as keymem_tsvector quotes it (schema.py).
_LEXEME_QUERY: Final = "('''' || replace(replace(t, '\\', '\\\\'), '''', '''''') || '''')::tsquery"


MEMORIES_BY_ID: Final = f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ANY(%s)"

STREAM_ROWS: Final = 4096
"""Rows per round trip of a streamed read (a load, the replica's fill): 8 MB of 512-d vectors,
so round trips are a small part of the transfer while the rows in hand stay a few MB."""


def streamed(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``sql``, ``STREAM_ROWS`` at a time, from a server-side cursor in binary
    form: a vector arrives as its bytes, not as hex text the server encodes and psycopg
    decodes again (which took as long as the rest of a load). Inside a transaction. The
    cursor is declared and fetched by SQL, not psycopg's named cursor: the read units run in
    pipeline mode (store/postgres/pipeline.py), where psycopg has no server-side cursors."""
    conn.execute(b"DECLARE keymem_stream NO SCROLL CURSOR FOR " + sql.encode(), params)
    fetch = conn.cursor(binary=True)
    try:
        while rows := fetch.execute(f"FETCH FORWARD {STREAM_ROWS} FROM keymem_stream".encode()).fetchall():
            yield rows
    except GeneratorExit:  # a reader that stopped early: the name is free for the next one
        conn.execute(b"CLOSE keymem_stream")
        raise
    conn.execute(b"CLOSE keymem_stream")


class PgMemoryRows:
    """The memory-row operations of a PostgreSQL reader/writer."""

    _conn: psycopg.Connection[Any]
    # Set by a write that changed the lexical index: its BM25 statistics are renewed after COMMIT.
    index_changed: bool

    def _memories(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[Memory]:
        # By position (SELECT {MEMORY_COLUMNS}), as on SQLite: by name a row costs a dict each.
        return [memory_from_row(r) for r in self._conn.execute(sql.encode(), params)]

    def _value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self._conn.execute(sql.encode(), params).fetchone()
        return None if row is None else row[0]

    def memory(self, memory_id: str) -> Memory | None:
        found = self._memories(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = %s", (memory_id,))
        return found[0] if found else None

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        return {m.id: m for m in self._memories(MEMORIES_BY_ID, (list(dict.fromkeys(ids)),))}

    def memory_content(self, memory_id: str) -> str | None:
        value = self._value("SELECT content FROM memories WHERE id = %s", (memory_id,))
        return None if value is None else str(value)

    def is_current(self, memory_id: str) -> bool:
        return self._value("SELECT 1 FROM memories WHERE id = %s AND superseded_by IS NULL", (memory_id,)) is not None

    def active_twin(self, namespace: str, digest: str, now: float) -> str | None:
        value = self._value(f"SELECT m.id FROM memories m WHERE m.namespace = %s AND m.dedup_hash = %s AND {ACTIVE} "
                            "LIMIT 1", (namespace, digest, now))
        return None if value is None else str(value)

    def predecessor_of(self, memory_id: str) -> str | None:
        value = self._value("SELECT id FROM memories WHERE superseded_by = %s", (memory_id,))
        return None if value is None else str(value)

    def member_state(self, memory_id: str) -> MemberState | None:
        # Its keys in key order, as SQLite's index on links(memory_id, key_id) hands them out.
        row = self._conn.execute(
            "SELECT namespace, expires_at, superseded_by, ARRAY(SELECT l.key_id FROM links l "
            "WHERE l.memory_id = m.id ORDER BY l.key_id) FROM memories m WHERE id = %s", (memory_id,)).fetchone()
        if row is None or row[2] is not None:
            return None
        return MemberState(row[0], tuple(row[3]), row[1])

    def count_active(self, namespace: str | None, now: float) -> int:
        return int(self._value(f"SELECT COUNT(*) FROM memories m WHERE {ACTIVE} "
                               "AND (%s::text IS NULL OR m.namespace = %s)", (now, namespace, namespace)))

    def memory_rows(self) -> int:
        return int(self._value("SELECT COUNT(*) FROM memories"))

    def active_page(self, namespace: str | None, now: float, limit: int, offset: int) -> tuple[int, list[Memory]]:
        where = f"WHERE {ACTIVE} AND (%s::text IS NULL OR m.namespace = %s)"
        total = int(self._value(f"SELECT COUNT(*) FROM memories m {where}", (now, namespace, namespace)))
        page = self._memories(f"SELECT {MEMORY_COLUMNS} FROM memories m {where} ORDER BY m.rowid LIMIT %s OFFSET %s",
                              (now, namespace, namespace, limit, offset))
        return total, page

    def expired_memories(self, now: float) -> list[Memory]:
        return self._memories(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE expires_at IS NOT NULL "
                              "AND expires_at < %s", (now,))

    def batch_siblings(self, batch_id: str, memory: Memory, now: float) -> list[str]:
        return [r[0] for r in self._conn.execute(
            f"SELECT m.id FROM memories m WHERE m.source::jsonb ->> 'batch_id' = %s AND m.id != %s "
            f"AND m.namespace = %s AND {ACTIVE}".encode(), (batch_id, memory.id, memory.namespace, now))]

    def related_ids(self, memory_id: str) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT to_id FROM relations WHERE from_id = %s ORDER BY to_id", (memory_id,))]

    def explicit_neighbours(self, memory_id: str) -> list[str]:
        out = [r[0] for r in self._conn.execute("SELECT to_id FROM relations WHERE from_id = %s", (memory_id,))]
        out.extend(r[0] for r in self._conn.execute("SELECT from_id FROM relations WHERE to_id = %s", (memory_id,)))
        return out

    def counts(self, now: float) -> StoreCounts:
        namespaces = {r[0]: int(r[1]) for r in self._conn.execute(
            f"SELECT m.namespace, COUNT(*) FROM memories m WHERE {ACTIVE} GROUP BY m.namespace".encode(), (now,))}
        return StoreCounts(
            keys=int(self._value("SELECT COUNT(*) FROM keys")),
            links=int(self._value("SELECT COUNT(*) FROM links")),
            namespaces=namespaces,
            superseded=int(self._value("SELECT COUNT(*) FROM memories WHERE superseded_by IS NOT NULL")),
            expired=int(self._value("SELECT COUNT(*) FROM memories WHERE expires_at IS NOT NULL AND expires_at < %s",
                                    (now,))),
        )

    def stored_vectors(self, expected_bytes: int) -> Iterator[tuple[str, str, bytes | None, bool, str | None]]:
        # The text only of rows whose vector has the wrong size (as on SQLite).
        for rows in streamed(self._conn, "SELECT id, namespace, vector, superseded_by IS NOT NULL, "
                             "CASE WHEN octet_length(vector) != %s::int THEN content END FROM memories "
                             "WHERE vector IS NOT NULL", (expected_bytes,)):
            yield from rows

    def live_vector_count(self) -> int:
        return int(self._value("SELECT COUNT(*) FROM memories WHERE superseded_by IS NULL AND vector IS NOT NULL"))

    def expiring_ids(self) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT id FROM memories WHERE superseded_by IS NULL AND expires_at IS NOT NULL")]

    def vectors_after(self, rowid: int) -> list[tuple[int, str, str]]:
        return [(int(r[0]), r[1], r[2]) for r in self._conn.execute(
            "SELECT rowid, id, content FROM memories WHERE vector IS NOT NULL AND rowid > %s ORDER BY rowid",
            (rowid,))]

    def memory_vector(self, memory_id: str) -> tuple[bytes | None, str]:
        row = self._conn.execute("SELECT vector, namespace FROM memories WHERE id = %s", (memory_id,)).fetchone()
        if row is None:
            raise KeyError(memory_id)
        return row[0], row[1]

    def memory_states(self, memory_ids: Sequence[str]) -> dict[str, tuple[bytes | None, list[str], MemberState | None]]:
        # Its keys in key order, as SQLite's index on links(memory_id, key_id) hands them out.
        rows = self._conn.execute(
            "SELECT id, vector, namespace, expires_at, superseded_by, ARRAY(SELECT l.key_id FROM links l "
            "WHERE l.memory_id = m.id ORDER BY l.key_id) FROM memories m WHERE id = ANY(%s)",
            (list(dict.fromkeys(memory_ids)),))
        return {r[0]: (r[1], list(r[5]), None if r[4] is not None else MemberState(r[2], tuple(r[5]), r[3]))
                for r in rows}

    def idempotent_result(self, key: str) -> tuple[dict[str, Any], str | None] | None:
        # Per role: row-level security shows only the connecting role's records.
        row = self._conn.execute("SELECT result, fingerprint FROM idempotency WHERE key = %s", (key,)).fetchone()
        return None if row is None else (json.loads(row[0]), row[1])

    def meta(self) -> dict[str, str]:
        return {r[0]: r[1] for r in self._conn.execute("SELECT name, value FROM meta")}

    def meta_value(self, name: str) -> str | None:
        value = self._value("SELECT value FROM meta WHERE name = %s", (name,))
        return None if value is None else str(value)

    # -- the lexical index as the writes see it ----------------------------------------------

    def indexed_holding(self, forms: Sequence[str]) -> set[str]:
        return {r[0] for r in self._conn.execute(
            "SELECT m.id FROM memories m JOIN memory_fts f ON f.memory_id = m.id "
            "WHERE EXISTS (SELECT 1 FROM unnest(%s::text[]) x WHERE strpos(m.content, x) > 0)", (list(forms),))}

    def document_frequencies(self, tokens: Sequence[str]) -> dict[str, int]:
        rows = self._conn.execute(
            f"SELECT t, (SELECT COUNT(*) FROM memory_fts WHERE lexemes @@ {_LEXEME_QUERY}) "
            "FROM unnest(%s::text[]) t".encode(), (list(dict.fromkeys(tokens)),))
        return {r[0]: int(r[1]) for r in rows if r[1]}

    # -- writes -----------------------------------------------------------------------------

    def insert_memory(self, row: MemoryRow) -> None:
        source = json.dumps(dict(row.source), ensure_ascii=False)
        self._conn.execute(
            "INSERT INTO memories(id, content, dedup_hash, namespace, created_at, updated_at, observed_at, "
            "last_confirmed_at, confirmation_count, decay_profile, last_confirmation_evidence, "
            "last_confirmation_source, expires_at, supersedes, source, vector) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 1, %s, 'user', %s, %s, %s, %s, %s)",
            (row.id, row.content, row.dedup_hash, row.namespace, row.at, row.at, row.observed_at, row.at,
             row.decay_profile, source, row.expires_at, row.supersedes, source, row.vector))

    def fold_into_twin(self, memory_id: str, *, now: float, source: Mapping[str, Any],
                       expires_at: float | None) -> None:
        # COALESCE: no expiry given keeps the twin's (the SQLite version leaves the column out).
        self._conn.execute(
            "UPDATE memories SET last_confirmed_at = %s, updated_at = %s, last_confirmation_evidence = 'user', "
            "last_confirmation_source = %s, expires_at = COALESCE(%s, expires_at), "
            "confirmation_count = confirmation_count + 1 WHERE id = %s",
            (now, now, json.dumps(dict(source), ensure_ascii=False), expires_at, memory_id))

    def supersede(self, old_id: str, new_id: str, *, depth_factor: float, now: float) -> None:
        self._conn.execute("UPDATE memories SET superseded_by = %s, depth = depth * %s, updated_at = %s WHERE id = %s",
                           (new_id, depth_factor, now, old_id))

    def clear_supersedes(self, memory_id: str) -> None:
        self._conn.execute("UPDATE memories SET supersedes = NULL WHERE id = %s", (memory_id,))

    def restore(self, memory_id: str) -> None:
        self._conn.execute("UPDATE memories SET superseded_by = NULL WHERE id = %s", (memory_id,))

    def delete_memory(self, memory_id: str) -> None:
        self.index_changed = True  # its index row goes with it
        self._conn.execute("DELETE FROM memories WHERE id = %s", (memory_id,))

    def confirm(self, memory_id: str, *, now: float, depth_step: float, evidence: str,
                source: Mapping[str, Any], confirmation_id: str | None) -> None:
        self._conn.execute(
            "UPDATE memories SET last_confirmed_at = %s, confirmation_count = confirmation_count + 1, "
            "depth = LEAST(1.0, depth + %s), last_confirmation_evidence = %s, last_confirmation_source = %s, "
            "last_confirmation_id = %s, updated_at = %s WHERE id = %s",
            (now, depth_step, evidence, json.dumps(dict(source), ensure_ascii=False), confirmation_id, now,
             memory_id))

    def count_access(self, memory_id: str, now: float) -> None:
        self._conn.execute("UPDATE memories SET access_count = access_count + 1, last_accessed = %s WHERE id = %s",
                           (now, memory_id))

    def set_memory_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        self._conn.cursor().executemany("UPDATE memories SET vector = %s WHERE id = %s", pairs)

    def add_relations(self, memory_id: str, related: Sequence[str]) -> None:
        self._conn.cursor().executemany(
            "INSERT INTO relations(from_id, to_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(memory_id, r) for r in related if r != memory_id])

    def record_idempotent(self, key: str, result: str, created_at: float, fingerprint: str) -> None:
        self._conn.execute("INSERT INTO idempotency(key, result, created_at, fingerprint) VALUES (%s, %s, %s, %s)",
                           (key, result, created_at, fingerprint))

    def prune_idempotency(self, before: float) -> None:
        self._conn.execute("DELETE FROM idempotency WHERE created_at <= %s", (before,))

    def set_meta(self, values: Mapping[str, str]) -> None:
        self._conn.cursor().executemany(
            "INSERT INTO meta(name, value) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            list(values.items()))

    def delete_meta_prefixed(self, prefix: str) -> None:
        self._conn.execute("DELETE FROM meta WHERE left(name, %s) = %s", (len(prefix), prefix))

    # -- the lexical index rows a write keeps in step ---------------------------------------

    def index_memory(self, memory_id: str, content_tokens: str, key_tokens: str) -> None:
        self.index_changed = True
        self._conn.execute(
            "INSERT INTO memory_fts(memory_id, content_tokens, key_tokens) VALUES (%s, %s, %s) "
            "ON CONFLICT (memory_id) DO UPDATE SET content_tokens = excluded.content_tokens, "
            "key_tokens = excluded.key_tokens", (memory_id, content_tokens, key_tokens))

    def set_key_tokens(self, memory_id: str, key_tokens: str) -> None:
        self.index_changed = True
        self._conn.execute("UPDATE memory_fts SET key_tokens = %s WHERE memory_id = %s", (key_tokens, memory_id))

    def unindex(self, rowid: int) -> None:
        self.index_changed = True
        self._conn.execute("DELETE FROM memory_fts WHERE memory_id = (SELECT id FROM memories WHERE rowid = %s)",
                           (rowid,))
