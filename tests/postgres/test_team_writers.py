"""Many writers on one PostgreSQL store, as a team has them (issue 22): real daemons (each its
own data directory), real OS client processes writing over HTTP at the same time, and a daemon
SIGKILLed in the middle of a burst of writes. What was acknowledged is there exactly once and
whole (the memory, its links to every key asked for, its index row); nothing half-written is
left; nothing stays locked."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, wait_for
from pg_cluster import start_on

DAEMONS = 2
CLIENTS_PER_DAEMON = 4
REMEMBERS_PER_CLIENT = 250
STALL_TIMEOUT = 120.0
"""Seconds the clients may go without one more remember acknowledged: the wait for the
burst lasts as long as it makes progress, however loaded the machine (one remember takes
~50 ms alone, over a second with eight clients on a busy 2-core machine)."""
REQUEST_TIMEOUT = 60.0
"""One remember, waiting its turn behind the other clients' writes."""
KILL_TIMEOUT = 120.0
"""Seconds for the burst to reach KILL_AFTER acknowledged writes."""
PROPAGATION_TIMEOUT = 30.0
"""Seconds for a write through one daemon to be recallable through the other (well under 1 s)."""
SAMPLED = 12
"""Memories read by id through each daemon after the burst (all 2,000 would take minutes)."""
KILL_AFTER = 40
"""Acknowledged writes before the daemon is SIGKILLed (the burst goes on around the kill)."""
KILL_WRITERS = 4
PROMPT_WRITE_TIMEOUT = 30.0
"""Seconds the first write after the restart may take: a lock left behind would hold it forever."""
DEAD_SESSION_TIMEOUT = 30.0
"""Seconds for the server to drop the killed daemon's sessions (it sees the sockets close at once)."""

pytestmark = pytest.mark.timeout(1800)  # the burst's own wait scales with its progress

# One client process: waits for "go" on stdin, then remembers REMEMBERS_PER_CLIENT notes
# through one daemon, one request at a time, printing each id it is given (or the error).
_CLIENT = """
import json, sys, uuid
import httpx

url, token, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=float(sys.argv[5])) as client:
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(count):
        arguments = {"content": f"{name} note {i}: the canary for shard {i % 17} must stay below {i} errors",
                     "keys": [f"{name} shard {i % 17}", "canary rollout"]}
        response = client.post("/v1/tools/remember", json={"arguments": arguments},
                               headers={"Idempotency-Key": str(uuid.uuid4())})
        body = response.json()
        if response.status_code != 200 or body.get("is_error"):
            print(json.dumps({"error": [i, response.status_code, body]}), flush=True)
            sys.exit(1)
        print(json.dumps({"saved": body["result"]["saved"]}), flush=True)
"""


def _serves(daemon: DaemonProcess, memory_id: str, content: str) -> bool:
    memory = daemon.call("read_memory", {"memory_id": memory_id})["result"].get("memory")
    return memory is not None and memory["content"].split(":", 1)[0] == content


def test_two_daemons_and_eight_client_processes_store_all_2000_remembers_exactly_once(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    daemons = [start_on(factories, tmp_path, f"d{n}", pg_database) for n in range(DAEMONS)]
    clients: list[subprocess.Popen[str]] = []
    outs = [tmp_path / f"client-{k}.out" for k in range(DAEMONS * CLIENTS_PER_DAEMON)]
    try:
        for ((n, daemon), c), out in zip(itertools.product(enumerate(daemons), range(CLIENTS_PER_DAEMON)), outs,
                                         strict=True):
            with out.open("w") as sink:
                clients.append(subprocess.Popen(
                    [sys.executable, "-c", _CLIENT, daemon.url, daemon.token, f"client-{n}-{c}",
                     str(REMEMBERS_PER_CLIENT), str(REQUEST_TIMEOUT)],
                    stdin=subprocess.PIPE, stdout=sink, stderr=subprocess.STDOUT, text=True))

        def lines() -> list[list[str]]:
            return [out.read_text().splitlines() for out in outs]

        # Each has its connection set up: they start together.
        wait_for(lambda: all(o[:1] == ["ready"] for o in lines()), STALL_TIMEOUT, message="the clients to be ready")
        started = time.monotonic()
        for client in clients:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.close()
        wait_for(lambda: all(client.poll() is not None for client in clients), STALL_TIMEOUT,
                 progress=lambda: sum(map(len, lines())),
                 message=lambda: f"the clients to finish ({sum(map(len, lines()))} lines so far)")
        took = time.monotonic() - started
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait(timeout=60)
    failed = [o[-3:] for o, client in zip(lines(), clients, strict=True) if client.returncode != 0]
    assert not failed, failed[:2]
    results = [[json.loads(line) for line in o[1:]] for o in lines()]
    saved = [r["saved"] for rs in results for r in rs]
    total = DAEMONS * CLIENTS_PER_DAEMON * REMEMBERS_PER_CLIENT
    print(f"{total} remembers from {len(clients)} client processes through {DAEMONS} daemons in {took:.1f} s "
          f"({total / took:.0f}/s)")
    assert len(saved) == len(set(saved)) == total
    expected = {f"client-{n}-{c} note {i}": None for n in range(DAEMONS) for c in range(CLIENTS_PER_DAEMON)
                for i in range(REMEMBERS_PER_CLIENT)}
    # Through SQL: every note once, under the id its client was given, with both its keys.
    with psycopg.connect(pg_database) as conn:
        rows = conn.execute("SELECT id, split_part(content, ':', 1) FROM memories").fetchall()
        links = conn.execute("SELECT COUNT(*), COUNT(DISTINCT memory_id) FROM links").fetchone()
        canary = conn.execute("SELECT COUNT(*) FROM keys WHERE norm = 'canary rollout'").fetchone()
    assert len(rows) == total and {note for _, note in rows} == expected.keys()
    assert {memory_id for memory_id, _ in rows} == set(saved)
    assert links == (2 * total, total) and canary == (1,), (links, canary)
    # Through each daemon: its export holds every note once, and it serves what the other wrote.
    for daemon in daemons:
        notes = [m["content"].split(":", 1)[0] for m in daemon.export()["memories"]]
        assert len(notes) == total and set(notes) == expected.keys()
    by_id: dict[str, str] = dict(rows)
    # The 2,000 notes differ only in a name and two numbers, so recall cannot tell one from
    # its neighbours: each daemon is asked for sampled ones by id (its in-memory tables and
    # the server's rows both hold what the other daemon wrote).
    for memory_id in random.Random(22).sample(saved, SAMPLED):
        for daemon in daemons:
            wait_for(lambda d=daemon, m=memory_id: _serves(d, m, by_id[m]), PROPAGATION_TIMEOUT,
                     message=f"{memory_id} to be served through daemon {daemon.pid}")


def _burst(daemon: DaemonProcess, writer: int, stop: threading.Event, acknowledged: list[tuple[str, str]],
           attempted: dict[str, list[str]]) -> None:
    """Remember until the daemon goes away; each acknowledged write as (id, content)."""
    with httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"},
                      timeout=PROPAGATION_TIMEOUT) as client:
        for i in itertools.count():
            if stop.is_set():
                return
            content = f"kill burst {writer}-{i}: the replica at rack {i % 5} lags behind the primary"
            keys = [f"replica {writer} {i}", f"rack {writer} {i}", "replication lag"]
            attempted[content] = keys
            try:
                response = client.post("/v1/tools/remember", json={"arguments": {"content": content, "keys": keys}})
            except httpx.HTTPError:
                return  # the daemon is gone
            body: dict[str, Any] = response.json()
            if response.status_code == 200 and not body.get("is_error"):
                acknowledged.append((body["result"]["saved"], content))


def test_a_daemon_sigkilled_mid_burst_leaves_every_acknowledged_write_whole_and_nothing_locked(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str) -> None:
    daemon = start_on(factories, tmp_path, "a", pg_database)
    stop = threading.Event()
    acknowledged: list[tuple[str, str]] = []
    attempted: dict[str, list[str]] = {}
    threads = [threading.Thread(target=_burst, args=(daemon, w, stop, acknowledged, attempted))
               for w in range(KILL_WRITERS)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(acknowledged) >= KILL_AFTER, KILL_TIMEOUT, message=f"{KILL_AFTER} acknowledged writes")
        daemon.kill()  # SIGKILL, with writes in flight
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=PROPAGATION_TIMEOUT * 2)
    database = pg_database.rsplit("/", 1)[1]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        # The server drops the killed daemon's sessions, and with them every lock they held.
        def others() -> list[tuple[Any, ...]]:
            return conn.execute("SELECT a.pid, a.state, l.locktype FROM pg_stat_activity a LEFT JOIN pg_locks l "
                                "ON l.pid = a.pid WHERE a.datname = %s AND a.pid <> pg_backend_pid() "
                                "AND a.backend_type = 'client backend'", (database,)).fetchall()

        wait_for(lambda: not others(), DEAD_SESSION_TIMEOUT, message=lambda: f"the killed daemon's sessions to "
                 f"end: {others()}")
        rows = {r[0]: r[1] for r in conn.execute("SELECT id, content FROM memories")}
        linked: dict[str, set[str]] = {}
        for memory_id, norm in conn.execute("SELECT l.memory_id, k.norm FROM links l JOIN keys k ON k.id = l.key_id"):
            linked.setdefault(memory_id, set()).add(norm)
        indexed = {r[0] for r in conn.execute("SELECT memory_id FROM memory_fts")}
    # Every acknowledged write is there, whole.
    for memory_id, content in acknowledged:
        assert rows.get(memory_id) == content, (memory_id, content)
    # Every memory there -- acknowledged or committed just before the kill -- is whole: all
    # the keys its write asked for, and its index row. Nothing is half-written.
    for memory_id, content in rows.items():
        assert linked.get(memory_id) == set(attempted[content]), (memory_id, content, linked.get(memory_id))
        assert memory_id in indexed, memory_id
    assert set(linked) <= set(rows)
    print(f"{len(acknowledged)} writes acknowledged, {len(rows)} committed, {len(attempted)} attempted "
          "before the SIGKILL")
    # Restarted on the same data directory, it writes at once (no lock waits for a dead
    # transaction) -- to the shared key every killed write touched -- and serves what was saved.
    restarted = factories[0].start(KEYMEM_STORE_URL=pg_database)
    began = time.monotonic()
    fresh = restarted.remember("after the restart the replica caught up within a minute", ["replication lag"])
    assert time.monotonic() - began < PROMPT_WRITE_TIMEOUT
    assert fresh not in rows
    for memory_id, content in acknowledged[-3:]:
        read = restarted.call("read_memory", {"memory_id": memory_id})
        assert not read["is_error"] and content in json.dumps(read["result"], ensure_ascii=False), read
