"""LoCoMo evidence recall: keymem's retrieval paths against flat baselines, in one run.

    python scripts/bench_locomo.py [--data ../shared/data/locomo] [--convs 0,1,2,3,4]
                                   [--daemon | --in-process] [--out bench-out/locomo.jsonl]

For each conversation the facts an assistant saved (with the keys an LLM agent chose for
them, and the date of their session as ``observed_at``) are stored through the tool API,
one namespace per conversation. Every question of categories 1-4 is then asked through:
  inject        POST /v1/inject as the prompt hook calls it (top 10, after its relevance floor)
  recall_mem    the recall_memories tool (hybrid recall, no reinforcement)
  agent_walk    recall -> its top keys -> read_key handles in rank order (an agent's walk)
  bm25          BM25 over fact content (rank-bm25, keymem's tokenizer)     -- baseline
  dense         cosine of the default embedder over fact content           -- baseline
A question is a hit at k when one of the top-k facts cites one of its evidence turns.
Chars@5 is the text a path hands the agent for its top 5. The data is test data only
(CC BY-NC 4.0): it is read from ../shared, never copied into the package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_client import Client, open_client  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo"
KS = (1, 5, 10)
PATHS = ("inject", "recall_mem", "agent_walk", "bm25", "dense")


def session_time(text: str) -> str:
    """'1:56 pm on 8 May, 2023' -> ISO-8601 UTC."""
    parsed = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=timezone.utc)
    return parsed.isoformat()


def load(data: Path, convs: Sequence[int]) -> tuple[dict[int, list[dict[str, Any]]], dict[int, list[dict[str, Any]]]]:
    facts = json.loads((data / "facts.json").read_text(encoding="utf-8"))
    conversations = json.loads((data / "conversations.json").read_text(encoding="utf-8"))
    by_conv: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for fact in facts:
        if fact["conv"] in convs:
            by_conv[fact["conv"]].append(fact)
    questions: dict[int, list[dict[str, Any]]] = {}
    for conv in conversations:
        if conv["conv"] in convs:
            questions[conv["conv"]] = [q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4)]
    return by_conv, questions


class Baselines:
    """BM25 and dense cosine over the facts of one conversation."""

    def __init__(self, facts: Sequence[dict[str, Any]], tokenize: Callable[[str], list[str]], embed: Any) -> None:
        from rank_bm25 import BM25Okapi

        self.ids = [f["id"] for f in facts]
        self.bm25 = BM25Okapi([tokenize(f["content"]) for f in facts])
        self.tokenize = tokenize
        self.embed = embed
        self.vectors = embed([f["content"] for f in facts])

    def rank_bm25(self, query: str, k: int) -> list[str]:
        scores = self.bm25.get_scores(self.tokenize(query))
        return [self.ids[i] for i in np.argsort(-scores)[:k]]

    def rank_dense(self, query: str, k: int) -> list[str]:
        sims = self.vectors @ self.embed([query])[0]
        return [self.ids[i] for i in np.argsort(-sims)[:k]]


def agent_walk(client: Client, question: str, namespace: str, k: int) -> list[str]:
    """recall -> Top-1 preview, then read_key of the top keys with the question, in rank order."""
    recall = client.tool("recall", {"query": question, "context": question, "namespace": namespace, "top_k": 5})
    order: list[str] = []
    for preview in recall.get("memories", []):
        order.append(preview["id"])
    for key in recall.get("keys", [])[:3]:
        page = client.tool("read_key", {"key_id": key["key_id"], "query": question, "namespace": namespace,
                                        "limit": k})
        for handle in page.get("memories", []):
            if handle["memory_id"] not in order:
                order.append(handle["memory_id"])
    return order[:k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("KEYMEM_LOCOMO_DATA", DEFAULT_DATA)))
    parser.add_argument("--convs", default="0,1,2,3,4")
    parser.add_argument("--daemon", action="store_true", help="run a real daemon and use HTTP (default)")
    parser.add_argument("--in-process", action="store_true", help="call the service in this process")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "locomo.jsonl")
    parser.add_argument("--data-dir", type=Path, default=None, help="keymem data dir (default: a temp dir)")
    parser.add_argument("--hops", type=int, default=2, help="recall_memories hops (1-5)")
    args = parser.parse_args()
    convs = [int(c) for c in args.convs.split(",")]
    facts, questions = load(args.data, convs)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="keymem-locomo-"))
    started = time.perf_counter()
    with open_client(data_dir, in_process=args.in_process) as client:
        evidence_of: dict[str, set[str]] = {}
        content_of: dict[str, str] = {}
        id_map: dict[str, str] = {}
        for conv in convs:
            namespace = f"locomo-{conv}"
            for fact in facts[conv]:
                result = client.tool("remember", {"content": fact["content"], "keys": fact["keys"],
                                                  "namespace": namespace,
                                                  "observed_at": session_time(fact["session_date"])})
                mid = result["saved"]
                id_map[mid] = fact["id"]
                evidence_of[fact["id"]] = set(fact["evidence"])
                content_of[fact["id"]] = fact["content"]
        stored = time.perf_counter()
        print(f"stored {len(id_map)} facts in {stored - started:.1f} s", file=sys.stderr)

        from keymem_daemon.engine.text import default_analyzer
        from keymem_daemon.inference.embedders import UseEmbedder

        analyzer = default_analyzer()
        embedder = UseEmbedder()
        rows: list[dict[str, Any]] = []
        latency: dict[str, list[float]] = defaultdict(list)
        for conv in convs:
            namespace = f"locomo-{conv}"
            base = Baselines(facts[conv], analyzer.index_tokens, embedder.embed)
            for q in questions[conv]:
                gold = set(q["evidence"])
                ranked: dict[str, list[str]] = {}
                t0 = time.perf_counter()
                inj = client.inject({"prompt": q["question"], "namespace": namespace, "top_k": 10,
                                     "max_chars": 20000})
                latency["inject"].append(time.perf_counter() - t0)
                ranked["inject"] = [id_map[m["id"]] for m in inj["memories"]]
                t0 = time.perf_counter()
                hits = client.tool("recall_memories", {"query": q["question"], "namespace": namespace, "top_k": 10,
                                                       "reinforce": False, "hops": args.hops})
                latency["recall_mem"].append(time.perf_counter() - t0)
                ranked["recall_mem"] = [id_map[h["id"]] for h in hits]
                t0 = time.perf_counter()
                ranked["agent_walk"] = [id_map[m] for m in agent_walk(client, q["question"], namespace, 10)]
                latency["agent_walk"].append(time.perf_counter() - t0)
                ranked["bm25"] = base.rank_bm25(q["question"], 10)
                ranked["dense"] = base.rank_dense(q["question"], 10)
                row: dict[str, Any] = {"conv": conv, "question": q["question"], "category": q["category"],
                                       "evidence": sorted(gold),
                                       "answerable": any(evidence_of[f["id"]] & gold for f in facts[conv])}
                for path in PATHS:
                    ids = ranked[path]
                    first = next((i for i, fid in enumerate(ids) if evidence_of[fid] & gold), None)
                    row[path] = {"rank": first, "top": ids[:10],
                                 "chars5": sum(len(content_of[f]) for f in ids[:5])}
                rows.append(row)
    report(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    for path, values in latency.items():
        v = np.array(values) * 1000
        print(f"{path:10s} latency p50 {np.percentile(v, 50):6.1f} ms  p95 {np.percentile(v, 95):6.1f} ms",
              file=sys.stderr)
    print(f"per-question rows: {args.out}", file=sys.stderr)


def report(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Print the table; return {path: {"R@5": ..., ...}} for callers (the regression test)."""
    cats = sorted({r["category"] for r in rows})
    header = "path        " + "".join(f" c{c}R@5" for c in cats) + "   R@1   R@5  R@10  chars@5"
    print(f"{len(rows)} questions; answerable (some fact cites the evidence): "
          f"{np.mean([r['answerable'] for r in rows]):.3f}")
    print(header)
    out: dict[str, dict[str, float]] = {}
    for path in PATHS:
        def recall_at(sel: Sequence[dict[str, Any]], k: int, path: str = path) -> float:
            return float(np.mean([r[path]["rank"] is not None and r[path]["rank"] < k for r in sel])) if sel else 0.0

        line = f"{path:12s}"
        figures: dict[str, float] = {}
        for c in cats:
            value = recall_at([r for r in rows if r["category"] == c], 5)
            figures[f"c{c}R@5"] = value
            line += f" {value:6.3f}"
        for k in KS:
            figures[f"R@{k}"] = recall_at(rows, k)
            line += f" {figures[f'R@{k}']:5.3f}"
        figures["chars5"] = float(np.mean([r[path]["chars5"] for r in rows]))
        line += f"  {figures['chars5']:7.0f}"
        print(line)
        out[path] = figures
    return out


if __name__ == "__main__":
    main()
