"""The fast tier's own rules: its embedder is deterministic and behaves like an embedder,
and ``-m fast`` (which imports only ``tests/unit/fast``, see ``tests/conftest.py``) misses
no fast test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import HashingEmbedder

from keymem_daemon.inference.embedders import Embedder

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

TESTS = Path(__file__).parents[2]
FAST_TIER = Path(__file__).parent


def test_equal_texts_embed_equally_in_every_instance_and_each_row_is_unit_length() -> None:
    texts = ["Deploys go out on Fridays", "deploys  go out on FRIDAYS", "배포는 금요일에 나간다"]
    first: Embedder = HashingEmbedder()
    vectors = first.embed(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (3, first.dim)
    assert np.array_equal(vectors, HashingEmbedder().embed(texts))
    assert np.array_equal(vectors[0], vectors[1]), "texts equal once normalised embed equally"
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)


def test_texts_sharing_words_are_closer_than_texts_sharing_none() -> None:
    a, near, far = HashingEmbedder().embed(["the staging server", "staging server certificate", "dark mode editor"])
    assert float(a @ near) > 0.5 > float(a @ far)


def test_a_text_without_words_embeds_to_zero() -> None:
    assert not HashingEmbedder().embed(["", " -- "]).any()


def test_the_fast_marker_is_used_only_in_the_fast_tier_and_by_each_of_its_modules() -> None:
    outside = [p for p in TESTS.rglob("*.py") if FAST_TIER not in p.parents and "mark.fast" in p.read_text()]
    assert outside == [], "-m fast collects tests/unit/fast only: move these tests there"
    unmarked = [p.name for p in FAST_TIER.glob("test_*.py") if "pytest.mark.fast" not in p.read_text()]
    assert unmarked == []
