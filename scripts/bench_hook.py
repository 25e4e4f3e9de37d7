"""Push-path latency: the prompt hook end to end, and ``POST /v1/inject``, at 1k and 10k memories.

    python scripts/bench_hook.py [--sizes 1000,10000] [--inject-rounds 5] [--hook-runs 60] [--stages]
                                 [--python /usr/bin/python3] [--out bench-out/hook.json]

For each size a fresh daemon (``keymemd start``, reranker off) on a temporary data dir is
loaded with synthetic memories through ``POST /v1/import`` -- service notes, owners,
deploy steps, limits and conventions over a few hundred services, in English and Korean,
whose keys repeat the way an agent's do (a handful of hubs such as ``PostgreSQL`` or
``배포``, a long tail of service names). Then:

  inject   ``POST /v1/inject`` over a kept-alive connection, every prompt ``--inject-rounds``
           times (client-side wall time and the daemon's own ``took_ms``);
  hook     ``python3 -S hooks/keymem_hook.py user-prompt-submit`` as a host runs it (as
           hooks/hooks.json says): a new process fed a Claude Code payload on stdin, timed
           from spawn to exit with its output read;
  bare     ``python3 -c pass`` with the same interpreter, interleaved with the hook runs, so
           the hook's own cost can be read off against the machine's process start-up;
  no-req   the hook fed a slash command: everything but the request (start, parse, exit);
  baseline with ``--baseline-hook FILE`` (another version of the hook, e.g.
           ``git show main:hooks/keymem_hook.py > /tmp/hook-main.py``; its interpreter flags
           ``--baseline-flags``, default ``-S``), run interleaved with
           this one against the same daemon, so what a change costs reads off as a ratio;
  stages   with ``--stages``: once the daemon stopped, its store opened in this process and
           every prompt injected ``--inject-rounds`` times with a wall-clock span around each
           stage of the push path (``STAGES``; nested, so a stage includes those under it),
           printed as ms per inject: where the daemon's ``took_ms`` goes.

The prompts are half about stored memories (English, Korean, and Korean prompts about
memories stored in English), half unrelated. Injected size is the length of
``additionalContext`` per prompt. Targets: hook p95 <= 150 ms, inject p95 <= 30 ms at 10k.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_client import Http, InProcess  # noqa: E402
from measure import percentile  # noqa: E402

HOOK = ROOT / "hooks" / "keymem_hook.py"
TARGET_HOOK_P95_MS = 150.0
TARGET_INJECT_P95_MS = 30.0

# -- synthetic memories ----------------------------------------------------------------------

AREAS = [
    ("billing", "결제"),
    ("payments", "지불"),
    ("auth", "인증"),
    ("search", "검색"),
    ("notifications", "알림"),
    ("orders", "주문"),
    ("inventory", "재고"),
    ("shipping", "배송"),
    ("analytics", "분석"),
    ("profile", "프로필"),
    ("checkout", "체크아웃"),
    ("reviews", "리뷰"),
    ("catalog", "카탈로그"),
    ("pricing", "가격"),
    ("reporting", "리포트"),
    ("gateway", "게이트웨이"),
    ("ledger", "원장"),
    ("coupons", "쿠폰"),
    ("chat", "채팅"),
    ("media", "미디어"),
]
PARTS = [
    "api",
    "worker",
    "scheduler",
    "consumer",
    "admin",
    "sync",
    "export",
    "importer",
    "cache",
    "proxy",
    "indexer",
    "webhook",
    "batch",
    "stream",
    "cron",
]
STORES = ["PostgreSQL", "Redis", "MySQL", "DynamoDB", "Elasticsearch", "ClickHouse", "S3", "Kafka"]
TOOLS = ["ArgoCD", "Helm", "Terraform", "GitHub Actions", "Jenkins", "Spinnaker"]
PEOPLE = [
    "Minji Park",
    "Alex Chen",
    "Seo-yeon Kim",
    "Priya Shah",
    "Jonas Weber",
    "Hyunwoo Lee",
    "Maria Garcia",
    "Tom Becker",
    "Jiho Choi",
    "Emma Novak",
    "Daniel Yoon",
    "Sara Ito",
]
CHANNELS = ["#oncall", "#deploys", "#payments-alerts", "#infra", "#search-dev", "#incidents"]
LANGS = [
    ("Python", "3.11", "ruff"),
    ("Go", "1.22", "golangci-lint"),
    ("TypeScript", "5.4", "eslint"),
    ("Kotlin", "1.9", "detekt"),
    ("Rust", "1.78", "clippy"),
]


@dataclass(frozen=True)
class Note:
    content: str
    keys: tuple[str, ...]
    namespace: str
    ask: str
    """A prompt a user might type about this note."""


def service_names(count: int) -> list[tuple[str, str]]:
    names = [(f"{a}-{p}", f"{ko} {p}") for a, ko in AREAS for p in PARTS]
    return names[:count]


def make_note(rng: random.Random, service: tuple[str, str], i: int) -> Note:
    svc, svc_ko = service
    area = svc.split("-")[0]
    n = rng.randint(2, 500)
    store, tool, person = rng.choice(STORES), rng.choice(TOOLS), rng.choice(PEOPLE)
    channel, (lang, ver, linter) = rng.choice(CHANNELS), rng.choice(LANGS)
    ns = "default" if rng.random() < 0.7 else f"project-{area}"
    kind = i % 8
    if kind == 0:
        return Note(
            f"The {svc} service stores its state in {store}; the connection pool size is {n} "
            f"and slow queries over {n * 3} ms are logged.",
            (svc, store, "connection pool"),
            ns,
            f"What connection pool size does {svc} use?",
        )
    if kind == 1:
        return Note(
            f"{person} owns {svc}; page them through {channel} when {svc} alerts fire for "
            f"more than {n % 30 + 5} minutes.",
            (svc, person, "on-call", "owner"),
            ns,
            f"Who owns {svc} and where do I page them?",
        )
    if kind == 2:
        return Note(
            f"Deploy {svc} with {tool}: merge to main, wait for the canary ({n % 20 + 5}% of "
            f"traffic) and promote; rollback takes about {n % 15 + 2} minutes.",
            (svc, tool, "deployment", "배포", "rollback"),
            ns,
            f"How do I deploy {svc}?",
        )
    if kind == 3:
        return Note(
            f"The {svc} API allows {n * 10} requests per minute per token; clients over the "
            f"limit get HTTP 429 with Retry-After.",
            (svc, "rate limit", "HTTP 429"),
            ns,
            f"What is the rate limit of the {svc} API?",
        )
    if kind == 4:
        return Note(
            f"{svc} is written in {lang} {ver}; run {linter} before pushing and keep test "
            f"coverage above {n % 30 + 60}%.",
            (svc, lang, linter, "coding convention"),
            ns,
            f"Which linter does {svc} use?",
        )
    if kind == 5:
        return Note(
            f"{svc_ko} 서비스 배포는 {tool}로 하며, 배포 전에 스모크 테스트를 돌리고 롤백은 약 {n % 15 + 2}분 걸린다.",
            (svc, f"{svc_ko} 배포", "배포", "스모크 테스트"),
            ns,
            f"{svc_ko} 배포는 어떻게 해?",
        )
    if kind == 6:
        return Note(
            f"{svc_ko} 장애가 나면 {person}에게 {channel} 채널로 연락하고, {n % 50 + 10}분 안에 "
            f"복구되지 않으면 인시던트를 연다.",
            (svc, f"{svc_ko} 장애", "장애 대응", "on-call"),
            ns,
            f"{svc_ko} 장애 나면 누구한테 연락해?",
        )
    return Note(
        f"Cron job {svc}-nightly runs at {n % 24:02d}:30 UTC, exports to {store} and retries "
        f"{n % 5 + 1} times before alerting {channel}.",
        (svc, "cron job", store, "nightly export"),
        ns,
        f"{svc_ko} 야간 작업은 몇 시에 돌아?",
    )


def synthetic(count: int, seed: int = 7) -> list[Note]:
    rng = random.Random(seed)
    services = service_names(max(20, min(300, count // 30)))
    # Zipf-like: a few services get many notes, most get a few.
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(services))]
    notes: list[Note] = []
    seen: set[str] = set()
    i = 0
    while len(notes) < count:
        note = make_note(rng, rng.choices(services, weights)[0], i)
        i += 1
        if note.content not in seen:
            seen.add(note.content)
            notes.append(note)
    return notes


def export_document(notes: list[Note], *, now: float, seed: int = 13) -> dict[str, Any]:
    """The notes as a ``keymem-export`` document (keymem_daemon/engine/transfer.py), saved
    over the past year (a store filled in one afternoon would put every memory into the
    window of "today")."""

    def ident(prefix: str, text: str) -> str:
        return hashlib.sha1(f"{prefix}:{text}".encode()).hexdigest()[:12]

    rng = random.Random(seed)
    keys: dict[str, dict[str, Any]] = {}
    memories, links = [], []
    for note in notes:
        mid = ident("m", note.content)
        saved = now - rng.uniform(0, 365 * 86400)
        memories.append({"id": mid, "content": note.content, "namespace": note.namespace, "created_at": saved})
        for concept in note.keys:
            kid = ident("k", concept.casefold())
            keys.setdefault(kid, {"id": kid, "concept": concept})
            links.append({"key_id": kid, "memory_id": mid})
    return {
        "format": "keymem-export",
        "version": 1,
        "keys": list(keys.values()),
        "memories": memories,
        "links": links,
    }


UNRELATED = [
    "Write a haiku about the ocean",
    "Explain the difference between a process and a thread",
    "What is the capital of Australia?",
    "Refactor this function to use a list comprehension",
    "Summarize the plot of Hamlet in three sentences",
    "오늘 저녁 메뉴 추천해줘",
    "피보나치 수열을 재귀로 구현해줘",
    "Give me a regex that matches an ISO date",
    "How do I center a div with flexbox?",
    "이 문장을 영어로 번역해줘: 좋은 아침입니다",
]


def prompts_for(notes: list[Note], count: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    related = [note.ask for note in rng.sample(notes, count - len(UNRELATED))]
    return related + UNRELATED


# -- the daemon --------------------------------------------------------------------------------


def load(daemon: Http, document: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/import``; returns the ``done`` event's result."""
    last: dict[str, Any] = {}
    with daemon.client.stream("POST", "/v1/import", json=document, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.strip():
                last = json.loads(line)
    if last.get("event") != "done":
        raise RuntimeError(f"import failed: {last}")
    result: dict[str, Any] = last["result"]
    return result


def inject(daemon: Http, prompt: str) -> tuple[float, dict[str, Any]]:
    """One ``POST /v1/inject`` as the hook sends it: (client-side ms, response)."""
    started = time.perf_counter()
    body: dict[str, Any] = daemon.inject({"prompt": prompt, "agent": "claude"})
    return (time.perf_counter() - started) * 1000, body


# -- measuring -----------------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 0.50), 2),
        "p95": round(percentile(values, 0.95), 2),
        "max": round(max(values), 2),
        "mean": round(statistics.fmean(values), 2),
    }


def timed_process(command: list[str], stdin: bytes, env: dict[str, str]) -> tuple[float, bytes]:
    started = time.perf_counter()
    proc = subprocess.run(command, input=stdin, env=env, capture_output=True, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {proc.returncode}: {proc.stderr[-500:]!r}")
    return elapsed, proc.stdout


# The push path's stages timed by ``--stages``: (label, module, function), outermost first;
# the label's indent says what it runs under.
STAGES = [
    ("judge", "keymem_daemon.engine.reads.inject", "judge"),
    ("  condense", "keymem_daemon.engine.reads.inject", "condense"),
    ("  heard_keys", "keymem_daemon.engine.reads.inject", "heard_keys"),
    ("  plan_query", "keymem_daemon.engine.reads.inject", "plan_query"),
    ("  hybrid_recall", "keymem_daemon.engine.reads.inject", "hybrid_recall"),
    ("    score_keys", "keymem_daemon.engine.reads.hybrid", "score_keys"),
    ("    _candidates", "keymem_daemon.engine.reads.hybrid", "_candidates"),
    ("      lexical", "keymem_daemon.engine.reads.hybrid", "lexical"),
    ("      dense", "keymem_daemon.engine.reads.hybrid", "dense"),
    ("      key_members", "keymem_daemon.engine.reads.hybrid", "key_members"),
    ("    _score", "keymem_daemon.engine.reads.hybrid", "_score"),
    ("      coverage_scores", "keymem_daemon.engine.reads.hybrid", "coverage_scores"),
    ("    _share_evidence", "keymem_daemon.engine.reads.hybrid", "_share_evidence"),
    ("    _skip_repeats", "keymem_daemon.engine.reads.hybrid", "_skip_repeats"),
    ("    _hits", "keymem_daemon.engine.reads.hybrid", "_hits"),
    ("  _evidence", "keymem_daemon.engine.reads.inject", "_evidence"),
]
# Spans anywhere in the path (called from several stages): the embedder and the store's
# document frequencies.
CROSS_STAGES = [
    ("embed (any stage)", "keymem_daemon.inference.embedders", "CachedEmbedder.embed"),
    ("token_stats (any stage)", "keymem_daemon.engine.indexes", "GraphIndexes.token_stats"),
]


@contextlib.contextmanager
def spans(targets: list[tuple[str, str, str]], totals: dict[str, float]) -> Iterator[None]:
    """Wrap each (label, module, [Class.]function) so its wall time adds to ``totals[label]``;
    restored on exit."""
    import importlib

    restore: list[tuple[Any, str, Any]] = []

    def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - started
        return run

    try:
        for label, module_name, name in targets:
            owner: Any = importlib.import_module(module_name)
            if "." in name:
                cls_name, name = name.split(".")
                owner = getattr(owner, cls_name)
            original = getattr(owner, name)
            setattr(owner, name, timed(original, label))
            restore.append((owner, name, original))
        yield
    finally:
        for owner, name, original in reversed(restore):
            setattr(owner, name, original)


def stage_times(data_dir: Path, prompts: list[str], rounds: int) -> dict[str, float]:
    """ms per inject in each stage, on the store at ``data_dir`` opened in this process."""
    from keymem_daemon.service import InjectRequest

    client = InProcess(data_dir)
    try:
        requests = [InjectRequest(prompt=p, agent="claude") for p in prompts]
        for request in requests[:5]:
            client.service.inject(request)
        totals: dict[str, float] = {}
        with spans(STAGES + CROSS_STAGES, totals):
            for _ in range(rounds):
                for request in requests:
                    client.service.inject(request)
    finally:
        client.close()
    count = rounds * len(prompts)
    return {label: round(totals.get(label, 0.0) / count * 1000, 2) for label, _, _ in STAGES + CROSS_STAGES}


def bench_size(size: int, args: argparse.Namespace, python: str) -> dict[str, Any]:
    notes = synthetic(size)
    prompts = prompts_for(notes, args.prompts)
    document = export_document(notes, now=time.time())
    with tempfile.TemporaryDirectory(prefix=f"keymem-bench-hook-{size}-") as tmp:
        data_dir, home = Path(tmp) / "data", Path(tmp) / "home"
        home.mkdir()
        started = time.perf_counter()
        daemon = Http(data_dir)
        start_s = time.perf_counter() - started
        try:
            started = time.perf_counter()
            imported = load(daemon, document)
            load_s = time.perf_counter() - started
            for prompt in prompts[:5]:  # first calls load the Korean analyser and warm caches
                inject(daemon, prompt)

            wall, took = [], []
            surfaced: dict[str, int] = {}
            per_prompt: dict[str, list[float]] = {p: [] for p in prompts}
            for _ in range(args.inject_rounds):
                for prompt in prompts:
                    ms, body = inject(daemon, prompt)
                    wall.append(ms)
                    took.append(float(body["took_ms"]))
                    per_prompt[prompt].append(float(body["took_ms"]))
                    surfaced[prompt] = len(body["context"] or "")

            hook_env = {
                "PATH": os.environ.get("PATH", ""),
                "HOME": str(home),
                "KEYMEM_DATA_DIR": str(data_dir),
                "KEYMEM_AUTOSTART": "false",
            }
            hook_ms, bare_ms, skip_ms, hook_chars, baseline_ms = [], [], [], [], []
            # As hooks/hooks.json runs it (-S: without site-packages).
            command = [python, "-S", str(HOOK), "user-prompt-submit"]
            baseline = [python, *args.baseline_flags.split(), str(args.baseline_hook), "user-prompt-submit"] \
                if args.baseline_hook else None
            for i in range(args.hook_runs):
                payload = {
                    "session_id": str(uuid.uuid4()),
                    "transcript_path": "/tmp/t.jsonl",
                    "cwd": str(home),
                    "permission_mode": "default",
                    "hook_event_name": "UserPromptSubmit",
                    "prompt": prompts[i % len(prompts)],
                }
                ms, _ = timed_process([python, "-c", "pass"], b"", hook_env)
                bare_ms.append(ms)
                # A slash command: the hook's own cost, with no request to the daemon.
                slash = json.dumps({**payload, "prompt": "/compact keep the plan"}).encode()
                ms, _ = timed_process(command, slash, hook_env)
                skip_ms.append(ms)
                if baseline is not None:
                    ms, _ = timed_process(baseline, json.dumps(payload).encode(), hook_env)
                    baseline_ms.append(ms)
                ms, out = timed_process(command, json.dumps(payload).encode(), hook_env)
                hook_ms.append(ms)
                context = json.loads(out)["hookSpecificOutput"]["additionalContext"] if out else ""
                hook_chars.append(len(context))
        finally:
            daemon.close()
        stages = stage_times(data_dir, prompts, args.inject_rounds) if args.stages else None

    related = prompts[: len(prompts) - len(UNRELATED)]
    sizes = [surfaced[p] for p in related if surfaced[p]]
    return {
        "memories": size,
        "keys": len(document["keys"]),
        "links": len(document["links"]),
        "daemon_start_s": round(start_s, 2),
        "load_s": round(load_s, 2),
        "import": imported,
        "inject_wall_ms": percentiles(wall),
        "inject_daemon_ms": percentiles(took),
        "slowest_prompts_daemon_ms": sorted(
            ((round(statistics.median(v), 1), p) for p, v in per_prompt.items()), reverse=True
        )[:5],
        "stages_ms_per_inject": stages,
        "hook_ms": percentiles(hook_ms),
        "bare_python_ms": percentiles(bare_ms),
        "hook_no_request_ms": percentiles(skip_ms),
        "hook_minus_bare_p50_ms": round(statistics.median(hook_ms) - statistics.median(bare_ms), 2),
        "baseline_hook_ms": percentiles(baseline_ms) if baseline_ms else None,
        "injected": {
            "related_prompts": len(related),
            "related_with_context": len(sizes),
            "unrelated_with_context": sum(1 for p in UNRELATED if surfaced[p]),
            "chars_per_prompt_mean": round(statistics.fmean(surfaced.values()), 1),
            "chars_when_injected": percentiles([float(s) for s in sizes]) if sizes else None,
            "hook_chars_max": max(hook_chars),
        },
    }


def report(result: dict[str, Any]) -> str:
    def row(name: str, p: dict[str, float], target: float | None = None) -> str:
        mark = "" if target is None else ("  ok" if p["p95"] <= target else f"  OVER {target:g} ms")
        return f"  {name:<22} p50 {p['p50']:8.2f}  p95 {p['p95']:8.2f}  max {p['max']:8.2f} ms{mark}"

    inj = result["injected"]
    size = inj["chars_when_injected"]
    lines = [
        f"{result['memories']} memories, {result['keys']} keys, {result['links']} links: "
        f"daemon start {result['daemon_start_s']} s, import {result['load_s']} s",
        row("/v1/inject (client)", result["inject_wall_ms"]),
        row(
            "/v1/inject (daemon)",
            result["inject_daemon_ms"],
            TARGET_INJECT_P95_MS if result["memories"] >= 10000 else None,
        ),
        row("hook end to end", result["hook_ms"], TARGET_HOOK_P95_MS),
        row("bare python -c pass", result["bare_python_ms"]),
        row("hook, no request", result["hook_no_request_ms"]),
        f"  hook - bare (p50)      {result['hook_minus_bare_p50_ms']:.2f} ms",
        *(
            [row("baseline hook", result["baseline_hook_ms"], TARGET_HOOK_P95_MS),
             f"  hook / baseline        p50 {result['hook_ms']['p50'] / result['baseline_hook_ms']['p50']:.2f}x"
             f"  p95 {result['hook_ms']['p95'] / result['baseline_hook_ms']['p95']:.2f}x"]
            if result["baseline_hook_ms"] else []
        ),
        f"  injected: {inj['related_with_context']}/{inj['related_prompts']} related prompts, "
        f"{inj['unrelated_with_context']}/{len(UNRELATED)} unrelated; "
        f"{inj['chars_per_prompt_mean']} chars per prompt on average"
        + (f", p50 {size['p50']:.0f} / max {size['max']:.0f} chars when injected" if size else ""),
        "  slowest prompts (daemon median ms): "
        + "; ".join(f"{ms:g} {prompt!r}" for ms, prompt in result["slowest_prompts_daemon_ms"][:3]),
    ]
    if result.get("stages_ms_per_inject"):
        lines.append("  stages (in process, ms per inject; nested stages include those under them):")
        lines += [f"    {label:<26} {ms:7.2f}" for label, ms in result["stages_ms_per_inject"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="memory counts, comma-separated")
    parser.add_argument("--prompts", type=int, default=40, help="prompts per size (10 are unrelated)")
    parser.add_argument("--inject-rounds", type=int, default=5, help="passes over the prompts")
    parser.add_argument("--hook-runs", type=int, default=60, help="hook processes per size")
    parser.add_argument(
        "--python",
        default=getattr(sys, "_base_executable", sys.executable),
        help="interpreter for the hook and the bare run (default: this one, "
        "outside any venv, as a host's python3 would be)",
    )
    parser.add_argument("--baseline-hook", type=Path, help="another hook file, timed interleaved as the baseline")
    parser.add_argument("--baseline-flags", default="-S",
                        help="interpreter flags for the baseline hook (main's configs before -S: '')")
    parser.add_argument("--stages", action="store_true",
                        help="also time the push path's stages in this process (see STAGES)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "hook.json")
    args = parser.parse_args()
    if args.prompts <= len(UNRELATED):
        parser.error(f"--prompts must be above {len(UNRELATED)}")
    results = []
    print(f"hook interpreter: {args.python}", flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        result = bench_size(size, args, args.python)
        results.append(result)
        print(report(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"python": args.python, "results": results}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
