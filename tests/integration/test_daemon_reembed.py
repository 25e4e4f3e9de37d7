"""Switching a populated store to another embedder: the daemon re-embeds it before it is
ready, and says so with its progress -- in ``/health``, in ``keymemd status`` and in the
message of a ``keymemd start`` that stops waiting -- instead of a bare "starting". A daemon
killed in the middle resumes where it stopped; a switch back to the old model after such a
kill embeds everything again rather than keep the half it had.

The new embedder is a real ONNX model from a local directory (all-MiniLM-L6-v2, int8), and
the store is large enough (3,000 memories) that re-embedding it takes seconds here.
"""

from __future__ import annotations

import base64
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from daemon_helpers import READY_TIMEOUT, DaemonFactory, log_growth, scaled, wait_for
from fake_hub import minilm_files, model_dir

from keymem_daemon import runtime
from keymem_daemon.config import Settings
from keymem_daemon.errors import DaemonNotRunning
from keymem_daemon.inference.embedders import load_embedder

pytestmark = pytest.mark.timeout(1800)  # only a guard against a hang: the waits end on a stall

MEMORIES = 3000
WORDS = ("deploy", "queue", "cache", "schema", "billing", "search", "mobile", "alerting", "backup", "editor")


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory holding MEMORIES memories, written by a real daemon on USE."""
    factory = DaemonFactory(tmp_path_factory.mktemp("populated"))
    daemon = factory.start()
    try:
        for start in range(0, MEMORIES, 100):
            items = [{"content": f"Note {i}: the {WORDS[i % 10]} job of team {i % 37} moved to a new "
                                 f"{WORDS[(i // 10) % 10]} host after review {i}.",
                      "keys": [WORDS[i % 10], f"team {i % 37}", f"review {i}"]} for i in range(start, start + 100)]
            assert daemon.call("remember_batch", {"items": items})["result"]["saved"] == 100
    finally:
        factory.teardown()
    return factory.data_dir


def populate(daemons: DaemonFactory, populated: Path) -> None:
    shutil.copytree(populated, daemons.data_dir, ignore=shutil.ignore_patterns("logs", "backups", "*.sock"))


def test_re_embedding_for_a_new_embedder_is_reported_with_its_progress(
    daemons: DaemonFactory, tmp_path: Path, populated: Path
) -> None:
    populate(daemons, populated)

    model = model_dir(tmp_path / "minilm", minilm_files())
    process, _ = daemons.spawn(KEYMEM_EMBED_MODEL=str(model))
    env = daemons.env(KEYMEM_EMBED_MODEL=str(model))
    try:
        seen = wait_for(lambda: _health_detail(daemons), READY_TIMEOUT, message="a re-embedding progress line",
                        progress=lambda: log_growth(daemons.data_dir))
        assert seen.startswith("re-embedding the store for a new embedder: "), seen
        status = subprocess.run([sys.executable, "-m", "keymem_daemon", "status"], env=env, capture_output=True,
                                text=True, timeout=scaled(60), check=False).stdout
        waited = subprocess.run([sys.executable, "-m", "keymem_daemon", "start", "--timeout", "0.2"], env=env,
                                capture_output=True, text=True, timeout=scaled(60), check=False)
        # As long as it takes: the re-embedding logs each chunk, and only a stall fails.
        wait_for(lambda: _health_detail(daemons) is None and _ready(daemons), READY_TIMEOUT,
                 message="the re-embedded daemon to be ready", progress=lambda: log_growth(daemons.data_dir))
    finally:
        process.terminate()
        process.wait(timeout=scaled(60))

    assert "starting on http" in status and "loading:   re-embedding the store for a new embedder" in status, status
    assert waited.returncode == 1
    assert "is still starting: re-embedding the store for a new embedder" in waited.stderr, waited.stderr


def _health(daemons: DaemonFactory) -> dict[str, object] | None:
    try:
        info = runtime.read_daemon_info(daemons.data_dir)
    except DaemonNotRunning:  # not up yet, or killed
        return None
    return runtime.get_health(info, timeout=1.0)


def _ready(daemons: DaemonFactory) -> bool:
    health = _health(daemons)
    return health is not None and health.get("status") == "ready"


def _health_detail(daemons: DaemonFactory) -> str | None:
    detail = (_health(daemons) or {}).get("detail")
    return detail if isinstance(detail, str) else None


def test_a_daemon_killed_while_re_embedding_resumes_and_a_switch_back_embeds_everything_again(
    daemons: DaemonFactory, tmp_path: Path, populated: Path
) -> None:
    populate(daemons, populated)
    model = str(model_dir(tmp_path / "minilm", minilm_files()))
    log = daemons.data_dir / "logs" / "daemon.log"

    def killed_while_re_embedding(embed_model: str) -> None:
        process, _ = daemons.spawn(KEYMEM_EMBED_MODEL=embed_model)
        try:
            wait_for(lambda: _health_detail(daemons), READY_TIMEOUT, message="the re-embedding to start",
                     progress=lambda: log_growth(daemons.data_dir))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=scaled(60))

    def totals() -> list[int]:
        return [int(t) for t in re.findall(r"re-embedding \w+: \d+/(\d+)", log.read_text())]

    killed_while_re_embedding(model)
    first_total = totals()[-1]
    daemon = daemons.start(KEYMEM_EMBED_MODEL=model)
    assert "resuming the re-embedding" in log.read_text()
    assert totals()[-1] < first_total, "the resumed start embedded everything again"
    daemons.stop(daemon)

    # Killed on the way back to USE, then started on MiniLM again: the store is neither.
    killed_while_re_embedding("use-multilingual-v3")
    daemon = daemons.start(KEYMEM_EMBED_MODEL=model)
    exported = daemon.client().post("/v1/export", json={"include_vectors": True}).json()
    daemons.stop(daemon)
    minilm = load_embedder(Settings(data_dir=tmp_path / "probe", embed_model=model))
    assert exported["embedder"] == minilm.fingerprint
    keys = {k["concept"]: k for k in exported["keys"]}
    concepts = ["deploy", "team 3", "review 2999"]
    for concept, fresh in zip(concepts, minilm.embed(concepts), strict=True):
        stored = np.frombuffer(base64.b64decode(keys[concept]["vector"]), dtype=np.float32)
        assert float(stored @ fresh) > 0.99, concept
