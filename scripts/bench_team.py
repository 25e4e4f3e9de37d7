"""Team memory's store layer, measured: the PostgreSQL repository beside the SQLite store in
the same run, and how fast a change reaches another daemon's change-log follower.

    python scripts/bench_team.py [--writes 300] [--out bench-out/team.json]

Starts a throwaway PostgreSQL cluster as the tests do (tests/pg_cluster.py: initdb on a free
port under a temp dir, as the unprivileged postgres user when run as root; fsync off, as
there). Then, for each backend, ``--writes`` write units each storing one memory with a key,
a link and its lexical-index row (what a remember writes, without the engine), and as many
read units fetching one memory with its links; and, on PostgreSQL, the delay from a write's
COMMIT through repository A to its arrival at a ChangeFollower (the other daemon), p50/p95.
Baseline: the SQLite store's figures.

Then, over HTTP (``--memories`` seeded, ``--samples`` timed calls; 0 skips it): a SQLite
daemon and two daemons A and B on one PostgreSQL database (``KEYMEM_STORE_URL``, separate
data dirs), each seeded with the same memories (through A for the shared store): remember
and recall p50/p95 through each, and the propagation delay -- from sending a remember to A
until a recall through B returns that memory -- p50/p95. Not yet measured: 3-4 daemons,
100k memories, daemon RSS, and a new daemon's load time from the server.
Targets from the issue: remember p95 <= 30 ms; recall within 1.5x of SQLite; propagation
p95 <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import random
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

from bench_daemon import Daemon, call, memory, timed  # noqa: E402
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


PROPAGATION_POLL = 0.005
"""Seconds between recalls through B while waiting for A's memory (a recall takes ~10 ms)."""
PROPAGATION_TIMEOUT = 30.0


def _http_figures(daemon: Daemon, rng: random.Random, memories: int, samples: int, seed: bool) -> dict[str, float]:
    with daemon.client() as client:
        if seed:
            for start in range(0, memories, 100):
                items = [memory(rng, i) for i in range(start, min(memories, start + 100))]
                if call(client, "remember_batch", {"items": items})["failed"]:
                    raise RuntimeError(f"seeding failed at {start}")
        counter = [memories + rng.randrange(10**9)]

        def remember() -> None:
            counter[0] += 1
            call(client, "remember", memory(rng, counter[0]))

        remember_ms = timed(remember, samples)
        recall_ms = timed(lambda: call(client, "recall", {"query": rng.choice(["deploy", "cache", "Mina budget",
                                                                              "release 2.4 helm charts"])}), samples)
    return {"remember_p50_ms": percentile(remember_ms, 0.5), "remember_p95_ms": percentile(remember_ms, 0.95),
            "recall_p50_ms": percentile(recall_ms, 0.5), "recall_p95_ms": percentile(recall_ms, 0.95)}


def _http_propagation(a: Daemon, b: Daemon, rounds: int) -> dict[str, float]:
    delays = []
    with a.client() as to_a, b.client() as to_b:
        for i in range(rounds):
            marker = f"zq{i}x{random.randrange(10**6)}"
            started = time.perf_counter()
            saved = call(to_a, "remember", {"content": f"the propagation probe {marker} was saved through daemon a",
                                            "keys": [f"probe {marker}"]})["saved"]
            deadline = time.monotonic() + PROPAGATION_TIMEOUT
            while saved not in json.dumps(call(to_b, "recall", {"query": f"propagation probe {marker}"})):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{saved} never reached daemon b")
                time.sleep(PROPAGATION_POLL)
            delays.append((time.perf_counter() - started) * 1000)
    return {"http_propagation_p50_ms": percentile(delays, 0.5), "http_propagation_p95_ms": percentile(delays, 0.95)}


def _over_http(url: str, memories: int, samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keymem-bench-team-") as tmp:
        sqlite, a, b = Daemon(Path(tmp) / "sqlite"), Daemon(Path(tmp) / "a"), Daemon(Path(tmp) / "b")
        for daemon in (a, b):
            daemon.env["KEYMEM_STORE_URL"] = url
        started: list[Daemon] = []
        try:
            for daemon in (sqlite, a, b):
                daemon.start()
                started.append(daemon)
            out: dict[str, Any] = {
                "sqlite": _http_figures(sqlite, random.Random(7), memories, samples, seed=True),
                "postgresql_a": _http_figures(a, random.Random(7), memories, samples, seed=True),
                "postgresql_b": _http_figures(b, random.Random(8), memories, samples, seed=False),
            }
            out.update(_http_propagation(a, b, samples))
        finally:
            for daemon in started:
                daemon.stop()
    out["ratios"] = {f"{name}_{k}": round(out[name][k] / out["sqlite"][k], 2)
                     for name in ("postgresql_a", "postgresql_b") for k in out["sqlite"] if out["sqlite"][k]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--memories", type=int, default=2000, help="seeded before the HTTP figures (0: skip them)")
    parser.add_argument("--samples", type=int, default=100, help="timed HTTP calls of each kind")
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
        http = _over_http(cluster.url_for("keymem_owner", cluster.create_database()), args.memories, args.samples) \
            if args.memories else None
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
    if http is not None:
        result["http"] = http
        print(f"over HTTP, {args.memories} memories, {args.samples} calls each:")
        for name in ("sqlite", "postgresql_a", "postgresql_b"):
            f = http[name]
            print(f"  {name:13} remember p50 {f['remember_p50_ms']:.1f} ms  p95 {f['remember_p95_ms']:.1f} ms   "
                  f"recall p50 {f['recall_p50_ms']:.1f} ms  p95 {f['recall_p95_ms']:.1f} ms")
        print("  ratios (postgresql / sqlite): " + ", ".join(f"{k} {v}" for k, v in http["ratios"].items()))
        print(f"  propagation remember via A -> recalled via B: p50 {http['http_propagation_p50_ms']:.0f} ms  "
              f"p95 {http['http_propagation_p95_ms']:.0f} ms (target p95 <= 1000 ms)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
