"""Benchmark the daemon process the way hosts use it: a real ``keymemd`` over HTTP.

Measures
- cold start to ready (``python -m keymem_daemon run`` until ``/health`` says ready),
- resident memory at idle (empty store) and at 10k memories,
- HTTP round-trip p50/p95 of ``remember`` and ``recall`` at 10k memories (one client),
- requests per second with 4 concurrent clients (recall, and remember),
- resident memory under load: ``--mixed-clients`` (16) clients, each its own connection,
  mixing remember, recall and ``/v1/inject`` for ``--seconds``; RSS sampled every 50 ms
  (peak and after), next to the one-client figure of the same run as the baseline, with
  the daemon's thread count and its anonymous / file-backed split (``smaps_rollup``),
against the targets: ready <= 3 s, RSS <= 400 MB at 10k (also under load), remember/recall
p95 <= 30 ms.

    python scripts/bench_daemon.py            # the full run (10k memories)
    python scripts/bench_daemon.py --memories 2000 --json

Runs on a temporary data directory with the reranker off and no network.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import httpx

from keymem_daemon import runtime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import percentile, rss_mb  # noqa: E402

TARGET_READY_S: Final = 3.0
TARGET_RSS_MB: Final = 400.0
TARGET_P95_MS: Final = 30.0
READY_TIMEOUT: Final = 60.0
BATCH: Final = 100
LOAD_CLIENTS: Final = 4
MIXED_CLIENTS: Final = 16
RSS_SAMPLE_S: Final = 0.05

TOPICS: Final = [
    ("deploy", "배포"),
    ("database", "데이터베이스"),
    ("editor", "에디터"),
    ("coffee", "커피"),
    ("travel", "여행"),
    ("python", "파이썬"),
    ("schedule", "일정"),
    ("budget", "예산"),
    ("testing", "테스트"),
    ("security", "보안"),
    ("music", "음악"),
    ("running", "달리기"),
    ("kubernetes", "쿠버네티스"),
    ("review", "리뷰"),
    ("meeting", "회의"),
    ("release", "릴리스"),
    ("cache", "캐시"),
    ("logging", "로깅"),
]
PEOPLE: Final = ["Mina", "Joon", "Sora", "Alex", "Priya", "Dana", "Kenji", "Lea", "Omar", "Yuna"]
VERBS: Final = [
    "prefers",
    "decided on",
    "switched to",
    "keeps forgetting",
    "wants to try",
    "asked about",
    "recommended",
    "is responsible for",
    "scheduled",
    "reviewed",
]
THINGS: Final = [
    "the staging cluster",
    "Postgres 16",
    "a blue-green rollout",
    "vim keybindings",
    "the Friday sync",
    "cold brew",
    "the Jeju trip",
    "pytest fixtures",
    "the Q3 budget",
    "rotating API keys",
    "a lo-fi playlist",
    "the 10k race",
    "helm charts",
    "the RFC draft",
    "release 2.4",
    "a Redis cache",
    "structured logs",
    "the on-call rota",
]


def memory(rng: random.Random, i: int) -> dict[str, Any]:
    topic, korean = rng.choice(TOPICS)
    person = rng.choice(PEOPLE)
    content = f"{person} {rng.choice(VERBS)} {rng.choice(THINGS)} for {topic} (note {i})"
    keys = [topic, korean, person, f"{topic}-{i % 50}"]
    return {
        "content": content,
        "keys": keys,
        "key_types": {person: "name"},
        "namespace": f"project-{i % 5}",
    }


class Daemon:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYMEM_", "CLAUDE_", "CODEX_"))}
        self.env.update(
            {
                "HOME": str(root),
                "KEYMEM_DATA_DIR": str(self.data_dir),
                "KEYMEM_RERANK": "false",
                "KEYMEM_HF_ENDPOINT": "http://127.0.0.1:9",
                "HF_HUB_OFFLINE": "1",
                "KEYMEM_LOG_LEVEL": "warning",
            }
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.info: runtime.DaemonInfo | None = None

    def start(self, timeout: float = READY_TIMEOUT) -> float:
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "keymem_daemon", "run", "--background"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.info = runtime.wait_until_ready(self.data_dir, timeout=timeout, process=self.process)
        return time.perf_counter() - started

    def client(self) -> httpx.Client:
        assert self.info is not None
        return httpx.Client(base_url=self.info.url, headers=self.info.headers, timeout=120)

    def stop(self) -> None:
        if self.info is not None and self.process is not None:
            runtime.stop_daemon(self.info, self.data_dir)
            self.process.wait(timeout=60)


def call(client: httpx.Client, tool: str, arguments: dict[str, Any]) -> Any:
    response = client.post(f"/v1/tools/{tool}", json={"arguments": arguments})
    response.raise_for_status()
    body = response.json()
    if body["is_error"]:
        raise RuntimeError(f"{tool}: {body['result']}")
    return body["result"]


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def throughput(make: Callable[[int], Callable[[], Any]], clients: int, seconds: float) -> float:
    counts = [0] * clients
    stop = threading.Event()

    def worker(index: int) -> None:
        fn = make(index)
        while not stop.is_set():
            fn()
            counts[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - started)


def memory_split(pid: int) -> dict[str, float]:
    """Anonymous and file-backed resident MB (``/proc/<pid>/smaps_rollup``) and threads."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("Anonymous", "Rss"):
            out[f"{name.lower()}_mb"] = round(int(value.split()[0]) / 1024, 1)
    out["file_mb"] = round(out["rss_mb"] - out["anonymous_mb"], 1)
    out["threads"] = len(list(Path(f"/proc/{pid}/task").iterdir()))
    return out


def mixed_load(daemon: Daemon, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads, each with its own connection, cycling remember / recall / inject,
    while a sampler records the daemon's RSS; the peak and the figure after."""
    assert daemon.process is not None
    pid = daemon.process.pid
    peak = [rss_mb(pid)]
    stop = threading.Event()
    errors: list[str] = []

    def sample() -> None:
        while not stop.wait(RSS_SAMPLE_S):
            peak[0] = max(peak[0], rss_mb(pid))

    def mixed_worker(index: int) -> Callable[[], Any]:
        local = daemon.client()
        r = random.Random(1000 + index)
        queries = [f"what does {p} think about {t}?" for p in PEOPLE for t, _ in TOPICS]
        step = [20_000_000 * (index + 1)]

        def fn() -> None:
            step[0] += 1
            try:
                if step[0] % 3 == 0:
                    call(local, "remember", memory(r, step[0]))
                elif step[0] % 3 == 1:
                    call(local, "recall", {"query": r.choice(queries)})
                else:
                    local.post("/v1/inject", json={"prompt": r.choice(queries) + " I need it now."}).raise_for_status()
            except (httpx.HTTPError, RuntimeError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

        return fn

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rps = throughput(mixed_worker, clients, seconds)
    finally:
        stop.set()
        sampler.join()
    return {
        "clients": clients,
        "requests_per_s": round(rps, 1),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "rss_peak_mb": round(peak[0], 1),
        "rss_after_mb": round(rss_mb(pid), 1),
        **memory_split(pid),
    }


def run(memories: int, samples: int, seconds: float, starts: int, mixed_clients: int = MIXED_CLIENTS
        ) -> dict[str, Any]:
    rng = random.Random(7)
    out: dict[str, Any] = {"memories": memories}
    with tempfile.TemporaryDirectory(prefix="keymem-bench-") as tmp:
        cold = []
        for i in range(starts):
            d = Daemon(Path(tmp) / f"cold-{i}")
            cold.append(d.start())
            d.stop()
        out["ready_s"] = {
            "median": round(statistics.median(cold), 2),
            "max": round(max(cold), 2),
            "runs": [round(c, 2) for c in cold],
        }

        daemon = Daemon(Path(tmp) / "main")
        daemon.start()
        assert daemon.process is not None
        with daemon.client() as client:
            client.get("/v1/stats")
            out["rss_idle_mb"] = round(rss_mb(daemon.process.pid), 1)

            loaded = time.perf_counter()
            for start in range(0, memories, BATCH):
                items = [memory(rng, i) for i in range(start, min(memories, start + BATCH))]
                result = call(client, "remember_batch", {"items": items})
                if result["failed"]:
                    raise RuntimeError(f"batch at {start}: {result}")
            out["load_s"] = round(time.perf_counter() - loaded, 1)
            out["stored"] = client.get("/v1/stats").json()["memories"]

            counter = [memories]

            def remember() -> None:
                counter[0] += 1
                call(client, "remember", memory(rng, counter[0]))

            queries = [f"what does {p} think about {t}?" for p in PEOPLE for t, _ in TOPICS]

            def recall() -> None:
                call(client, "recall", {"query": rng.choice(queries)})

            for _ in range(20):  # warm-up: first calls pay one-time costs (analyzers, caches)
                recall()
                remember()
            rem = timed(remember, samples)
            rec = timed(recall, samples)
            out["remember_ms"] = {
                "p50": round(percentile(rem, 0.5), 1),
                "p95": round(percentile(rem, 0.95), 1),
            }
            out["recall_ms"] = {
                "p50": round(percentile(rec, 0.5), 1),
                "p95": round(percentile(rec, 0.95), 1),
            }

        def recall_worker(index: int) -> Callable[[], Any]:
            local = daemon.client()
            r = random.Random(index)
            queries = [f"what does {p} think about {t}?" for p in PEOPLE for t, _ in TOPICS]
            return lambda: call(local, "recall", {"query": r.choice(queries)})

        def remember_worker(index: int) -> Callable[[], Any]:
            local = daemon.client()
            r = random.Random(100 + index)
            seq = [10_000_000 * (index + 1)]

            def fn() -> None:
                seq[0] += 1
                call(local, "remember", memory(r, seq[0]))

            return fn

        out["recall_rps_4_clients"] = round(throughput(recall_worker, LOAD_CLIENTS, seconds), 1)
        out["remember_rps_4_clients"] = round(throughput(remember_worker, LOAD_CLIENTS, seconds), 1)
        out["rss_10k_mb"] = round(rss_mb(daemon.process.pid), 1)
        out["rss_10k_split"] = memory_split(daemon.process.pid)
        out["mixed"] = mixed_load(daemon, mixed_clients, seconds) if mixed_clients else None
        daemon.stop()
    out["targets"] = {
        "ready<=3s": out["ready_s"]["median"] <= TARGET_READY_S,
        "rss<=400MB": out["rss_10k_mb"] <= TARGET_RSS_MB,
        "remember_p95<=30ms": out["remember_ms"]["p95"] <= TARGET_P95_MS,
        "recall_p95<=30ms": out["recall_ms"]["p95"] <= TARGET_P95_MS,
    }
    if out["mixed"] is not None:
        out["targets"]["rss_under_load<=400MB"] = out["mixed"]["rss_peak_mb"] <= TARGET_RSS_MB
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=200, help="timed calls per operation")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each throughput run")
    parser.add_argument("--starts", type=int, default=3, help="cold starts to time")
    parser.add_argument("--mixed-clients", type=int, default=MIXED_CLIENTS,
                        help="clients of the mixed remember/recall/inject load (0: skip it)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.memories, args.samples, args.seconds, args.starts, args.mixed_clients)
    if args.json:
        print(json.dumps(result))
        return
    r = result
    ready, rem, rec = r["ready_s"], r["remember_ms"], r["recall_ms"]
    rows = [
        (
            "cold start to ready",
            f"{ready['median']:.2f} s median (max {ready['max']:.2f}, {ready['runs']})",
        ),
        ("RSS idle (empty store)", f"{r['rss_idle_mb']:.0f} MB"),
        (
            f"load {r['memories']} memories",
            f"{r['load_s']:.1f} s via remember_batch ({r['stored']} stored)",
        ),
        (f"RSS at {r['memories']} memories", f"{r['rss_10k_mb']:.0f} MB"),
        ("remember over HTTP", f"p50 {rem['p50']:.1f} ms, p95 {rem['p95']:.1f} ms"),
        ("recall over HTTP", f"p50 {rec['p50']:.1f} ms, p95 {rec['p95']:.1f} ms"),
        (
            f"{LOAD_CLIENTS} concurrent clients",
            f"recall {r['recall_rps_4_clients']:.1f} req/s, remember {r['remember_rps_4_clients']:.1f} req/s",
        ),
    ]
    split = r["rss_10k_split"]
    rows.append(("  of which", f"{split['anonymous_mb']:.0f} MB anonymous, {split['file_mb']:.0f} MB file-backed, "
                               f"{split['threads']:.0f} threads"))
    if r["mixed"] is not None:
        m = r["mixed"]
        rows += [
            (f"{m['clients']} clients, mixed load", f"{m['requests_per_s']:.1f} req/s, {m['errors']} errors"
             + (f" (first: {m['first_error']})" if m["first_error"] else "")),
            ("  RSS under it", f"peak {m['rss_peak_mb']:.0f} MB, after {m['rss_after_mb']:.0f} MB "
                               f"({m['rss_peak_mb'] / r['rss_10k_mb']:.2f}x the one-client figure)"),
            ("  of which", f"{m['anonymous_mb']:.0f} MB anonymous, {m['file_mb']:.0f} MB file-backed, "
                           f"{m['threads']:.0f} threads"),
        ]
    rows.append(("targets", ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in r["targets"].items())))
    for label, value in rows:
        print(f"{label:<28}{value}")


if __name__ == "__main__":
    main()
