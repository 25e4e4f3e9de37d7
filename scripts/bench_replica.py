"""The local read replica of a PostgreSQL store (store/postgres/offline.py), measured: how long
a daemon takes to fill it from the server and how big it is, at ``--memories`` (10k and 100k
by default), beside two baselines from the same run:

- **stream**: only reading the same rows from the server (what any copy costs at least);
- **in memory**: holding those rows in Python instead (the alternative to a file), its RSS growth.

    python scripts/bench_replica.py [--memories 10000 100000] [--out bench-out/replica.json]

Starts a throwaway PostgreSQL cluster as the tests do (tests/pg_cluster.py), seeds it through
bulk SQL (memories of ~150 characters, three keys each from a shared vocabulary, their
links and lexical-index rows), then fills a replica in a temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from pg_cluster import find_bindir, start_cluster, stop_cluster, unprivileged_user  # noqa: E402

from keymem_daemon.engine.ports import KeyRow  # noqa: E402
from keymem_daemon.store.postgres.offline import Replica, source_rows  # noqa: E402
from keymem_daemon.store.postgres.repository import PostgresRepository  # noqa: E402

VECTOR: Final = b"\0" * 2048  # a 512-d float32 vector, as the default embedder's
KEYS_PER_MEMORY: Final = 3
VOCABULARY: Final = 5000
"""Distinct keys the seeded memories share (a store's vocabulary grows far slower than its memories)."""
SEED_UNIT: Final = 10_000
"""Memories per seeding write unit."""
WORDS: Final = ("deploy", "staging", "database", "rotate", "vault", "ingress", "cluster", "release", "train",
                "backup", "monitor", "alert", "owner", "gateway", "schema", "migration", "queue", "worker")


def _seed(url: str, start: int, count: int) -> None:
    """Memories ``start`` .. ``start + count - 1`` with their links and index rows, in bulk SQL
    (the write units take ~20 ms a memory: minutes at 100k)."""
    words = " || ' ' || ".join(f"(ARRAY{list(WORDS)!r})[1 + (i * 7 + {j}) %% {len(WORDS)}]" for j in range(20))
    with psycopg.connect(url) as conn:
        conn.execute(f"""INSERT INTO memories(id, content, dedup_hash, namespace, created_at, updated_at,
                         last_confirmed_at, source, vector)
                         SELECT 'm' || i, 'memory ' || i || ': ' || {words}, 'h' || i, 'proj', i, i, i,
                                '{{"agent": "bench"}}', %s
                         FROM generate_series(%s::int, %s::int) AS i""".encode(), (VECTOR, start, start + count - 1))
        conn.execute(f"""INSERT INTO links(key_id, memory_id, weight, auto)
                         SELECT 'k' || ((i * 31 + j * 977) %% {VOCABULARY}), 'm' || i, 1.0, 0
                         FROM generate_series(%s::int, %s::int) AS i, generate_series(0, {KEYS_PER_MEMORY - 1}) AS j
                         ON CONFLICT DO NOTHING""".encode(), (start, start + count - 1))
        conn.execute(b"""INSERT INTO memory_fts(memory_id, content_tokens, key_tokens)
                        SELECT m.id, m.content, string_agg(l.key_id, ' ') FROM memories m
                        JOIN links l ON l.memory_id = m.id
                        WHERE m.rowid > (SELECT coalesce(max(rowid), 0) FROM memories) - %s
                        GROUP BY m.id, m.content""", (count,))


def _seed_keys(repo: PostgresRepository) -> None:
    def fn(w: Any) -> None:
        for k in range(VOCABULARY):
            w.insert_key(KeyRow(id=f"k{k}", concept=f"concept {k}", norm=f"concept {k}", compact=f"concept{k}",
                                key_type="concept", vector=VECTOR, created_at=float(k)))
    repo.write(fn)


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _measure(repo: PostgresRepository, work: Path, size: int) -> dict[str, Any]:
    # Baseline 1: streaming the rows only.
    started = time.perf_counter()

    def stream(conn: Any) -> int:
        return sum(len(chunk) for _, chunk in source_rows(conn))

    rows = repo.snapshot(stream)
    stream_s = time.perf_counter() - started
    # Baseline 2: the same rows held in Python.
    before = _rss_mb()

    def hold(conn: Any) -> list[Any]:
        return [row for _, chunk in source_rows(conn) for row in chunk]

    held = repo.snapshot(hold)
    in_memory_mb = _rss_mb() - before
    del held
    # The replica.
    path = work / f"replica-{size}.db"
    before = _rss_mb()
    started = time.perf_counter()
    replica = Replica.create(path, repo)
    replica.fill_in_background().join()
    fill_s = time.perf_counter() - started
    fill_rss = _rss_mb() - before
    assert replica.ready, "the fill failed (see the log)"
    replica.close()
    file_mb = sum(Path(f"{path}{s}").stat().st_size for s in ("", "-wal") if Path(f"{path}{s}").exists()) / 2**20
    return {"memories": size, "rows": rows, "stream_s": round(stream_s, 2), "fill_s": round(fill_s, 2),
            "fill_vs_stream": round(fill_s / stream_s, 1), "replica_mb": round(file_mb, 1),
            "in_memory_rss_mb": round(in_memory_mb, 1), "fill_rss_growth_mb": round(fill_rss, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("PostgreSQL is not installed (see tests/pg_cluster.py)")
    cluster = start_cluster(bindir, unprivileged_user())
    results = []
    try:
        repo = PostgresRepository.open(cluster.url)
        _seed_keys(repo)
        seeded = 0
        with tempfile.TemporaryDirectory(prefix="keymem-replica-bench-") as tmp:
            for size in sorted(args.memories):
                started = time.perf_counter()
                while seeded < size:
                    count = min(SEED_UNIT, size - seeded)
                    _seed(cluster.url, seeded, count)
                    seeded += count
                print(f"seeded {size} memories ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                result = _measure(repo, Path(tmp), size)
                results.append(result)
                print(json.dumps(result))
        repo.close()
    finally:
        stop_cluster(cluster)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
