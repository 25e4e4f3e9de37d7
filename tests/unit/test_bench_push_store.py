"""scripts/bench_push.py --memories: a new user's store drawn from the push set."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_push  # noqa: E402


def test_a_small_store_keeps_n_memories_and_cuts_each_prompts_gold_to_them() -> None:
    memories = bench_push.read_jsonl(bench_push.FIXTURES / "push_memories.jsonl")
    prompts = bench_push.read_jsonl(bench_push.FIXTURES / "push_prompts.jsonl")
    kept, cut = bench_push.sample_store(memories, prompts, 24, 1)
    ids = {m["id"] for m in kept}
    assert len(kept) == 24 and [p["id"] for p in cut] == [p["id"] for p in prompts]
    assert all(set(p["gold"]) == set(q["gold"]) & ids for p, q in zip(cut, prompts, strict=True))
    assert any(q["gold"] and not p["gold"] for p, q in zip(cut, prompts, strict=True)), "some prompts lose all gold"
    # The same seed draws the same store; without a size the set is whole.
    assert bench_push.sample_store(memories, prompts, 24, 1) == (kept, cut)
    assert bench_push.sample_store(memories, prompts, 24, 2)[0] != kept
    assert bench_push.sample_store(memories, prompts, None, 1) == (memories, prompts)
