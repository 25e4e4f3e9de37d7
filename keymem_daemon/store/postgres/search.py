"""Retrieval's and the push path's reads on PostgreSQL, and the reinforcement a recall writes:
``engine.ports.SearchReads``/``SearchWrites`` as ``store/sqlite/search.py`` does them.

Lexical search scores as SQLite FTS5's ``bm25()`` does (k1 1.2, b 0.75, the same column
weights, IDF floored at 1e-6), over the same stored tokens: the GIN index on the tsvector
finds the candidates, and the score counts each query token in each column's token list.
Document count and average length are taken over the index rows the role can see (FTS5:
the whole index; the same when every namespace is granted). They are aggregated per query,
which costs a scan of ``memory_fts``: a maintained statistics row is the next step for a
100k store."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import psycopg

from keymem_daemon.store.postgres.memories import ACTIVE
from keymem_daemon.store.sqlite.search import LEXICAL_WEIGHTS, Scope

_K1: Final = 1.2  # FTS5's bm25 constants
_B: Final = 0.75
_MIN_IDF: Final = 1e-6
# One token as a tsquery lexeme, quoted as keymem_tsvector quotes it (schema.py).
_LEXEME: Final = "('''' || replace(replace({t}, '\\', '\\\\'), '''', '''''') || '''')::tsquery"
_TOKENS: Final = "array_remove(string_to_array({col}, ' '), '')"


def _scope(scope: Scope) -> tuple[str, list[Any]]:
    if scope is None:
        return "", []
    return " AND m.namespace = ANY(%s)", [sorted(scope)]


class PgSearchRows:
    """Retrieval's and the push path's reads."""

    _conn: psycopg.Connection[Any]

    def lexical_hits(self, tokens: Sequence[str], scope: Scope, now: float, limit: int
                     ) -> list[tuple[str, float]]:
        terms = [t for t in dict.fromkeys(tokens) if t]
        if not terms:
            return []
        where, params = _scope(scope)
        content, keys = _TOKENS.format(col="f.content_tokens"), _TOKENS.format(col="f.key_tokens")
        sql = f"""
            WITH q AS (SELECT t FROM unnest(%s::text[]) t),
            stats AS (SELECT count(*)::float8 AS n,
                             avg(cardinality({_TOKENS.format(col='content_tokens')})
                                 + cardinality({_TOKENS.format(col='key_tokens')}))::float8 AS avgdl
                      FROM memory_fts),
            idf AS (SELECT q.t, GREATEST({_MIN_IDF}, ln((s.n - d.hits + 0.5) / (d.hits + 0.5))) AS idf
                    FROM q, stats s, LATERAL (SELECT count(*)::float8 AS hits FROM memory_fts
                                              WHERE lexemes @@ {_LEXEME.format(t='q.t')}) d),
            docs AS (SELECT f.memory_id, {content} AS c, {keys} AS k FROM memory_fts f
                     WHERE f.lexemes @@ (SELECT string_agg({_LEXEME.format(t='t')}::text, ' | ')::tsquery FROM q))
            SELECT d.memory_id, sum(i.idf * (w.w * ({_K1} + 1))
                       / (w.w + {_K1} * (1 - {_B} + {_B} * (cardinality(d.c) + cardinality(d.k)) / s.avgdl))) AS score
            FROM docs d JOIN memories m ON m.id = d.memory_id CROSS JOIN stats s CROSS JOIN idf i,
                 LATERAL (SELECT {LEXICAL_WEIGHTS[0]} * (SELECT count(*) FROM unnest(d.c) x WHERE x = i.t)
                               + {LEXICAL_WEIGHTS[1]} * (SELECT count(*) FROM unnest(d.k) x WHERE x = i.t) AS w) w
            WHERE w.w > 0 AND {ACTIVE}{where}
            GROUP BY d.memory_id ORDER BY score DESC, d.memory_id LIMIT %s"""
        rows = self._conn.execute(sql.encode(), [terms, now, *params, limit]).fetchall()
        return [(r[0], float(r[1])) for r in rows]

    def indexed_tokens(self, memory_ids: Iterable[str]) -> dict[str, tuple[list[str], list[str]]]:
        return {mid: ((content or "").split(), (keys or "").split()) for mid, content, keys in self._conn.execute(
            "SELECT memory_id, content_tokens, key_tokens FROM memory_fts WHERE memory_id = ANY(%s)",
            (list(dict.fromkeys(memory_ids)),))}

    def key_members(self, key_ids: Sequence[str], scope: Scope, now: float, per_key: int
                    ) -> dict[str, list[tuple[str, float]]]:
        where, params = _scope(scope)
        out: dict[str, list[tuple[str, float]]] = {}
        for kid in key_ids:
            out[kid] = [(r[0], float(r[1])) for r in self._conn.execute(
                f"SELECT l.memory_id, l.weight FROM links l JOIN memories m ON m.id = l.memory_id "
                f"WHERE l.key_id = %s AND {ACTIVE}{where} ORDER BY l.weight DESC, l.memory_id LIMIT %s".encode(),
                [kid, now, *params, per_key])]
        return out

    def key_links(self, key_id: str, *, among: Sequence[str] | None = None, strongest: int | None = None
                  ) -> list[tuple[str, float]]:
        if among is not None:
            if not among:
                return []
            rows = self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = %s AND memory_id = ANY(%s) "
                                      "ORDER BY memory_id", (key_id, list(among)))
        elif strongest is not None:
            rows = self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = %s "
                                      "ORDER BY weight DESC, memory_id LIMIT %s", (key_id, strongest))
        else:
            rows = self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = %s ORDER BY memory_id",
                                      (key_id,))
        return [(r[0], float(r[1])) for r in rows]

    def links_by_memory(self, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
        out: dict[str, dict[str, tuple[float, bool]]] = {}
        for mid, kid, weight, auto in self._conn.execute(
                "SELECT memory_id, key_id, weight, auto FROM links WHERE memory_id = ANY(%s) "
                "ORDER BY memory_id, key_id", (list(dict.fromkeys(memory_ids)),)):
            out.setdefault(mid, {})[kid] = (float(weight), bool(auto))
        return out

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
