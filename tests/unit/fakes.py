"""Test doubles of the fast tier: a deterministic embedder and an in-memory repository.

They stand in for the two costly parts of the engine the way ``httpx.MockTransport`` stands
in for the network: ``HashingEmbedder`` implements ``inference.embedders.Embedder`` without a
model (equal texts give equal vectors, texts sharing words are close), and
``InMemoryRepository`` implements ``engine.ports.Repository`` with dicts and a unit of work
that commits or rolls back. ``tests/unit/fast`` runs the engine's logic on them; the
real-model tests in ``tests/unit/test_engine_*.py`` stay as they are.
"""

from __future__ import annotations

import logging
import pickle
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypeVar

import numpy as np

from keymem_daemon.engine.records import Memory
from keymem_daemon.engine.text import normalize
from keymem_daemon.errors import StoreError
from keymem_daemon.inference.embedders import ThresholdProfile, Vectors, l2_normalize

logger = logging.getLogger(__name__)

T = TypeVar("T")

# -- a deterministic embedder ------------------------------------------------------------------

_WORD: Final = re.compile(r"[^\W_]+")
# Each word counts once whole and once spread over its character trigrams, so a shared word
# moves two texts closer than shared letters do, and inflections (deploy, deploys) stay near.
_WORD_WEIGHT: Final = 1.0
_TRIGRAMS_WEIGHT: Final = 1.0

# Cosines of this embedder, chosen so that only near-identical spellings merge keys
# (``Deploy Pipeline`` / ``deploy pipelines`` ~0.9) and one shared word reaches a key:
# the fast tier tests the engine's rules, not the real model's calibration.
HASHING_PROFILE: Final = ThresholdProfile(
    key_recall=0.45,
    key_merge=0.88,
    short_key_merge=0.88,
    cross_script_merge=0.95,
    key_autolink=0.6,
    translation_pair=0.95,
)


def _bucket(feature: str, dim: int) -> tuple[int, float]:
    """The column a feature hashes to and its sign (crc32: the same in every process)."""
    h = zlib.crc32(feature.encode("utf-8"))
    return h % dim, (1.0 if (h >> 31) & 1 else -1.0)


@dataclass(frozen=True, slots=True)
class HashingEmbedder:
    """Feature hashing of a text's words and their character trigrams into ``dim`` columns,
    L2-normalised: fast, model-free and the same on every run. A text with no word embeds to
    zero (a cosine of 0 with everything), as an unreadable text does for USE."""

    dim: int = 256
    profile: ThresholdProfile = HASHING_PROFILE

    @property
    def name(self) -> str:
        return "hashing"

    @property
    def fingerprint(self) -> str:
        return f"hashing-trigrams-v1/{self.dim}"

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(normalize(text)):
                column, sign = _bucket(f"w:{word}", self.dim)
                out[row, column] += sign * _WORD_WEIGHT
                padded = f"<{word}>"
                grams = [padded[i:i + 3] for i in range(len(padded) - 2)]
                for gram in grams:
                    column, sign = _bucket(f"g:{gram}", self.dim)
                    out[row, column] += sign * _TRIGRAMS_WEIGHT / len(grams) ** 0.5
        return l2_normalize(out)


# -- an in-memory repository -------------------------------------------------------------------


@dataclass(slots=True)
class Tables:
    """Everything the repository holds; values are frozen records, so a shallow copy of each
    table is a snapshot a unit of work may change without touching the committed one."""

    memories: dict[str, Memory] = field(default_factory=dict)

    def copy(self) -> Tables:
        return Tables(memories=dict(self.memories))


@dataclass(slots=True)
class InMemoryReader:
    """One snapshot: the tables as they were committed when the read (or write) began."""

    _tables: Tables

    # -- MemoryReads (store/sqlite/memories.py: MemoryRows)

    def memory(self, memory_id: str) -> Memory | None:
        """The memory with this id, active or not, or None."""
        return self._tables.memories.get(memory_id)

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        """The memories with these ids that exist, by id."""
        found = self._tables.memories
        return {mid: found[mid] for mid in dict.fromkeys(ids) if mid in found}


@dataclass(slots=True)
class InMemoryWriter(InMemoryReader):
    """A unit of work on a private copy of the tables: committed by swapping it in."""

    _after: list[Callable[[], object]] = field(default_factory=list)

    def after_commit(self, callback: Callable[[], object]) -> None:
        self._after.append(callback)


class InMemoryRepository:
    """``engine.ports.Repository`` on dicts. Writes are serialised and each is one unit of
    work: ``fn`` changes a copy of the tables, which replaces the committed ones only if
    ``fn`` returns; then the ``after_commit`` callbacks run in order (a failing one is
    logged, as the SQLite writer does). Reads see the last committed tables."""

    found: Literal["store", "missing", "empty"]
    lost: str | None

    def __init__(self, *, memories: Iterable[Memory] = ()) -> None:
        self.found = "store"
        self.lost = None
        self._tables = Tables(memories={m.id: m for m in memories})
        self._write_lock = threading.Lock()
        self._writing: threading.Thread | None = None
        self._closed = False

    def read(self, fn: Callable[[InMemoryReader], T]) -> T:
        self._check_open()
        return fn(InMemoryReader(self._tables))

    def write(self, fn: Callable[[InMemoryWriter], T]) -> T:
        if self._writing is threading.current_thread():
            raise RuntimeError("InMemoryRepository.write called from inside a write transaction")
        self._check_open()
        with self._write_lock:
            self._writing = threading.current_thread()
            try:
                tx = InMemoryWriter(self._tables.copy())
                result = fn(tx)
                self._tables = tx._tables
            finally:
                self._writing = None
        for callback in tx._after:
            try:
                callback()
            except Exception:
                logger.exception("an after-commit step failed; the in-memory index may lag")
        return result

    def check_files(self) -> str | None:
        return None  # no file can be replaced under it

    def checkpoint(self) -> None:
        """Nothing to fold: every commit is already the whole state."""

    def backup_to(self, dest: Path) -> None:
        """The committed tables, pickled to ``dest``."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(pickle.dumps(self._tables))

    def integrity_check(self) -> str:
        broken = [mid for mid, m in self._tables.memories.items() if m.id != mid]
        return "ok" if not broken else f"memories filed under another id: {broken}"

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")
