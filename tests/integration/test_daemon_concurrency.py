"""Many client processes writing at once through HTTP: nothing lost, nothing doubled."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from daemon_helpers import DaemonProcess, scaled

pytestmark = pytest.mark.timeout(600)

PROCESSES = 8
PER_PROCESS = 250

# One client process: PER_PROCESS remembers in flight at the same time, one result line each.
CLIENT = r"""
import asyncio, json, sys
import httpx

url, token, worker, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
VOCAB = ["deploy", "database", "editor", "coffee", "travel", "python", "schedule", "budget"]

async def one(client, i):
    content = f"worker {worker} fact {i}: item {worker * 1000 + i} is stored exactly once"
    keys = [VOCAB[i % len(VOCAB)], VOCAB[(i + worker) % len(VOCAB)], f"worker{worker}"]
    arguments = {"content": content, "keys": keys}
    try:
        response = await client.post("/v1/tools/remember", json={"arguments": arguments})
        body = response.json()
        ok = response.status_code == 200 and not body["is_error"] and "saved" in body["result"]
        return {"content": content, "status": response.status_code, "ok": ok,
                "id": body["result"].get("saved") if ok else None, "body": None if ok else body}
    except Exception as exc:
        return {"content": content, "status": None, "ok": False, "id": None, "body": repr(exc)}

async def main():
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                 limits=limits, timeout=500) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(count)))
    for result in results:
        print(json.dumps(result))

asyncio.run(main())
"""


def test_eight_processes_of_250_concurrent_remembers_store_all_2000_once(
    daemon: DaemonProcess,
) -> None:
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, daemon.url, daemon.token, str(w), str(PER_PROCESS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(PROCESSES)
    ]
    results: list[dict[str, Any]] = []
    for client in clients:
        out, err = client.communicate(timeout=scaled(550))
        assert client.returncode == 0, err
        results.extend(json.loads(line) for line in out.splitlines())
    failures = [r for r in results if not r["ok"]]
    assert not failures, f"{len(failures)} failed, e.g. {failures[:3]}\n{daemon.log()}"
    assert len(results) == PROCESSES * PER_PROCESS
    ids = [r["id"] for r in results]
    assert len(set(ids)) == len(ids), "two writes were given the same memory id"

    exported = daemon.export()["memories"]
    contents = Counter(m["content"] for m in exported)
    assert sorted(contents) == sorted(r["content"] for r in results), "stored set differs from acknowledged"
    assert max(contents.values()) == 1, "a memory was stored twice"
    assert {m["id"] for m in exported} == set(ids)
    stats = daemon.client().get("/v1/stats").json()
    assert stats["memories"] == PROCESSES * PER_PROCESS
