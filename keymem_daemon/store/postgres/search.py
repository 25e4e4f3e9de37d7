"""Retrieval's and the push path's reads on PostgreSQL, and the reinforcement a recall writes:
``engine.ports.SearchReads``/``SearchWrites`` as ``store/sqlite/search.py`` does them.

Lexical search scores as SQLite FTS5's ``bm25()`` does (k1 1.2, b 0.75, the same column
weights, IDF floored at 1e-6), over the same stored tokens: the GIN index on the tsvector
finds the candidates, and the score counts each query token in each column's token list.
Document count and average length are taken over the index rows the role can see (FTS5:
the whole index; the same when every namespace is granted). Counting them scans
``memory_fts``, so each repository keeps them (``LexicalStatistics``): renewed after each of
its own writes that changed the index, and at most ``STATISTICS_MAX_AGE`` old otherwise."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import psycopg

from keymem_daemon.store.postgres.memories import ACTIVE
from keymem_daemon.store.sqlite.search import LEXICAL_OVERFETCH, LEXICAL_WEIGHTS, Scope

_K1: Final = 1.2  # FTS5's bm25 constants
_B: Final = 0.75
_MIN_IDF: Final = 1e-6
# One token as a tsquery lexeme, quoted as keymem_tsvector quotes it (schema.py).
_LEXEME: Final = "('''' || replace(replace({t}, '\\', '\\\\'), '''', '''''') || '''')::tsquery"
STATISTICS_MAX_AGE: Final = 5.0
"""Seconds the index-wide BM25 statistics are reused before they are counted again: how late
another daemon's writes shift this daemon's lexical scores (its own writes renew them at once).
Counting them reads every index row the role can see (~tens of ms at 100k memories)."""


class LexicalStatistics:
    """The document count and average document length of the index rows a repository's role
    can see, counted once and reused by its reads (thread-safe). ``renew()`` after COMMIT of a
    write that changed the index; a read unit notes the ``generation`` before its snapshot."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counted: tuple[float, float] | None = None
        self._at = 0.0
        self.generation = 0

    def renew(self) -> None:
        with self._lock:
            self._counted = None
            self.generation += 1

    def statistics(self, conn: psycopg.Connection[Any], *, since: int) -> tuple[float, float]:
        """(documents, average document length), reused or counted in ``conn``'s snapshot,
        which its unit took at generation ``since``."""
        with self._lock:
            if self._counted is not None and self._clock() - self._at < STATISTICS_MAX_AGE:
                return self._counted
        row = conn.execute("SELECT count(*)::float8, COALESCE(avg(doc_len), 0)::float8 FROM memory_fts").fetchone()
        counted = (float(row[0]), float(row[1])) if row else (0.0, 0.0)  # an aggregate always has its row
        with self._lock:
            # Counted in a snapshot older than a renewal: right for this read, not for later ones.
            # An empty index is not kept: its zero average would divide the first rows another
            # daemon adds (and counting no rows costs nothing).
            if since == self.generation and counted[0] > 0:
                self._counted, self._at = counted, self._clock()
        return counted


def _ranked(keep: str, join: str) -> str:
    """BM25 of the index rows matching any query token (``join``: only those it admits),
    best first, each with whether ``keep`` holds for its memory. Each matching row's token
    lists are split once (``docs``); a token's frequency in a column is then the number of its
    positions in the list. Parameters: tokens, document count, [join's], average length,
    limit, [keep's]."""
    return f"""
        WITH q AS (SELECT t FROM unnest(%s::text[]) t),
        -- A count reused from before another daemon's writes can be below a token's hits now.
        idf AS MATERIALIZED (
            SELECT q.t, GREATEST({_MIN_IDF}, ln((GREATEST(%s, d.hits) - d.hits + 0.5) / (d.hits + 0.5))) AS idf
                FROM q, LATERAL (SELECT count(*)::float8 AS hits FROM memory_fts
                                 WHERE lexemes @@ {_LEXEME.format(t='q.t')}) d),
        docs AS MATERIALIZED (
            SELECT f.memory_id, f.doc_len, string_to_array(f.content_tokens, ' ') AS c,
                   string_to_array(f.key_tokens, ' ') AS k
            FROM memory_fts f {join}
            WHERE f.lexemes @@ (SELECT string_agg({_LEXEME.format(t='t')}::text, ' | ')::tsquery FROM q)),
        ranked AS MATERIALIZED (
            -- ``{_B}::float8``: a bare {_B} times the integer length is numeric arithmetic, a
            -- sixth of the statement's time; the product is exact either way (so are the scores).
            SELECT x.memory_id, sum(x.idf * (x.w * ({_K1} + 1))
                                    / (x.w + {_K1} * (1 - {_B} + {_B}::float8 * x.doc_len / %s::float8))) AS score
            FROM (SELECT d.memory_id, d.doc_len, i.idf,
                         {LEXICAL_WEIGHTS[0]}::float8 * cardinality(array_positions(d.c, i.t))
                         + {LEXICAL_WEIGHTS[1]}::float8 * cardinality(array_positions(d.k, i.t)) AS w
                  -- OFFSET 0: the planner would push ``w > 0`` into the join filter and
                  -- count each (row, token)'s positions twice (at 10k memories, a quarter of its time).
                  FROM docs d CROSS JOIN idf i OFFSET 0) x
            WHERE x.w > 0
            GROUP BY x.memory_id ORDER BY score DESC, x.memory_id LIMIT %s)
        SELECT r.memory_id, r.score, {keep} FROM ranked r JOIN memories m ON m.id = r.memory_id
        ORDER BY r.score DESC, r.memory_id"""


def _scope(scope: Scope) -> tuple[str, list[Any]]:
    if scope is None:
        return "", []
    return " AND m.namespace = ANY(%s)", [sorted(scope)]


INDEXED_TOKENS: Final = b"SELECT memory_id, content_tokens, key_tokens FROM memory_fts WHERE memory_id = ANY(%s)"
LINKS_BY_MEMORY: Final = (b"SELECT memory_id, key_id, weight, auto FROM links WHERE memory_id = ANY(%s) "
                          b"ORDER BY memory_id, key_id")


def tokens_of_rows(rows: Iterable[tuple[Any, ...]]) -> dict[str, tuple[list[str], list[str]]]:
    """``indexed_tokens``' answer from the rows of ``INDEXED_TOKENS``."""
    return {mid: ((content or "").split(), (keys or "").split()) for mid, content, keys in rows}


def links_of_rows(rows: Iterable[tuple[Any, ...]]) -> dict[str, dict[str, tuple[float, bool]]]:
    """``links_by_memory``'s answer from the rows of ``LINKS_BY_MEMORY``, in their order."""
    out: dict[str, dict[str, tuple[float, bool]]] = {}
    for mid, kid, weight, auto in rows:
        out.setdefault(mid, {})[kid] = (float(weight), bool(auto))
    return out


class PgSearchRows:
    """Retrieval's and the push path's reads."""

    _conn: psycopg.Connection[Any]
    _lexicon: LexicalStatistics
    _generation: int

    def lexical_hits(self, tokens: Sequence[str], scope: Scope, now: float, limit: int
                     ) -> list[tuple[str, float]]:
        terms = [t for t in dict.fromkeys(tokens) if t]
        if not terms:
            return []
        where, params = _scope(scope)
        documents, avgdl = self._lexicon.statistics(self._conn, since=self._generation)
        fetch = LEXICAL_OVERFETCH * limit
        # The index alone first, as on SQLite: joining every match to ``memories`` before
        # the LIMIT costs several times as much on a large store.
        rows = self._conn.execute(_ranked(f"{ACTIVE}{where}", "").encode(),
                                  [terms, documents, avgdl, fetch, now, *params]).fetchall()
        out = [(r[0], float(r[1])) for r in rows if r[2]]
        if len(out) >= limit or len(rows) < fetch:
            return out[:limit]
        # Most matches are inactive or outside the scope (a small namespace): filter them first.
        join = f"JOIN memories m ON m.id = f.memory_id AND {ACTIVE}{where}"
        rows = self._conn.execute(_ranked("true", join).encode(),
                                  [terms, documents, now, *params, avgdl, limit]).fetchall()
        return [(r[0], float(r[1])) for r in rows]

    def indexed_tokens(self, memory_ids: Iterable[str]) -> dict[str, tuple[list[str], list[str]]]:
        return tokens_of_rows(self._conn.execute(INDEXED_TOKENS, (list(dict.fromkeys(memory_ids)),)))

    def key_members(self, key_ids: Sequence[str], scope: Scope, now: float, per_key: int
                    ) -> dict[str, list[tuple[str, float]]]:
        where, params = _scope(scope)
        out: dict[str, list[tuple[str, float]]] = {}
        sql = (f"SELECT l.memory_id, l.weight FROM links l JOIN memories m ON m.id = l.memory_id "
               f"WHERE l.key_id = %s AND {ACTIVE}{where} ORDER BY l.weight DESC, l.memory_id LIMIT %s").encode()
        # Every key's statement sent before the first answer is read: one round trip for all.
        asked = [(kid, self._conn.execute(sql, [kid, now, *params, per_key])) for kid in key_ids]
        for kid, rows in asked:
            out[kid] = [(r[0], float(r[1])) for r in rows]
        return out

    def key_links(self, key_id: str, *, among: Sequence[str] | None = None, strongest: int | None = None
                  ) -> list[tuple[str, float]]:
        asked: list[psycopg.Cursor[Any]] = []
        if among:
            asked.append(self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = %s "
                                            "AND memory_id = ANY(%s) ORDER BY memory_id", (key_id, list(among))))
        if strongest is not None:
            asked.append(self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = %s "
                                            "ORDER BY weight DESC, memory_id LIMIT %s", (key_id, strongest)))
        if among is None and strongest is None:
            asked.append(self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = %s "
                                            "ORDER BY memory_id", (key_id,)))
        # Both statements sent before the first answer is read: one round trip.
        return [(r[0], float(r[1])) for rows in asked for r in rows]

    def links_by_memory(self, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
        return links_of_rows(self._conn.execute(LINKS_BY_MEMORY, (list(dict.fromkeys(memory_ids)),)))

    def observed_between(self, start: float, end: float, scope: Scope, now: float, limit: int) -> list[str]:
        where, params = _scope(scope)
        return [r[0] for r in self._conn.execute(
            f"SELECT m.id FROM memories m WHERE COALESCE(m.observed_at, m.created_at) >= %s AND "
            f"COALESCE(m.observed_at, m.created_at) < %s AND {ACTIVE}{where} "
            f"ORDER BY COALESCE(m.observed_at, m.created_at) DESC LIMIT %s".encode(),
            [start, end, now, *params, limit])]

    def related_either_way(self, memory_id: str) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT to_id FROM relations WHERE from_id = %s UNION SELECT from_id FROM relations WHERE to_id = %s "
            "ORDER BY 1", (memory_id, memory_id))]


class PgSearchWriteRows:
    """The reinforcement a recall writes: increments in the database, never read-modify-write,
    so two daemons reinforcing one link at once both count."""

    _conn: psycopg.Connection[Any]

    def mark_accessed(self, memory_ids: Iterable[str], now: float) -> None:
        self._conn.execute("UPDATE memories SET access_count = access_count + 1, last_accessed = %s "
                           "WHERE id = ANY(%s)", (now, list(memory_ids)))

    def bump_links(self, bumps: Sequence[tuple[float, str, str]], *, ceiling: float) -> None:
        self._conn.cursor().executemany(
            "UPDATE links SET weight = LEAST(%s, weight + %s) WHERE key_id = %s AND memory_id = %s",
            [(float(ceiling), amount, kid, mid) for amount, kid, mid in bumps])

    def decay_links(self, key_ids: Iterable[str], sparing: Iterable[str], by: float, *, floor: float) -> None:
        keys = list(key_ids)
        if not keys:
            return
        self._conn.execute("UPDATE links SET weight = GREATEST(%s, weight - %s) WHERE key_id = ANY(%s) "
                           "AND NOT (memory_id = ANY(%s))", (float(floor), by, keys, list(sparing)))
