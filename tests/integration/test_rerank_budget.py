"""The reranker's time budget: it measures its own speed, scores only the best candidates it
can finish in time, never queues behind another call for longer than its budget, and
recall and the push path each spend their own budget on it.

Two real ONNX graphs stand in for bge-reranker-v2-m3: the word-weight cross-encoder of
``fake_hub`` where the scores must be exact, and all-MiniLM-L6-v2 (int8, a real transformer
whose last output value serves as the logit) where the time a pair costs must be real.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import READY_TIMEOUT, DaemonFactory, scaled, wait_for
from fake_hub import build_cross_encoder, minilm_files, model_dir, reranker_files

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads import inject as push
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.recall import rank_key_members, recall
from keymem_daemon.engine.text import normalize
from keymem_daemon.inference.embedders import CachedEmbedder, Embedder, UseEmbedder
from keymem_daemon.inference.reranker import OnnxReranker, RerankerManager
from keymem_daemon.store.opening import open_sqlite

pytestmark = pytest.mark.timeout(120)

# Token ids in the MiniLM vocabulary and the test cross-encoder's weight for each.
APPLE, BANANA, CHERRY = 6207, 15212, 9115
WEIGHTS = {APPLE: 3.0, BANANA: 2.0, CHERRY: 1.0}
TEXTS = [f"{fruit} number {i} with a few more words to read" for i in range(12)
         for fruit in ("apple", "banana", "cherry")]


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_cross_encoder(WEIGHTS, vocab_size=30522)
    return model_dir(tmp_path_factory.mktemp("rerank") / "weights", reranker_files(model, minilm_files()))


@pytest.fixture(scope="module")
def transformer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    minilm = minilm_files()
    return model_dir(tmp_path_factory.mktemp("rerank") / "minilm", reranker_files(minilm["model.onnx"], minilm))


def cost_of(reranker: OnnxReranker, query: str, texts: list[str]) -> float:
    """Seconds the reranker needs for ``texts`` at its measured speed, with some room."""
    tokens = sum(len(reranker._tokenizer.encode(query, t).ids) for t in texts)
    return 1.5 * tokens / reranker.tokens_per_second


def test_loading_measures_a_speed_and_a_budget_scores_the_best_first_prefix(transformer_dir: Path) -> None:
    reranker = OnnxReranker(transformer_dir, threads=1)
    assert reranker.tokens_per_second > 0

    # A budget that fits about ten pairs scores a prefix of the candidates, in their order
    # (batched as a call with just that prefix would be, so the values are the same).
    some = reranker.score("q", TEXTS, budget=cost_of(reranker, "q", TEXTS[:10]))
    roomy = reranker.score("q", TEXTS, budget=60.0)

    assert 2 <= len(some) < len(TEXTS)
    assert some == reranker.score("q", TEXTS[: len(some)])
    assert roomy == reranker.score("q", TEXTS)
    # Time for about one pair: at most that one; no time: none.
    assert len(reranker.score("q", TEXTS, budget=cost_of(reranker, "q", TEXTS[:1]))) <= 1
    assert reranker.score("q", TEXTS, budget=0.0) == []


def test_a_real_transformer_stays_near_its_budget_and_learns_its_speed(transformer_dir: Path) -> None:
    reranker = OnnxReranker(transformer_dir, threads=1)
    texts = TEXTS * 3
    started = time.perf_counter()
    reranker.score("which fruit?", texts)
    full = time.perf_counter() - started
    budget = full / 4

    started = time.perf_counter()
    scored = reranker.score("which fruit?", texts, budget=budget)
    spent = time.perf_counter() - started

    # About a quarter of the pairs fit a quarter of the time; it may overrun by a batch's
    # misprediction, never by the whole remaining pool.
    assert 2 <= len(scored) < len(texts) / 2
    assert spent < full / 2, (spent, full)


def test_a_busy_reranker_is_not_waited_for_longer_than_the_budget(transformer_dir: Path) -> None:
    reranker = OnnxReranker(transformer_dir, threads=1)
    long_run = threading.Thread(target=reranker.score, args=("which fruit?", TEXTS * 8))
    long_run.start()
    try:
        wait_for(reranker._lock.locked, 5, message="the long run to hold the model")
        started = time.perf_counter()
        scored = reranker.score("which fruit?", TEXTS[:4], budget=0.05)
        waited = time.perf_counter() - started
        still_running = long_run.is_alive()
    finally:
        long_run.join()

    assert scored == []
    assert still_running, "the long run ended first: the test proved nothing"
    assert waited < 1.0, waited


# -- recall and the push path -------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return CachedEmbedder(UseEmbedder())


@pytest.fixture
def open_with(tmp_path: Path, embedder: Embedder, weights_dir: Path) -> Iterator[Callable[..., MemoryGraph]]:
    opened: list[tuple[MemoryGraph, RerankerManager | None]] = []

    def make(reranked: bool, **budgets: int) -> MemoryGraph:
        settings = Settings(data_dir=tmp_path / "data", rerank_model_path=weights_dir, rerank_threads=1,
                            rerank="true" if reranked else "false").replace(**budgets)
        manager = None
        if reranked:
            manager = RerankerManager(settings)
            manager.start()
            wait_for(lambda: manager.state == "ready", 20, message="the reranker to load")
        store = open_sqlite(settings, tmp_path / f"keymem{len(opened)}.db")
        graph = MemoryGraph.over(store, embedder, settings, reranker=manager)
        opened.append((graph, manager))
        for content in ("We bake cherry pie for the team lunch.", "Banana bread is the weekend dessert.",
                        "The office fruit bowl gets apple deliveries on Monday.",
                        "Dessert at the offsite was a cherry tart."):
            graph.remember(graph.prepare(content=content, keys=["dessert", "fruit"]))
        return graph

    yield make
    for graph, manager in opened:
        graph.close()
        if manager is not None:
            manager.close()


def order(graph: MemoryGraph, query: str) -> list[str]:
    hits = hybrid_recall(graph, query, top_k=4, reinforce=False).hits
    return [h.content for h in hits]


def pushed(graph: MemoryGraph, query: str) -> list[str]:
    return [m.content for m in push.inject(graph, query, scope=None, top_k=4, min_rel=0.0).memories]


def test_recall_follows_the_reranker_within_its_budget_and_the_push_path_within_its_own(
    open_with: Callable[..., MemoryGraph],
) -> None:
    query = "which dessert or fruit do we have?"
    fused = open_with(False)
    reranked = open_with(True, rerank_budget_ms=60_000, inject_rerank_budget_ms=0)
    no_time = open_with(True, rerank_budget_ms=0, inject_rerank_budget_ms=60_000)

    # The cross-encoder weighs apple 3, banana 2, cherry 1: its order, not the fused one.
    assert order(reranked, query)[:2] == ["The office fruit bowl gets apple deliveries on Monday.",
                                         "Banana bread is the weekend dessert."]
    assert order(fused, query) != order(reranked, query)
    # No budget: the fused order, although the model is ready.
    assert order(no_time, query) == order(fused, query)
    # The push path spends its own budget: none for the first store, plenty for the second.
    assert pushed(reranked, query) == pushed(fused, query)
    assert pushed(no_time, query)[:2] == order(reranked, query)[:2]


def test_a_keys_best_members_follow_the_reranker_within_the_tools_budget(
    open_with: Callable[..., MemoryGraph],
) -> None:
    query = "which dessert or fruit do we have?"

    def members(graph: MemoryGraph) -> list[str]:
        kid = graph.keys.by_norm(normalize("fruit"))
        assert kid is not None
        ranked, _ = rank_key_members(graph, kid, query, None, pool=30)
        return [m.memory.content for m in ranked]

    fused = open_with(False)
    reranked = open_with(True, rerank_budget_ms=60_000)
    no_time = open_with(True, rerank_budget_ms=0)

    # read_key and recall's passive Top-1 rank a key's members this way.
    assert members(reranked)[:2] == ["The office fruit bowl gets apple deliveries on Monday.",
                                     "Banana bread is the weekend dessert."]
    assert members(fused) != members(reranked)
    assert members(no_time) == members(fused)
    top = recall(reranked, query).memories[0].content
    assert top == "The office fruit bowl gets apple deliveries on Monday."


def test_a_daemon_with_a_ready_reranker_reports_its_speed_and_budgets(
    daemons: DaemonFactory, weights_dir: Path
) -> None:
    daemon = daemons.start(KEYMEM_RERANK="true", KEYMEM_RERANK_MODEL_PATH=str(weights_dir),
                           KEYMEM_INJECT_RERANK_BUDGET_MS="120")
    stats = daemon.client()

    def ready() -> dict[str, Any] | None:
        reranker: dict[str, Any] = stats.get("/v1/stats").json()["reranker"]
        return reranker if reranker["state"] == "ready" else None

    reranker = wait_for(ready, READY_TIMEOUT, message="the reranker to load")
    assert reranker["ranking"] == "reranker" and reranker["tokens_per_second"] > 0
    assert (reranker["budget_ms"], reranker["inject_budget_ms"]) == (500, 120)
    status = subprocess.run([sys.executable, "-m", "keymem_daemon", "status"], env=daemon.env,
                            capture_output=True, text=True, timeout=scaled(60), check=True).stdout
    assert f"{reranker['tokens_per_second']} tokens/s; within 500 ms for a tool call and 120 ms" in status

    daemon.remember("The office fruit bowl gets apple deliveries on Monday.", ["fruit", "office"])
    daemon.remember("Banana bread is the weekend dessert.", ["dessert", "banana"])
    pushed = stats.post("/v1/inject", json={"prompt": "when do apple deliveries come to the office?"}).json()
    assert [m["content"] for m in pushed["memories"]][:1] == ["The office fruit bowl gets apple deliveries on Monday."]
