"""In-memory vector tables, kept in step with the store.

A ``VectorTable`` holds one contiguous matrix of L2-normalised rows with string ids. Rows
are appended (the matrix doubles when full) and removed by tombstone, so a reader's
snapshot -- a view of the first ``count`` rows -- stays valid while the writer appends.
Only the store's writer thread mutates a table, and only after its transaction committed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

_INITIAL_ROWS: Final = 256

Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent read view: ``matrix[i]`` is the vector of ``ids[i]`` if ``alive[i]``."""

    ids: list[str]
    matrix: Matrix
    alive: npt.NDArray[np.bool_]
    groups: npt.NDArray[np.int32]

    def similarities(self, queries: Matrix) -> Matrix:
        """Cosine of every query row with every row (dead rows read -1)."""
        if len(self.ids) == 0:
            return np.zeros((len(queries), 0), dtype=np.float32)
        sims = queries @ self.matrix.T
        sims[:, ~self.alive] = -1.0
        return sims


class VectorTable:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._ids: list[str] = []
        self._rows: dict[str, int] = {}
        self._matrix: Matrix = np.zeros((_INITIAL_ROWS, dim), dtype=np.float32)
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

    def upsert(self, item_id: str, vector: npt.NDArray[np.floating], group: int = 0) -> int:
        with self._lock:
            row = self._rows.get(item_id)
            if row is None:
                row = len(self._ids)
                if row >= len(self._matrix):
                    self._grow()
                self._ids.append(item_id)
                self._rows[item_id] = row
            self._matrix[row] = vector
            self._groups[row] = group
            self._alive[row] = True
            return row

    def bulk_load(self, items: Iterable[tuple[str, npt.NDArray[np.floating], int]]) -> None:
        for item_id, vector, group in items:
            self.upsert(item_id, vector, group)

    def remove(self, item_id: str) -> None:
        with self._lock:
            row = self._rows.pop(item_id, None)
            if row is not None:
                self._alive[row] = False

    def get(self, item_id: str) -> Matrix | None:
        row = self._rows.get(item_id)
        return None if row is None else self._matrix[row]

    def snapshot(self) -> Snapshot:
        with self._lock:
            n = len(self._ids)
            return Snapshot(list(self._ids), self._matrix[:n], self._alive[:n], self._groups[:n])

    def _grow(self) -> None:
        size = len(self._matrix) * 2
        matrix = np.zeros((size, self.dim), dtype=np.float32)
        matrix[: len(self._matrix)] = self._matrix
        alive = np.zeros(size, dtype=bool)
        alive[: len(self._alive)] = self._alive
        groups = np.zeros(size, dtype=np.int32)
        groups[: len(self._groups)] = self._groups
        # Readers holding the old arrays keep a valid (if older) view.
        self._matrix, self._alive, self._groups = matrix, alive, groups
