"""Fixtures of the engine behaviour tests (``tests/unit/test_engine_*.py``).

Every engine test runs against the real thing: a SQLite file under ``tmp_path``, the real
Kiwi analyser and the real default embedder (USE multilingual v3, behind ``CachedEmbedder``).
The embedder is built once per session because loading it costs about a second; the Kiwi
analyser is the process-wide ``default_analyzer()``. Time comes from a ``FakeClock`` the
tests advance, so freshness, TTL and alias pruning never wait on the wall clock. Helpers
the tests call themselves (``remember``, ``key_id``, ``state`` ...) are in ``engine_helpers``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import FakeClock, GraphFactory, Tools, open_graph

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.text import Analyzer, default_analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.inference.embedders import CachedEmbedder, Embedder, UseEmbedder


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real default embedder, loaded once for the whole session."""
    return CachedEmbedder(UseEmbedder())


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


@pytest.fixture
def graph(
    tmp_path: Path, embedder: Embedder, analyzer: Analyzer, settings: Settings, clock: FakeClock
) -> Iterator[MemoryGraph]:
    g = open_graph(tmp_path / "keymem.db", embedder, settings, clock, analyzer)
    try:
        yield g
    finally:
        g.close()


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


@pytest.fixture
def full_settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, tools="full")


@pytest.fixture
def tools(graph: MemoryGraph, full_settings: Settings) -> Tools:
    """The full tool surface (the ten default tools and the extended ones)."""
    return Tools(graph, full_settings, Host())
