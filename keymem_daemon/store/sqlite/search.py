"""The FTS5 lexical index (``memory_fts``, ``memory_vocab``).

``LexicalRows``: the index rows the writes keep in step with the memories (and the two reads
they make of it). The reads of retrieval and the push path join this module next to it.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from keymem_daemon.store.sqlite.keys import holding
from keymem_daemon.store.sqlite.rows import rows_in


class LexicalRows:
    """The lexical-index operations of the writes (a mixin of ``session.SqliteReader``)."""

    _conn: sqlite3.Connection

    def index_memory(self, memory_id: str, content_tokens: str, key_tokens: str) -> None:
        (rowid,) = self._conn.execute("SELECT rowid FROM memories WHERE id = ?", (memory_id,)).fetchone()
        self._conn.execute("DELETE FROM memory_fts WHERE rowid = ?", (rowid,))
        self._conn.execute("INSERT INTO memory_fts(rowid, content_tokens, key_tokens) VALUES (?, ?, ?)",
                           (rowid, content_tokens, key_tokens))

    def set_key_tokens(self, memory_id: str, key_tokens: str) -> None:
        self._conn.execute("UPDATE memory_fts SET key_tokens = ? WHERE rowid = "
                           "(SELECT rowid FROM memories WHERE id = ?)", (key_tokens, memory_id))

    def unindex(self, rowid: int) -> None:
        self._conn.execute("DELETE FROM memory_fts WHERE rowid = ?", (rowid,))

    def indexed_holding(self, forms: Sequence[str]) -> set[str]:
        return {r[0] for r in self._conn.execute(
            f"SELECT m.id FROM memories m JOIN memory_fts f ON f.rowid = m.rowid WHERE {holding('m.content', forms)}",
            forms)}

    def document_frequencies(self, tokens: Sequence[str]) -> dict[str, int]:
        return {r[0]: int(r[1]) for r in rows_in(
            self._conn, "SELECT term, doc FROM memory_vocab WHERE term IN ({marks})", list(tokens))}
