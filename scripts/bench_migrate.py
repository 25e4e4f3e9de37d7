"""``keymemd migrate-store`` measured: memories per second into PostgreSQL, beside the time
``keymemd import`` takes to write the same export into a SQLite store, in the same run.

    python scripts/bench_migrate.py                      # 2,000 and 10,000 memories
    python scripts/bench_migrate.py --sizes 1000         # a short run

For each size: an export of that many memories (two keys each, one in ten memories related
to another) is imported into a fresh data directory with ``keymemd import`` (the baseline:
embedding included, timed from the CLI), then ``keymemd migrate-store --to URL`` copies that
SQLite store into a fresh database of a throwaway PostgreSQL cluster (tests/pg_cluster.py,
as the tests start it). Both are real CLI subprocesses, the import through a running daemon
(stopped before the migration). Printed: seconds and memories/s of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from daemon_helpers import isolated_env  # noqa: E402
from pg_cluster import OWNER, find_bindir, start_cluster, stop_cluster, unprivileged_user  # noqa: E402

CLI_TIMEOUT = 3600.0
"""One import or migration of the largest size on a loaded machine."""


def _export(size: int) -> dict[str, Any]:
    keys = max(10, size // 10)
    return {
        "format": "keymem-export", "version": 1,
        "keys": [{"id": f"k{k}", "concept": f"service area {k}"} for k in range(keys)],
        "memories": [{"id": f"m{i:06d}", "content": f"note {i}: service {i % keys} restarts after deploy {i}",
                      "namespace": "bench"} for i in range(size)],
        "links": [{"key_id": f"k{(i + j) % keys}", "memory_id": f"m{i:06d}"} for i in range(size) for j in (0, 1)],
        "relations": [{"from": f"m{i:06d}", "to": f"m{(i + 1) % size:06d}"} for i in range(0, size, 10)],
    }


def _keymemd(env: dict[str, str], *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "keymem_daemon", *args], env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"keymemd {' '.join(args[:1])} failed:\n{done.stderr}")
    return time.perf_counter() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 10_000])
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql)")
    cluster = start_cluster(bindir, unprivileged_user())
    try:
        for size in args.sizes:
            with tempfile.TemporaryDirectory(prefix="keymem-bench-migrate-") as tmp:
                env = isolated_env(Path(tmp))
                data = Path(tmp) / "export.json"
                data.write_text(json.dumps(_export(size)))
                _keymemd(env, "start")
                imported, _ = _keymemd(env, "import", str(data))
                _keymemd(env, "stop")
                url = cluster.url_for(OWNER, cluster.create_database())
                migrated, out = _keymemd(env, "migrate-store", "--to", url, "--json")
                report = json.loads(out)
                assert report["counts"]["memories"] == size, report
                print(f"{size} memories: keymemd import into SQLite {imported:.1f} s ({size / imported:.0f}/s); "
                      f"keymemd migrate-store into PostgreSQL {migrated:.1f} s ({size / migrated:.0f}/s, "
                      f"{migrated / imported:.2f}x the import), verified {report['sha256'][:12]}")
    finally:
        stop_cluster(cluster)


if __name__ == "__main__":
    main()
