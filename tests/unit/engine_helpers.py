"""Helpers for the engine behaviour tests: a settable clock, opening a store, calling the
tools as the daemon does, and reading the store back (its rows, links and whole state).
The fixtures built from them are in ``conftest.py``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.records import render
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.inference.embedders import Embedder
from keymem_daemon.mcp.tools import Context, Outcome, call_tool
from keymem_daemon.store.opening import open_sqlite
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


def open_graph(
    path: Path,
    embedder: Embedder,
    settings: Settings,
    clock: FakeClock,
    analyzer: Analyzer | None = None,
) -> MemoryGraph:
    return MemoryGraph.over(open_sqlite(settings, path), embedder, settings, clock=clock, analyzer=analyzer)


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


def db_read(store: Store, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn`` on a connection of the test's own to the store's file: the store's readers
    offer domain operations only, and a test looks at the rows themselves."""
    conn = sqlite3.connect(store.path)
    conn.row_factory = sqlite3.Row
    try:
        return fn(conn)
    finally:
        conn.close()


def db_write(store: Store, fn: Callable[[sqlite3.Connection], object]) -> None:
    """``fn`` in one transaction on a connection of the test's own: rows changed under the
    engine, as an older keymem or a damaged file leaves them."""
    conn = sqlite3.connect(store.path)
    try:
        with conn:
            fn(conn)
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
