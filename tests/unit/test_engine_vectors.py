"""The in-memory vector tables: exact and int8 rows, growth, tombstones, batch cosines."""

from __future__ import annotations

import numpy as np
import pytest

from keymem_daemon.engine.vectors import VectorTable


def unit_rows(count: int, dim: int, seed: int = 3) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("quantized", [False, True])
def test_batch_cosines_match_row_by_row_and_survive_growth(quantized: bool) -> None:
    rows = unit_rows(600, 32)  # more than the initial 256 rows: the matrix grows twice
    table = VectorTable(32, quantized=quantized)
    for i, row in enumerate(rows):
        table.upsert(f"m{i}", row)
    table.remove("m5")
    queries = unit_rows(2, 32, seed=9)
    wanted = ["m0", "m5", "m300", "m599", "missing"]

    got = table.cosines(wanted, queries)

    # Unknown and removed ids are simply absent; the others get one cosine per query row.
    assert sorted(got) == ["m0", "m300", "m599"]
    for item_id, values in got.items():
        exact = rows[int(item_id[1:])] @ queries.T
        assert values.shape == (2,)
        np.testing.assert_allclose(values, exact, atol=0.01 if quantized else 1e-5)
        single = table.get(item_id)
        assert single is not None
        np.testing.assert_allclose(values, single @ queries.T, atol=1e-5)


def test_a_single_query_vector_gives_one_column() -> None:
    table = VectorTable(4)
    table.upsert("a", np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32))
    got = table.cosines(["a"], np.array([0.6, 0.8, 0.0, 0.0], dtype=np.float32))
    np.testing.assert_allclose(got["a"], [0.6])
    assert table.cosines([], np.zeros(4, dtype=np.float32)) == {}


@pytest.mark.parametrize("quantized", [False, True])
def test_stacked_rows_equal_single_reads_with_zeros_for_unknown_ids(quantized: bool) -> None:
    rows = unit_rows(300, 16)
    table = VectorTable(16, quantized=quantized)
    for i, row in enumerate(rows):
        table.upsert(f"m{i}", row)
    table.remove("m7")

    stacked = table.stack(["m299", "m7", "nope", "m0"])

    assert stacked.shape == (4, 16) and stacked.dtype == np.float32
    for i, item_id in enumerate(["m299", "m7", "nope", "m0"]):
        single = table.get(item_id)
        np.testing.assert_allclose(stacked[i], single if single is not None else np.zeros(16), atol=1e-6)
    assert not stacked[1].any() and not stacked[2].any()
    assert table.stack([]).shape == (0, 16)


@pytest.mark.parametrize("quantized", [False, True])
def test_a_block_upsert_stores_the_rows_row_by_row_upserts_store_bit_for_bit(quantized: bool) -> None:
    rows = unit_rows(700, 32)
    rows[3] = 0.0  # a text the embedder cannot read: a zero row (scale 1/127 on int8)
    one, block = VectorTable(32, quantized=quantized), VectorTable(32, quantized=quantized)
    for i, row in enumerate(rows[:650]):
        one.upsert(f"m{i}", row, i % 3)
    # Two blocks, the second growing the matrix and replacing rows the first put.
    block.upsert_many([f"m{i}" for i in range(300)], rows[:300], np.arange(300, dtype=np.int32) % 3)
    block.upsert_many([f"m{i}" for i in range(250, 650)], rows[250:650], np.arange(250, 650, dtype=np.int32) % 3)

    a, b = one.snapshot(), block.snapshot()
    assert a.ids == b.ids
    np.testing.assert_array_equal(a.matrix, b.matrix)
    np.testing.assert_array_equal(a.groups, b.groups)
    assert a.alive.all() and b.alive.all()
    if quantized:
        assert a.scales is not None and b.scales is not None
        np.testing.assert_array_equal(a.scales, b.scales)


def quantized_table(count: int, dim: int) -> VectorTable:
    table = VectorTable(dim, quantized=True)
    for i, row in enumerate(unit_rows(count, dim)):
        table.upsert(f"m{i}", row)
    table.remove("m7")
    return table


def widened_block_by_block(table: VectorTable, queries: np.ndarray) -> np.ndarray:
    """Scoring as it was before the kept buffer: a new float32 array per 1024-row block."""
    snap = table.snapshot()
    assert snap.scales is not None
    sims = np.empty((len(queries), len(snap.ids)), dtype=np.float32)
    for start in range(0, len(snap.ids), 1024):
        block = snap.matrix[start:start + 1024].astype(np.float32)
        sims[:, start:start + 1024] = (queries @ block.T) * snap.scales[start:start + 1024]
    sims[:, ~snap.alive] = -1.0
    return sims


@pytest.mark.parametrize("queries", [1, 3, 17])
def test_scoring_int8_rows_through_the_kept_buffer_gives_the_same_cosines_bit_for_bit(queries: int) -> None:
    table = quantized_table(2600, 48)  # three blocks, the last one short
    query_rows = unit_rows(queries, 48, seed=11)
    got = table.snapshot().similarities(query_rows)
    assert np.array_equal(got, widened_block_by_block(table, query_rows))


def test_scoring_int8_rows_allocates_no_block_per_call() -> None:
    # A new 1024-row float32 block per call was a fresh mmap under the daemon's fixed mmap
    # threshold (allocators.py), every page faulted in: the thread's buffer is reused.
    import tracemalloc

    dim = 256
    table = quantized_table(3000, dim)
    query = unit_rows(1, dim, seed=5)
    snap = table.snapshot()
    snap.similarities(query)  # this thread's buffer exists from here on
    tracemalloc.start()
    try:
        snap.similarities(query)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    block_bytes = 1024 * dim * 4
    assert peak < block_bytes // 4, peak
