"""Model downloads against a hub served on 127.0.0.1: the bge-m3 embedder path, healing,
failing fast offline, and the reranker and its manager.

The hub hosts a real small ONNX embedder (all-MiniLM-L6-v2, int8) under bge-m3's repository
names, and a cross-encoder graph built here under the reranker's, so every byte keymem reads
came through the same code that talks to huggingface.co.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import pytest
from daemon_helpers import READY_TIMEOUT, scaled, wait_for
from fake_hub import (
    FakeHub,
    SilentServer,
    build_cross_encoder,
    closed_port_url,
    hub_repos,
    minilm_files,
    model_dir,
    reranker_files,
)

from keymem_daemon.config import Settings
from keymem_daemon.errors import ModelError
from keymem_daemon.inference import download
from keymem_daemon.inference.download import (
    MANIFEST_NAME,
    DownloadProgress,
    ensure_model,
    missing_files,
)
from keymem_daemon.inference.embedders import (
    BGE_M3_PROFILE,
    BGE_M3_SPEC,
    OnnxEmbedder,
    UseEmbedder,
    load_embedder,
    load_embedder_or_default,
)
from keymem_daemon.inference.reranker import RERANKER_SPEC, OnnxReranker, RerankerManager

pytestmark = pytest.mark.timeout(60)

# Token ids in the MiniLM vocabulary, and what the test cross-encoder makes of them.
APPLE, BANANA, CHERRY = 6207, 15212, 9115
WEIGHTS = {APPLE: 3.0, BANANA: 2.0, CHERRY: 1.0}
VOCAB_SIZE = 30522
# A margin for thread start-up on top of a configured timeout (a quiet machine's; tests scale it).
SLACK = 1.5


@pytest.fixture(scope="module")
def minilm() -> dict[str, bytes]:
    return minilm_files()


@pytest.fixture(scope="module")
def cross_encoder() -> bytes:
    # [PAD] weighs 100: a reranker that scored padding would rank short texts last.
    return build_cross_encoder(WEIGHTS, vocab_size=VOCAB_SIZE, pad_weight=100.0)


@pytest.fixture
def hub(minilm: dict[str, bytes], cross_encoder: bytes) -> Iterator[FakeHub]:
    with FakeHub(hub_repos(minilm, cross_encoder)) as served:
        yield served


HUB_TIMEOUT: Final = 30.0
"""A read from the in-process fake hub: milliseconds here, but a busy 2-core machine can keep
its thread off the CPU for seconds. Tests of the timeout itself pass their own, shorter one."""


def settings_for(tmp_path: Path, endpoint: str, **changes: object) -> Settings:
    base = Settings(
        data_dir=tmp_path / "data",
        embed_model="bge-m3",
        embed_threads=1,
        rerank_threads=1,
        hf_endpoint=endpoint,
        download_timeout=HUB_TIMEOUT,
    )
    return base.replace(**changes)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


def keymem_records(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("keymem_daemon") and r.levelno >= level]


# ----------------------------------------------------------------------------------------
# bge-m3 through the hub


def test_the_first_load_fetches_every_file_and_yields_a_working_embedder(
    tmp_path: Path, hub: FakeHub, minilm: dict[str, bytes]
) -> None:
    settings = settings_for(tmp_path, hub.url)
    progress = DownloadProgress()
    started = time.monotonic()
    embedder = load_embedder(settings, progress=progress)
    elapsed = time.monotonic() - started

    model_dir = settings.models_dir / "bge-m3"
    for item in BGE_M3_SPEC.files:
        source = "model.onnx" if item.local == "model.onnx" else item.local
        assert (model_dir / item.local).read_bytes() == minilm[source]
    assert not list(model_dir.rglob("*.part"))
    assert isinstance(embedder, OnnxEmbedder)
    assert embedder.fingerprint == "onnx:bge-m3+nopad"
    assert embedder.profile == BGE_M3_PROFILE
    assert embedder.pooling == "cls"
    assert embedder.dim == 384

    cat, kitten, revenue = embedder.embed(
        ["The cat sits on the mat", "A kitten is resting on a rug", "Quarterly revenue grew"]
    )
    assert cosine(cat, kitten) > cosine(cat, revenue) + 0.1
    assert np.allclose(np.linalg.norm(embedder.embed(["x", "longer text here"]), axis=1), 1.0)

    snapshot = progress.get("bge-m3")
    assert snapshot.state == "done"
    sizes = {f.file: (f.done, f.total) for f in snapshot.files}
    assert sizes["model.onnx"] == (len(minilm["model.onnx"]), len(minilm["model.onnx"]))
    assert snapshot.bytes_done == snapshot.bytes_total == sum(
        len(minilm[f.local]) for f in BGE_M3_SPEC.files
    )
    assert progress.as_dict()["state"] == "done"
    print(f"\nfirst download + load of the 23 MB test model: {elapsed:.2f} s")


def test_a_complete_model_dir_costs_zero_requests(tmp_path: Path, hub: FakeHub) -> None:
    settings = settings_for(tmp_path, hub.url)
    load_embedder(settings)
    hub.reset()

    again = load_embedder(settings)

    assert hub.requests == []
    assert again.fingerprint == "onnx:bge-m3+nopad"


def test_a_partial_dir_fetches_only_the_missing_file(tmp_path: Path, hub: FakeHub) -> None:
    settings = settings_for(tmp_path, hub.url)
    load_embedder(settings)
    model_dir = settings.models_dir / "bge-m3"
    (model_dir / "tokenizer.json").unlink()
    hub.reset()

    load_embedder(settings)

    hub_paths = {p for s, _, p in hub.requests if s == "hub"}
    assert hub_paths == {"/BAAI/bge-m3/resolve/main/tokenizer.json"}
    assert (model_dir / "tokenizer.json").is_file()


def test_a_dir_given_by_embed_model_path_is_used_and_healed(
    tmp_path: Path, hub: FakeHub, minilm: dict[str, bytes]
) -> None:
    own = tmp_path / "my-bge"
    own.mkdir()
    # A model file copied in by hand (no manifest) is trusted; only the rest is fetched.
    (own / "model.onnx").write_bytes(minilm["model.onnx"])
    settings = settings_for(tmp_path, hub.url, embed_model_path=own)

    load_embedder(settings)

    fetched = {p.rsplit("/", 1)[-1] for s, m, p in hub.requests if s == "hub" and m == "GET"}
    assert fetched == {"tokenizer.json", "tokenizer_config.json", "config.json",
                       "special_tokens_map.json"}
    assert not (settings.models_dir / "bge-m3").exists()


def test_a_truncated_model_file_is_noticed_without_asking_the_hub_and_fetched_again(
    tmp_path: Path, hub: FakeHub, minilm: dict[str, bytes]
) -> None:
    settings = settings_for(tmp_path, hub.url)
    load_embedder(settings)
    model = settings.models_dir / "bge-m3" / "model.onnx"
    with model.open("r+b") as fh:
        fh.truncate(1000)
    assert [f.local for f in missing_files(BGE_M3_SPEC, model.parent)] == ["model.onnx"]
    hub.reset()

    embedder = load_embedder(settings)

    assert {p for s, _, p in hub.requests if s == "hub"} == {
        "/onnx-community/bge-m3-ONNX/resolve/main/onnx/model_quantized.onnx"
    }
    assert model.read_bytes() == minilm["model.onnx"]
    assert embedder.dim == 384


def test_a_corrupt_file_the_manifest_cannot_catch_is_healed_after_the_load_fails(
    tmp_path: Path, hub: FakeHub, minilm: dict[str, bytes]
) -> None:
    settings = settings_for(tmp_path, hub.url)
    load_embedder(settings)
    model_dir = settings.models_dir / "bge-m3"
    (model_dir / MANIFEST_NAME).unlink()
    (model_dir / "model.onnx").write_bytes(b"not an onnx graph" * 100)
    hub.reset()

    embedder = load_embedder(settings)

    gets = {p.rsplit("/", 1)[-1] for s, m, p in hub.requests if s == "hub" and m == "GET"}
    assert gets == {"model_quantized.onnx"}, "only the damaged file is fetched again"
    assert (model_dir / "model.onnx").read_bytes() == minilm["model.onnx"]
    # The files the check found intact are in the manifest again.
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text())["files"]
    assert sorted(manifest) == sorted(f.local for f in BGE_M3_SPEC.files)
    assert embedder.dim == 384


def test_a_corrupt_file_with_the_hub_offline_is_a_clear_model_error(
    tmp_path: Path, hub: FakeHub
) -> None:
    settings = settings_for(tmp_path, hub.url)
    load_embedder(settings)
    model_dir = settings.models_dir / "bge-m3"
    (model_dir / MANIFEST_NAME).unlink()
    (model_dir / "model.onnx").write_bytes(b"garbage")

    with pytest.raises(ModelError) as caught:
        load_embedder(settings.replace(hf_endpoint=closed_port_url()))

    assert "model.onnx" in caught.value.message
    assert "cannot connect" in caught.value.message


def test_a_transfer_that_does_not_match_the_hub_sha256_is_rejected_and_leaves_nothing(
    tmp_path: Path, hub: FakeHub, minilm: dict[str, bytes]
) -> None:
    original = minilm["model.onnx"]
    sha = hub.files[("onnx-community/bge-m3-ONNX", "onnx/model_quantized.onnx")].sha256
    hub.cdn_override[sha] = bytes(reversed(original))  # same size, other bytes
    settings = settings_for(tmp_path, hub.url)

    with pytest.raises(ModelError, match="sha256"):
        load_embedder(settings)

    model_dir = settings.models_dir / "bge-m3"
    assert not (model_dir / "model.onnx").exists()
    assert not list(model_dir.rglob("*.part"))


def test_a_closed_port_fails_at_once_with_a_model_error(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, closed_port_url())
    progress = DownloadProgress()
    started = time.monotonic()

    with pytest.raises(ModelError, match="cannot connect") as caught:
        load_embedder(settings, progress=progress)

    elapsed = time.monotonic() - started
    # At once: a refused connection is not retried until the download timeout runs out
    # (milliseconds on a quiet machine; the bound holds on a busy one).
    assert elapsed < settings.download_timeout, elapsed
    assert "bge-m3" in caught.value.message
    assert progress.get("bge-m3").state == "failed"
    assert progress.get("bge-m3").error == caught.value.message
    print(f"\nclosed port: ModelError after {elapsed * 1000:.0f} ms")


def test_a_hub_that_never_answers_fails_within_the_download_timeout(tmp_path: Path) -> None:
    with SilentServer() as silent:
        settings = settings_for(tmp_path, silent.url, download_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ModelError, match="no answer") as caught:
            load_embedder(settings)
        elapsed = time.monotonic() - started

    assert 0.9 <= elapsed < 1.0 + scaled(SLACK), elapsed
    assert "within 1 s" in caught.value.message
    print(f"\nsilent hub, download_timeout=1: ModelError after {elapsed:.2f} s")


def test_offline_the_daemon_keeps_the_default_embedder_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = settings_for(tmp_path, closed_port_url())

    embedder, warning = load_embedder_or_default(settings)

    assert isinstance(embedder, UseEmbedder)
    assert warning is not None and "bge-m3" in warning and "use-multilingual-v3" in warning
    assert keymem_records(caplog) == [warning]


def test_the_hub_offline_switch_is_reported_as_such(
    tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    with pytest.raises(ModelError, match="HF_HUB_OFFLINE"):
        load_embedder(settings_for(tmp_path, hub.url))
    assert hub.requests == []


def test_an_unknown_repository_file_is_a_model_error(tmp_path: Path, hub: FakeHub) -> None:
    spec = download.ModelSpec(
        name="nope",
        files=(download.ModelFile("BAAI/bge-m3", "missing.bin", "missing.bin"),),
        pooling=None,
        fingerprint="x",
    )
    with pytest.raises(ModelError, match="not found"):
        ensure_model(spec, tmp_path / "nope", endpoint=hub.url, timeout=HUB_TIMEOUT)


def test_two_fetches_of_one_dir_download_each_file_once(tmp_path: Path, hub: FakeHub) -> None:
    import threading

    dest = tmp_path / "shared"
    hub.gate.clear()  # the CDN holds the first download until both fetches have started
    results: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def fetch(name: str) -> None:
        try:
            results[name] = ensure_model(BGE_M3_SPEC, dest, endpoint=hub.url, timeout=HUB_TIMEOUT)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    first = threading.Thread(target=fetch, args=("first",))
    first.start()
    wait_for(lambda: bool(hub.requested("GET")), 5, message="the first GET")
    second = threading.Thread(target=fetch, args=("second",))
    second.start()
    hub.gate.set()
    first.join(timeout=scaled(READY_TIMEOUT))
    second.join(timeout=scaled(READY_TIMEOUT))

    assert not errors
    assert sorted(results) == ["first", "second"]
    assert sorted(results["first"]) == sorted(f.local for f in BGE_M3_SPEC.files)
    assert results["second"] == [], "the second caller found the directory complete"
    cdn_gets = [p for s, m, p in hub.requests if s == "cdn"]
    assert len(cdn_gets) == len(set(cdn_gets)) == 2  # model.onnx and tokenizer.json, once each


def test_a_running_download_is_logged_with_its_progress(
    tmp_path: Path, hub: FakeHub, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="keymem_daemon")
    monkeypatch.setattr(download, "PROGRESS_LOG_INTERVAL", 0.0)

    ensure_model(BGE_M3_SPEC, tmp_path / "m", endpoint=hub.url, timeout=HUB_TIMEOUT)

    lines = keymem_records(caplog)
    assert any(line.startswith("downloading bge-m3 model.onnx: ") and line.endswith("/22.9 MB")
               for line in lines), lines
    assert any(line.startswith("downloaded bge-m3 model.onnx: 22.9 MB") for line in lines)
    assert lines[-1].startswith("fetched bge-m3: model.onnx, tokenizer.json")


# ----------------------------------------------------------------------------------------
# The reranker


@pytest.fixture
def reranker_dir(tmp_path: Path, minilm: dict[str, bytes], cross_encoder: bytes) -> Path:
    return model_dir(tmp_path / "reranker", reranker_files(cross_encoder, minilm))


TEXTS = [
    "nothing to see here",
    "a banana and an apple",
    "cherry pie",
    "apple",
    "banana bread with a lot of other words around it so it runs longer than the rest",
]
# apple 3, banana 2, cherry 1, summed: what the graph computes for TEXTS.
EXPECTED = [0.0, 5.0, 1.0, 3.0, 2.0]


def test_the_reranker_returns_the_graphs_scores_and_ignores_padding(reranker_dir: Path) -> None:
    reranker = OnnxReranker(reranker_dir, threads=1)

    scores = reranker.score("query without weighted words", TEXTS)

    assert scores == pytest.approx(EXPECTED)
    ranked = sorted(range(len(TEXTS)), key=lambda i: -scores[i])
    assert ranked == [1, 3, 4, 2, 0]
    assert reranker.score("q", []) == []


def test_the_reranker_keeps_order_across_batches_and_cuts_long_texts(reranker_dir: Path) -> None:
    reranker = OnnxReranker(reranker_dir, threads=1)
    texts = TEXTS * 7  # more than one batch of 16, of mixed lengths
    long_text = "word " * 200 + "apple"  # the apple lies past the 512-character cut

    scores = reranker.score("apple", [*texts, long_text])

    # The query's own "apple" counts 3 in every pair.
    assert scores[:-1] == pytest.approx([e + 3.0 for e in EXPECTED * 7])
    assert scores[-1] == pytest.approx(3.0)


def test_the_manager_with_rerank_false_never_loads(tmp_path: Path, reranker_dir: Path) -> None:
    manager = RerankerManager(settings_for(tmp_path, closed_port_url(), rerank="false",
                                           rerank_model_path=reranker_dir))
    manager.start()

    assert manager.score("q", TEXTS) is None
    assert manager.status()["state"] == "disabled"
    assert manager.status()["ranking"] == "fused"


def test_the_manager_never_waits_for_a_download_and_scores_once_it_finished(
    tmp_path: Path, hub: FakeHub
) -> None:
    progress = DownloadProgress()
    settings = settings_for(tmp_path, hub.url, rerank="auto")
    manager = RerankerManager(settings, progress)
    hub.gate.clear()  # the CDN holds the model until the test lets it go
    try:
        started = time.monotonic()
        first = manager.score("apple", TEXTS)
        elapsed = time.monotonic() - started

        assert first is None
        # It did not wait for the download: the hub holds the model until the gate opens,
        # and the answer came before the download timeout could have ended a wait.
        assert progress.get(RERANKER_SPEC.name).state != "done"
        assert elapsed < settings.download_timeout, elapsed
        wait_for(lambda: progress.get(RERANKER_SPEC.name).state == "downloading", 5, message="download")
        status = manager.status()
        assert status["state"] == "downloading" and status["ranking"] == "fused"
        assert status["download"]["state"] == "downloading"
        assert manager.score("apple", TEXTS) is None

        hub.gate.set()
        wait_for(lambda: manager.score("q", TEXTS) is not None, READY_TIMEOUT, message="reranker ready")
    finally:
        hub.gate.set()
        manager.close()

    assert manager.score("q", TEXTS) == pytest.approx(EXPECTED)
    assert manager.status()["ranking"] == "reranker"
    assert progress.get(RERANKER_SPEC.name).state == "done"
    assert (settings.models_dir / RERANKER_SPEC.name / "model.onnx").is_file()
    print(f"\nreranker score() while downloading returned in {elapsed * 1000:.1f} ms")


def test_the_manager_uses_a_cached_model_without_any_request(
    tmp_path: Path, hub: FakeHub, reranker_dir: Path
) -> None:
    manager = RerankerManager(settings_for(tmp_path, hub.url, rerank_model_path=reranker_dir))
    manager.start()
    wait_for(lambda: manager.state == "ready", READY_TIMEOUT, message="reranker ready")
    manager.close()

    assert manager.score("q", TEXTS) == pytest.approx(EXPECTED)
    assert hub.requests == []


def test_the_manager_offline_stays_fused_and_logs_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="keymem_daemon")
    manager = RerankerManager(settings_for(tmp_path, closed_port_url(), rerank="auto"))

    assert manager.score("q", TEXTS) is None
    wait_for(lambda: manager.state == "failed", 5, message="the fetch to fail")
    for _ in range(20):
        assert manager.score("q", TEXTS) is None
    manager.close()

    lines = keymem_records(caplog)
    assert len(lines) == 1, lines
    assert "bge-reranker-v2-m3 unavailable" in lines[0] and "cannot connect" in lines[0]
    status = manager.status()
    assert status["state"] == "failed" and status["ranking"] == "fused"
    assert 0 < status["retry_in_s"] <= 600


def test_the_manager_retries_after_its_backoff_only(
    tmp_path: Path, hub: FakeHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keymem_daemon")
    now = [1000.0]
    manager = RerankerManager(settings_for(tmp_path, hub.url, rerank="true"),
                              clock=lambda: now[0], retry_backoff=600.0)
    hub.fail_status = 503
    manager.start()
    wait_for(lambda: manager.state == "failed", 5, message="the fetch to fail")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 503" in warnings[0].getMessage()

    hub.fail_status = None
    hub.reset()
    now[0] += 599.0
    assert manager.score("q", TEXTS) is None
    assert manager.state == "failed" and hub.requests == [], "no retry inside the backoff"

    now[0] += 2.0
    assert manager.score("q", TEXTS) is None  # starts the retry, does not wait for it
    wait_for(lambda: manager.state == "ready", READY_TIMEOUT, message="the retry to succeed")
    manager.close()
    assert manager.score("q", TEXTS) == pytest.approx(EXPECTED)


def test_a_reranker_that_fails_to_run_is_dropped_then_reloaded_after_the_backoff(
    tmp_path: Path, hub: FakeHub, reranker_dir: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="keymem_daemon")
    now = [0.0]
    manager = RerankerManager(
        settings_for(tmp_path, hub.url, rerank_model_path=reranker_dir),
        clock=lambda: now[0], retry_backoff=60.0,
    )
    manager.start()
    wait_for(lambda: manager.state == "ready", READY_TIMEOUT, message="reranker ready")

    def broken(self: OnnxReranker, query: str, texts: object) -> list[float]:
        raise RuntimeError("onnxruntime: bad alloc")

    monkeypatch.setattr(OnnxReranker, "score", broken)
    assert manager.score("q", TEXTS) is None
    assert manager.status()["state"] == "failed"
    assert manager.score("q", TEXTS) is None
    failures = [m for m in keymem_records(caplog) if "failed to run" in m]
    assert len(failures) == 1

    monkeypatch.undo()
    now[0] += 61.0
    manager.start()
    wait_for(lambda: manager.state == "ready", READY_TIMEOUT, message="reranker reloaded")
    manager.close()
    assert manager.score("q", TEXTS) == pytest.approx(EXPECTED)
    # The reload re-checked the files with the hub (a run failure may mean a bad file).
    assert hub.requested("HEAD")


def test_closing_the_manager_stops_a_download_quietly(
    tmp_path: Path, hub: FakeHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keymem_daemon")
    manager = RerankerManager(settings_for(tmp_path, hub.url, download_timeout=1.0))
    hub.gate.clear()  # the CDN never sends the model while the test runs
    try:
        manager.start()
        wait_for(lambda: bool(hub.requested("GET")), 5, message="the download to start")
        started = time.monotonic()
        manager.close()
        elapsed = time.monotonic() - started
    finally:
        hub.gate.set()

    assert elapsed < 1.0 + scaled(SLACK), elapsed
    assert manager.state == "absent"
    assert manager.score("q", TEXTS) is None, "a closed manager starts nothing"
    assert not [m for m in keymem_records(caplog) if "unavailable" in m]
    assert not list((tmp_path / "data").rglob("*.part"))


def test_downloaded_files_are_not_left_writable_by_others(tmp_path: Path, hub: FakeHub) -> None:
    ensure_model(BGE_M3_SPEC, tmp_path / "m", endpoint=hub.url, timeout=HUB_TIMEOUT)

    mode = os.stat(tmp_path / "m" / "model.onnx").st_mode
    assert not mode & 0o002
