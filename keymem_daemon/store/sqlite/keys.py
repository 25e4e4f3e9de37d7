"""Keys, their aliases and alias candidates, and the key->memory links: the reads and writes
of ``engine.ports.KeyReads``/``KeyWrites`` (a mixin of ``session.SqliteReader``)."""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Final

from keymem_daemon.engine.keys import KeyInfo
from keymem_daemon.engine.ports import KeyRow
from keymem_daemon.store.sqlite.rows import rows_in

# The separator of the key texts ``loanword_evidence`` concatenates (ASCII unit separator:
# never in a key, which is visible text).
_UNIT: Final = "\x1f"


def holding(column: str, forms: Sequence[str]) -> str:
    """A condition true where ``column`` contains one of ``forms`` (never, for none)."""
    return " OR ".join([f"instr({column}, ?) > 0"] * len(forms)) or "0"


class KeyRows:
    """The key, alias and link operations of a reader/writer."""

    _conn: sqlite3.Connection

    # -- reads ----------------------------------------------------------------------------

    def key_info(self, key_id: str) -> KeyInfo:
        conn = self._conn
        row = conn.execute("SELECT id, concept, compact, key_type FROM keys WHERE id = ?", (key_id,)).fetchone()
        aliases = conn.execute("SELECT alias, compact FROM aliases WHERE key_id = ? ORDER BY added_at",
                               (key_id,)).fetchall()
        count = conn.execute("SELECT COUNT(*) FROM links WHERE key_id = ?", (key_id,)).fetchone()[0]
        return KeyInfo(id=row["id"], concept=row["concept"], key_type=row["key_type"], compact=row["compact"],
                       aliases=tuple(a[0] for a in aliases), alias_compacts=tuple(a[1] for a in aliases),
                       link_count=count)

    def keys_named(self, norms: Sequence[str]) -> dict[str, str]:
        return {str(r[0]): str(r[1]) for r in rows_in(
            self._conn, "SELECT norm, MIN(id) FROM keys WHERE norm IN ({marks}) GROUP BY norm",
            list(dict.fromkeys(norms)))}

    def key_concept(self, key_id: str) -> str | None:
        row = self._conn.execute("SELECT concept FROM keys WHERE id = ?", (key_id,)).fetchone()
        return None if row is None else str(row[0])

    def key_count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM keys").fetchone()[0])

    def has_hangul_keys(self) -> bool:
        return self._conn.execute("SELECT 1 FROM keys WHERE concept GLOB '*[가-힣]*' LIMIT 1").fetchone() is not None

    def stored_keys(self) -> Iterator[tuple[KeyInfo, bytes | None]]:
        conn = self._conn
        aliases: dict[str, list[tuple[str, str]]] = {}
        for key_id, alias, compact in conn.execute("SELECT key_id, alias, compact FROM aliases ORDER BY added_at"):
            aliases.setdefault(key_id, []).append((alias, compact))
        counts = self.link_counts()
        for key_id, concept, compact, key_type, blob in conn.execute(
                "SELECT id, concept, compact, key_type, vector FROM keys"):
            alias_rows = aliases.get(key_id, [])
            yield KeyInfo(
                id=key_id, concept=concept, key_type=key_type, compact=compact,
                aliases=tuple(a for a, _ in alias_rows), alias_compacts=tuple(c for _, c in alias_rows),
                link_count=counts.get(key_id, 0)), blob

    def key_concepts(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._conn.execute("SELECT id, concept FROM keys").fetchall()]

    def key_rows(self, key_ids: Sequence[str]) -> dict[str, tuple[KeyInfo, bytes]]:
        out: dict[str, tuple[KeyInfo, bytes]] = {}
        for key_id in dict.fromkeys(key_ids):
            row = self._conn.execute("SELECT vector FROM keys WHERE id = ?", (key_id,)).fetchone()
            if row is not None:
                out[key_id] = self.key_info(key_id), bytes(row[0])
        return out

    def keys_after(self, rowid: int) -> list[tuple[int, str, str]]:
        return [(r[0], r[1], r[2]) for r in self._conn.execute(
            "SELECT rowid, id, concept FROM keys WHERE rowid > ? ORDER BY rowid", (rowid,)).fetchall()]

    def keys_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._conn.execute(
            f"SELECT id, concept FROM keys WHERE {holding('concept', forms)}", forms).fetchall()]

    def aliases_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._conn.execute(
            f"SELECT key_id, alias FROM aliases WHERE {holding('alias', forms)}", forms).fetchall()]

    def duplicate_key_norms(self) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT norm FROM keys GROUP BY norm HAVING COUNT(*) > 1").fetchall()]

    def learned_aliases(self, key_id: str) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT alias FROM aliases WHERE key_id = ? AND learned = 1 ORDER BY added_at", (key_id,))]

    def learned_alias_count(self, key_id: str) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM aliases WHERE key_id = ? AND learned = 1",
                                      (key_id,)).fetchone()[0])

    def stale_learned_aliases(self, cutoff: float) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._conn.execute(
            "SELECT key_id, norm FROM aliases WHERE learned = 1 AND hits = 0 AND added_at <= ?",
            (cutoff,)).fetchall()]

    def key_texts_of(self, memory_id: str, *, likely: Sequence[str] | None = None) -> list[str]:
        texts: list[str] = []
        for row in self._conn.execute(
                "SELECT k.concept, k.id FROM links l JOIN keys k ON k.id = l.key_id WHERE l.memory_id = ?",
                (memory_id,)):
            texts.append(row[0])
            texts.extend(a[0] for a in self._conn.execute("SELECT alias FROM aliases WHERE key_id = ?", (row[1],)))
        return texts

    def key_ids_of(self, memory_id: str, *, manual_only: bool = False) -> list[str]:
        sql = "SELECT key_id FROM links WHERE memory_id = ?" + (" AND auto = 0" if manual_only else "")
        return [r[0] for r in self._conn.execute(sql, (memory_id,))]

    def links_of(self, memory_id: str) -> list[tuple[str, float, bool]]:
        return [(r[0], r[1], bool(r[2])) for r in self._conn.execute(
            "SELECT key_id, weight, auto FROM links WHERE memory_id = ? ORDER BY weight DESC",
            (memory_id,)).fetchall()]

    def link_weight(self, key_id: str, memory_id: str) -> float | None:
        row = self._conn.execute("SELECT weight FROM links WHERE key_id = ? AND memory_id = ?",
                                 (key_id, memory_id)).fetchone()
        return None if row is None else float(row[0])

    def has_links(self, key_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM links WHERE key_id = ? LIMIT 1", (key_id,)).fetchone() is not None

    def memories_linked_to(self, key_ids: Sequence[str], *, limit: int | None = None) -> list[str]:
        if limit is not None and len(key_ids) == 1:
            return [r[0] for r in self._conn.execute(
                "SELECT memory_id FROM links WHERE key_id = ? LIMIT ?", (key_ids[0], limit))]
        return [r[0] for r in rows_in(self._conn, "SELECT DISTINCT memory_id FROM links WHERE key_id IN ({marks})",
                                      list(key_ids))]

    def co_members(self, key_id: str, memory_id: str, limit: int) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT memory_id FROM links WHERE key_id = ? AND memory_id != ? LIMIT ?", (key_id, memory_id, limit))]

    def link_counts(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT key_id, COUNT(*) FROM links GROUP BY key_id").fetchall())

    def unexpiring_counts(self, of: Sequence[str] | None = None) -> list[tuple[str, str, int]]:
        sql = ("SELECT l.key_id, m.namespace, COUNT(*) FROM links l JOIN memories m ON m.id = l.memory_id "
               "WHERE m.superseded_by IS NULL AND m.expires_at IS NULL{keys} GROUP BY l.key_id, m.namespace")
        if of is None:
            return [(r[0], r[1], r[2]) for r in self._conn.execute(sql.format(keys="")).fetchall()]
        return [(r[0], r[1], r[2]) for r in rows_in(self._conn, sql.format(keys=" AND l.key_id IN ({marks})"),
                                                   list(of))]

    def loanword_evidence(self, key_id: str, limit: int) -> list[tuple[str, list[str]]]:
        return [(content, keys.split(_UNIT)) for content, keys in self._conn.execute(
            "SELECT m.content, (SELECT group_concat(k.concept, char(31)) FROM links o "
            "JOIN keys k ON k.id = o.key_id WHERE o.memory_id = m.id) "
            "FROM links l JOIN memories m ON m.id = l.memory_id "
            "WHERE l.key_id = ? AND m.superseded_by IS NULL LIMIT ?", (key_id, limit))]

    # -- writes ---------------------------------------------------------------------------

    def insert_key(self, row: KeyRow) -> None:
        self._conn.execute(
            "INSERT INTO keys(id, concept, norm, compact, key_type, vector, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row.id, row.concept, row.norm, row.compact, row.key_type, row.vector, row.created_at))

    def set_key_type(self, key_id: str, key_type: str) -> None:
        self._conn.execute("UPDATE keys SET key_type = ? WHERE id = ?", (key_type, key_id))

    def set_key_compact(self, key_id: str, compact: str) -> None:
        self._conn.execute("UPDATE keys SET compact = ? WHERE id = ?", (compact, key_id))

    def set_alias_compact(self, key_id: str, alias: str, compact: str) -> None:
        self._conn.execute("UPDATE aliases SET compact = ? WHERE key_id = ? AND alias = ?", (compact, key_id, alias))

    def set_key_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        self._conn.executemany("UPDATE keys SET vector = ? WHERE id = ?", pairs)

    def delete_key(self, key_id: str) -> None:
        self._conn.execute("DELETE FROM keys WHERE id = ?", (key_id,))

    def merge_keys_named(self, norm: str) -> tuple[int, set[str]]:
        conn = self._conn
        rows = conn.execute("SELECT id, key_type FROM keys WHERE norm = ? ORDER BY created_at, rowid",
                            (norm,)).fetchall()
        keep, duplicates = rows[0]["id"], [r["id"] for r in rows[1:]]
        entity = next((r["key_type"] for r in rows if r["key_type"] != "concept"), None)
        if entity is not None and rows[0]["key_type"] == "concept":
            self.set_key_type(keep, entity)
        memories: set[str] = set()
        for dup in duplicates:
            memories.update(r[0] for r in conn.execute("SELECT memory_id FROM links WHERE key_id = ?", (dup,)))
            conn.execute(
                "INSERT INTO links(key_id, memory_id, weight, auto) "
                "SELECT ?, memory_id, weight, auto FROM links WHERE key_id = ? "
                "ON CONFLICT(key_id, memory_id) DO UPDATE SET weight = MAX(weight, excluded.weight), "
                "auto = MIN(auto, excluded.auto)", (keep, dup))
            conn.execute(
                "INSERT INTO aliases(key_id, alias, norm, compact, learned, added_at, hits) "
                "SELECT ?, alias, norm, compact, learned, added_at, hits FROM aliases "
                "WHERE key_id = ? AND norm != ? "
                "ON CONFLICT(key_id, norm) DO UPDATE SET hits = hits + excluded.hits, "
                "learned = MIN(learned, excluded.learned)", (keep, dup, norm))
            conn.execute(
                "INSERT INTO alias_candidates(key_id, norm, query_text, count, last_seen) "
                "SELECT ?, norm, query_text, count, last_seen FROM alias_candidates WHERE key_id = ? "
                "ON CONFLICT(key_id, norm) DO UPDATE SET count = count + excluded.count, "
                "last_seen = MAX(last_seen, excluded.last_seen)", (keep, dup))
            self.delete_key(dup)  # its rows cascade
        return len(duplicates), memories

    def add_alias(self, key_id: str, alias: str, *, norm: str, compact: str, learned: bool,
                  added_at: float) -> bool:
        cur = self._conn.execute(
            "INSERT OR IGNORE INTO aliases(key_id, alias, norm, compact, learned, added_at) VALUES (?, ?, ?, ?, ?, ?)",
            (key_id, alias, norm, compact, int(learned), added_at))
        return cur.rowcount > 0

    def delete_aliases(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._conn.executemany("DELETE FROM aliases WHERE key_id = ? AND norm = ?", pairs)

    def count_alias_hits(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._conn.executemany("UPDATE aliases SET hits = hits + 1 WHERE key_id = ? AND norm = ? AND learned = 1",
                               pairs)

    def see_alias_candidate(self, key_id: str, norm: str, text: str, now: float) -> int:
        self._conn.execute(
            "INSERT INTO alias_candidates(key_id, norm, query_text, count, last_seen) VALUES (?, ?, ?, 1, ?) "
            "ON CONFLICT(key_id, norm) DO UPDATE SET count = count + 1, last_seen = excluded.last_seen, "
            "query_text = excluded.query_text", (key_id, norm, text, now))
        return int(self._conn.execute("SELECT count FROM alias_candidates WHERE key_id = ? AND norm = ?",
                                      (key_id, norm)).fetchone()[0])

    def drop_alias_candidate(self, key_id: str, norm: str) -> None:
        self._conn.execute("DELETE FROM alias_candidates WHERE key_id = ? AND norm = ?", (key_id, norm))

    def unsee_alias_candidate(self, key_id: str, norm: str) -> str | None:
        row = self._conn.execute("SELECT count, query_text FROM alias_candidates WHERE key_id = ? AND norm = ?",
                                 (key_id, norm)).fetchone()
        if row is None:
            return None
        if row[0] <= 1:
            self.drop_alias_candidate(key_id, norm)
        else:
            self._conn.execute("UPDATE alias_candidates SET count = count - 1 WHERE key_id = ? AND norm = ?",
                               (key_id, norm))
        return str(row[1])

    def prune_alias_candidates(self, cutoff: float) -> int:
        return self._conn.execute("DELETE FROM alias_candidates WHERE last_seen <= ?", (cutoff,)).rowcount

    def link(self, key_id: str, memory_id: str, weight: float, auto: bool) -> bool:
        cur = self._conn.execute("INSERT OR IGNORE INTO links(key_id, memory_id, weight, auto) VALUES (?, ?, ?, ?)",
                                 (key_id, memory_id, weight, int(auto)))
        return cur.rowcount > 0

    def link_all(self, key_ids: Sequence[str], memory_id: str, weight: float, auto: bool) -> list[str]:
        return [key_id for key_id in key_ids if self.link(key_id, memory_id, weight, auto)]

    def add_links(self, links: Sequence[tuple[str, str, float, bool]]) -> None:
        self._conn.executemany("INSERT OR IGNORE INTO links(key_id, memory_id, weight, auto) VALUES (?, ?, ?, ?)",
                               [(k, m, w, int(a)) for k, m, w, a in links])

    def set_link_weight(self, key_id: str, memory_id: str, weight: float) -> None:
        self._conn.execute("UPDATE links SET weight = ? WHERE key_id = ? AND memory_id = ?",
                           (weight, key_id, memory_id))
