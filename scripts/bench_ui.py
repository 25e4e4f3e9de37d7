"""The inspector's page data: how long each page's request takes at 10k memories.

    python scripts/bench_ui.py [--memories 10000] [--rounds 20] [--out bench-out/ui.json]

A fresh daemon (``keymemd start``, reranker off) on a temporary data dir is loaded with
``scripts/synthetic_store.py``'s memories through ``POST /v1/import``; a browser session is
opened through a login link, as ``keymemd ui`` does; then every page's data route under
``/ui/api`` is asked ``--rounds`` times over one kept-alive connection (client wall time,
so HTTP and JSON are included): search with a query, with a query and filters, without a
query (newest first), one memory, a hub key and a rare key, the key list, the graph around a
hub and around a memory, the activity feed and the health page. The baseline, measured in
the same run, is ``GET /v1/stats`` (a quick read with no page logic). Target: every page's
p95 <= 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from measure import percentile  # noqa: E402
from synthetic_store import generate  # noqa: E402

TARGET_P95_MS = 100.0
QUERIES = ["deployment database", "editor preference", "배포 롤백", "kafka latency incident", "postgres backup"]


def timed(client: httpx.Client, path: str, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = client.get(path)
        response.raise_for_status()
        response.json()
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keymem-bench-ui-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEYMEM_")}
        env.update(HOME=str(home), KEYMEM_DATA_DIR=str(Path(tmp) / "data"), KEYMEM_RERANK="false",
                   HF_HUB_OFFLINE="1", KEYMEM_BACKUP_INTERVAL="0")
        subprocess.run([sys.executable, "-m", "keymem_daemon", "start"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        try:
            info = json.loads((Path(tmp) / "data" / "daemon.json").read_text())
            base = f"http://127.0.0.1:{info['port']}"
            api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {info['token']}"}, timeout=600,
                               trust_env=False)
            started = time.perf_counter()
            with api.stream("POST", "/v1/import", content=json.dumps(generate(args.memories)),
                            headers={"Content-Type": "application/json"}) as response:
                lines = [json.loads(line) for line in response.iter_lines() if line.strip()]
            assert lines[-1]["event"] == "done", lines[-1]
            load_s = time.perf_counter() - started
            # Activity to show: a few writes and injections, as a day of use leaves.
            for i, query in enumerate(QUERIES * 4):
                api.post("/v1/inject", json={"prompt": f"How do we handle {query} this week?"})
                api.post("/v1/tools/remember", json={"arguments": {"content": f"Bench note {i} about {query}.",
                                                                   "keys": query.split()}})
            link = api.post("/v1/inspect/login-link").json()["url"]
            page = httpx.Client(base_url=base, timeout=600, trust_env=False)
            assert page.get(link[len(base):], follow_redirects=False).status_code == 303
            keys = page.get("/ui/api/keys?limit=500").json()["keys"]
            hub, rare = keys[0]["key_id"], keys[-1]["key_id"]
            memory = page.get("/ui/api/search?q=").json()["results"][0]["id"]
            paths = {
                "search": [f"/ui/api/search?q={q}" for q in QUERIES],
                "search+filters": [f"/ui/api/search?q={q}&status=fresh&namespace=default&decay_profile=standard"
                                   for q in QUERIES],
                "search newest": ["/ui/api/search?q=", "/ui/api/search?q=&key=" + keys[1]["concept"]],
                "memory": [f"/ui/api/memory/{memory}"],
                "key (hub)": [f"/ui/api/key/{hub}"],
                "key (rare)": [f"/ui/api/key/{rare}"],
                "keys": ["/ui/api/keys"],
                "graph (hub)": [f"/ui/api/graph/key/{hub}"],
                "graph (memory)": [f"/ui/api/graph/memory/{memory}"],
                "activity": ["/ui/api/activity?limit=100"],
                "health": ["/ui/api/health"],
            }
            baseline = timed(api, "/v1/stats", args.rounds)
            base_p50 = percentile(baseline, 0.5)
            results: dict[str, Any] = {"memories": args.memories, "load_s": round(load_s, 1),
                                       "baseline_stats_p50_ms": round(base_p50, 2), "pages": {}}
            print(f"{args.memories} memories loaded in {load_s:.1f} s; baseline GET /v1/stats p50 "
                  f"{base_p50:.1f} ms")
            print(f"{'page':<16} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'p50/base':>9}")
            worst = 0.0
            for name, urls in paths.items():
                samples = [t for url in urls for t in timed(page, url, max(1, args.rounds // len(urls)))]
                p50, p95 = percentile(samples, 0.5), percentile(samples, 0.95)
                worst = max(worst, p95)
                results["pages"][name] = {"p50_ms": round(p50, 2), "p95_ms": round(p95, 2),
                                          "max_ms": round(max(samples), 2), "n": len(samples)}
                print(f"{name:<16} {p50:8.1f} {p95:8.1f} {max(samples):8.1f} {p50 / base_p50:9.1f}")
            results["worst_p95_ms"] = round(worst, 2)
            print(f"worst page p95 {worst:.1f} ms (target <= {TARGET_P95_MS:.0f} ms): "
                  f"{'ok' if worst <= TARGET_P95_MS else 'OVER'}")
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=2))
        finally:
            subprocess.run([sys.executable, "-m", "keymem_daemon", "stop"], env=env, check=False,
                           stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
