"""Retrieval quality guards: a change that loses quality fails here.

Both run the benchmark code (scripts/bench_korean.py, scripts/bench_locomo.py) in process,
on a fresh store, with the real tokenizer and embedder. Thresholds sit a little below the
figures measured when they were set (in each assert's message), so noise does not trip
them but a real regression does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_korean  # noqa: E402
import bench_locomo  # noqa: E402
from bench_client import open_client  # noqa: E402


def test_the_korean_english_set_keeps_its_recall_and_its_silence_on_unanswerable_prompts(tmp_path: Path) -> None:
    memories = bench_korean.read_jsonl(bench_korean.FIXTURES / "ko_en_memories.jsonl")
    queries = bench_korean.read_jsonl(bench_korean.FIXTURES / "ko_en_queries.jsonl")
    with open_client(tmp_path / "data", in_process=True) as client:
        rows = bench_korean.run(client, memories, queries)
    figures = bench_korean.report(rows)
    recall, push = figures["recall_mem"], figures["inject"]
    assert recall["R@5"] >= 0.96, f"recall_memories R@5 {recall['R@5']:.3f} (measured 0.979)"
    assert push["not_found"] >= 0.87, f"push-path not-found accuracy {push['not_found']:.3f} (measured 0.938)"
    assert push["R@5"] >= 0.78, f"push-path R@5 {push['R@5']:.3f} (measured 0.807; 0.693 two stops before)"
    across = (push["en_to_ko"] + push["ko_to_en"]) / 2
    assert across >= 0.60, f"push path across languages {across:.3f} (measured 0.674; 0.478 before sound-alike words)"
    for path in (recall, push):
        assert path["twins_en"] - path["twins_ko"] <= 0.03, "Korean queries fell behind their English twins"
    for baseline in ("fts_unicode61", "fts_trigram"):
        assert recall["R@5"] >= figures[baseline]["R@5"] + 0.2, f"no longer well ahead of {baseline}"


@pytest.mark.skipif(not (bench_locomo.DEFAULT_DATA / "facts.json").exists(),
                    reason=f"LoCoMo test data not found at {bench_locomo.DEFAULT_DATA} (kept outside the repo)")
def test_one_locomo_conversation_keeps_keymem_ahead_of_the_flat_baselines(tmp_path: Path) -> None:
    from keymem_daemon.engine.text import default_analyzer
    from keymem_daemon.inference.embedders import UseEmbedder

    facts, questions = bench_locomo.load(bench_locomo.DEFAULT_DATA, [0])
    rows: list[dict[str, Any]] = []
    with open_client(tmp_path / "data", in_process=True) as client:
        ids: dict[str, str] = {}
        for fact in facts[0]:
            saved = client.tool("remember", {"content": fact["content"], "keys": fact["keys"], "namespace": "c0",
                                             "observed_at": bench_locomo.session_time(fact["session_date"])})
            ids[saved["saved"]] = fact["id"]
        evidence = {f["id"]: set(f["evidence"]) for f in facts[0]}
        content = {f["id"]: f["content"] for f in facts[0]}
        base = bench_locomo.Baselines(facts[0], default_analyzer().index_tokens, UseEmbedder().embed)
        for q in questions[0]:
            ranked = {
                "inject": [ids[m["id"]] for m in client.inject(
                    {"prompt": q["question"], "namespace": "c0", "top_k": 10, "max_chars": 20000})["memories"]],
                "recall_mem": [ids[h["id"]] for h in client.tool(
                    "recall_memories", {"query": q["question"], "namespace": "c0", "top_k": 10, "reinforce": False})],
                "agent_walk": [ids[m] for m in bench_locomo.agent_walk(client, q["question"], "c0", 10)],
                "bm25": base.rank_bm25(q["question"], 10),
                "dense": base.rank_dense(q["question"], 10),
            }
            row: dict[str, Any] = {"category": q["category"], "answerable": True}
            for path, found in ranked.items():
                first = next((i for i, f in enumerate(found) if evidence[f] & set(q["evidence"])), None)
                row[path] = {"rank": first, "chars5": sum(len(content[f]) for f in found[:5])}
            rows.append(row)
    figures = bench_locomo.report(rows)
    best_baseline = max(figures["bm25"]["R@5"], figures["dense"]["R@5"])
    recall, walk = figures["recall_mem"]["R@5"], figures["agent_walk"]["R@5"]
    assert recall >= 0.60, f"recall_memories R@5 {recall:.3f} (measured 0.625)"
    assert walk >= 0.60, f"agent walk R@5 {walk:.3f} (measured 0.632)"
    assert figures["recall_mem"]["R@5"] >= best_baseline + 0.07, "no longer clearly ahead of BM25 / dense"
