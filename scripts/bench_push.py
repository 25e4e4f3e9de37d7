"""The push path on prompts as developers type them: what ``/v1/inject`` surfaces, against baselines.

    python scripts/bench_push.py [--split test|dev|all] [--top-k 2] [--json bench-out/push.json]
                                 [--rows bench-out/push.jsonl] [--no-with-existing]
                                 [--locomo-data DIR] [--locomo-convs 0,1,2,3,4]

The set (tests/fixtures/push_*.jsonl, written for issue 18) is one developer's store as a coding
agent built it over a few weeks -- preferences, project facts, gotchas, people and decisions over
four projects (each a namespace with a checkout dir, push_projects.jsonl) plus the person's own
(namespace ``default``), about 45% Korean -- and prompts as people type them: tasks, pasted errors
and long logs, code to refactor, paraphrases, people, cross-language and typo'd prompts, and
prompts that need no memory (general questions, near misses sharing words with stored memories).
Each prompt has the cwd it is typed in and gold = the memory ids a thoughtful assistant would
want in mind ([] for none). The dev/test split is fixed in the file (seeded hash, stratified by
kind, language and has-gold; tests/unit/test_fixtures_wellformed.py checks the rule): tune on
dev, report on test.

A real daemon (``keymemd start``, reranker off, temporary data dir) gets the memories through the
remember tool and a ``namespaces.json`` mapping each project's cwd to its namespace; then every
prompt goes to ``POST /v1/inject`` as the hook sends it (its ``top_k``, its prompt cut, the
prompt's cwd, a fresh ``session_id`` per prompt). Per kind, per language and overall it prints:

  hit        prompts with gold where >= 1 gold memory was surfaced
  silence    prompts without gold where nothing was surfaced
  precision  surfaced memories that are gold (over all surfaced)
  chars      the surfaced memories' text per prompt; ``block`` is the whole block the hook adds
  p50/p95    /v1/inject client wall time and the daemon's own took_ms (ms)

Baselines from the same candidates, in the same run:
  floor   today's rule (main at e4d377c): candidates with relevance_score >= the settings'
          inject_min_rel, at most top_k
  top1    always the first candidate, whatever its score
  top2    always the first two candidates
The candidates are computed in this process, after the daemon stopped, on a copy of its store:
``reads.hybrid.hybrid_recall`` with the arguments main's ``retrieval.inject`` passes (top_k
max(3k, 15), one hop, no reinforcement, the inject rerank budget), minus the hits main's inject
never surfaces (BM25-only, date-only, hop-only and linked-only). That rule is frozen here on
purpose, so the baselines stay "today" while the inject route's decision changes; only
hybrid_recall's ranking and relevance_score are shared with the engine. (The inject route has no
floor override, and calling ``retrieval.inject`` with ``min_rel`` would follow its new decision.)
On main the inject route and ``floor`` agree on every prompt; the run prints their agreement.

``--memories N`` stores only N of the set's memories (drawn by ``--memories-seed``), as a new
user's store of tens of memories holds: each prompt's gold is cut to the memories stored, so a
prompt whose every gold memory was left out is one that needs none (the store has nothing for it).
With few memories most prompts have one candidate or none, which is where a decision that weighs
a candidate against its prompt's other candidates is tried hardest.

``--with-existing`` (default on) adds the push-path figures of the existing sets, each in its own
daemon: the Korean/English set's inject R@5 and not-found accuracy (``bench_korean.run`` and
``report``, all queries) and LoCoMo's inject R@5 (the facts and questions of ``bench_locomo.load``,
inject top 10 per question as bench_locomo asks it; ``--locomo-convs`` limits the conversations).
The whole run takes 80 s on an idle 2-core machine (the push set 25 s, the Korean/English set
20 s, LoCoMo's five conversations 35 s), 2-4 min when it is shared; each phase prints its time.
Latency figures move with the machine's load: compare them within one run. ``--json`` writes
every figure, ``--rows`` the per-prompt results (what each path surfaced, with the baselines'
relevance scores, for reading misses).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_korean  # noqa: E402
import bench_locomo  # noqa: E402
from bench_client import Http, InProcess, open_client  # noqa: E402
from measure import percentile  # noqa: E402

# The hook's request defaults (top_k, prompt cut), so the bench sends what it sends. Imported by
# name: the hooks/ dir is the keymem_hook package only through the install's package-dir mapping,
# which mypy does not follow.
keymem_hook: Any = importlib.import_module("keymem_hook.keymem_hook")

FIXTURES = ROOT / "tests" / "fixtures"
PATHS = ("inject", "floor", "top1", "top2")
BASELINES = PATHS[1:]
CEILING = "ceiling"
"""Every candidate: whether gold is among them at all (the most any decision over them can hit)."""
TODAY_FLOOR = 0.5
"""main's KEYMEM_INJECT_MIN_REL default, used only if the setting no longer exists."""
NEVER_ALONE = ("(bm25)", "(date)", "(linked)")
"""Main's inject skips a hit whose every match is one of these (or a hop, ``...(via)``)."""
CANDIDATES_MIN = 15
"""Main's inject asks hybrid_recall for max(3 * top_k, 15) candidates."""
INJECT_PROMPT_CHARS = 4000
"""Main's inject searches the first 4000 characters of a prompt."""
MIN_PROMPT_CHARS = 6
"""Main's inject skips shorter prompts (retrieval.MIN_PROMPT_CHARS there; frozen here with the rest)."""
WARMUP_PROMPT = "warm up the analyser and the embedder before timing 배포 준비"

Row = dict[str, Any]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def sample_store(memories: Sequence[dict[str, Any]], prompts: Sequence[dict[str, Any]], size: int | None,
                 seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``size`` of the memories (all if None), drawn by ``seed``, and the prompts with their gold
    cut to those memories."""
    if size is None or size >= len(memories):
        return list(memories), list(prompts)
    kept = set(random.Random(seed).sample(sorted(m["id"] for m in memories), size))
    return ([m for m in memories if m["id"] in kept],
            [{**p, "gold": [g for g in p["gold"] if g in kept]} for p in prompts])


def namespace_map(projects: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """``namespaces.json`` for the set: each project's checkout dir -> its namespace."""
    return {p["cwd"]: [p["namespace"]] for p in projects}


def store(client: Http | InProcess, memories: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Remember every memory; return store id -> fixture id."""
    id_map: dict[str, str] = {}
    for m in memories:
        result = client.tool("remember", {"content": m["content"], "keys": m["keys"],
                                          "key_types": m.get("key_types") or {}, "namespace": m["namespace"]})
        if result.get("deduplicated") or result["saved"] in id_map:
            raise RuntimeError(f"{m['id']} was merged into {id_map.get(result['saved'], result['saved'])}")
        id_map[result["saved"]] = m["id"]
    return id_map


def run_inject(daemon: Http, prompts: Sequence[dict[str, Any]], id_map: dict[str, str], top_k: int
               ) -> dict[str, Row]:
    """Every prompt through POST /v1/inject as the hook sends it; per-prompt results by prompt id."""
    daemon.inject({"prompt": WARMUP_PROMPT, "top_k": top_k})
    out: dict[str, Row] = {}
    for p in prompts:
        body = {"prompt": p["prompt"].strip()[:keymem_hook.PROMPT_SEND_CHARS], "cwd": p["cwd"], "top_k": top_k,
                "session_id": uuid.uuid4().hex, "agent": "claude"}
        started = time.perf_counter()
        answer = daemon.inject(body)
        wall = (time.perf_counter() - started) * 1000
        out[p["id"]] = {"ids": [id_map[m["id"]] for m in answer["memories"]],
                        "chars": sum(len(m["content"]) for m in answer["memories"]),
                        "block": len(answer["context"] or ""), "wall_ms": wall, "took_ms": answer["took_ms"],
                        "why": [(m["matched_key"] or {}).get("concept") for m in answer["memories"]]}
    return out


def copy_store(source: Path, target: Path) -> None:
    """A consistent copy of the daemon's SQLite store (the backup API reads through its WAL)."""
    target.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(source / "keymem.db") as src, sqlite3.connect(target / "keymem.db") as dst:
        src.backup(dst)


def frozen_candidates(service: Any, prompt: str, cwd: str, mapping: dict[str, list[str]], top_k: int
                      ) -> list[Any]:
    """Main's inject candidates for a prompt, best first, before its floor (see the docstring)."""
    from keymem_daemon.engine.reads.hybrid import hybrid_recall
    from keymem_daemon.engine.reads.query import namespaces_for_cwd

    text = prompt.strip()[:keymem_hook.PROMPT_SEND_CHARS]
    if len(text) < MIN_PROMPT_CHARS or text.startswith("/"):
        return []
    graph = service.ready_graph()
    scope = namespaces_for_cwd(mapping, cwd)
    result = hybrid_recall(graph, text[:INJECT_PROMPT_CHARS], scope=scope,
                                     top_k=max(3 * top_k, CANDIDATES_MIN), hops=1, reinforce=False,
                                     max_chars=graph.settings.inject_max_chars,
                                     rerank_budget_ms=graph.settings.inject_rerank_budget_ms)
    return [hit for hit in result.hits
            if not all(v in NEVER_ALONE or v.endswith("(via)") for v in hit.matched_via)]


def run_baselines(data_dir: Path, prompts: Sequence[dict[str, Any]], id_map: dict[str, str],
                  mapping: dict[str, list[str]], top_k: int) -> tuple[dict[str, dict[str, Row]], float]:
    """floor / top1 / top2 (and the ceiling) per prompt, from the frozen candidates on ``data_dir``'s store."""
    client = InProcess(data_dir)
    try:
        floor = float(getattr(client.service.ready_graph().settings, "inject_min_rel", TODAY_FLOOR))
        pickers: dict[str, Callable[[list[Any]], list[Any]]] = {
            "floor": lambda c: [h for h in c if h.relevance_score >= floor][:top_k],
            "top1": lambda c: c[:1],
            "top2": lambda c: c[:2],
            "ceiling": lambda c: c,
        }
        out: dict[str, dict[str, Row]] = {name: {} for name in pickers}
        for p in prompts:
            candidates = frozen_candidates(client.service, p["prompt"], p["cwd"], mapping, top_k)
            for name, pick in pickers.items():
                hits = pick(candidates)
                out[name][p["id"]] = {"ids": [id_map[h.id] for h in hits], "chars": sum(len(h.content) for h in hits),
                                      "rel": [round(h.relevance_score, 3) for h in hits]}
    finally:
        client.close()
    return out, floor


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def figures(prompts: Sequence[dict[str, Any]], results: dict[str, Row]) -> dict[str, Any]:
    """hit, silence, precision and chars over ``prompts`` for one path's results."""
    gold = [p for p in prompts if p["gold"]]
    none = [p for p in prompts if not p["gold"]]
    surfaced = [(i, p) for p in prompts for i in results[p["id"]]["ids"]]
    out: dict[str, Any] = {
        "n": len(prompts), "with_gold": len(gold), "without_gold": len(none),
        "hit": _share([bool(set(results[p["id"]]["ids"]) & set(p["gold"])) for p in gold]),
        "silence": _share([not results[p["id"]]["ids"] for p in none]),
        "precision": _share([i in p["gold"] for i, p in surfaced]),
        "surfaced_per_prompt": len(surfaced) / len(prompts) if prompts else None,
        "chars": sum(results[p["id"]]["chars"] for p in prompts) / len(prompts) if prompts else None,
    }
    if prompts and "block" in results[prompts[0]["id"]]:
        out["block"] = sum(results[p["id"]]["block"] for p in prompts) / len(prompts)
        for field in ("wall_ms", "took_ms"):
            values = [results[p["id"]][field] for p in prompts]
            out[f"{field}_p50"], out[f"{field}_p95"] = percentile(values, 0.5), percentile(values, 0.95)
    return out


def groups(prompts: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """"all", then "kind=...", then "lang=..." subsets, in a stable order."""
    out: dict[str, list[dict[str, Any]]] = {"all": list(prompts)}
    for field in ("kind", "lang"):
        for value in sorted({p[field] for p in prompts}):
            out[f"{field}={value}"] = [p for p in prompts if p[field] == value]
    return out


def _fmt(value: float | None, width: int = 6, digits: int = 3) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}.{digits}f}"


def print_table(title: str, table: dict[str, dict[str, Any]], *, latency: bool) -> None:
    print(f"\n{title}")
    head = f"  {'group':22s} {'n':>4s} {'gold':>4s} {'hit':>6s} {'silent':>6s} {'prec':>6s} {'chars':>6s}"
    if latency:
        head += f" {'block':>6s} {'wall50':>6s} {'wall95':>6s} {'took50':>6s} {'took95':>6s}"
    print(head)
    for name, f in table.items():
        line = (f"  {name:22s} {f['n']:4d} {f['with_gold']:4d} {_fmt(f['hit'])} {_fmt(f['silence'])} "
                f"{_fmt(f['precision'])} {_fmt(f['chars'], 6, 0)}")
        if latency:
            line += (f" {_fmt(f['block'], 6, 0)} {_fmt(f['wall_ms_p50'], 6, 1)} {_fmt(f['wall_ms_p95'], 6, 1)}"
                     f" {_fmt(f['took_ms_p50'], 6, 1)} {_fmt(f['took_ms_p95'], 6, 1)}")
        print(line)


def compare(tables: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """inject against each baseline, overall and per group: differences (and hit ratios)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    print("\ninject against the baselines (inject - baseline; hit also as inject / baseline):")
    print(f"  {'group':22s} " + " ".join(f"{b + ' hit':>14s} {'silent':>7s} {'prec':>7s}" for b in BASELINES))
    for name, f in tables["inject"].items():
        out[name] = {}
        line = f"  {name:22s} "
        for b in BASELINES:
            g = tables[b][name]
            diff = {m: (f[m] - g[m] if f[m] is not None and g[m] is not None else None)
                    for m in ("hit", "silence", "precision")}
            ratio = f["hit"] / g["hit"] if f["hit"] is not None and g["hit"] else None
            out[name][b] = {**diff, "hit_ratio": ratio}
            line += (f"{_fmt(diff['hit'], 7, 3)} x{_fmt(ratio, 5, 2)} {_fmt(diff['silence'], 7, 3)} "
                     f"{_fmt(diff['precision'], 7, 3)} ")
        print(line)
    return out


def existing_korean() -> dict[str, float]:
    """The Korean/English set through bench_korean (all queries): the inject path's figures."""
    memories = bench_korean.read_jsonl(FIXTURES / "ko_en_memories.jsonl")
    queries = bench_korean.read_jsonl(FIXTURES / "ko_en_queries.jsonl")
    print("\n== Korean/English set (bench_korean, all queries) ==")
    with open_client(Path(tempfile.mkdtemp(prefix="keymem-push-korean-"))) as client:
        rows = bench_korean.run(client, memories, queries)
    table = bench_korean.report(rows)
    return {"inject_R@5": table["inject"]["R@5"], "inject_not_found": table["inject"]["not_found"],
            "recall_mem_R@5": table["recall_mem"]["R@5"], "fts_trigram_R@5": table["fts_trigram"]["R@5"]}


def existing_locomo(data: Path, convs: Sequence[int]) -> dict[str, float]:
    """LoCoMo's inject R@5 as bench_locomo asks it (top 10 per question, one namespace per conversation)."""
    facts, questions = bench_locomo.load(data, convs)
    print(f"\n== LoCoMo (conversations {','.join(map(str, convs))}) ==")
    hits: list[bool] = []
    with open_client(Path(tempfile.mkdtemp(prefix="keymem-push-locomo-"))) as client:
        evidence_of: dict[str, set[str]] = {}
        for conv in convs:
            for fact in facts[conv]:
                result = client.tool("remember", {"content": fact["content"], "keys": fact["keys"],
                                                  "namespace": f"locomo-{conv}",
                                                  "observed_at": bench_locomo.session_time(fact["session_date"])})
                evidence_of[result["saved"]] = set(fact["evidence"])
        for conv in convs:
            for q in questions[conv]:
                inj = client.inject({"prompt": q["question"], "namespace": f"locomo-{conv}", "top_k": 10,
                                     "max_chars": 20000})
                hits.append(any(evidence_of[m["id"]] & set(q["evidence"]) for m in inj["memories"][:5]))
    figure = sum(hits) / len(hits)
    print(f"{len(hits)} questions, inject R@5 {figure:.3f}")
    return {"questions": len(hits), "inject_R@5": figure}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="test", choices=("test", "dev", "all"))
    parser.add_argument("--set", type=Path, default=FIXTURES, dest="set_dir",
                        help="the folder holding push_projects/memories/prompts.jsonl (default: this "
                             "repository's; tests/fixtures/push_heldout is a second writer's set, all test)")
    parser.add_argument("--top-k", type=int, default=keymem_hook.DEFAULT_TOP_K,
                        help="memories per prompt (default: the hook's)")
    parser.add_argument("--memories", type=int, default=None,
                        help="store only this many of the set's memories (a new user's store; gold cut to them)")
    parser.add_argument("--memories-seed", type=int, default=0, help="which memories --memories draws")
    parser.add_argument("--with-existing", action=argparse.BooleanOptionalAction, default=True,
                        help="also the push-path figures of the Korean/English and LoCoMo sets")
    parser.add_argument("--locomo-data", type=Path,
                        default=Path(os.environ.get("KEYMEM_LOCOMO_DATA", bench_locomo.DEFAULT_DATA)))
    parser.add_argument("--locomo-convs", default="0,1,2,3,4", help="LoCoMo conversations (fewer is faster)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--rows", type=Path, default=ROOT / "bench-out" / "push.jsonl",
                        help="per-prompt results")
    args = parser.parse_args()
    started = time.perf_counter()
    projects = read_jsonl(args.set_dir / "push_projects.jsonl")
    memories = read_jsonl(args.set_dir / "push_memories.jsonl")
    prompts = [p for p in read_jsonl(args.set_dir / "push_prompts.jsonl") if args.split in ("all", p["split"])]
    memories, prompts = sample_store(memories, prompts, args.memories, args.memories_seed)
    mapping = namespace_map(projects)

    data_dir = Path(tempfile.mkdtemp(prefix="keymem-push-"))
    (data_dir / "namespaces.json").write_text(json.dumps(mapping, indent=1), encoding="utf-8")
    daemon = Http(data_dir)
    try:
        id_map = store(daemon, memories)
        results: dict[str, dict[str, Row]] = {"inject": run_inject(daemon, prompts, id_map, args.top_k)}
    finally:
        daemon.close()
    copy = Path(tempfile.mkdtemp(prefix="keymem-push-baselines-"))
    copy_store(data_dir, copy)
    baselines, floor = run_baselines(copy, prompts, id_map, mapping, args.top_k)
    results.update(baselines)

    print(f"push set, split {args.split}: {len(prompts)} prompts ({sum(bool(p['gold']) for p in prompts)} with gold), "
          f"{len(memories)} memories, top_k {args.top_k}; today's floor = inject_min_rel {floor}")
    parts = groups(prompts)
    tables = {path: {name: figures(sel, results[path]) for name, sel in parts.items()} for path in PATHS}
    titles = {"inject": "inject  POST /v1/inject (the decision under test)",
              "floor": "floor   baseline: today's rule, relevance_score >= inject_min_rel",
              "top1": "top1    baseline: always the first candidate", "top2": "top2    baseline: always the first two"}
    for path in PATHS:
        print_table(titles[path], tables[path], latency=path == "inject")
    diffs = compare(tables)
    agree = _share([results["inject"][p["id"]]["ids"] == results["floor"][p["id"]]["ids"] for p in prompts])
    print(f"\ninject and floor surface the same memories on {_fmt(agree, 0)} of the prompts "
          "(1.000 on main's decision)")
    ceiling = {name: figures(sel, results[CEILING])["hit"] for name, sel in parts.items()}
    print("gold among the candidates at all (ceiling of any decision over them): "
          + ", ".join(f"{name} {_fmt(v, 0)}" for name, v in ceiling.items() if v is not None))
    print(f"push set: {time.perf_counter() - started:.0f} s", file=sys.stderr)

    existing: dict[str, Any] = {}
    if args.with_existing:
        phase = time.perf_counter()
        existing["korean"] = existing_korean()
        print(f"Korean/English set: {time.perf_counter() - phase:.0f} s", file=sys.stderr)
        if (args.locomo_data / "facts.json").exists():
            phase = time.perf_counter()
            existing["locomo"] = existing_locomo(args.locomo_data, [int(c) for c in args.locomo_convs.split(",")])
            print(f"LoCoMo: {time.perf_counter() - phase:.0f} s", file=sys.stderr)
        else:
            print(f"\nLoCoMo skipped: no facts.json in {args.locomo_data} (--locomo-data or KEYMEM_LOCOMO_DATA)")
    runtime = time.perf_counter() - started
    print(f"\nruntime {runtime:.0f} s", file=sys.stderr)

    args.rows.parent.mkdir(parents=True, exist_ok=True)
    with args.rows.open("w", encoding="utf-8") as out:
        for p in prompts:
            row = {"id": p["id"], "kind": p["kind"], "lang": p["lang"], "split": p["split"], "gold": p["gold"],
                   "prompt": p["prompt"][:200], **{path: results[path][p["id"]] for path in (*PATHS, CEILING)}}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"per-prompt rows: {args.rows}", file=sys.stderr)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"split": args.split, "top_k": args.top_k, "floor": floor,
                                         "tables": tables, "against_baselines": diffs, "inject_floor_agreement": agree,
                                         "ceiling_hit": ceiling,
                                         "existing": existing, "runtime_s": runtime}, indent=1, ensure_ascii=False),
                             encoding="utf-8")
        print(f"figures: {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
