"""In-memory vector tables, kept in step with the store.

A ``VectorTable`` holds one contiguous matrix of L2-normalised rows with string ids. Rows
are appended (the matrix grows when full) and removed by tombstone, so a reader's
snapshot -- a view of the first ``count`` rows -- stays valid while the writer appends.
Only the store's writer thread mutates a table, and only after its transaction committed.

A table may store its rows as int8 (``quantized=True``: symmetric, one scale per row).
Memory bodies use it: 100k bodies take 51 MB instead of 205 MB, scoring them is as fast
(rows are widened to float32 a block at a time), and a cosine moves by well under 0.01.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

_INITIAL_ROWS: Final = 256
# Headroom when a table is sized for a known number of rows (a load), before it grows.
_HEADROOM: Final = 1.1
# Rows widened from int8 to float32 per block when scoring a quantized table: 1024 rows of
# 512 floats (2 MB) stay in cache between the widening and the product; 8192 (16 MB) did not,
# and scoring 10k bodies took 3.4 ms against 1.7 (same cosines, bit for bit: each is one
# row's dot product, whatever the block; a smaller block is not: at 256 rows a product with
# 17 query rows differed in the last bit).
_BLOCK: Final = 1024
# Each thread's widening buffer, reused by every scoring call on that thread. A new array per
# block was a fresh mmap (the daemon fixes glibc's mmap threshold at 128 KiB, allocators.py)
# whose every page faulted in and was unmapped again: with that threshold, scoring 10k bodies
# took 75 ms against 2 ms with the buffer (load 13), and in the daemon it was 23% of
# /v1/inject's time. The cost: 2 MB per thread that scores (one per concurrent request).
_scratch = threading.local()

Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent read view: row ``i`` is the vector of ``ids[i]`` if ``alive[i]``."""

    ids: list[str]
    matrix: npt.NDArray[np.float32] | npt.NDArray[np.int8]
    scales: npt.NDArray[np.float32] | None
    alive: npt.NDArray[np.bool_]
    groups: npt.NDArray[np.int32]

    def similarities(self, queries: Matrix) -> Matrix:
        """Cosine of every query row with every row (dead rows read -1)."""
        if len(self.ids) == 0:
            return np.zeros((len(queries), 0), dtype=np.float32)
        if self.scales is None:
            sims = queries @ self.matrix.T
        else:
            sims = np.empty((len(queries), len(self.ids)), dtype=np.float32)
            buffer = _widening_buffer(self.matrix.shape[1])
            for start in range(0, len(self.ids), _BLOCK):
                rows = self.matrix[start:start + _BLOCK]
                block = buffer[:len(rows)]
                block[...] = rows  # the same widening as astype(np.float32), into kept memory
                sims[:, start:start + _BLOCK] = (queries @ block.T) * self.scales[start:start + _BLOCK]
        sims[:, ~self.alive] = -1.0
        return sims

    def dot_rows(self, rows: list[int], vector: Matrix) -> Matrix:
        """Cosine of ``vector`` with the given rows."""
        values = self.matrix[rows].astype(np.float32) @ vector
        return values if self.scales is None else values * self.scales[rows]


def _quantized(vectors: Matrix) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Rows as a quantized table stores them: each scaled to its peak magnitude at 127 and
    rounded (stored as int8), and that peak / 127, the row's scale (a zero row: 1 / 127).
    The factor and the scale are taken in float64 from the float32 peak."""
    peak = np.abs(vectors).max(axis=1).astype(np.float64)
    peak[peak == 0.0] = 1.0
    return np.round(vectors * (127.0 / peak).astype(np.float32)[:, None]), peak / 127.0


def _widening_buffer(dim: int) -> Matrix:
    """This thread's (``_BLOCK``, ``dim``) float32 buffer for widening int8 rows."""
    buffer: Matrix | None = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.shape[1] != dim:
        buffer = np.empty((_BLOCK, dim), dtype=np.float32)
        _scratch.buffer = buffer
    return buffer


class VectorTable:
    def __init__(self, dim: int, *, quantized: bool = False) -> None:
        self.dim = dim
        self.quantized = quantized
        self._ids: list[str] = []
        self._rows: dict[str, int] = {}
        self._matrix = np.zeros((_INITIAL_ROWS, dim), dtype=np.int8 if quantized else np.float32)
        self._scales = np.zeros(_INITIAL_ROWS, dtype=np.float32)
        self._alive = np.zeros(_INITIAL_ROWS, dtype=bool)
        # A small integer per row (the memory table keeps namespace codes here), so a
        # reader can mask rows without a round trip to SQLite.
        self._groups = np.zeros(_INITIAL_ROWS, dtype=np.int32)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._rows

    def row_of(self, item_id: str) -> int | None:
        return self._rows.get(item_id)

    def reserve(self, rows: int) -> None:
        """Size the matrix for ``rows`` rows (plus headroom) before a bulk load."""
        with self._lock:
            if rows > len(self._matrix):
                self._resize(int(rows * _HEADROOM) + _INITIAL_ROWS)

    def upsert(self, item_id: str, vector: npt.NDArray[np.floating], group: int = 0) -> int:
        with self._lock:
            row = self._rows.get(item_id)
            if row is None:
                row = len(self._ids)
                if row >= len(self._matrix):
                    self._resize(len(self._matrix) * 2)
                self._ids.append(item_id)
                self._rows[item_id] = row
            if self.quantized:
                self._matrix[row:row + 1], self._scales[row:row + 1] = _quantized(
                    np.asarray(vector, dtype=np.float32)[None, :])
            else:
                self._matrix[row] = vector
            self._groups[row] = group
            self._alive[row] = True
            return row

    def upsert_many(self, item_ids: Sequence[str], vectors: Matrix, groups: npt.NDArray[np.int32]) -> None:
        """``upsert`` for many rows at once (a load), with the quantization done for the whole
        block instead of row by row."""
        if not item_ids:
            return
        with self._lock:
            needed = len(self._ids) + len(item_ids)
            if needed > len(self._matrix):
                self._resize(max(len(self._matrix) * 2, needed))
            rows = np.empty(len(item_ids), dtype=np.intp)
            for i, item_id in enumerate(item_ids):
                row = self._rows.get(item_id)
                if row is None:
                    row = len(self._ids)
                    self._ids.append(item_id)
                    self._rows[item_id] = row
                rows[i] = row
            if self.quantized:
                self._matrix[rows], self._scales[rows] = _quantized(vectors)
            else:
                self._matrix[rows] = vectors
            self._groups[rows] = groups
            self._alive[rows] = True

    def remove(self, item_id: str) -> None:
        with self._lock:
            row = self._rows.pop(item_id, None)
            if row is not None:
                self._alive[row] = False

    def get(self, item_id: str) -> Matrix | None:
        row = self._rows.get(item_id)
        if row is None:
            return None
        vector: Matrix = self._matrix[row].astype(np.float32, copy=False)
        return vector * self._scales[row] if self.quantized else vector

    def stack(self, item_ids: Iterable[str]) -> Matrix:
        """The rows of ``item_ids`` as one float32 matrix, a zero row for an unknown id."""
        rows = [self._rows.get(item_id, -1) for item_id in item_ids]
        matrix, scales = self._matrix, self._scales
        known = np.array([r >= 0 for r in rows], dtype=bool)
        picked = np.asarray(rows, dtype=np.intp).clip(min=0)
        values: Matrix = matrix[picked].astype(np.float32)
        if self.quantized:
            values *= scales[picked][:, None]
        values[~known] = 0.0
        return values

    def cosines(self, item_ids: Iterable[str], queries: Matrix) -> dict[str, Matrix]:
        """Each known id's cosine with every row of ``queries``, in one matrix product."""
        known: list[str] = []
        rows: list[int] = []
        for item_id in item_ids:
            row = self._rows.get(item_id)
            if row is not None:
                known.append(item_id)
                rows.append(row)
        if not known:
            return {}
        # Read after the rows: a concurrent resize only ever replaces the matrix with a longer copy.
        matrix, scales = self._matrix, self._scales
        values = matrix[rows].astype(np.float32) @ np.atleast_2d(queries).T
        if self.quantized:
            values *= scales[rows][:, None]
        return dict(zip(known, values, strict=True))

    def snapshot(self) -> Snapshot:
        with self._lock:
            n = len(self._ids)
            return Snapshot(list(self._ids), self._matrix[:n], self._scales[:n] if self.quantized else None,
                            self._alive[:n], self._groups[:n])

    def _resize(self, size: int) -> None:
        n = len(self._ids)
        matrix = np.zeros((size, self.dim), dtype=self._matrix.dtype)
        matrix[:n] = self._matrix[:n]
        scales = np.zeros(size, dtype=np.float32)
        scales[:n] = self._scales[:n]
        alive = np.zeros(size, dtype=bool)
        alive[:n] = self._alive[:n]
        groups = np.zeros(size, dtype=np.int32)
        groups[:n] = self._groups[:n]
        # Readers holding the old arrays keep a valid (if older) view.
        self._matrix, self._scales, self._alive, self._groups = matrix, scales, alive, groups


def top_indices(values: npt.NDArray[np.floating], n: int) -> npt.NDArray[np.intp]:
    """Indices of the ``n`` largest values, largest first (a partial sort)."""
    if n <= 0 or values.size == 0:
        return np.zeros(0, dtype=np.intp)
    part = np.argpartition(-values, n - 1)[:n] if values.size > n else np.arange(values.size)
    return part[np.argsort(-values[part], kind="stable")]
