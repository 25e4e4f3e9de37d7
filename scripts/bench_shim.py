"""How fast the MCP shim starts: import time, and ``initialize`` as a host sees it.

Measured in one run, each as p50/p95 over several repetitions, against ``python -c pass``
(the interpreter's own start-up) on the same machine:

Import times are given as wall-clock and as CPU time (user + system): on a busy machine the
wall clock grows with the load, the CPU time much less.

- ``python -c pass``: the floor every process pays.
- ``import keymem_shim._client``: the shim's own code (config, runtime, httpx).
- ``import mcp.server.lowlevel``: the MCP SDK alone.
- ``import keymem_shim._server``: everything the shim imports before it serves.
- ``initialize, daemon running``: spawn ``python -m keymem_shim`` -> ``initialize`` answer.
- ``tools/list`` and ``tools/call recall``: one round trip each, after ``initialize``.
- ``initialize, cold autostart``: the same on an empty data dir: the shim starts keymemd.
- ``first tool call, cold``: from spawn to the first successful ``recall`` on that empty
  data dir (includes loading the models).

Example::

    python scripts/bench_shim.py --runs 10 --cold-runs 5 --json bench-out/shim.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from keymem_daemon import runtime
from keymem_daemon.config import Settings
from keymem_daemon.errors import DaemonNotRunning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import percentile  # noqa: E402

SCRUBBED = ("KEYMEM_", "CLAUDE_", "CODEX_", "HF_", "HUGGINGFACE_")


def environment(root: Path, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED)}
    home = root / "home"
    home.mkdir(exist_ok=True)
    env.update(
        HOME=str(home),
        KEYMEM_DATA_DIR=str(data_dir),
        KEYMEM_RERANK="false",
        KEYMEM_HF_ENDPOINT="http://127.0.0.1:9",
        HF_HUB_OFFLINE="1",
        KEYMEM_LOG_LEVEL="warning",
    )
    return env


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values) * 1000, 1),
        "p95_ms": round(percentile(values, 0.95) * 1000, 1),
        "min_ms": round(min(values) * 1000, 1),
        "runs": len(values),
    }


def timed_process(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock and CPU (user + system) seconds of one process; CPU ignores machine load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


async def one_session(env: dict[str, str], *, calls: bool, until_ready: bool = False) -> dict[str, float]:
    """Spawn the shim, initialize; optionally time tools/list and a recall too."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "keymem_shim"], env=env)
    out: dict[str, float] = {}
    with open(os.devnull, "w") as sink:
        started = time.perf_counter()
        async with (
            stdio_client(params, errlog=sink) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            out["initialize"] = time.perf_counter() - started
            if calls:
                t = time.perf_counter()
                await session.list_tools()
                out["tools_list"] = time.perf_counter() - t
                t = time.perf_counter()
                result = await session.call_tool("recall", {"query": "editor"})
                out["tools_call"] = time.perf_counter() - t
                if result.is_error:
                    raise RuntimeError(f"recall failed: {result.content}")
            if until_ready:
                result = await session.call_tool("recall", {"query": "editor"})
                if result.is_error:
                    raise RuntimeError(f"recall failed: {result.content}")
                out["first_call"] = time.perf_counter() - started
    return out


def stop(data_dir: Path) -> None:
    try:
        info = runtime.read_daemon_info(data_dir)
    except DaemonNotRunning:
        return
    runtime.stop_daemon(info, data_dir)


def run(runs: int, cold_runs: int) -> dict[str, Any]:
    results: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        results.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory(prefix="keymem-bench-shim-") as tmp:
        root = Path(tmp)
        warm_dir = root / "warm"
        env = environment(root, warm_dir)
        imports: list[tuple[str, list[str]]] = [
            ("python -c pass", [sys.executable, "-c", "pass"]),
            ("import keymem_shim._client", [sys.executable, "-c", "import keymem_shim._client"]),
            ("import mcp.server.lowlevel", [sys.executable, "-c", "import mcp.server.lowlevel"]),
            ("import keymem_shim._server", [sys.executable, "-c", "import keymem_shim._server"]),
        ]
        for _ in range(runs):
            for name, args in imports:
                wall, cpu = timed_process(args, env)
                add(name, wall)
                add(f"{name} (CPU)", cpu)

        settings = Settings.from_env(env)
        runtime.start_daemon(settings, timeout=60)
        try:
            for _ in range(runs):
                timings = anyio.run(partial(one_session, env, calls=True))
                add("initialize, daemon running", timings["initialize"])
                add("tools/list round trip", timings["tools_list"])
                add("tools/call recall round trip", timings["tools_call"])
        finally:
            stop(warm_dir)

        for index in range(cold_runs):
            cold_dir = root / f"cold-{index}"
            cold_env = environment(root, cold_dir)
            try:
                timings = anyio.run(partial(one_session, cold_env, calls=False, until_ready=True))
            finally:
                stop(cold_dir)
            add("initialize, cold autostart", timings["initialize"])
            add("first tool call, cold autostart", timings["first_call"])

    return {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "measurements": {name: summary(values) for name, values in results.items()},
    }


def render(report: dict[str, Any], write: Callable[[str], object]) -> None:
    load = ", ".join(f"{x:.2f}" for x in report["load_average"])
    write(f"python {report['python']}, {report['cpus']} CPUs, load average {load}\n")
    write(f"{'measurement':<40}{'p50 ms':>10}{'p95 ms':>10}{'min ms':>10}{'runs':>6}\n")
    for name, row in report["measurements"].items():
        write(f"{name:<40}{row['p50_ms']:>10.1f}{row['p95_ms']:>10.1f}{row['min_ms']:>10.1f}{row['runs']:>6}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="repetitions of the warm measurements")
    parser.add_argument("--cold-runs", type=int, default=5, help="repetitions of cold autostart")
    parser.add_argument("--json", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    report = run(args.runs, args.cold_runs)
    render(report, sys.stdout.write)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
