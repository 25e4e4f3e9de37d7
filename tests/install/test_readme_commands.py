"""README's first fresh-machine command works from a clean copy of the repository.

The command (``python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/keymemd start``)
runs verbatim with ``sh``, on an empty HOME, with pip offline against the session's
wheelhouse (see ``installsim.build_wheelhouse``) so the test needs no network. The second
command -- the test suite -- is what CI runs (``tests/unit/test_docs.py`` checks that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import scaled
from installsim import base_python, copy_plugin, offline_pip_env, session_wheelhouse, stop_daemon

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from test_docs import fresh_machine_commands  # noqa: E402


@pytest.fixture(scope="session")
def wheelhouse(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_wheelhouse(request, tmp_path_factory)


def test_the_readme_command_sets_up_and_starts_keymem_from_a_clean_copy(tmp_path: Path, wheelhouse: Path) -> None:
    run_keymem, _ = fresh_machine_commands()
    checkout = copy_plugin(tmp_path / "keymem")
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(base_python())
    env = {
        "HOME": str(home),
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "KEYMEM_RERANK": "false",
        "HF_HUB_OFFLINE": "1",
        # README's `keymemd start` waits its default 20 s: the modules compiled at install,
        # as pip does by default, not at the daemon's first start.
        **offline_pip_env(wheelhouse, compile_modules=True),
    }
    data = home / ".keymem"
    try:
        done = subprocess.run(["sh", "-c", run_keymem], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=scaled(900), check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        status = subprocess.run([str(checkout / ".venv" / "bin" / "keymemd"), "status", "--json"], cwd=checkout,
                                env=env, capture_output=True, text=True, timeout=scaled(60), check=False)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["running"] is True and report["state"] in ("ready", "starting"), report
        assert Path(report["data_dir"]) == data
    finally:
        stop_daemon(data)
