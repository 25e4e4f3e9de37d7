"""Shared fixtures for the engine behaviour tests (``tests/unit/test_engine_*.py``).

Every engine test runs against the real thing: a SQLite file under ``tmp_path``, the real
Kiwi analyser and the real default embedder (USE multilingual v3, behind ``CachedEmbedder``).
The embedder is built once per session because loading it costs about a second; the Kiwi
analyser is the process-wide ``default_analyzer()``. Time comes from a ``FakeClock`` the
tests advance, so freshness, TTL and alias pruning never wait on the wall clock.

Test modules import the fixtures they use from here (``from engine_fixtures import ...``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import Host, MemoryGraph
from keymem_daemon.engine.model import render
from keymem_daemon.engine.text import Analyzer, default_analyzer
from keymem_daemon.models.embedders import CachedEmbedder, Embedder, UseEmbedder
from keymem_daemon.tools import Context, Outcome, call_tool

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


@functools.cache
def shared_embedder() -> Embedder:
    """One embedder per process. Each test module imports the fixture below, and pytest
    keeps a separate session fixture per importing module, so the instance lives here."""
    return CachedEmbedder(UseEmbedder())


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real default embedder, loaded once for the whole session."""
    return shared_embedder()


@pytest.fixture(scope="session")
def analyzer() -> Analyzer:
    analyzer = default_analyzer()
    analyzer.preload_kiwi()
    return analyzer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


def open_graph(
    path: Path,
    embedder: Embedder,
    settings: Settings,
    clock: FakeClock,
    analyzer: Analyzer | None = None,
) -> MemoryGraph:
    return MemoryGraph.open(path, embedder, settings, clock=clock, analyzer=analyzer)


@pytest.fixture
def graph(
    tmp_path: Path, embedder: Embedder, analyzer: Analyzer, settings: Settings, clock: FakeClock
) -> Iterator[MemoryGraph]:
    g = open_graph(tmp_path / "keymem.db", embedder, settings, clock, analyzer)
    try:
        yield g
    finally:
        g.close()


GraphFactory = Callable[..., MemoryGraph]


@pytest.fixture
def graph_with(
    tmp_path: Path, embedder: Embedder, analyzer: Analyzer, clock: FakeClock
) -> Iterator[GraphFactory]:
    """``graph_with(hub_min_links=2)``: the ``graph`` fixture's store, opened with those
    settings changed; closed at teardown."""
    opened: list[MemoryGraph] = []

    def make(**overrides: Any) -> MemoryGraph:
        g = open_graph(tmp_path / "keymem.db", embedder, Settings(data_dir=tmp_path, **overrides), clock, analyzer)
        opened.append(g)
        return g

    yield make
    for g in opened:
        g.close()


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


@pytest.fixture
def full_settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, tools="full")


@pytest.fixture
def tools(graph: MemoryGraph, full_settings: Settings) -> Tools:
    """The full tool surface (the ten default tools and the extended ones)."""
    return Tools(graph, full_settings, Host())


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


def link_weight(graph: MemoryGraph, kid: str, mid: str) -> float | None:
    row = graph.store.read(
        lambda c: c.execute(
            "SELECT weight FROM links WHERE key_id = ? AND memory_id = ?", (kid, mid)
        ).fetchone()
    )
    return None if row is None else float(row[0])


def memory_row(graph: MemoryGraph, mid: str) -> dict[str, Any] | None:
    row = graph.store.read(
        lambda c: c.execute("SELECT * FROM memories WHERE id = ?", (mid,)).fetchone()
    )
    return None if row is None else dict(row)


def state(graph: MemoryGraph) -> dict[str, Any]:
    """Everything observable about the store: the lossless export and the stats."""
    return {"export": transfer.export(graph), "stats": render(graph.stats())}


def fts_rows(graph: MemoryGraph) -> int:
    return int(
        graph.store.read(lambda c: c.execute("SELECT COUNT(*) FROM memory_fts").fetchone()[0])
    )
