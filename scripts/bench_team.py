"""Team memory measured: PostgreSQL daemons beside a SQLite daemon, in the same run.

    python scripts/bench_team.py                                   # 10k and 100k memories, 2 daemons
    python scripts/bench_team.py --sizes 2000 --daemons 3 --samples 50 --writes 100   # a short run

Starts a throwaway PostgreSQL cluster as the tests do (tests/pg_cluster.py: initdb on a free
port under a temp dir, as the unprivileged postgres user when run as root; fsync off, as
there).

1. Store level: ``--writes`` write units each storing one memory with a key, a link and its
   lexical-index row (what a remember writes, without the engine), and as many read units,
   on the SQLite store and on the PostgreSQL repository; and the delay from a COMMIT through
   repository A to its arrival at a ChangeFollower (another daemon's), p50/p95.
2. Over HTTP, for each of ``--sizes``: a store of that many memories is built once in
   process through the engine's import (keys embedded by the real embedder, memory vectors
   derived from their keys' so that 100k memories need no 100k embeddings) into a SQLite
   file, and copied table by table into a fresh PostgreSQL database with COPY. Then a SQLite
   daemon on a copy of that file (the baseline) and ``--daemons`` (2-4) daemons on the one
   PostgreSQL database (``KEYMEM_STORE_URL``, each its own data dir) start: time to ready
   and the time each took to load its in-memory tables (its log's "loaded ... in"); remember
   and recall p50/p95 through each (``--samples`` calls, taken in turns across the daemons so
   that a load swinging by the minute weighs on all alike), with the ratio to SQLite's; the
   propagation delay from a remember sent to daemon A until a recall through each other
   daemon returns it, p50/p95; and each daemon's RSS afterwards.

Targets (issue 22): remember p95 <= 30 ms; recall within 1.5x of SQLite; propagation p95 <=
1 s; a new daemon loads 100k memories from the server in <= 10 s.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_daemon import Daemon, call, memory  # noqa: E402
from measure import percentile, rss_mb  # noqa: E402
from pg_cluster import find_bindir, start_cluster, stop_cluster, unprivileged_user  # noqa: E402

from keymem_daemon.config import Settings  # noqa: E402
from keymem_daemon.engine import transfer  # noqa: E402
from keymem_daemon.engine.graph import MemoryGraph  # noqa: E402
from keymem_daemon.engine.ports import KeyRow, MemoryRow  # noqa: E402
from keymem_daemon.inference.embedders import load_embedder_or_default  # noqa: E402
from keymem_daemon.store import opening  # noqa: E402
from keymem_daemon.store.postgres import changes  # noqa: E402
from keymem_daemon.store.postgres.offline import REPLICA_FILE  # noqa: E402
from keymem_daemon.store.postgres.repository import PostgresRepository  # noqa: E402
from keymem_daemon.store.postgres.resume import POSITION  # noqa: E402
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
QUERIES = ["deploy", "cache", "Mina budget", "release 2.4 helm charts", "what does Joon think about coffee?",
           "배포 일정", "who is responsible for the on-call rota"]
# The tables a store's export holds, in an order their foreign keys accept (SQLite's names
# and columns are PostgreSQL's: the schemas are the same).
COPIED_TABLES = ("meta", "keys", "aliases", "memories", "links", "relations", "alias_candidates")
READY_TIMEOUT = 600.0
"""Seconds a daemon may take to load a 100k store on a machine shared by many (its figure is
measured, not bounded, here)."""
LOADED = re.compile(r"loaded (\d+) keys and (\d+) memory vectors in ([0-9.]+) s")


def build_sqlite(path: Path, size: int) -> float:
    """A SQLite store of ``size`` memories (bench_daemon's generator) through the engine's
    import: each distinct key embedded once, each memory's vector the normalised sum of its
    keys' (an embedding per memory would take longer than everything measured). Seconds."""
    started = time.perf_counter()
    rng = random.Random(7)
    items = [memory(rng, i) for i in range(size)]
    with tempfile.TemporaryDirectory() as home:
        settings = Settings.from_env({"KEYMEM_DATA_DIR": home, "HOME": home, "KEYMEM_RERANK": "false"})
        embedder, _ = load_embedder_or_default(settings)
        concepts = sorted({key for item in items for key in item["keys"]})
        vectors = dict(zip(concepts, embedder.embed(concepts), strict=True))
        key_ids = {c: f"k{i}" for i, c in enumerate(concepts)}
        kinds = {key: kind for item in items for key, kind in item["key_types"].items()}

        def b64(vector: Any) -> str:
            return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()

        memories, links = [], []
        for i, item in enumerate(items):
            body = np.sum([vectors[k] for k in item["keys"]], axis=0)
            memories.append({"id": f"m{i}", "content": item["content"], "namespace": item["namespace"],
                             "created_at": 1.7e9 + i, "vector": b64(body / np.linalg.norm(body))})
            links += [{"key_id": key_ids[k], "memory_id": f"m{i}", "weight": 1.0, "auto": False}
                      for k in item["keys"]]
        data = {"format": transfer.FORMAT, "version": transfer.VERSION, "embedder": embedder.fingerprint,
                "keys": [{"id": key_ids[c], "concept": c, "key_type": kinds.get(c, "concept"), "created_at": 1.7e9,
                          "aliases": [], "vector": b64(vectors[c])} for c in concepts],
                "memories": memories, "links": links, "relations": [], "alias_candidates": []}
        graph = MemoryGraph.over(opening.open_sqlite(settings, path), embedder, settings)
        try:
            transfer.import_data(graph, data)
        finally:
            graph.close()
    return time.perf_counter() - started


def copy_to_postgres(path: Path, url: str) -> float:
    """The SQLite store at ``path`` into the empty PostgreSQL database at ``url``: keymem's
    schema (PostgresRepository.open), then each table with COPY, the lexical index's tokens
    from FTS5's table, with the change-log triggers off (nobody follows a store being built)
    and the identity counters moved past the copied rowids. Seconds."""
    started = time.perf_counter()
    PostgresRepository.open(url).close()
    lite = sqlite3.connect(path)
    try:
        with psycopg.connect(url) as conn:
            for table in COPIED_TABLES:
                conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(sql.Identifier(table)))
            for table in COPIED_TABLES:
                columns = [r[1] for r in lite.execute(f"PRAGMA table_info({table})")]
                copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
                    sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
                with conn.cursor().copy(copy_sql) as copy:
                    for row in lite.execute(f"SELECT {', '.join(columns)} FROM {table}"):  # noqa: S608 - our names
                        copy.write_row(row)
            with conn.cursor().copy("COPY memory_fts (memory_id, content_tokens, key_tokens) FROM STDIN") as copy:
                for row in lite.execute("SELECT m.id, f.content_tokens, f.key_tokens FROM memory_fts f "
                                        "JOIN memories m ON m.rowid = f.rowid"):
                    copy.write_row(row)
            for table in ("keys", "memories"):
                conn.execute(sql.SQL("SELECT setval(pg_get_serial_sequence({}, 'rowid'), "
                                     "(SELECT COALESCE(max(rowid), 0) + 1 FROM {}), false)").format(
                    sql.Literal(table), sql.Identifier(table)))
            for table in COPIED_TABLES:
                conn.execute(sql.SQL("ALTER TABLE {} ENABLE TRIGGER USER").format(sql.Identifier(table)))
            # One change in the log, as any store that was written to has: a replica records its
            # position by the newest change it saw (store/postgres/resume.py).
            conn.execute("INSERT INTO meta(name, value) VALUES ('bench_built', now()::text)")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
    finally:
        lite.close()
    return time.perf_counter() - started


def _http_figures(daemons: dict[str, Daemon], samples: int) -> dict[str, dict[str, float]]:
    """Remember and recall p50/p95 through each daemon, the calls taken in turns (one through
    each daemon, then the next round): on a machine whose load swings by the minute, every
    daemon's figures are measured under the same load, so their ratios hold."""
    clients = {name: daemon.client() for name, daemon in daemons.items()}
    try:
        rngs = {name: random.Random(7 + i) for i, name in enumerate(daemons)}
        counters = {name: 10**7 + rngs[name].randrange(10**9) for name in daemons}

        def remember(name: str) -> None:
            counters[name] += 1
            call(clients[name], "remember", memory(rngs[name], counters[name]))

        def recall(name: str) -> None:
            call(clients[name], "recall", {"query": rngs[name].choice(QUERIES)})

        times: dict[str, dict[str, list[float]]] = {name: {"remember": [], "recall": []} for name in daemons}
        for kind, fn in (("remember", remember), ("recall", recall)):
            for _ in range(5):  # warm-up: first calls pay one-time costs (connections, caches)
                for name in daemons:
                    fn(name)
            for _ in range(samples):
                for name in daemons:
                    started = time.perf_counter()
                    fn(name)
                    times[name][kind].append((time.perf_counter() - started) * 1000)
    finally:
        for client in clients.values():
            client.close()
    return {name: {f"{kind}_{p}_ms": percentile(t[kind], q) for kind in ("remember", "recall")
                   for p, q in (("p50", 0.5), ("p95", 0.95))} for name, t in times.items()}


def _http_propagation(a: Daemon, b: Daemon, rounds: int) -> dict[str, float]:
    delays = []
    with a.client() as to_a, b.client() as to_b:
        for i in range(rounds):
            marker = f"zq{i}x{random.randrange(10**6)}"
            started = time.perf_counter()
            saved = call(to_a, "remember", {"content": f"the propagation probe {marker} was saved through daemon a",
                                            "keys": [f"probe {marker}"], "namespace": "project-0"})["saved"]
            deadline = time.monotonic() + PROPAGATION_TIMEOUT
            while saved not in json.dumps(call(to_b, "recall", {"query": f"propagation probe {marker}",
                                                                "namespace": "project-0"})):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{saved} never reached daemon b")
                time.sleep(PROPAGATION_POLL)
            delays.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": percentile(delays, 0.5), "p95_ms": percentile(delays, 0.95)}


def _start(daemon: Daemon) -> dict[str, float]:
    """Start ``daemon``: seconds to ready, and the seconds its log says loading its tables took."""
    daemon.env["KEYMEM_LOG_LEVEL"] = "info"
    ready = daemon.start(timeout=READY_TIMEOUT)
    log = (daemon.data_dir / "logs" / "daemon.log").read_text(errors="replace")
    found = LOADED.findall(log)
    return {"ready_s": round(ready, 2), "load_tables_s": float(found[-1][2]) if found else float("nan"),
            "vectors_loaded": int(found[-1][1]) if found else 0}


def seed_store(size: int, tmp: Path, seed_dir: Path | None) -> tuple[Path, float]:
    """The SQLite store of ``size`` memories (``build_sqlite``), and seconds spent building it:
    kept as ``seed-SIZE.db`` in ``seed_dir`` and reused from there when given (100k memories
    take minutes to build, against ~2 minutes for the COPY and seconds for what is measured)."""
    if seed_dir is None:
        seed = tmp / "seed.db"
        return seed, build_sqlite(seed, size)
    seed = seed_dir / f"seed-{size}.db"
    if seed.exists():
        return seed, 0.0
    seed_dir.mkdir(parents=True, exist_ok=True)
    partial = seed.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    spent = build_sqlite(partial, size)
    partial.rename(seed)
    return seed, spent


def _replica_position(data_dir: Path) -> bool:
    """Whether a daemon's replica has recorded its position (store/postgres/resume.py)."""
    path = data_dir / REPLICA_FILE
    if not path.exists():
        return False
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT 1 FROM meta WHERE name = ?", (POSITION,)).fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def joining(url: str, tmp: Path, baseline_src: Path | None) -> dict[str, Any]:
    """Daemons joining the team on the store at ``url``, one after the other: with the code at
    ``baseline_src`` (when given: another checkout's package directory's parent, put first on
    PYTHONPATH), with this code, and this one again restarted on its data dir once its
    replica recorded its position (it resumes from it). Each: seconds to ready, to load its
    tables (its log), and its RSS once ready."""
    out: dict[str, Any] = {}
    runs: list[tuple[str, Path | None]] = [("this", None)]
    if baseline_src is not None:
        runs.insert(0, ("baseline", baseline_src))
    for name, src in runs:
        daemon = Daemon(tmp / f"join-{name}")
        daemon.env["KEYMEM_STORE_URL"] = url
        if src is not None:
            daemon.env["PYTHONPATH"] = str(src)
        # ``python -m`` puts the working directory first on sys.path: not this checkout's.
        here = Path.cwd()
        os.chdir(tmp)
        try:
            out[name] = {**_start(daemon), "rss_mb": round(rss_mb(daemon.process.pid), 1) if daemon.process else 0}
            if name == "this":
                deadline = time.monotonic() + READY_TIMEOUT
                while not _replica_position(daemon.data_dir):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the joining daemon's replica never recorded its position")
                    time.sleep(PROPAGATION_POLL * 20)
                daemon.stop()
                out["restarted"] = {**_start(daemon), "rss_mb": round(rss_mb(daemon.process.pid), 1)
                                    if daemon.process else 0}
        finally:
            daemon.stop()
            os.chdir(here)
    if "baseline" in out:
        out["ratio_load_tables"] = round(out["this"]["load_tables_s"] / out["baseline"]["load_tables_s"], 2)
        out["ratio_ready"] = round(out["this"]["ready_s"] / out["baseline"]["ready_s"], 2)
    return out


def _at_size(url: str, size: int, daemons: int, samples: int, seed_dir: Path | None, baseline_src: Path | None,
             load_only: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keymem-bench-team-") as tmp:
        seed, built = seed_store(size, Path(tmp), seed_dir)
        out: dict[str, Any] = {"memories": size, "build_sqlite_s": round(built, 1),
                               "copy_to_postgresql_s": round(copy_to_postgres(seed, url), 1)}
        if load_only:
            out["joining"] = joining(url, Path(tmp), baseline_src)
            return out
        sqlite = Daemon(Path(tmp) / "sqlite")
        sqlite.data_dir.mkdir(parents=True)
        shutil.copy(seed, sqlite.data_dir / "keymem.db")
        team = [Daemon(Path(tmp) / f"pg{i}") for i in range(daemons)]
        for daemon in team:
            daemon.env["KEYMEM_STORE_URL"] = url
        started: list[Daemon] = []
        try:
            starts = {}
            for name, daemon in (("sqlite", sqlite), *((f"postgresql_{i}", d) for i, d in enumerate(team))):
                starts[name] = _start(daemon)
                started.append(daemon)
            out["starts"] = starts
            figures = _http_figures({"sqlite": sqlite, **{f"postgresql_{i}": d for i, d in enumerate(team)}},
                                    samples)
            out["http"] = figures
            out["ratios"] = {name: {k: round(f[k] / figures["sqlite"][k], 2) for k in f if figures["sqlite"][k]}
                             for name, f in figures.items() if name != "sqlite"}
            out["propagation"] = {f"postgresql_0->postgresql_{i}": _http_propagation(team[0], team[i], samples)
                                  for i in range(1, daemons)}
            out["rss_mb"] = {name: round(rss_mb(d.process.pid), 1) for name, d in
                             (("sqlite", sqlite), *((f"postgresql_{i}", d) for i, d in enumerate(team)))
                             if d.process is not None}
        finally:
            for daemon in started:
                daemon.stop()
        # Daemons that join the team now load everything the others wrote (a join that fails
        # is reported with the figures above, not instead of them).
        try:
            out["joining"] = joining(url, Path(tmp), baseline_src)
        except RuntimeError as exc:
            out["joining"] = {"failed": str(exc)}
    return out


def _print_joining(r: dict[str, Any]) -> None:
    if "failed" in r["joining"]:
        print(f"  a daemon joining: {r['joining']['failed']}")
    for name, what in (("baseline", "baseline code"), ("this", "this code"), ("restarted", "this code, restarted")):
        f = r["joining"].get(name)
        if f is not None:
            print(f"  a daemon joining ({what}): ready in {f['ready_s']:.2f} s, its tables ({f['vectors_loaded']:,} "
                  f"memory vectors) loaded in {f['load_tables_s']:.2f} s (target <= 10 s), RSS {f['rss_mb']:.0f} MB")
    if "ratio_load_tables" in r["joining"]:
        j = r["joining"]
        print(f"  this code / baseline: load x{j['ratio_load_tables']}, ready x{j['ratio_ready']}")


def _print_size(r: dict[str, Any]) -> None:
    print(f"\n{r['memories']:,} memories (built in {r['build_sqlite_s']} s, copied to PostgreSQL in "
          f"{r['copy_to_postgresql_s']} s)")
    if "http" not in r:
        _print_joining(r)
        return
    print(f"  {'daemon':14} {'ready s':>8} {'load s':>7} {'remember p50/p95 ms':>20} {'recall p50/p95 ms':>18} "
          f"{'ratio rem p95':>13} {'ratio rec p50/p95':>17} {'RSS MB':>7}")
    for name, f in r["http"].items():
        start, ratio = r["starts"][name], r["ratios"].get(name)
        ratios = (f"{ratio['remember_p95_ms']:>13.2f} {ratio['recall_p50_ms']:>8.2f} / {ratio['recall_p95_ms']:<6.2f}"
                  if ratio else f"{'(baseline)':>13} {'':>17}")
        print(f"  {name:14} {start['ready_s']:>8.2f} {start['load_tables_s']:>7.2f} "
              f"{f['remember_p50_ms']:>9.1f} / {f['remember_p95_ms']:<8.1f} {f['recall_p50_ms']:>8.1f} / "
              f"{f['recall_p95_ms']:<7.1f} {ratios} {r['rss_mb'].get(name, 0):>7.0f}")
    for pair, p in r["propagation"].items():
        print(f"  propagation {pair}: p50 {p['p50_ms']:.0f} ms, p95 {p['p95_ms']:.0f} ms (target p95 <= 1000)")
    _print_joining(r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300, help="store-level write and read units (0: skip)")
    parser.add_argument("--sizes", default="10000,100000", help="store sizes measured over HTTP, comma-separated")
    parser.add_argument("--daemons", type=int, default=2, choices=(2, 3, 4), help="PostgreSQL daemons on one server")
    parser.add_argument("--samples", type=int, default=100, help="timed HTTP calls of each kind per daemon")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seed-dir", type=Path, help="keep the built stores here (seed-SIZE.db) and reuse them")
    parser.add_argument("--baseline-src", type=Path,
                        help="a checkout of other code (e.g. git archive main) whose joining daemon is measured beside")
    parser.add_argument("--load-only", action="store_true",
                        help="only the joining daemons' load (no HTTP figures, no store-level units)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    bindir = find_bindir()
    if bindir is None:
        sys.exit("PostgreSQL is not installed (see tests/pg_cluster.py)")
    result: dict[str, Any] = {"load_average_at_start": os.getloadavg(), "daemons": args.daemons}
    cluster = start_cluster(bindir, unprivileged_user())
    try:
        if args.writes and not args.load_only:
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
            propagation = _propagation(cluster.url_for("keymem_owner", cluster.create_database()),
                                       min(args.writes, 200))
            result["store"] = {"sqlite": sqlite, "postgresql": postgres, **propagation,
                               "ratios": {k: round(postgres[k] / sqlite[k], 2) for k in sqlite if sqlite[k]}}
            for name, figures in (("sqlite", sqlite), ("postgresql", postgres)):
                print(f"store {name:10}  write p50 {figures['write_p50_ms']:.2f} ms  p95 {figures['write_p95_ms']:.2f} "
                      f"ms   read p50 {figures['read_p50_ms']:.2f} ms  p95 {figures['read_p95_ms']:.2f} ms")
            ratios = result["store"]["ratios"]
            print("  ratios (postgresql / sqlite): " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
            print(f"  commit on A -> B's change follower: p50 {propagation['propagation_p50_ms']:.1f} ms  "
                  f"p95 {propagation['propagation_p95_ms']:.1f} ms")
        result["sizes"] = []
        for size in sizes:
            figures = _at_size(cluster.url_for("keymem_owner", cluster.create_database()), size, args.daemons,
                               args.samples, args.seed_dir, args.baseline_src, args.load_only)
            result["sizes"].append(figures)
            _print_size(figures)
    finally:
        stop_cluster(cluster)
    result["load_average_at_end"] = os.getloadavg()
    print(f"\nload average (1/5/15 min): at start {' '.join(f'{v:.1f}' for v in result['load_average_at_start'])}, "
          f"at end {' '.join(f'{v:.1f}' for v in result['load_average_at_end'])} (2 cores)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
