"""Korean/English retrieval: keymem against SQLite FTS5 baselines, in one run.

    python scripts/bench_korean.py [--split all|dev|test] [--daemon | --in-process]

The set (tests/fixtures/ko_en_*.jsonl, written for this project) holds memories a coding
agent would keep -- preferences, decisions, people, deployments -- half Korean, half
English, with the 3-6 keys an agent gives them, and queries with gold memory ids: Korean
particles and endings, compounds, two-syllable nouns, NFD input, mixed-script tokens,
English->Korean and Korean->English through bilingual keys, plain queries, and questions
nothing answers. It prints Recall@5 over answerable queries and not-found accuracy (the
share of unanswerable queries that get nothing back) for:
  inject        POST /v1/inject as the prompt hook calls it (top 5)
  recall_mem    the recall_memories tool
  fts_unicode61 SQLite FTS5, unicode61 tokenizer, BM25 over content + keys  -- baseline
  fts_trigram   SQLite FTS5, trigram tokenizer, BM25 over content + keys    -- baseline
and Korean queries beside their English twins.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_client import Client, open_client  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
PATHS = ("inject", "recall_mem", "fts_unicode61", "fts_trigram")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class FtsBaseline:
    """BM25 over content + keys in an in-memory FTS5 table with the given tokenizer."""

    def __init__(self, memories: Sequence[dict[str, Any]], tokenizer: str) -> None:
        self.conn = sqlite3.connect(":memory:")
        self.conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(mid UNINDEXED, ns UNINDEXED, body, "
                          f"tokenize = '{tokenizer}')")
        self.conn.executemany("INSERT INTO t(mid, ns, body) VALUES (?, ?, ?)",
                              [(m["id"], m["namespace"], m["content"] + " " + " ".join(m["keys"]))
                               for m in memories])
        self.trigram = tokenizer == "trigram"

    def search(self, query: str, namespace: str, k: int) -> list[str]:
        text = unicodedata.normalize("NFC", query)
        if self.trigram:
            # Every 3-character window of each word, OR-ed: substring matching, as trigram does.
            grams = {w[i:i + 3] for w in text.split() for i in range(max(1, len(w) - 2)) if len(w) >= 3}
            terms = ['"' + g.replace('"', '""') + '"' for g in grams]
        else:
            words = "".join(c if c.isalnum() else " " for c in text).split()
            terms = ['"' + w.replace('"', '""') + '"' for w in words]
        if not terms:
            return []
        try:
            rows = self.conn.execute("SELECT mid FROM t WHERE t MATCH ? AND ns = ? ORDER BY bm25(t) LIMIT ?",
                                     (" OR ".join(terms), namespace, k)).fetchall()
        except sqlite3.OperationalError:
            return []
        return [r[0] for r in rows]


def run(client: Client, memories: Sequence[dict[str, Any]], queries: Sequence[dict[str, Any]]
        ) -> list[dict[str, Any]]:
    id_map: dict[str, str] = {}
    for m in memories:
        result = client.tool("remember", {"content": m["content"], "keys": m["keys"],
                                          "key_types": m.get("key_types") or {}, "namespace": m["namespace"]})
        id_map[result["saved"]] = m["id"]
    baselines = {"fts_unicode61": FtsBaseline(memories, "unicode61"), "fts_trigram": FtsBaseline(memories, "trigram")}
    rows = []
    for q in queries:
        ranked: dict[str, list[str]] = {}
        inj = client.inject({"prompt": q["query"], "namespace": q["namespace"], "top_k": 5, "max_chars": 20000})
        ranked["inject"] = [id_map[m["id"]] for m in inj["memories"]]
        hits = client.tool("recall_memories", {"query": q["query"], "namespace": q["namespace"], "top_k": 5,
                                               "reinforce": False})
        ranked["recall_mem"] = [id_map[h["id"]] for h in hits]
        for name, base in baselines.items():
            ranked[name] = base.search(q["query"], q["namespace"], 5)
        rows.append({**q, "ranked": ranked})
    return rows


def report(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    found = [r for r in rows if r["gold"]]
    missing = [r for r in rows if not r["gold"]]
    cats = sorted({r["category"] for r in found})
    print(f"{len(found)} answerable queries, {len(missing)} not-found queries")
    print(f"{'path':14s} {'R@5':>6s} {'notfound':>9s} " + " ".join(f"{c[:9]:>9s}" for c in cats))
    out: dict[str, dict[str, float]] = {}
    for path in PATHS:
        def r5(sel: Sequence[dict[str, Any]], path: str = path) -> float:
            return float(np.mean([bool(set(r["ranked"][path][:5]) & set(r["gold"])) for r in sel])) if sel else 0.0

        figures = {"R@5": r5(found),
                   "not_found": float(np.mean([not r["ranked"][path] for r in missing])) if missing else 0.0}
        for c in cats:
            figures[c] = r5([r for r in found if r["category"] == c])
        out[path] = figures
        print(f"{path:14s} {figures['R@5']:6.3f} {figures['not_found']:9.3f} "
              + " ".join(f"{figures[c]:9.3f}" for c in cats))
    by_id = {r["id"]: r for r in rows}
    twins = [(r, by_id[r["twin"]]) for r in found if r["lang"] == "ko" and r.get("twin") in by_id]
    if twins:
        print(f"\ntwins ({len(twins)} Korean queries with an English twin), R@5 Korean vs English:")
        for path in PATHS:
            ko = np.mean([bool(set(k["ranked"][path][:5]) & set(k["gold"])) for k, _ in twins])
            en = np.mean([bool(set(e["ranked"][path][:5]) & set(e["gold"])) for _, e in twins])
            out[path]["twins_ko"], out[path]["twins_en"] = float(ko), float(en)
            print(f"  {path:14s} ko {ko:.3f}  en {en:.3f}  gap {en - ko:+.3f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="all", choices=("all", "dev", "test"))
    parser.add_argument("--in-process", action="store_true", help="call the service in this process")
    parser.add_argument("--daemon", action="store_true", help="run a real daemon and use HTTP (default)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "korean.jsonl")
    args = parser.parse_args()
    memories = read_jsonl(FIXTURES / "ko_en_memories.jsonl")
    queries = [q for q in read_jsonl(FIXTURES / "ko_en_queries.jsonl") if args.split in ("all", q["split"])]
    with open_client(Path(tempfile.mkdtemp(prefix="keymem-korean-")), in_process=args.in_process) as client:
        rows = run(client, memories, queries)
    report(rows)
    misses = defaultdict(list)
    for r in rows:
        if r["gold"] and not set(r["ranked"]["inject"][:5]) & set(r["gold"]):
            misses[r["category"]].append(r["id"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    print(f"\ninject misses by category: {dict(misses)}\nper-query rows: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
