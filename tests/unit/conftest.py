"""Fixtures of the engine behaviour tests (``tests/unit/test_engine_*.py``).

Every engine test runs against the real thing: a SQLite file under ``tmp_path``, the real
Kiwi analyser and the real default embedder (USE multilingual v3, behind ``CachedEmbedder``).
The embedder is built once per session because loading it costs about a second; the Kiwi
analyser is the process-wide ``default_analyzer()``. Time comes from a ``FakeClock`` the
tests advance, so freshness, TTL and alias pruning never wait on the wall clock. Helpers
the tests call themselves (``remember``, ``key_id``, ``state`` ...) are in ``engine_helpers``.

Each test that uses the store (``graph``, ``graph_with``, ``tools``, ``store_at``) runs once
per backend (``backend``): on the SQLite file, and on a fresh PostgreSQL database of the
session's throwaway cluster, copied from one migrated template (tests/pg_cluster.py) so a
test costs a ``CREATE DATABASE``, not a migration. Without PostgreSQL the postgres cases
skip, saying why -- under ``CI=true`` they fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import FakeClock, GraphFactory, StoreAt, Tools, open_graph
from pg_cluster import OWNER as PG_OWNER

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


BACKENDS = ("sqlite", "postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of the store runs on each backend, but one marked ``sqlite_only`` (with the
    reason why it tests SQLite itself) on SQLite alone."""
    if "backend" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only")
        metafunc.parametrize("backend", BACKENDS[:1] if only else BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Which store the test's engine runs on."""
    return str(request.param)


@pytest.fixture
def new_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[str], StoreAt]]:
    """``new_store(name)``: where a new, empty store of the test's backend lives -- a file
    ``tmp_path/name/keymem.db``, or a new database of the session's cluster (dropped after)."""
    made: list[str] = []
    cluster = request.getfixturevalue("pg_cluster") if backend == "postgres" else None
    supply = request.getfixturevalue("pg_fresh_databases") if backend == "postgres" else None

    def make(name: str) -> StoreAt:
        if cluster is None or supply is None:
            (tmp_path / name).mkdir(parents=True, exist_ok=True)
            return tmp_path / name / "keymem.db"
        made.append(supply.take())
        return str(cluster.url_for(PG_OWNER, made[-1]))

    yield make
    if supply is not None:
        for database in made:
            supply.give_back(database)


@pytest.fixture
def store_at(backend: str, tmp_path: Path, new_store: Callable[[str], StoreAt]) -> StoreAt:
    """The test's store: ``tmp_path/keymem.db`` (as the tests have always had it), or a fresh
    PostgreSQL database."""
    return tmp_path / "keymem.db" if backend == "sqlite" else new_store("keymem")


@pytest.fixture
def graph(
    store_at: StoreAt, embedder: Embedder, analyzer: Analyzer, settings: Settings, clock: FakeClock
) -> Iterator[MemoryGraph]:
    g = open_graph(store_at, embedder, settings, clock, analyzer)
    try:
        yield g
    finally:
        g.close()


@pytest.fixture
def graph_with(
    store_at: StoreAt, tmp_path: Path, embedder: Embedder, analyzer: Analyzer, clock: FakeClock
) -> Iterator[GraphFactory]:
    """``graph_with(hub_min_links=2)``: the ``graph`` fixture's store, opened with those
    settings changed; closed at teardown."""
    opened: list[MemoryGraph] = []

    def make(**overrides: Any) -> MemoryGraph:
        g = open_graph(store_at, embedder, Settings(data_dir=tmp_path, **overrides), clock, analyzer)
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
