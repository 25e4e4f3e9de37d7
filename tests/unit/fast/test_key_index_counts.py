"""How the key index takes in a key a write created or read back, after its commit, when other
writes' steps ran first (engine/keys.py ``put_created`` / ``put_written``; the races on a
shared store: tests/postgres/test_pg_key_counts.py)."""

from __future__ import annotations

import numpy as np
import pytest

from keymem_daemon.engine.keys import KeyIndex, KeyInfo

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

DIM = 4


def _vector(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    return v


def _key(link_count: int, *, concept: str = "deploy", aliases: tuple[str, ...] = ()) -> KeyInfo:
    return KeyInfo(id="k1", concept=concept, key_type="concept", compact=concept, aliases=aliases,
                   alias_compacts=aliases, link_count=link_count)


def test_a_created_key_goes_in_with_its_one_link_and_its_vector() -> None:
    index = KeyIndex(DIM)
    index.put_created(_key(1), _vector(0))
    assert index.get("k1") == _key(1)
    assert index.by_norm("deploy") == "k1"
    assert index.snapshot().ids == ["k1"]


def test_a_created_key_another_write_put_first_keeps_that_count_and_gains_the_vector() -> None:
    """The other write found the key in the store after the creator's commit: its count (two
    links) has the creator's link in it already."""
    index = KeyIndex(DIM)
    index.put_written(_key(2), 1)
    index.put_created(_key(1), _vector(1))
    assert index.get("k1").link_count == 2  # type: ignore[union-attr]
    assert index.snapshot().ids == ["k1"]


def test_a_key_read_back_keeps_the_index_count_moved_by_the_links_the_write_made() -> None:
    """The write's read (3 links, its own among them) missed a link a later commit applied
    by delta first: the index's count (4, that link among them) plus the write's one."""
    index = KeyIndex(DIM)
    index.put(_key(3), _vector(0))
    index.add_links("k1", 1)
    index.put_written(_key(3, aliases=("deploys",)), 1)
    info = index.get("k1")
    assert info is not None
    assert info.link_count == 5
    assert info.aliases == ("deploys",)  # the rest is the write's
    assert index.by_norm("deploys") == "k1"


def test_a_key_read_back_that_the_index_lacks_takes_the_count_the_write_read() -> None:
    index = KeyIndex(DIM)
    index.put_written(_key(3), 1)
    assert index.get("k1").link_count == 3  # type: ignore[union-attr]


def test_a_key_read_back_whose_text_changed_is_found_by_its_new_text_only() -> None:
    index = KeyIndex(DIM)
    index.put(_key(1, concept="deploy"), _vector(0))
    index.put_written(_key(1, concept="release"), 0)
    assert index.by_norm("release") == "k1"
    assert index.by_norm("deploy") is None
    assert index.get("k1").link_count == 1  # type: ignore[union-attr]


def test_a_key_the_write_created_and_then_changed_goes_in_with_its_vector() -> None:
    """A key made and given an alias by one write (a translation pair) is read back, not taken
    as created: it still brings the vector only the write has."""
    index = KeyIndex(DIM)
    index.put_written(_key(1, aliases=("배포",)), 1, _vector(2))
    assert index.snapshot().ids == ["k1"]
    assert index.by_norm("배포") == "k1"
