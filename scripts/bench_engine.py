"""Engine speed and memory at 1k, 10k and 100k memories (in-process, no HTTP).

    python scripts/bench_engine.py [--sizes 1000,10000,100000] [--ops 200]

For each size it bulk-loads a synthetic store (scripts/synthetic_store.py: realistic key
reuse, a third Korean), closes it, then measures:
  load       reopening the store (indexes rebuilt from SQLite), seconds, and RSS after it
  remember / recall / read_key / read_memory / recall_memories   p50 and p95 in ms
Each process measures one size, so RSS figures are not polluted by the previous size.
Baseline in the same run: one embedding of a short text (the floor of every query).
Targets on 2 cores: every operation p95 <= 20 ms at 10k; recall p95 <= 60 ms at 100k;
100k memories load in <= 5 s and <= 500 MB RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from measure import percentile, rss_mb  # noqa: E402

QUERIES = ("deployment schedule for the billing API", "which editor does the user prefer", "배포 롤백 절차",
           "kafka queue latency incident", "데이터베이스 마이그레이션 일정", "hiring budget meeting",
           "what did we decide about redis cache", "테스트 커버리지 기준", "on-call alerting rules", "module42 owner")


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p95 of durations in seconds, in milliseconds."""
    return {"p50": round(percentile(values, 0.50) * 1000, 2), "p95": round(percentile(values, 0.95) * 1000, 2)}


def build(size: int) -> tuple[Path, float]:
    """Bulk-load a synthetic store of ``size`` memories; returns its data dir and seconds."""
    from synthetic_store import generate

    from keymem_daemon.config import Settings
    from keymem_daemon.engine import transfer
    from keymem_daemon.engine.graph import MemoryGraph
    from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder, single_threaded_blas
    from keymem_daemon.store.opening import open_store

    single_threaded_blas()
    data = Path(tempfile.mkdtemp(prefix=f"keymem-bench-{size}-"))
    settings = Settings(data_dir=data, rerank="false")
    graph = MemoryGraph.over(open_store(settings), CachedEmbedder(UseEmbedder()), settings)
    t0 = time.perf_counter()
    transfer.import_data(graph, generate(size))
    seconds = time.perf_counter() - t0
    graph.close()
    return data, seconds


def measure(data: Path, ops: int) -> dict[str, Any]:
    """Open the store at ``data`` in this (fresh) process and time the operations."""
    from keymem_daemon import allocators
    from keymem_daemon.config import Settings
    from keymem_daemon.engine.graph import MemoryGraph
    from keymem_daemon.engine.reads.hybrid import hybrid_recall
    from keymem_daemon.engine.reads.recall import recall
    from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder, single_threaded_blas
    from keymem_daemon.store.opening import open_store

    # As the daemon does: allocator settings, one BLAS thread, the piece table on disk.
    allocators.configure()
    single_threaded_blas()
    settings = Settings(data_dir=data, rerank="false")
    embedder = CachedEmbedder(UseEmbedder(settings.models_dir))
    before = rss_mb()
    t0 = time.perf_counter()
    graph = MemoryGraph.over(open_store(settings), embedder, settings)
    graph.analyzer.preload_kiwi()  # the store holds Korean: the daemon loads Kiwi at start
    load = time.perf_counter() - t0
    after_load = rss_mb()
    rng = random.Random(1)
    times: dict[str, list[float]] = {k: [] for k in ("remember", "recall", "read_key", "read_memory",
                                                     "recall_memories")}
    t0 = time.perf_counter()
    embedder.inner.embed(["a fresh short text"])
    embed_once = time.perf_counter() - t0
    for i in range(ops):
        query = QUERIES[i % len(QUERIES)] + ("" if i < len(QUERIES) else f" {i}")
        t0 = time.perf_counter()
        request = graph.prepare(content=f"Benchmark note {i}: the team moved the job {i} to a new queue.",
                                keys=["benchmark", "queue", f"job{i}", "배포"])
        saved = graph.remember(request)
        times["remember"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = recall(graph, query, top_k=8)
        times["recall"].append(time.perf_counter() - t0)
        if result.keys:
            t0 = time.perf_counter()
            page = graph.read_key(result.keys[0].key_id, query=query, limit=10)
            times["read_key"].append(time.perf_counter() - t0)
            if page.memories:
                handle = page.memories[rng.randrange(len(page.memories))]
                t0 = time.perf_counter()
                graph.read_memory(handle.memory_id, via_key_id=result.keys[0].key_id)
                times["read_memory"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hybrid_recall(graph, query, top_k=5, reinforce=False)
        times["recall_memories"].append(time.perf_counter() - t0)
        assert getattr(saved, "saved", None)
    out = {"load_s": round(load, 2), "rss_before_open_mb": round(before), "rss_after_load_mb": round(after_load),
           "rss_after_ops_mb": round(rss_mb()), "embed_one_ms": round(embed_once * 1000, 2),
           **{name: percentiles(values) for name, values in times.items() if values}}
    graph.close()
    return out


def run_child(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env={**os.environ})
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{' '.join(args)} failed")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--build", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        data, seconds = build(args.build)
        print(json.dumps({"data": str(data), "build_s": round(seconds, 1)}))
        return
    if args.measure:
        print(json.dumps(measure(args.measure, args.ops)))
        return
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        built = run_child("--build", str(size))
        measured = run_child("--measure", built["data"], "--ops", str(args.ops))
        results.append({"size": size, "build_s": built["build_s"], **measured})
        print(json.dumps(results[-1]), file=sys.stderr)
    ops = ("remember", "recall", "read_key", "read_memory", "recall_memories")
    print(f"{'size':>7s} {'build s':>8s} {'load s':>7s} {'RSS MB':>7s} " + " ".join(f"{o:>17s}" for o in ops))
    for r in results:
        cells = " ".join(f"{r[o]['p50']:7.1f}/{r[o]['p95']:7.1f}ms" if o in r else f"{'-':>17s}" for o in ops)
        print(f"{r['size']:7d} {r['build_s']:8.1f} {r['load_s']:7.2f} {r['rss_after_load_mb']:7d} {cells}")
    print(f"(p50/p95; RSS right after opening the store; one short-text embedding: {results[0]['embed_one_ms']} ms)")


if __name__ == "__main__":
    main()
