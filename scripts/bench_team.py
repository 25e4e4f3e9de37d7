"""Team memory's store layer, measured: the PostgreSQL repository beside the SQLite store in
the same run, and how fast a change reaches another daemon's change-log follower.

    python scripts/bench_team.py [--writes 300] [--out bench-out/team.json]

Starts a throwaway PostgreSQL cluster as the tests do (tests/pg_cluster.py: initdb on a free
port under a temp dir, as the unprivileged postgres user when run as root; fsync off, as
there). Then, for each backend, ``--writes`` write units each storing one memory with a key,
a link and its lexical-index row (what a remember writes, without the engine), and as many
read units fetching one memory with its links; and, on PostgreSQL, the delay from a write's
COMMIT through repository A to its arrival at a ChangeFollower (the other daemon), p50/p95.
Baseline: the SQLite store's figures. Daemon-level figures (HTTP remember/recall, 2-4
daemons, 100k memories, load time) wait for the daemon to serve from PostgreSQL (issue 22).
Targets from the issue: remember p95 <= 30 ms; propagation p95 <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from measure import percentile  # noqa: E402
from pg_cluster import find_bindir, start_cluster, stop_cluster, unprivileged_user  # noqa: E402

from keymem_daemon.engine.ports import KeyRow, MemoryRow  # noqa: E402
from keymem_daemon.store.postgres import changes  # noqa: E402
from keymem_daemon.store.postgres.repository import PostgresRepository  # noqa: E402
from keymem_daemon.store.sqlite.database import Store  # noqa: E402

VECTOR = b"\0" * 2048  # a 512-d float32 vector, as the default embedder's


def _remember(i: int) -> Any:
    def fn(w: Any) -> None:
        w.insert_key(KeyRow(id=f"k{i}", concept=f"concept {i}", norm=f"concept {i}", compact=f"concept{i}",
                            key_type="concept", vector=VECTOR, created_at=float(i)))
        w.insert_memory(MemoryRow(id=f"m{i}", content=f"memory number {i} about concept {i}", dedup_hash=f"h{i}",
                                  namespace="proj", at=float(i), observed_at=None, decay_profile="standard",
                                  source={"agent": "bench"}, expires_at=None, vector=VECTOR))
        w.link(f"k{i}", f"m{i}", 1.0, False)
        w.index_memory(f"m{i}", f"memory number {i} concept {i}", f"concept {i}")
    return fn


def _measure(store: Any, writes: int) -> dict[str, float]:
    write_ms, read_ms = [], []
    for i in range(writes):
        started = time.perf_counter()
        store.write(_remember(i))
        write_ms.append((time.perf_counter() - started) * 1000)
    for i in range(writes):
        started = time.perf_counter()
        store.read(lambda r, i=i: (r.memory(f"m{i}"), r.links_of(f"m{i}")))
        read_ms.append((time.perf_counter() - started) * 1000)
    return {"write_p50_ms": percentile(write_ms, 0.5), "write_p95_ms": percentile(write_ms, 0.95),
            "read_p50_ms": percentile(read_ms, 0.5), "read_p95_ms": percentile(read_ms, 0.95)}


def _propagation(url: str, writes: int) -> dict[str, float]:
    arrived: dict[str, float] = {}
    lock = threading.Lock()

    def on_changes(batch: list[changes.Change]) -> None:
        now = time.perf_counter()
        with lock:
            for change in batch:
                arrived.setdefault(change.id, now)

    repo = PostgresRepository.open(url)
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = changes.horizon(conn)
    follower = changes.ChangeFollower(url, cursor, on_changes)
    follower.start()
    delays = []
    try:
        for i in range(writes):
            memory_id = f"p{i}"
            committed = time.perf_counter()
            repo.write(lambda w, memory_id=memory_id: w.insert_memory(MemoryRow(
                id=memory_id, content=memory_id, dedup_hash=memory_id, namespace="proj", at=0.0, observed_at=None,
                decay_profile="standard", source={}, expires_at=None, vector=VECTOR)))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with lock:
                    if memory_id in arrived:
                        break
                time.sleep(0.0005)
            with lock:
                delays.append((arrived.get(memory_id, float("inf")) - committed) * 1000)
    finally:
        follower.stop()
        repo.close()
    return {"propagation_p50_ms": percentile(delays, 0.5), "propagation_p95_ms": percentile(delays, 0.95)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("PostgreSQL is not installed (see tests/pg_cluster.py)")
    cluster = start_cluster(bindir, unprivileged_user())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            sqlite_store = Store.open(Path(tmp) / "keymem.db")
            try:
                sqlite = _measure(sqlite_store, args.writes)
            finally:
                sqlite_store.close()
        repo = PostgresRepository.open(cluster.url)
        try:
            postgres = _measure(repo, args.writes)
        finally:
            repo.close()
        database = cluster.create_database()
        propagation = _propagation(cluster.url_for("keymem_owner", database), min(args.writes, 200))
    finally:
        stop_cluster(cluster)
    result = {"writes": args.writes, "sqlite": sqlite, "postgresql": postgres, **propagation,
              "ratios": {k: round(postgres[k] / sqlite[k], 2) for k in sqlite if sqlite[k]}}
    for name, figures in (("sqlite", sqlite), ("postgresql", postgres)):
        print(f"{name:10}  write p50 {figures['write_p50_ms']:.2f} ms  p95 {figures['write_p95_ms']:.2f} ms   "
              f"read p50 {figures['read_p50_ms']:.2f} ms  p95 {figures['read_p95_ms']:.2f} ms")
    print("ratios (postgresql / sqlite): " + ", ".join(f"{k} {v}" for k, v in result["ratios"].items()))
    print(f"propagation A -> B follower: p50 {propagation['propagation_p50_ms']:.1f} ms  "
          f"p95 {propagation['propagation_p95_ms']:.1f} ms (target p95 <= 1000 ms)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
