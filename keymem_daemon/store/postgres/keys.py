"""Keys, aliases, alias candidates and links on PostgreSQL: ``engine.ports.KeyReads``/
``KeyWrites`` as ``store/sqlite/keys.py`` does them on SQLite, in PostgreSQL's dialect."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

import psycopg

from keymem_daemon.engine.keys import KeyInfo
from keymem_daemon.engine.ports import KeyRow
from keymem_daemon.store.postgres.memories import streamed
from keymem_daemon.store.postgres.pipeline import affected

# The separator of the key texts ``loanword_evidence`` concatenates (as on SQLite).
_UNIT: Final = "\x1f"
# ``column`` contains one of the forms bound as a text[] (SQLite: instr() per form).
_HOLDING: Final = "EXISTS (SELECT 1 FROM unnest(%s::text[]) x WHERE strpos({column}, x) > 0)"


# What ``KeyInfo`` holds of key ``k``, in one statement: the key, its aliases (alias, compact)
# in the order they were added, and its link count.
_KEY_INFO: Final = ("k.id, k.concept, k.compact, k.key_type, ARRAY(SELECT ARRAY[a.alias, a.compact] FROM aliases a "
                    "WHERE a.key_id = k.id ORDER BY a.added_at), (SELECT COUNT(*) FROM links l WHERE l.key_id = k.id)")


def _key_info(row: Sequence[Any]) -> KeyInfo:
    """The ``KeyInfo`` of a row that starts with ``_KEY_INFO``'s columns."""
    key_id, concept, compact, key_type, aliases, count = row[:6]
    return KeyInfo(id=key_id, concept=concept, key_type=key_type, compact=compact,
                   aliases=tuple(a[0] for a in aliases), alias_compacts=tuple(a[1] for a in aliases),
                   link_count=int(count))


class PgKeyRows:
    """The key, alias and link operations of a PostgreSQL reader/writer."""

    _conn: psycopg.Connection[Any]
    _pipeline: psycopg.Pipeline

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(sql.encode(), params))

    def _value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self._conn.execute(sql.encode(), params).fetchone()
        return None if row is None else row[0]

    # -- reads ----------------------------------------------------------------------------

    def key_info(self, key_id: str) -> KeyInfo:
        rows = self._rows(f"SELECT {_KEY_INFO} FROM keys k WHERE id = %s", (key_id,))
        if not rows:
            raise KeyError(key_id)
        return _key_info(rows[0])

    def key_rows(self, key_ids: Sequence[str]) -> dict[str, tuple[KeyInfo, bytes]]:
        return {r[0]: (_key_info(r), bytes(r[6])) for r in self._rows(
            f"SELECT {_KEY_INFO}, vector FROM keys k WHERE id = ANY(%s)", (list(dict.fromkeys(key_ids)),))}

    def keys_named(self, norms: Sequence[str]) -> dict[str, str]:
        return {r[0]: r[1] for r in self._rows("SELECT norm, MIN(id) FROM keys WHERE norm = ANY(%s) GROUP BY norm",
                                               (list(dict.fromkeys(norms)),))}

    def key_concept(self, key_id: str) -> str | None:
        value = self._value("SELECT concept FROM keys WHERE id = %s", (key_id,))
        return None if value is None else str(value)

    def key_count(self) -> int:
        return int(self._value("SELECT COUNT(*) FROM keys"))

    def has_hangul_keys(self) -> bool:
        return self._value("SELECT 1 FROM keys WHERE concept ~ '[가-힣]' LIMIT 1") is not None

    def stored_keys(self) -> Iterator[tuple[KeyInfo, bytes | None]]:
        aliases: dict[str, list[tuple[str, str]]] = {}
        for key_id, alias, compact in self._rows("SELECT key_id, alias, compact FROM aliases ORDER BY added_at"):
            aliases.setdefault(key_id, []).append((alias, compact))
        counts = self.link_counts()
        for rows in streamed(self._conn, "SELECT id, concept, compact, key_type, vector FROM keys"):
            for key_id, concept, compact, key_type, blob in rows:
                alias_rows = aliases.get(key_id, [])
                yield KeyInfo(
                    id=key_id, concept=concept, key_type=key_type, compact=compact,
                    aliases=tuple(a for a, _ in alias_rows), alias_compacts=tuple(c for _, c in alias_rows),
                    link_count=counts.get(key_id, 0)), blob

    def key_concepts(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._rows("SELECT id, concept FROM keys")]

    def key_vector(self, key_id: str) -> bytes | None:
        rows = self._rows("SELECT vector FROM keys WHERE id = %s", (key_id,))
        return None if not rows else bytes(rows[0][0])

    def keys_after(self, rowid: int) -> list[tuple[int, str, str]]:
        return [(int(r[0]), r[1], r[2]) for r in self._rows(
            "SELECT rowid, id, concept FROM keys WHERE rowid > %s ORDER BY rowid", (rowid,))]

    def keys_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._rows(
            "SELECT id, concept FROM keys WHERE " + _HOLDING.format(column="concept"), (list(forms),))]

    def aliases_holding(self, forms: Sequence[str]) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._rows(
            "SELECT key_id, alias FROM aliases WHERE " + _HOLDING.format(column="alias"), (list(forms),))]

    def duplicate_key_norms(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT norm FROM keys GROUP BY norm HAVING COUNT(*) > 1")]

    def learned_aliases(self, key_id: str) -> list[str]:
        return [r[0] for r in self._rows(
            "SELECT alias FROM aliases WHERE key_id = %s AND learned = 1 ORDER BY added_at", (key_id,))]

    def learned_alias_count(self, key_id: str) -> int:
        return int(self._value("SELECT COUNT(*) FROM aliases WHERE key_id = %s AND learned = 1", (key_id,)))

    def stale_learned_aliases(self, cutoff: float) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._rows(
            "SELECT key_id, norm FROM aliases WHERE learned = 1 AND hits = 0 AND added_at <= %s", (cutoff,))]

    def key_texts_of(self, memory_id: str, *, likely: Sequence[str] | None = None) -> list[str]:
        texts: list[str] = []
        for concept, aliases in self._rows(
                "SELECT k.concept, ARRAY(SELECT a.alias FROM aliases a WHERE a.key_id = k.id) "
                "FROM links l JOIN keys k ON k.id = l.key_id WHERE l.memory_id = %s", (memory_id,)):
            texts.append(concept)
            texts.extend(aliases)
        return texts

    def key_ids_of(self, memory_id: str, *, manual_only: bool = False) -> list[str]:
        # Ordered as SQLite's indexes hand the rows out (here and in the link reads below).
        sql = "SELECT key_id FROM links WHERE memory_id = %s" + (" AND auto = 0" if manual_only else "") + \
            " ORDER BY key_id"
        return [r[0] for r in self._rows(sql, (memory_id,))]

    def links_of(self, memory_id: str) -> list[tuple[str, float, bool]]:
        return [(r[0], float(r[1]), bool(r[2])) for r in self._rows(
            "SELECT key_id, weight, auto FROM links WHERE memory_id = %s ORDER BY weight DESC", (memory_id,))]

    def link_weight(self, key_id: str, memory_id: str) -> float | None:
        value = self._value("SELECT weight FROM links WHERE key_id = %s AND memory_id = %s", (key_id, memory_id))
        return None if value is None else float(value)

    def has_links(self, key_id: str) -> bool:
        return self._value("SELECT 1 FROM links WHERE key_id = %s LIMIT 1", (key_id,)) is not None

    def memories_linked_to(self, key_ids: Sequence[str], *, limit: int | None = None) -> list[str]:
        if limit is not None and len(key_ids) == 1:
            return [r[0] for r in self._rows(
                "SELECT memory_id FROM links WHERE key_id = %s ORDER BY memory_id LIMIT %s", (key_ids[0], limit))]
        return [r[0] for r in self._rows("SELECT DISTINCT memory_id FROM links WHERE key_id = ANY(%s)",
                                         (list(key_ids),))]

    def co_members(self, key_id: str, memory_id: str, limit: int) -> list[str]:
        return [r[0] for r in self._rows(
            "SELECT memory_id FROM links WHERE key_id = %s AND memory_id != %s ORDER BY memory_id LIMIT %s",
            (key_id, memory_id, limit))]

    def link_counts(self) -> dict[str, int]:
        return {r[0]: int(r[1]) for r in self._rows("SELECT key_id, COUNT(*) FROM links GROUP BY key_id")}

    def unexpiring_counts(self, of: Sequence[str] | None = None) -> list[tuple[str, str, int]]:
        return [(r[0], r[1], int(r[2])) for r in self._rows(
            "SELECT l.key_id, m.namespace, COUNT(*) FROM links l JOIN memories m ON m.id = l.memory_id "
            "WHERE m.superseded_by IS NULL AND m.expires_at IS NULL AND (%s::text[] IS NULL OR l.key_id = ANY(%s)) "
            "GROUP BY l.key_id, m.namespace", (None if of is None else list(of), None if of is None else list(of)))]

    def loanword_evidence(self, key_id: str, limit: int) -> list[tuple[str, list[str]]]:
        return [(content, keys.split(_UNIT)) for content, keys in self._rows(
            "SELECT m.content, (SELECT string_agg(k.concept, chr(31)) FROM links o "
            "JOIN keys k ON k.id = o.key_id WHERE o.memory_id = m.id) "
            "FROM links l JOIN memories m ON m.id = l.memory_id "
            "WHERE l.key_id = %s AND m.superseded_by IS NULL LIMIT %s", (key_id, limit))]

    # -- writes ---------------------------------------------------------------------------

    def insert_key(self, row: KeyRow) -> None:
        self._conn.execute(
            "INSERT INTO keys(id, concept, norm, compact, key_type, vector, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (row.id, row.concept, row.norm, row.compact, row.key_type, row.vector, row.created_at))

    def set_key_type(self, key_id: str, key_type: str) -> None:
        self._conn.execute("UPDATE keys SET key_type = %s WHERE id = %s", (key_type, key_id))

    def set_key_compact(self, key_id: str, compact: str) -> None:
        self._conn.execute("UPDATE keys SET compact = %s WHERE id = %s", (compact, key_id))

    def set_alias_compact(self, key_id: str, alias: str, compact: str) -> None:
        self._conn.execute("UPDATE aliases SET compact = %s WHERE key_id = %s AND alias = %s",
                           (compact, key_id, alias))

    def set_key_vectors(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        self._conn.cursor().executemany("UPDATE keys SET vector = %s WHERE id = %s", pairs)

    def delete_key(self, key_id: str) -> None:
        self._conn.execute("DELETE FROM keys WHERE id = %s", (key_id,))

    def merge_keys_named(self, norm: str) -> tuple[int, set[str]]:
        rows = self._rows("SELECT id, key_type FROM keys WHERE norm = %s ORDER BY created_at, rowid", (norm,))
        keep, duplicates = rows[0][0], [r[0] for r in rows[1:]]
        entity = next((r[1] for r in rows if r[1] != "concept"), None)
        if entity is not None and rows[0][1] == "concept":
            self.set_key_type(keep, entity)
        memories: set[str] = set()
        for dup in duplicates:
            memories.update(r[0] for r in self._rows("SELECT memory_id FROM links WHERE key_id = %s", (dup,)))
            self._conn.execute(
                "INSERT INTO links AS l (key_id, memory_id, weight, auto) "
                "SELECT %s, memory_id, weight, auto FROM links WHERE key_id = %s "
                "ON CONFLICT (key_id, memory_id) DO UPDATE SET weight = GREATEST(l.weight, excluded.weight), "
                "auto = LEAST(l.auto, excluded.auto)", (keep, dup))
            self._conn.execute(
                "INSERT INTO aliases AS a (key_id, alias, norm, compact, learned, added_at, hits) "
                "SELECT %s, alias, norm, compact, learned, added_at, hits FROM aliases "
                "WHERE key_id = %s AND norm != %s "
                "ON CONFLICT (key_id, norm) DO UPDATE SET hits = a.hits + excluded.hits, "
                "learned = LEAST(a.learned, excluded.learned)", (keep, dup, norm))
            self._conn.execute(
                "INSERT INTO alias_candidates AS c (key_id, norm, query_text, count, last_seen) "
                "SELECT %s, norm, query_text, count, last_seen FROM alias_candidates WHERE key_id = %s "
                "ON CONFLICT (key_id, norm) DO UPDATE SET count = c.count + excluded.count, "
                "last_seen = GREATEST(c.last_seen, excluded.last_seen)", (keep, dup))
            self.delete_key(dup)  # its rows cascade
        return len(duplicates), memories

    def add_alias(self, key_id: str, alias: str, *, norm: str, compact: str, learned: bool,
                  added_at: float) -> bool:
        return affected(
            self._conn, self._pipeline, "INSERT INTO aliases(key_id, alias, norm, compact, learned, added_at) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", (key_id, alias, norm, compact, int(learned),
                                                                      added_at)) > 0

    def delete_aliases(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._conn.cursor().executemany("DELETE FROM aliases WHERE key_id = %s AND norm = %s", pairs)

    def count_alias_hits(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._conn.cursor().executemany(
            "UPDATE aliases SET hits = hits + 1 WHERE key_id = %s AND norm = %s AND learned = 1", pairs)

    def see_alias_candidate(self, key_id: str, norm: str, text: str, now: float) -> int:
        return int(self._value(
            "INSERT INTO alias_candidates AS c (key_id, norm, query_text, count, last_seen) "
            "VALUES (%s, %s, %s, 1, %s) ON CONFLICT (key_id, norm) DO UPDATE SET count = c.count + 1, "
            "last_seen = excluded.last_seen, query_text = excluded.query_text RETURNING count",
            (key_id, norm, text, now)))

    def drop_alias_candidate(self, key_id: str, norm: str) -> None:
        self._conn.execute("DELETE FROM alias_candidates WHERE key_id = %s AND norm = %s", (key_id, norm))

    def unsee_alias_candidate(self, key_id: str, norm: str) -> str | None:
        rows = self._rows("SELECT count, query_text FROM alias_candidates WHERE key_id = %s AND norm = %s "
                          "FOR UPDATE", (key_id, norm))
        if not rows:
            return None
        if rows[0][0] <= 1:
            self.drop_alias_candidate(key_id, norm)
        else:
            self._conn.execute("UPDATE alias_candidates SET count = count - 1 WHERE key_id = %s AND norm = %s",
                               (key_id, norm))
        return str(rows[0][1])

    def prune_alias_candidates(self, cutoff: float) -> int:
        return affected(self._conn, self._pipeline, "DELETE FROM alias_candidates WHERE last_seen <= %s", (cutoff,))

    def link(self, key_id: str, memory_id: str, weight: float, auto: bool) -> bool:
        return affected(
            self._conn, self._pipeline, "INSERT INTO links(key_id, memory_id, weight, auto) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING", (key_id, memory_id, weight, int(auto))) > 0

    def link_all(self, key_ids: Sequence[str], memory_id: str, weight: float, auto: bool) -> list[str]:
        # One statement for a remember's keys, not one round trip each.
        return [r[0] for r in self._rows(
            "INSERT INTO links(key_id, memory_id, weight, auto) SELECT k, %s, %s, %s FROM unnest(%s::text[]) k "
            "ON CONFLICT DO NOTHING RETURNING key_id", (memory_id, weight, int(auto), list(dict.fromkeys(key_ids))))]

    def add_links(self, links: Sequence[tuple[str, str, float, bool]]) -> None:
        # One statement whose result is not read: it goes out with the unit's next one.
        if links:
            self._conn.execute(
                "INSERT INTO links(key_id, memory_id, weight, auto) SELECT * FROM unnest(%s::text[], %s::text[], "
                "%s::float8[], %s::int[]) ON CONFLICT DO NOTHING",
                ([k for k, _, _, _ in links], [m for _, m, _, _ in links], [float(w) for _, _, w, _ in links],
                 [int(a) for _, _, _, a in links]))

    def set_link_weight(self, key_id: str, memory_id: str, weight: float) -> None:
        self._conn.execute("UPDATE links SET weight = %s WHERE key_id = %s AND memory_id = %s",
                           (weight, key_id, memory_id))
