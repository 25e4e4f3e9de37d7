"""The FTS5 lexical index (``memory_fts``, ``memory_vocab``) and the reads retrieval and the
push path make.

``LexicalRows``: the index rows the writes keep in step with the memories (and the two reads
they make of it); ``Vocabulary``: each term's document frequency, kept between the writes that
change the index. ``SearchRows``: BM25 search, key members, links by memory, date windows and
relations as retrieval reads them; ``SearchWriteRows``: the reinforcement a recall writes.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Final

from keymem_daemon.store.sqlite.keys import holding
from keymem_daemon.store.sqlite.memories import ACTIVE
from keymem_daemon.store.sqlite.rows import rows_in

logger = logging.getLogger(__name__)

# FTS5 bm25() weights for (content_tokens, key_tokens).
LEXICAL_WEIGHTS: Final = (1.0, 0.6)
# The index alone is asked for this many times the wanted hits before they are filtered to
# active memories in scope (most matches are active; a small namespace falls back to a join).
LEXICAL_OVERFETCH: Final = 4
_BM25: Final = f"bm25(memory_fts, {LEXICAL_WEIGHTS[0]}, {LEXICAL_WEIGHTS[1]})"

# The vocabulary is kept in memory up to this many terms (about 100 bytes each in a dict); a
# larger one is asked for the wanted terms each time, as before.
VOCABULARY_TERMS: Final = 200_000

Scope = frozenset[str] | None


def fts_query(tokens: Iterable[str]) -> str | None:
    """An FTS5 MATCH expression that ORs the distinct tokens, each quoted."""
    quoted = ['"' + t.replace('"', '""') + '"' for t in dict.fromkeys(tokens) if t]
    return " OR ".join(quoted) if quoted else None


def scope_clause(scope: Scope) -> tuple[str, list[Any]]:
    """The ``AND m.namespace IN (...)`` of a scope (nothing for every namespace)."""
    if scope is None:
        return "", []
    marks = ",".join("?" * len(scope))
    return f" AND m.namespace IN ({marks})", sorted(scope)


class Vocabulary:
    """Each term's document frequency in the lexical index (``memory_vocab``), read whole and
    kept in memory until a write changes the index.

    fts5vocab counts a term's documents by walking its doclist, and asked for an ``IN`` list
    of terms it walks every term's: at 10k memories about 7 ms a query on a quiet machine,
    and ``/v1/inject`` asks twice (the prompt's tokens, then its candidates' words). Reading
    the whole table costs the same one walk, after which every question is a dict lookup.

    Consistency: the store's one writer calls ``changing`` before a write transaction changes
    the index and ``settle`` once that transaction ended (committed or rolled back); both move
    ``generation`` and drop the table. A reader notes ``generation`` before its snapshot begins
    and uses or keeps a table only while the generation is still the one it noted and no
    change is under way, so what it keeps was read after the last change that ended, and a
    memory written or forgotten counts from the next read on.
    """

    def __init__(self, *, capacity: int = VOCABULARY_TERMS) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._generation = 0
        self._writing = False
        self._terms: dict[str, int] | None = None

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def held(self) -> int:
        """How many terms are kept now (0 when nothing is)."""
        terms = self._terms
        return 0 if terms is None else len(terms)

    def changing(self) -> None:
        """A write transaction is about to change the index (called on the writer thread)."""
        if self._writing:
            return
        with self._lock:
            self._writing = True
            self._generation += 1
            self._terms = None

    def settle(self) -> None:
        """The write transaction ended: what it changed (if anything) is committed or gone."""
        if not self._writing:
            return
        with self._lock:
            self._writing = False
            self._generation += 1
            self._terms = None

    def frequencies(self, conn: sqlite3.Connection, seen: int, tokens: Sequence[str]) -> dict[str, int]:
        """The document frequency of each of ``tokens`` the index holds, in the snapshot of
        ``conn`` that began after the generation was ``seen``."""
        with self._lock:
            terms = self._terms if seen == self._generation and not self._writing else None
        if terms is None:
            terms = {r[0]: int(r[1]) for r in conn.execute("SELECT term, doc FROM memory_vocab")}
            with self._lock:
                if seen == self._generation and not self._writing and len(terms) <= self.capacity:
                    self._terms = terms
        return {t: terms[t] for t in dict.fromkeys(tokens) if t in terms}


class LexicalRows:
    """The lexical-index operations of the writes (a mixin of ``session.SqliteReader``)."""

    _conn: sqlite3.Connection
    _vocabulary: Vocabulary | None
    _vocabulary_seen: int | None
    """The vocabulary's generation noted before this snapshot began; None: not to be used
    (a write transaction, which may have changed the index itself)."""

    def _index_changing(self) -> None:
        if self._vocabulary is not None:
            self._vocabulary.changing()

    def index_memory(self, memory_id: str, content_tokens: str, key_tokens: str) -> None:
        self._index_changing()
        (rowid,) = self._conn.execute("SELECT rowid FROM memories WHERE id = ?", (memory_id,)).fetchone()
        self._conn.execute("DELETE FROM memory_fts WHERE rowid = ?", (rowid,))
        self._conn.execute("INSERT INTO memory_fts(rowid, content_tokens, key_tokens) VALUES (?, ?, ?)",
                           (rowid, content_tokens, key_tokens))

    def set_key_tokens(self, memory_id: str, key_tokens: str) -> None:
        self._index_changing()
        self._conn.execute("UPDATE memory_fts SET key_tokens = ? WHERE rowid = "
                           "(SELECT rowid FROM memories WHERE id = ?)", (key_tokens, memory_id))

    def unindex(self, rowid: int) -> None:
        self._index_changing()
        self._conn.execute("DELETE FROM memory_fts WHERE rowid = ?", (rowid,))

    def indexed_holding(self, forms: Sequence[str]) -> set[str]:
        return {r[0] for r in self._conn.execute(
            f"SELECT m.id FROM memories m JOIN memory_fts f ON f.rowid = m.rowid WHERE {holding('m.content', forms)}",
            forms)}

    def document_frequencies(self, tokens: Sequence[str]) -> dict[str, int]:
        if self._vocabulary is not None and self._vocabulary_seen is not None:
            return self._vocabulary.frequencies(self._conn, self._vocabulary_seen, tokens)
        return {r[0]: int(r[1]) for r in rows_in(
            self._conn, "SELECT term, doc FROM memory_vocab WHERE term IN ({marks})", list(tokens))}


def _active_in_scope(conn: sqlite3.Connection, ranked: Sequence[tuple[int, float]], scope: Scope, now: float
                     ) -> list[tuple[str, float]]:
    """The (memory id, score >= 0) of the ranked (rowid, bm25) rows whose memories are active
    and in scope, in their order."""
    marks = ",".join("?" * len(ranked))
    rows = {r[0]: r for r in conn.execute(
        f"SELECT rowid, id, namespace, expires_at, superseded_by FROM memories WHERE rowid IN ({marks})",
        [r[0] for r in ranked])}
    out = []
    for rowid, score in ranked:
        row = rows.get(rowid)
        if row is None or row[4] is not None or (row[3] is not None and now > row[3]) \
                or (scope is not None and row[2] not in scope):
            continue
        out.append((row[1], -float(score)))
    return out


class SearchRows:
    """Retrieval's and the push path's reads (a mixin of session.SqliteReader)."""

    _conn: sqlite3.Connection

    def lexical_hits(self, tokens: Sequence[str], scope: Scope, now: float, limit: int
                     ) -> list[tuple[str, float]]:
        """BM25 over content and key tokens: (memory id, score >= 0) of active memories in
        scope, best first; [] for no tokens (or an index the query cannot be run on)."""
        conn = self._conn
        match = fts_query(tokens)
        if match is None:
            return []
        fetch = LEXICAL_OVERFETCH * limit
        try:
            # The index alone first: joining every match to ``memories`` before the LIMIT costs
            # about three times as much on a large store.
            ranked = conn.execute(f"SELECT rowid, {_BM25} AS s FROM memory_fts WHERE memory_fts MATCH ? "
                                  f"ORDER BY s LIMIT ?", (match, fetch)).fetchall()
            out: list[tuple[str, float]] = []
            # The best ``limit`` rows' memories first, the rest only when those fall short: most
            # are active and in scope, and reading all ``fetch`` rows' memories was a fifth of
            # the search (bench_hook's prompts at 10k memories: 1.85 -> 1.47 ms CPU per search).
            start = 0
            while start < len(ranked) and len(out) < limit:
                part = ranked[start:start + limit] if start == 0 else ranked[start:]
                start += len(part)
                out += _active_in_scope(conn, part, scope, now)
            if len(out) >= limit or len(ranked) < fetch:
                return out[:limit]
            # Most matches lie outside the scope (a small namespace): let SQLite filter them.
            where, params = scope_clause(scope)
            rows_scoped = conn.execute(
                f"SELECT m.id, {_BM25} AS s FROM memory_fts JOIN memories m ON m.rowid = memory_fts.rowid "
                f"WHERE memory_fts MATCH ? AND {ACTIVE}{where} ORDER BY s LIMIT ?",
                [match, now, *params, limit]).fetchall()
        except sqlite3.OperationalError as exc:
            logger.warning("lexical search skipped: %s", exc)
            return []
        return [(r[0], -float(r[1])) for r in rows_scoped]

    def indexed_tokens(self, memory_ids: Iterable[str]) -> dict[str, tuple[list[str], list[str]]]:
        """The lexical index's content and key tokens of each indexed memory, by id."""
        return {mid: ((content or "").split(), (keys or "").split()) for mid, content, keys in rows_in(
            self._conn, "SELECT m.id, f.content_tokens, f.key_tokens FROM memories m "
                        "JOIN memory_fts f ON f.rowid = m.rowid WHERE m.id IN ({marks})",
            list(dict.fromkeys(memory_ids)))}

    def key_members(self, key_ids: Sequence[str], scope: Scope, now: float, per_key: int
                    ) -> dict[str, list[tuple[str, float]]]:
        """Active members of each key in scope, strongest link first: key -> [(memory id, weight)]."""
        where, params = scope_clause(scope)
        out: dict[str, list[tuple[str, float]]] = {}
        for kid in key_ids:
            rows = self._conn.execute(
                f"SELECT l.memory_id, l.weight FROM links l JOIN memories m ON m.id = l.memory_id "
                f"WHERE l.key_id = ? AND {ACTIVE}{where} ORDER BY l.weight DESC LIMIT ?",
                [kid, now, *params, per_key]).fetchall()
            out[kid] = [(r[0], float(r[1])) for r in rows]
        return out

    def key_links(self, key_id: str, *, among: Sequence[str] | None = None, strongest: int | None = None
                  ) -> list[tuple[str, float]]:
        """A key's links, active or not, as (memory id, weight): to the memories ``among``, then
        its ``strongest`` few (strongest first); with neither, all of them."""
        rows: list[Any] = []
        if among:
            marks = ",".join("?" * len(among))
            rows += self._conn.execute(
                f"SELECT memory_id, weight FROM links WHERE key_id = ? AND memory_id IN ({marks})",
                [key_id, *among]).fetchall()
        if strongest is not None:
            rows += self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = ? ORDER BY weight DESC "
                                       "LIMIT ?", (key_id, strongest)).fetchall()
        if among is None and strongest is None:
            rows = self._conn.execute("SELECT memory_id, weight FROM links WHERE key_id = ?", (key_id,)).fetchall()
        return [(r[0], float(r[1])) for r in rows]

    def links_by_memory(self, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
        """Each memory's links: memory -> {key id: (weight, auto)}."""
        out: dict[str, dict[str, tuple[float, bool]]] = {}
        for mid, kid, weight, auto in rows_in(self._conn, "SELECT memory_id, key_id, weight, auto FROM links "
                                                          "WHERE memory_id IN ({marks})",
                                              list(dict.fromkeys(memory_ids))):
            out.setdefault(mid, {})[kid] = (float(weight), bool(auto))
        return out

    def observed_between(self, start: float, end: float, scope: Scope, now: float, limit: int) -> list[str]:
        """Active memories in scope observed in [start, end), latest first."""
        where, params = scope_clause(scope)
        rows = self._conn.execute(
            f"SELECT m.id FROM memories m WHERE COALESCE(m.observed_at, m.created_at) >= ? AND "
            f"COALESCE(m.observed_at, m.created_at) < ? AND {ACTIVE}{where} "
            f"ORDER BY COALESCE(m.observed_at, m.created_at) DESC LIMIT {int(limit)}",
            [start, end, now, *params]).fetchall()
        return [r[0] for r in rows]

    def related_either_way(self, memory_id: str) -> list[str]:
        """Memories an explicit relation joins to this one, in either direction, each once."""
        return [r[0] for r in self._conn.execute(
            "SELECT to_id FROM relations WHERE from_id = ? UNION SELECT from_id FROM relations WHERE to_id = ?",
            (memory_id, memory_id))]


class SearchWriteRows:
    """The reinforcement a recall writes (a mixin of session.SqliteWriter)."""

    _conn: sqlite3.Connection

    def mark_accessed(self, memory_ids: Iterable[str], now: float) -> None:
        """Count one more access of each memory, at ``now``."""
        self._conn.executemany("UPDATE memories SET access_count = access_count + 1, last_accessed = ? WHERE id = ?",
                               [(now, mid) for mid in memory_ids])

    def bump_links(self, bumps: Sequence[tuple[float, str, str]], *, ceiling: float) -> None:
        """Raise each (amount, key id, memory id) link's weight by amount, up to ``ceiling``."""
        self._conn.executemany(
            f"UPDATE links SET weight = MIN({float(ceiling)}, weight + ?) WHERE key_id = ? AND memory_id = ?", bumps)

    def decay_links(self, key_ids: Iterable[str], sparing: Iterable[str], by: float, *, floor: float) -> None:
        """Lower by ``by`` (down to ``floor``) the weight of the keys' links to every memory
        not in ``sparing``."""
        keys, spared = list(key_ids), list(sparing)
        if not keys:
            return
        self._conn.execute(
            f"UPDATE links SET weight = MAX({float(floor)}, weight - ?) WHERE key_id IN ({','.join('?' * len(keys))}) "
            f"AND memory_id NOT IN ({','.join('?' * len(spared))})", [by, *keys, *spared])
