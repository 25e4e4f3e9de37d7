"""Rows copied into a SQLite file from another store: the local read replica a daemon on a
shared PostgreSQL store keeps in its data dir (``store/postgres/offline.py``), so that it can
answer reads from it while the server does not answer. These are a ``SqliteWriter``'s
operations (never the engine's: its writes go to the server); the replica is read through
the ordinary ``SqliteReader``.

The tables and columns are the keymem schema's (both stores have the same); memories and keys
are copied with their vectors, so that a daemon that starts while the server is away loads
its in-memory tables from the copy.
A daemon restarted on a replica that is still current resumes from it (store/postgres/resume.py).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from keymem_daemon.store.sqlite.rows import rows_in
from keymem_daemon.store.sqlite.search import LexicalRows

REPLICA_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "meta": ("name", "value"),
    "keys": ("rowid", "id", "concept", "norm", "compact", "key_type", "vector", "created_at"),
    "aliases": ("key_id", "alias", "norm", "compact", "learned", "added_at", "hits"),
    "alias_candidates": ("key_id", "norm", "query_text", "count", "last_seen"),
    "memories": ("rowid", "id", "content", "dedup_hash", "namespace", "depth", "access_count", "created_at",
                 "updated_at", "last_accessed", "observed_at", "last_confirmed_at", "confirmation_count",
                 "decay_profile", "last_confirmation_evidence", "last_confirmation_source", "last_confirmation_id",
                 "expires_at", "supersedes", "superseded_by", "source", "vector"),
    "links": ("key_id", "memory_id", "weight", "auto"),
    "relations": ("from_id", "to_id"),
}
"""The tables a replica holds, in an order that satisfies their foreign keys, and the columns
it copies of each (in this order); the lexical index (``memory_fts``) comes after them."""
_CONFLICT_TARGET: Final = {"meta": "name", "keys": "id", "aliases": "key_id, norm",
                           "alias_candidates": "key_id, norm", "memories": "id", "links": "key_id, memory_id",
                           "relations": "from_id, to_id"}


def _upsert(table: str) -> str:
    columns = REPLICA_COLUMNS[table]
    target = _CONFLICT_TARGET[table]
    keep = [c for c in columns if c not in target.split(", ") and c != "rowid"]
    update = ", ".join(f"{c} = excluded.{c}" for c in keep) if keep else None
    return (f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT({target}) DO " + (f"UPDATE SET {update}" if update else "NOTHING"))


class ReplicaWriteRows(LexicalRows):
    """Putting another store's rows in place (tables and columns as ``REPLICA_COLUMNS``).
    Every write of ``memory_fts`` tells the vocabulary first (``_index_changing``), as the
    engine's index writes do: a daemon following a shared store reads its document
    frequencies from this replica, and a kept copy would go on counting the old rows."""

    def clear_replica(self) -> None:
        """Delete every row a replica holds (before it is filled again)."""
        self._index_changing()
        self._conn.execute("DELETE FROM memory_fts")
        for table in reversed(REPLICA_COLUMNS):
            self._conn.execute(f"DELETE FROM {table}")

    def put_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or update rows of ``table`` (one of ``REPLICA_COLUMNS``), columns in its order."""
        self._conn.executemany(_upsert(table), rows)

    def put_index_rows(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """``(memory_id, content_tokens, key_tokens)``: the memory's lexical index row, replaced."""
        self._index_changing()
        # One rowid at a time: FTS5 finds a row by ``rowid =`` directly, but scans for ``IN``.
        self._conn.executemany("DELETE FROM memory_fts WHERE rowid = (SELECT rowid FROM memories WHERE id = ?)",
                               [(row[0],) for row in rows])
        self._conn.executemany("INSERT INTO memory_fts(rowid, content_tokens, key_tokens) "
                               "SELECT rowid, ?, ? FROM memories WHERE id = ?",
                               [(content, keys, memory_id) for memory_id, content, keys in rows])

    def drop_memory_rows(self, memory_ids: Iterable[str]) -> None:
        """Delete memories with their index rows (links and relations cascade)."""
        ids = list(memory_ids)
        self._index_changing()
        rowids = [r[0] for r in rows_in(self._conn, "SELECT rowid FROM memories WHERE id IN ({marks})", ids)]
        list(rows_in(self._conn, "DELETE FROM memory_fts WHERE rowid IN ({marks})", rowids))
        list(rows_in(self._conn, "DELETE FROM memories WHERE id IN ({marks})", ids))

    def drop_memory_edges(self, memory_ids: Iterable[str]) -> None:
        """Delete the links of these memories and the relations they name (to be copied again)."""
        ids = list(memory_ids)
        list(rows_in(self._conn, "DELETE FROM links WHERE memory_id IN ({marks})", ids))
        list(rows_in(self._conn, "DELETE FROM relations WHERE from_id IN ({marks})", ids))

    def drop_key_rows(self, key_ids: Iterable[str]) -> None:
        """Delete keys (their links, aliases and alias candidates cascade)."""
        list(rows_in(self._conn, "DELETE FROM keys WHERE id IN ({marks})", list(key_ids)))

    def drop_aliases_of(self, key_ids: Iterable[str]) -> None:
        """Delete the aliases of these keys (to be copied again)."""
        list(rows_in(self._conn, "DELETE FROM aliases WHERE key_id IN ({marks})", list(key_ids)))

    def drop_meta_rows(self, names: Iterable[str]) -> None:
        list(rows_in(self._conn, "DELETE FROM meta WHERE name IN ({marks})", list(names)))
