"""Issue 19 item 6: the embedder is given at most ``EMBED_MAX_CHARS`` of any text, so one long
memory (a 19,000-character unbroken token took 2.5 s, a batch of 20 of them 74 s) cannot
hold every other write up behind the embedder."""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.limits import EMBED_MAX_CHARS
from keymem_daemon.inference.embedders import CachedEmbedder, Embedder, UseEmbedder
from keymem_daemon.store.opening import open_sqlite

pytestmark = pytest.mark.timeout(120)


class Recording:
    """The real embedder, noting the length of every text it is given."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.lengths: list[int] = []
        self.name, self.fingerprint, self.dim, self.profile = inner.name, inner.fingerprint, inner.dim, inner.profile

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.lengths.extend(len(t) for t in texts)
        return self.inner.embed(texts)


@pytest.fixture(scope="module")
def use() -> UseEmbedder:
    return UseEmbedder()


def test_a_long_unbroken_token_is_embedded_from_its_first_characters_only(use: UseEmbedder) -> None:
    token = "".join(random.Random(19).choices(string.ascii_letters, k=19_000))
    recording = Recording(use)
    vector = CachedEmbedder(recording).embed([token, "short text"])  # type: ignore[arg-type]
    assert max(recording.lengths) == EMBED_MAX_CHARS
    np.testing.assert_allclose(vector[0], use.embed([token[:EMBED_MAX_CHARS]])[0], atol=1e-6)


def test_remember_of_a_long_memory_embeds_a_capped_body(tmp_path: Path, use: UseEmbedder) -> None:
    recording = Recording(use)
    settings = Settings(data_dir=tmp_path)
    graph = MemoryGraph.over(open_sqlite(settings, tmp_path / "keymem.db"), CachedEmbedder(recording), settings)  # type: ignore[arg-type]
    try:
        content = "deploy the billing service with docker on port 8080. " * 360  # ~19,000 characters
        request = graph.prepare(content=content, keys=["deploy", "billing"])
        saved = graph.remember(request)
        assert max(recording.lengths) <= EMBED_MAX_CHARS
        body = graph.bodies.get(saved.saved)  # type: ignore[union-attr]
        assert body is not None and float(body @ use.embed([content[:EMBED_MAX_CHARS]])[0]) > 0.99
    finally:
        graph.close()
