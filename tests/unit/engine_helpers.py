"""Helpers for the engine behaviour tests: a settable clock, opening a store, calling the
tools as the daemon does, and reading the store back (its rows, links and whole state).
The fixtures built from them are in ``conftest.py``.

Every engine test runs on both backends (``conftest.py``'s ``backend``): a store is named by
where it lives, ``StoreAt`` -- a SQLite file's path or a PostgreSQL database's URL -- and
``open_graph`` is the one place that turns that into an engine. ``db_read``/``db_write`` give
a test a connection of its own to either, with SQLite's ``?`` placeholders and rows readable
by index and by column name, so a test's SQL looks at the rows of both."""

from __future__ import annotations

import json
import sqlite3
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.ports import Repository
from keymem_daemon.engine.records import render
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.inference.embedders import Embedder
from keymem_daemon.mcp.tools import Context, Outcome, call_tool
from keymem_daemon.store.opening import open_postgres, open_sqlite
from keymem_daemon.store.sqlite.database import Store

T = TypeVar("T")

DAY = 86400.0
# 2023-11-14T22:13:20Z: a fixed "now" so date windows and ages are reproducible.
START = 1_700_000_000.0


class FakeClock:
    """A mutable clock: ``clock()`` is the current time; tests move it with ``advance``."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def set(self, when: float) -> float:
        self.now = when
        return self.now


StoreAt = Path | str
"""Where a store lives: a SQLite file's path, or a PostgreSQL database's ``postgresql://`` URL."""

# The URL each PostgreSQL store a test opened was opened with: ``db_read`` connects there.
_PG_URLS: weakref.WeakKeyDictionary[Repository, str] = weakref.WeakKeyDictionary()


def open_graph(
    where: StoreAt,
    embedder: Embedder,
    settings: Settings,
    clock: FakeClock,
    analyzer: Analyzer | None = None,
    **options: Any,
) -> MemoryGraph:
    """The engine over the store at ``where`` (``MemoryGraph.over``'s keyword ``options``)."""
    if isinstance(where, Path):
        return MemoryGraph.over(open_sqlite(settings, where), embedder, settings, clock=clock, analyzer=analyzer,
                                **options)
    store = open_postgres(where)
    _PG_URLS[store] = where
    return MemoryGraph.over(store, embedder, settings, clock=clock, analyzer=analyzer, **options)


GraphFactory = Callable[..., MemoryGraph]


@dataclass
class Tools:
    """``call_tool`` bound to one graph, as the daemon's tool route runs it."""

    graph: MemoryGraph
    settings: Settings
    host: Host

    def __call__(self, name: str, arguments: Any = None, *, host: Host | None = None) -> Outcome:
        ctx = Context(self.graph, self.settings, host or self.host)
        return call_tool(ctx, name, arguments)

    def ok(self, name: str, arguments: Any = None, *, host: Host | None = None) -> Any:
        """Call a tool that must succeed; return its JSON result."""
        outcome = self(name, arguments, host=host)
        assert not outcome.is_error, f"{name} failed: {outcome.result}"
        assert not (isinstance(outcome.result, dict) and "error" in outcome.result), (
            f"{name} refused: {outcome.result}"
        )
        # The tool layer's answer must be JSON as the shim forwards it.
        return json.loads(json.dumps(outcome.result))


def remember(
    graph: MemoryGraph, content: str, keys: Any, *, host: Host | None = None, **fields: Any
) -> str:
    """Remember one memory through the engine API and return its id."""
    result = graph.remember(graph.prepare(content=content, keys=keys, **fields), host=host)
    saved: str = result.saved  # type: ignore[union-attr]
    return saved


def key_id(graph: MemoryGraph, concept: str) -> str:
    """The id of the key whose concept or alias is ``concept`` (exactly one must exist)."""
    from keymem_daemon.engine.text import normalize

    kid = graph.keys.by_norm(normalize(concept))
    assert kid is not None, f"no key {concept!r}; keys: {[k.concept for k in graph.keys.all()]}"
    return kid


class PgRow:
    """A PostgreSQL row as ``sqlite3.Row`` offers one: ``row[0]``, ``row["name"]``,
    ``tuple(row)`` and ``dict(row)``."""

    def __init__(self, names: Sequence[str], values: Sequence[Any]) -> None:
        self._names, self._values = list(names), tuple(values)

    def keys(self) -> list[str]:
        return self._names

    def __getitem__(self, item: int | str) -> Any:
        return self._values[item if isinstance(item, int) else self._names.index(item)]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class PgConnection:
    """A psycopg connection speaking the SQLite tests' SQL: ``?`` placeholders."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        def rows(cursor: Any) -> Callable[[Sequence[Any]], PgRow]:
            names = [column.name for column in cursor.description or ()]
            return lambda values: PgRow(names, values)

        if params:  # psycopg reads % as its own placeholder only when given parameters
            sql = sql.replace("%", "%%").replace("?", "%s")
        return self._conn.cursor(row_factory=rows).execute(sql, list(params) or None)


def _connect(store: Repository) -> Any:
    """A connection of the test's own to ``store``: SQLite's file, or PostgreSQL's database."""
    if isinstance(store, Store):
        conn = sqlite3.connect(store.path)
        conn.row_factory = sqlite3.Row
        return conn
    import psycopg

    return psycopg.connect(_PG_URLS[store])


def db_read(store: Repository, fn: Callable[[Any], T]) -> T:
    """``fn`` on a connection of the test's own to the store: the store's readers offer
    domain operations only, and a test looks at the rows themselves."""
    conn = _connect(store)
    try:
        return fn(conn if isinstance(store, Store) else PgConnection(conn))
    finally:
        conn.close()


def db_write(store: Repository, fn: Callable[[Any], object]) -> None:
    """``fn`` in one transaction on a connection of the test's own: rows changed under the
    engine, as an older keymem or a damaged file leaves them."""
    conn = _connect(store)
    try:
        with conn:
            fn(conn if isinstance(store, Store) else PgConnection(conn))
    finally:
        conn.close()


def link_weight(graph: MemoryGraph, kid: str, mid: str) -> float | None:
    row = db_read(graph.store,
        lambda c: c.execute(
            "SELECT weight FROM links WHERE key_id = ? AND memory_id = ?", (kid, mid)
        ).fetchone()
    )
    return None if row is None else float(row[0])


def memory_row(graph: MemoryGraph, mid: str) -> dict[str, Any] | None:
    row = db_read(graph.store,
        lambda c: c.execute("SELECT * FROM memories WHERE id = ?", (mid,)).fetchone()
    )
    return None if row is None else dict(row)


def state(graph: MemoryGraph) -> dict[str, Any]:
    """Everything observable about the store: the lossless export and the stats."""
    return {"export": transfer.export(graph), "stats": render(graph.stats())}


def fts_rows(graph: MemoryGraph) -> int:
    return int(
        db_read(graph.store, lambda c: c.execute("SELECT COUNT(*) FROM memory_fts").fetchone()[0])
    )
