"""The fast tier: the engine's logic on a deterministic embedder (``fakes.HashingEmbedder``)
instead of the real model, over both repositories: a real SQLite file under ``tmp_path`` and
the in-memory ``fakes.InMemoryRepository``. The fixtures of ``tests/unit/conftest.py``
(``tools``, ``clock`` ...) are reused; ``embedder`` and ``analyzer`` are replaced and
``graph`` runs each test once per repository. Run the tier with ``pytest -m fast``; each
module here marks itself ``fast``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import FakeClock, open_graph
from fakes import HashingEmbedder, InMemoryRepository

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.inference.embedders import Embedder


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The deterministic embedder, in place of the session's real one."""
    return HashingEmbedder()


@pytest.fixture(scope="session")
def analyzer() -> Analyzer:
    """The real analyser, Kiwi not preloaded: it loads (~2-4 s) on the first Hangul text, and
    the fast tier's texts are English."""
    return Analyzer()


@pytest.fixture(params=["sqlite", "memory"])
def graph(request: pytest.FixtureRequest, tmp_path: Path, embedder: Embedder, analyzer: Analyzer,
          settings: Settings, clock: FakeClock) -> Iterator[MemoryGraph]:
    """The engine over a SQLite file, then over the in-memory repository."""
    if request.param == "sqlite":
        g = open_graph(tmp_path / "keymem.db", embedder, settings, clock, analyzer)
    else:
        g = MemoryGraph.over(InMemoryRepository(), embedder, settings,  # type: ignore[arg-type]
                             clock=clock, analyzer=analyzer)
    try:
        yield g
    finally:
        g.close()
