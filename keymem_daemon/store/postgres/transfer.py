"""Export and import rows on PostgreSQL: ``engine.ports.TransferReads``/``TransferWrites`` as
``store/sqlite/transfer.py`` does them, so an export from either store imports into the other.
Ids sort bytewise (``COLLATE "C"``), as SQLite sorts them, whatever the database's locale.
Each import row runs in a savepoint: one PostgreSQL refuses becomes a ValueError with its
reason and leaves the transaction usable, as on SQLite."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

from keymem_daemon.store.postgres import schema
from keymem_daemon.store.sqlite.transfer import MEMORY_FIELDS

_JSON_FIELDS: Final = ("source", "last_confirmation_source")  # stored as JSON text, exported as objects


class PgTransferRows:
    """The rows an export reads."""

    _conn: psycopg.Connection[Any]

    def schema_version(self) -> int:
        return schema.schema_version(self._conn)

    def export_rows(self, *, include_vectors: bool) -> dict[str, list[dict[str, Any]]]:
        conn = self._conn
        aliases: dict[str, list[dict[str, Any]]] = {}
        for key_id, alias, learned, added_at, hits in conn.execute(
                'SELECT key_id, alias, learned, added_at, hits FROM aliases ORDER BY key_id COLLATE "C", '
                'norm COLLATE "C"'):
            aliases.setdefault(key_id, []).append(
                {"alias": alias, "learned": bool(learned), "added_at": added_at, "hits": hits})
        keys = []
        for key_id, concept, key_type, created_at, vector in conn.execute(
                'SELECT id, concept, key_type, created_at, vector FROM keys ORDER BY id COLLATE "C"'):
            item: dict[str, Any] = {"id": key_id, "concept": concept, "key_type": key_type,
                                    "created_at": created_at, "aliases": aliases.get(key_id, [])}
            if include_vectors:
                item["vector"] = bytes(vector)
            keys.append(item)
        memories = []
        columns = ", ".join(MEMORY_FIELDS)
        for row in conn.cursor(row_factory=dict_row).execute(
                f'SELECT {columns}, vector FROM memories ORDER BY id COLLATE "C"'.encode()):
            item = {name: row[name] for name in MEMORY_FIELDS}
            for name in _JSON_FIELDS:
                item[name] = json.loads(item[name]) if item[name] else None
            if include_vectors:
                item["vector"] = None if row["vector"] is None else bytes(row["vector"])
            memories.append(item)
        links = [{"key_id": r[0], "memory_id": r[1], "weight": r[2], "auto": bool(r[3])} for r in conn.execute(
            'SELECT key_id, memory_id, weight, auto FROM links ORDER BY key_id COLLATE "C", memory_id COLLATE "C"')]
        relations = [{"from": r[0], "to": r[1]} for r in conn.execute(
            'SELECT from_id, to_id FROM relations ORDER BY from_id COLLATE "C", to_id COLLATE "C"')]
        candidates = [{"key_id": r[0], "query_text": r[1], "count": r[2], "last_seen": r[3]} for r in conn.execute(
            'SELECT key_id, query_text, count, last_seen FROM alias_candidates '
            'ORDER BY key_id COLLATE "C", norm COLLATE "C"')]
        return {"keys": keys, "memories": memories, "links": links, "relations": relations,
                "alias_candidates": candidates}


class PgTransferWriteRows:
    """The rows an import adds, each leaving an existing row alone."""

    _conn: psycopg.Connection[Any]
    _pipeline: psycopg.Pipeline

    @contextlib.contextmanager
    def _row(self) -> Iterator[None]:
        """A savepoint inside the import's transaction around one row's statements, synced
        before it ends so that a refusal is raised here: the savepoint, the row and the sync
        are one round trip (store/postgres/pipeline.py)."""
        self._conn.execute(b"SAVEPOINT keymem_row")
        try:
            yield
            self._pipeline.sync()
        except psycopg.DatabaseError as exc:
            self._conn.execute(b"ROLLBACK TO SAVEPOINT keymem_row")
            raise ValueError(str(exc).strip()) from exc
        self._conn.execute(b"RELEASE SAVEPOINT keymem_row")

    def key_named(self, key_id: str, norm: str) -> str | None:
        row = self._conn.execute("SELECT id FROM keys WHERE id = %s OR norm = %s ORDER BY id = %s DESC LIMIT 1",
                                 (key_id, norm, key_id)).fetchone()
        return None if row is None else str(row[0])

    def import_key(self, key_id: str, concept: str, norm: str, compact: str, key_type: str, vector: bytes,
                   created_at: float) -> None:
        with self._row():
            self._conn.execute("INSERT INTO keys(id, concept, norm, compact, key_type, vector, created_at) "
                               "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                               (key_id, concept, norm, compact, key_type, vector, created_at))

    def import_alias(self, key_id: str, alias: str, norm: str, compact: str, *, learned: bool, added_at: float,
                     hits: int) -> None:
        with self._row():
            self._conn.execute("INSERT INTO aliases(key_id, alias, norm, compact, learned, added_at, hits) "
                               "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                               (key_id, alias, norm, compact, int(learned), added_at, hits))

    def import_memory(self, fields: Mapping[str, Any], dedup_hash: str, vector: bytes) -> None:
        values = {name: fields[name] for name in MEMORY_FIELDS}
        for name in _JSON_FIELDS:
            values[name] = json.dumps(values[name], ensure_ascii=False) if values[name] is not None else None
        columns = ", ".join([*MEMORY_FIELDS, "dedup_hash", "vector"])
        marks = ", ".join(["%s"] * (len(MEMORY_FIELDS) + 2))
        with self._row():
            self._conn.execute(f"INSERT INTO memories({columns}) VALUES ({marks})".encode(),
                               [*values.values(), dedup_hash, vector])

    def import_link(self, key_id: str, memory_id: str, weight: float, *, auto: bool) -> int:
        with self._row():
            cur = self._conn.execute("INSERT INTO links(key_id, memory_id, weight, auto) VALUES (%s, %s, %s, %s) "
                                     "ON CONFLICT DO NOTHING", (key_id, memory_id, weight, int(auto)))
        return cur.rowcount

    def import_relation(self, from_id: str, to_id: str) -> int:
        with self._row():
            cur = self._conn.execute("INSERT INTO relations(from_id, to_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                     (from_id, to_id))
        return cur.rowcount

    def import_alias_candidate(self, key_id: str, norm: str, query_text: str, count: int, last_seen: float) -> None:
        with self._row():
            self._conn.execute("INSERT INTO alias_candidates(key_id, norm, query_text, count, last_seen) "
                               "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                               (key_id, norm, query_text, count, last_seen))

    def drop_dangling_supersessions(self) -> None:
        self._conn.execute("UPDATE memories m SET superseded_by = NULL WHERE superseded_by IS NOT NULL AND "
                           "NOT EXISTS (SELECT 1 FROM memories s WHERE s.id = m.superseded_by)")
