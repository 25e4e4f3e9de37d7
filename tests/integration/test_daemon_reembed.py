"""Switching a populated store to another embedder: the daemon re-embeds it before it is
ready, and says so with its progress -- in ``/health``, in ``keymemd status`` and in the
message of a ``keymemd start`` that stops waiting -- instead of a bare "starting".

The new embedder is a real ONNX model from a local directory (all-MiniLM-L6-v2, int8), and
the store is large enough (3,000 memories) that re-embedding it takes seconds here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import READY_TIMEOUT, DaemonFactory, wait_for
from fake_hub import minilm_files

pytestmark = pytest.mark.timeout(300)

MEMORIES = 3000
WORDS = ("deploy", "queue", "cache", "schema", "billing", "search", "mobile", "alerting", "backup", "editor")


def minilm_dir(root: Path) -> Path:
    root.mkdir()
    for name, data in minilm_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_re_embedding_for_a_new_embedder_is_reported_with_its_progress(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    daemon = daemons.start()
    for start in range(0, MEMORIES, 100):
        items = [{"content": f"Note {i}: the {WORDS[i % 10]} job of team {i % 37} moved to a new "
                             f"{WORDS[(i // 10) % 10]} host after review {i}.",
                  "keys": [WORDS[i % 10], f"team {i % 37}", f"review {i}"]} for i in range(start, start + 100)]
        assert daemon.call("remember_batch", {"items": items})["result"]["saved"] == 100
    daemons.stop(daemon)

    model = minilm_dir(tmp_path / "minilm")
    process, _ = daemons.spawn(KEYMEM_EMBED_MODEL=str(model))
    env = daemons.env(KEYMEM_EMBED_MODEL=str(model))
    try:
        seen = wait_for(lambda: _health_detail(daemons), READY_TIMEOUT, message="a re-embedding progress line")
        assert seen.startswith("re-embedding the store for a new embedder: "), seen
        status = subprocess.run([sys.executable, "-m", "keymem_daemon", "status"], env=env, capture_output=True,
                                text=True, timeout=60, check=False).stdout
        waited = subprocess.run([sys.executable, "-m", "keymem_daemon", "start", "--timeout", "0.2"], env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        wait_for(lambda: _health_detail(daemons) is None and _ready(daemons), READY_TIMEOUT * 4,
                 message="the re-embedded daemon to be ready")
    finally:
        process.terminate()
        process.wait(timeout=60)

    assert "starting on http" in status and "loading:   re-embedding the store for a new embedder" in status, status
    assert waited.returncode == 1
    assert "is still starting: re-embedding the store for a new embedder" in waited.stderr, waited.stderr


def _ready(daemons: DaemonFactory) -> bool:
    from keymem_daemon import runtime

    try:
        info = runtime.read_daemon_info(daemons.data_dir)
    except Exception:
        return False
    health = runtime.get_health(info, timeout=1.0)
    return health is not None and health.get("status") == "ready"


def _health_detail(daemons: DaemonFactory) -> str | None:
    import httpx

    from keymem_daemon import runtime

    try:
        info = runtime.read_daemon_info(daemons.data_dir)
        body = httpx.get(f"{info.url}/health", timeout=1.0, trust_env=False).json()
    except Exception:  # not up yet
        return None
    detail = body.get("detail")
    return detail if isinstance(detail, str) else None
