"""Export and import rows: every table of the store read out in id order, and the rows an
import adds, each insert leaving an existing row alone (``TransferRows``, a mixin of
session.SqliteReader)."""
from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping
from typing import Any, Final

# A memory's fields as an export lists them (and an import writes them), in this order.
MEMORY_FIELDS: Final = (
    "id", "content", "namespace", "depth", "access_count", "created_at", "updated_at", "last_accessed",
    "observed_at", "last_confirmed_at", "confirmation_count", "decay_profile", "last_confirmation_evidence",
    "last_confirmation_source", "last_confirmation_id", "expires_at", "supersedes", "superseded_by", "source",
)
_JSON_FIELDS: Final = ("source", "last_confirmation_source")


@contextlib.contextmanager
def _rejected() -> Iterator[None]:
    """A row SQLite refuses becomes a ValueError carrying SQLite's reason (the caller names
    the record; the transaction rolls back)."""
    try:
        yield
    except sqlite3.Error as exc:
        raise ValueError(str(exc)) from exc


class TransferRows:
    """The rows an export reads (a mixin of session.SqliteReader)."""

    _conn: sqlite3.Connection

    def schema_version(self) -> int:
        """The schema version this store is at (an export records it): its migrations applied."""
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def export_rows(self, *, include_vectors: bool) -> dict[str, list[dict[str, Any]]]:
        """Every key (with its aliases), memory, link, relation and alias candidate, sorted by
        id; with ``include_vectors`` keys and memories carry their vector's bytes (``vector``)."""
        conn = self._conn
        aliases: dict[str, list[dict[str, Any]]] = {}
        for row in conn.execute("SELECT key_id, alias, learned, added_at, hits FROM aliases ORDER BY key_id, norm"):
            aliases.setdefault(row["key_id"], []).append(
                {"alias": row["alias"], "learned": bool(row["learned"]), "added_at": row["added_at"],
                 "hits": row["hits"]})
        keys = []
        for row in conn.execute("SELECT id, concept, key_type, created_at, vector FROM keys ORDER BY id"):
            item: dict[str, Any] = {"id": row["id"], "concept": row["concept"], "key_type": row["key_type"],
                                    "created_at": row["created_at"], "aliases": aliases.get(row["id"], [])}
            if include_vectors:
                item["vector"] = row["vector"]
            keys.append(item)
        memories = []
        columns = ", ".join(MEMORY_FIELDS)
        for row in conn.execute(f"SELECT {columns}, vector FROM memories ORDER BY id"):
            item = {name: row[name] for name in MEMORY_FIELDS}
            for name in _JSON_FIELDS:
                item[name] = json.loads(item[name]) if item[name] else None
            if include_vectors:
                item["vector"] = row["vector"]
            memories.append(item)
        links = [{"key_id": r[0], "memory_id": r[1], "weight": r[2], "auto": bool(r[3])} for r in conn.execute(
            "SELECT key_id, memory_id, weight, auto FROM links ORDER BY key_id, memory_id")]
        relations = [{"from": r[0], "to": r[1]} for r in conn.execute(
            "SELECT from_id, to_id FROM relations ORDER BY from_id, to_id")]
        candidates = [{"key_id": r[0], "query_text": r[1], "count": r[2], "last_seen": r[3]} for r in conn.execute(
            "SELECT key_id, query_text, count, last_seen FROM alias_candidates ORDER BY key_id, norm")]
        return {"keys": keys, "memories": memories, "links": links, "relations": relations,
                "alias_candidates": candidates}



class TransferWriteRows:
    """The rows an import adds (a mixin of session.SqliteWriter)."""

    _conn: sqlite3.Connection

    def key_named(self, key_id: str, norm: str) -> str | None:
        """The key with this id, else the one whose normalised text is ``norm``, else None."""
        with _rejected():
            row = self._conn.execute("SELECT id FROM keys WHERE id = ? OR norm = ? ORDER BY id = ? DESC LIMIT 1",
                                     (key_id, norm, key_id)).fetchone()
        return None if row is None else str(row[0])

    def import_key(self, key_id: str, concept: str, norm: str, compact: str, key_type: str, vector: bytes,
                created_at: float) -> None:
        with _rejected():
            self._conn.execute("INSERT INTO keys(id, concept, norm, compact, key_type, vector, created_at) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (key_id, concept, norm, compact, key_type, vector, created_at))

    def import_alias(self, key_id: str, alias: str, norm: str, compact: str, *, learned: bool, added_at: float,
                     hits: int) -> None:
        """Add an alias to a key, unless the key has it already."""
        with _rejected():
            self._conn.execute("INSERT OR IGNORE INTO aliases(key_id, alias, norm, compact, learned, added_at, hits) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)", (key_id, alias, norm, compact, int(learned), added_at,
                                                                hits))

    def import_memory(self, fields: Mapping[str, Any], dedup_hash: str, vector: bytes) -> None:
        """Insert a memory with every field of ``MEMORY_FIELDS`` as given (provenance as objects)."""
        values = {name: fields[name] for name in MEMORY_FIELDS}
        for name in _JSON_FIELDS:
            values[name] = json.dumps(values[name], ensure_ascii=False) if values[name] is not None else None
        columns = ", ".join([*MEMORY_FIELDS, "dedup_hash", "vector"])
        marks = ", ".join("?" * (len(MEMORY_FIELDS) + 2))
        with _rejected():
            self._conn.execute(f"INSERT INTO memories({columns}) VALUES ({marks})",
                               [*values.values(), dedup_hash, vector])

    def import_link(self, key_id: str, memory_id: str, weight: float, *, auto: bool) -> int:
        """Link a memory to a key unless they are linked already; 1 if it was added, else 0."""
        with _rejected():
            return self._conn.execute("INSERT OR IGNORE INTO links(key_id, memory_id, weight, auto) "
                                      "VALUES (?, ?, ?, ?)", (key_id, memory_id, weight, int(auto))).rowcount

    def import_relation(self, from_id: str, to_id: str) -> int:
        """Relate two memories unless they are already; 1 if it was added, else 0."""
        return self._conn.execute(
            "INSERT OR IGNORE INTO relations(from_id, to_id) VALUES (?, ?)", (from_id, to_id)).rowcount

    def import_alias_candidate(self, key_id: str, norm: str, query_text: str, count: int, last_seen: float) -> None:
        """Record a pending alias candidate unless the key has it already."""
        with _rejected():
            self._conn.execute("INSERT OR IGNORE INTO alias_candidates(key_id, norm, query_text, count, last_seen) "
                               "VALUES (?, ?, ?, ?, ?)", (key_id, norm, query_text, count, last_seen))

    def drop_dangling_supersessions(self) -> None:
        """Clear every ``superseded_by`` that names no memory of the store."""
        self._conn.execute("UPDATE memories SET superseded_by = NULL WHERE superseded_by IS NOT NULL AND "
                           "superseded_by NOT IN (SELECT id FROM memories)")
