"""SIGKILL in the middle of writing: the store survives and keeps every acknowledged write."""

from __future__ import annotations

import random
import shutil
import sqlite3
import threading
from pathlib import Path

import httpx
import pytest
from daemon_helpers import EXIT_TIMEOUT, DaemonFactory, DaemonProcess, scaled, wait_for

CYCLES = 20
WRITERS = 3


def _burst_then_kill(daemon: DaemonProcess, cycle: int, kill_after: int) -> list[str]:
    """Write from several threads; SIGKILL the daemon once ``kill_after`` writes were acknowledged.

    Returns the acknowledged contents: a 200 with a saved id. A request the kill cut off was
    never acknowledged and may or may not be stored.
    """
    acknowledged: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(worker: int) -> None:
        with httpx.Client(base_url=daemon.url, headers=daemon.info.headers, timeout=scaled(30)) as client:
            for i in range(100_000):
                if stop.is_set():
                    return
                content = f"cycle {cycle} writer {worker} write {i}: the crash test stores this"
                try:
                    response = client.post(
                        "/v1/tools/remember",
                        json={
                            "arguments": {
                                "content": content,
                                "keys": ["crash", "durability", f"cycle{cycle}"],
                            }
                        },
                    )
                except httpx.HTTPError:
                    return
                body = response.json()
                assert response.status_code == 200 and "saved" in body["result"], body
                with lock:
                    acknowledged.append(content)

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(acknowledged) >= kill_after, 60, message=f"{kill_after} acknowledged writes")
    daemon.kill()
    stop.set()
    for thread in threads:
        thread.join(timeout=scaled(EXIT_TIMEOUT))
    with lock:
        return list(acknowledged)


def _stored_after_crash(data_dir: Path, scratch: Path) -> set[str]:
    """Open a copy of what the killed daemon left on disk (db + WAL), check it, read it."""
    scratch.mkdir()
    for name in ("keymem.db", "keymem.db-wal"):
        if (data_dir / name).exists():
            shutil.copy2(data_dir / name, scratch / name)
    conn = sqlite3.connect(scratch / "keymem.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        return {row[0] for row in conn.execute("SELECT content FROM memories")}
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sigkill_mid_burst_twenty_times_keeps_every_acknowledged_write(daemons: DaemonFactory, tmp_path: Path) -> None:
    rng = random.Random(20)
    acknowledged: set[str] = set()
    for cycle in range(CYCLES):
        daemon = daemons.start()
        if acknowledged:  # the restarted daemon serves everything acknowledged before the kills
            served = {m["content"] for m in daemon.export()["memories"]}
            assert acknowledged <= served, f"cycle {cycle}: lost {sorted(acknowledged - served)[:3]}"
        daemon.close_clients()
        acked = _burst_then_kill(daemon, cycle, kill_after=rng.randint(3, 25))
        assert (daemons.data_dir / "daemon.json").exists(), "a killed daemon cannot clean up"
        acknowledged.update(acked)
        on_disk = _stored_after_crash(daemons.data_dir, tmp_path / f"after-kill-{cycle}")
        missing = set(acked) - on_disk
        assert not missing, f"cycle {cycle}: acknowledged but not on disk: {sorted(missing)[:3]}"
    final = daemons.start()
    assert final.client().get("/health").json()["status"] == "ready"
    served = {m["content"] for m in final.export()["memories"]}
    assert acknowledged <= served
    stats = final.client().get("/v1/stats").json()
    assert stats["memories"] == len(served)
