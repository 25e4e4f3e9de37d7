"""How fast the MCP shim starts: import time, and ``initialize`` as a host sees it.

Measured in one run, each as p50/p95 over several repetitions, against ``python -c pass``
(the interpreter's own start-up) on the same machine:

Import times are given as wall-clock and as CPU time (user + system): on a busy machine the
wall clock grows with the load, the CPU time much less.

- ``python -c pass``: the floor every process pays.
- ``import keymem_shim._client``: the shim's own code (config, runtime, httpx).
- ``import mcp.server.lowlevel``: the MCP SDK alone.
- ``import keymem_shim._server``: everything the shim imports before it serves.
- ``initialize, daemon running``: spawn ``python -m keymem_shim`` -> ``initialize`` answer;
  the launcher hands its stdio to the daemon's warm shim (``KEYMEM_WARM_SHIM``).
- ``initialize, daemon running, in-process``: the same with ``KEYMEM_WARM_SHIM=false`` in the
  shim's environment: it imports the MCP SDK and serves itself (the fallback path).
- ``tools/list`` and ``tools/call recall``: one round trip each, after ``initialize``.
- memory (Linux): RSS and private (unshared) memory of the warm shim, of one forked session
  and of one in-process shim, read from ``/proc/<pid>/smaps_rollup`` after ``initialize``.
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


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def memory_mb(pid: int) -> dict[str, float]:
    """RSS and private (not shared with any other process) memory of ``pid``, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) / 1024
    private = fields["Private_Clean"] + fields["Private_Dirty"]
    return {"rss_mb": round(fields["Rss"], 1), "private_mb": round(private, 1)}


def session_process(parent: int) -> int:
    """The process serving the session that ``parent`` (the warm shim or this script) started."""
    (pid,) = [c for c in children(parent) if b"keymem_shim" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return pid


async def one_session(
    env: dict[str, str],
    *,
    calls: bool,
    until_ready: bool = False,
    probe: Callable[[], None] | None = None,
) -> dict[str, float]:
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
            if probe is not None:
                probe()
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


def wait_for_warm_shim(data_dir: Path, timeout: float = 30.0) -> None:
    """The daemon starts its warm shim beside itself; it listens once it has imported the SDK."""
    deadline = time.monotonic() + timeout
    while not Settings.from_env({"KEYMEM_DATA_DIR": str(data_dir)}).warm_shim_socket.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no warm shim socket in {data_dir} after {timeout:g} s")
        time.sleep(0.05)


def stop(data_dir: Path) -> None:
    try:
        info = runtime.read_daemon_info(data_dir)
    except DaemonNotRunning:
        return
    runtime.stop_daemon(info, data_dir)


def run(runs: int, cold_runs: int) -> dict[str, Any]:
    results: dict[str, list[float]] = {}
    memory: dict[str, dict[str, float]] = {}

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
        in_process = {**env, "KEYMEM_WARM_SHIM": "false"}
        try:
            wait_for_warm_shim(warm_dir)
            if Path("/proc/self/smaps_rollup").exists():
                daemon = runtime.read_daemon_info(warm_dir).pid
                server = session_process(daemon)
                memory["warm shim"] = memory_mb(server)

                def forked() -> None:
                    memory["one forked session"] = memory_mb(session_process(server))

                def own() -> None:
                    memory["one in-process shim"] = memory_mb(session_process(os.getpid()))

                anyio.run(partial(one_session, env, calls=False, probe=forked))
                anyio.run(partial(one_session, in_process, calls=False, probe=own))
            for _ in range(runs):
                timings = anyio.run(partial(one_session, env, calls=True))
                add("initialize, daemon running", timings["initialize"])
                add("tools/list round trip", timings["tools_list"])
                add("tools/call recall round trip", timings["tools_call"])
                timings = anyio.run(partial(one_session, in_process, calls=False))
                add("initialize, daemon running, in-process", timings["initialize"])
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
        "memory": memory,
    }


def render(report: dict[str, Any], write: Callable[[str], object]) -> None:
    load = ", ".join(f"{x:.2f}" for x in report["load_average"])
    write(f"python {report['python']}, {report['cpus']} CPUs, load average {load}\n")
    write(f"{'measurement':<40}{'p50 ms':>10}{'p95 ms':>10}{'min ms':>10}{'runs':>6}\n")
    for name, row in report["measurements"].items():
        write(f"{name:<40}{row['p50_ms']:>10.1f}{row['p95_ms']:>10.1f}{row['min_ms']:>10.1f}{row['runs']:>6}\n")
    if report["memory"]:
        write(f"{'memory after initialize':<40}{'RSS MB':>10}{'private':>10}\n")
        for name, row in report["memory"].items():
            write(f"{name:<40}{row['rss_mb']:>10.1f}{row['private_mb']:>10.1f}\n")


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
