"""The fast tier: the engine's logic on a deterministic embedder (``fakes.HashingEmbedder``)
instead of the real model. Every fixture of ``tests/unit/conftest.py`` (``graph``, ``tools``,
``graph_with`` ...) is reused; only ``embedder`` is replaced, so they open a real SQLite file
under ``tmp_path`` with the real ``Analyzer`` and the hashing embedder. Run the tier with
``pytest -m fast``; each module here marks itself ``fast``."""

from __future__ import annotations

import pytest
from fakes import HashingEmbedder

from keymem_daemon.inference.embedders import Embedder


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The deterministic embedder, in place of the session's real one."""
    return HashingEmbedder()
