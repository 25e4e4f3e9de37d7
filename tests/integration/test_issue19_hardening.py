"""Issue 19, items 11 and 14-19: a connection flood, permissions, secrets in the log, and
the one-line errors of a read-only or full data dir and of an import cut short.

Real daemons, real processes, real file systems: the read-only and the full data dir are
tmpfs mounts (the tests that need one skip where mounting is not allowed). The tests that only
talk to a running daemon share one for the module, its store emptied before each.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from daemon_helpers import (
    CLI_TIMEOUT,
    EXIT_TIMEOUT,
    READY_TIMEOUT,
    DaemonFactory,
    DaemonProcess,
    isolated_env,
    scaled,
    wait_for,
)
from test_hook_push import claude_payload, run_hook

from keymem_daemon import runtime
from keymem_daemon.connections import HEAD_TIMEOUT

FLOOD: Final = 1100
"""Connections the flood holds open: more than the daemon's 1,024 descriptors."""
DESCRIPTORS: Final = 1024
IMPORT_MEMORIES: Final = 4000
"""An import that takes seconds to embed: long enough to be interrupted."""


@pytest.fixture
def daemon(module_store: DaemonProcess) -> DaemonProcess:
    """The module's daemon, its store emptied."""
    return module_store


def keymemd(env: dict[str, str], *args: str, timeout: float = CLI_TIMEOUT, umask: int = -1
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "keymem_daemon", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, umask=umask)


def one_clear_line(result: subprocess.CompletedProcess[str]) -> str:
    """A failed command's stderr: one line, no traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Unable to configure" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("--- ")]
    assert lines and lines[-1].startswith("Error: "), result.stderr
    return lines[-1]


# -- item 11: a connection flood ----------------------------------------------------------

FLOODER: Final = """
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for i in range(count):
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            sock.sendall(b"GET /v1/tools HTTP/1.1\\r\\nHost: 127.0.0.1")  # a request line never finished
        held.append(sock)
    except OSError:
        pass
print(len(held), flush=True)
sys.stdin.read()
"""


def test_issue19_tool_calls_and_the_hook_answer_while_1100_connections_sit_idle(daemon: DaemonProcess,
                                                                                tmp_path: Path) -> None:
    daemon.remember("The billing staging database listens on port 6543.",
                    ["billing staging database", "port 6543", "PostgreSQL"])
    resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))
    log = daemon.data_dir / "logs" / "daemon.log"
    lines_before = len(log.read_text(errors="replace").splitlines())
    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(daemon.info.port), str(FLOOD)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert flooder.stdout is not None
        assert int(flooder.stdout.readline()) > DESCRIPTORS // 2
        recalled = daemon.call("recall", {"query": "billing staging database port"})
        assert "6543" in json.dumps(recalled), recalled
        env = isolated_env(daemon.data_dir.parent, KEYMEM_AUTOSTART="false",
                           KEYMEM_HOOK_DEBUG_LOG=str(tmp_path / "hook.log"))
        run = run_hook(env, claude_payload("Which port does the billing staging database listen on?", tmp_path),
                       "user-prompt-submit")
        assert run.outcome == "surfaced" and "6543" in (run.context() or ""), run.debug
        open_fds = len(os.listdir(f"/proc/{daemon.pid}/fd"))
        assert open_fds < DESCRIPTORS, f"the daemon holds {open_fds} descriptors"
    finally:
        assert flooder.stdin is not None and flooder.stdout is not None
        flooder.stdin.close()
        flooder.wait(timeout=scaled(EXIT_TIMEOUT))
        flooder.stdout.close()
    new_lines = log.read_text(errors="replace").splitlines()[lines_before:]
    assert sum("Too many open files" in line for line in new_lines) <= 1, new_lines[-20:]
    assert len(new_lines) < 50, new_lines[-20:]


def test_issue19_a_request_head_never_finished_is_closed_after_the_head_timeout(daemon: DaemonProcess) -> None:
    with socket.create_connection(("127.0.0.1", daemon.info.port), timeout=scaled(HEAD_TIMEOUT * 3)) as sock:
        sock.sendall(b"GET /v1/tools HTTP/1.1\r\nHost: 127.0.0.1")
        started = time.monotonic()
        assert sock.recv(65536) == b"", "the daemon answered a request it never got"
        # Closed by the head timeout, not left open: the slack is for a busy machine.
        assert time.monotonic() - started < HEAD_TIMEOUT + scaled(HEAD_TIMEOUT)


# -- item 14: the data dir's mode, and who holds the lock -----------------------------------


def test_issue19_a_data_dir_open_to_others_is_made_private_at_start(daemons: DaemonFactory) -> None:
    daemons.data_dir.mkdir()
    daemons.data_dir.chmod(0o755)
    daemon = daemons.start()
    assert stat.S_IMODE(daemons.data_dir.stat().st_mode) == 0o700
    assert "made " in daemon.log() and "private (mode 755 -> 700)" in daemon.log()


def test_issue19_a_start_that_waits_for_the_lock_in_vain_names_who_holds_it(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    data_dir.mkdir(mode=0o700)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock, sys\nlock = filelock.FileLock(sys.argv[1])\nlock.acquire()\n"
         "print('locked', flush=True)\nsys.stdin.read()", str(data_dir / runtime.LOCK_FILE)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        line = one_clear_line(keymemd(env, "start", "--timeout", "2"))
        assert f"held by pid {holder.pid}" in line, line
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=scaled(EXIT_TIMEOUT))
        holder.stdout.close()


# -- item 15: the export file --------------------------------------------------------------


def test_issue19_an_export_file_is_private_whatever_the_umask(daemon: DaemonProcess, tmp_path: Path) -> None:
    daemon.remember("The deploy key is in the vault.", ["deploy key", "vault"])
    target = tmp_path / "export.json"
    result = keymemd(daemon.env, "export", "-o", str(target), umask=0o022)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert "The deploy key is in the vault." in target.read_text(encoding="utf-8")


# -- item 16: credentials in the access log ------------------------------------------------


def test_issue19_credentials_in_a_query_string_never_reach_the_debug_log(daemons: DaemonFactory) -> None:
    daemon = daemons.start(KEYMEM_LOG_LEVEL="debug")
    client = daemon.client()
    client.get("/health", params={"token": "SECRET-ONE-111", "password": "SECRET-TWO-222"})
    client.get("/v1/stats", params={"api_key": "SECRET-THREE-333", "access_token": "SECRET-FOUR-444"})
    client.get("/v1/stats", params={"client_secret": "SECRET-FIVE-555", "auth": "SECRET-SIX-666"})
    log = daemon.data_dir / "logs" / "daemon.log"
    wait_for(lambda: log.read_text(errors="replace").count("GET /v1/stats") >= 2, READY_TIMEOUT,
             message="the access log lines")
    text = log.read_text(errors="replace")
    assert "SECRET-" not in text, [line for line in text.splitlines() if "SECRET-" in line]
    assert "token=[redacted]" in text and "api_key=[redacted]" in text


# -- items 17 and 18: a read-only and a full data dir --------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``path`` (skips the test where that is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_issue19_a_read_only_data_dir_is_one_clear_line_for_start_and_run(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    with tmpfs(Path(env["KEYMEM_DATA_DIR"]), "ro,size=1m,mode=700"):
        for command in (["start", "--timeout", "10"], ["run"]):
            line = one_clear_line(keymemd(env, *command))
            assert "read-only" in line, line


def test_issue19_a_restart_on_a_full_disk_says_the_disk_is_full(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    data_dir = Path(env["KEYMEM_DATA_DIR"])
    with tmpfs(data_dir, "size=120m,mode=700"):
        first = DaemonFactory(tmp_path)
        try:
            first.start().remember("The disk filled up on Friday.", ["disk", "Friday"])
        finally:
            first.teardown()
        with open(data_dir / "filler", "wb") as filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * (1 << 20))
                filler.flush()
        line = one_clear_line(keymemd(env, "start", "--timeout", "20", timeout=READY_TIMEOUT + 30))
        assert "full" in line, line


# -- item 19: an import cut short ----------------------------------------------------------


def big_export(path: Path) -> Path:
    """A keymem export whose import takes seconds (its memories carry no vectors)."""
    keys = [{"id": f"k{n:011d}", "concept": f"service-{n}", "key_type": "concept", "aliases": []} for n in range(400)]
    memories, links = [], []
    for n in range(IMPORT_MEMORIES):
        memories.append({"id": f"m{n:011d}", "content": f"Note {n}: service-{n % 400} answers on port {1000 + n}.",
                         "namespace": "default", "created_at": 1.7e9 + n, "updated_at": 1.7e9 + n,
                         "last_confirmed_at": 1.7e9 + n})
        links.append({"key_id": keys[n % 400]["id"], "memory_id": memories[-1]["id"], "weight": 1.0})
    path.write_text(json.dumps({"format": "keymem-export", "version": 1, "keys": keys, "memories": memories,
                                "links": links, "relations": [], "alias_candidates": []}), encoding="utf-8")
    return path


def start_import(daemon: DaemonProcess, export: Path) -> subprocess.Popen[str]:
    """``keymemd import`` running, once it reports progress (stderr is not a terminal)."""
    process = subprocess.Popen([sys.executable, "-m", "keymem_daemon", "import", str(export)], env=daemon.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    first = process.stderr.readline()
    assert first.startswith(("embedding:", "indexing:")), first + process.stderr.read()
    return process


def memory_count(daemon: DaemonProcess) -> int:
    count: int = daemon.client().get("/v1/stats").json()["memories"]
    return count


def test_issue19_sigterm_to_keymemd_import_cancels_it_and_nothing_is_committed(daemon: DaemonProcess,
                                                                               tmp_path: Path) -> None:
    process = start_import(daemon, big_export(tmp_path / "big.json"))
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=scaled(EXIT_TIMEOUT))
    assert process.returncode == 1, (process.returncode, stderr)
    assert "Traceback" not in stderr and "cancelled" in stderr.splitlines()[-1], stderr
    wait_for(lambda: "import cancelled" in daemon.log(), READY_TIMEOUT, message=lambda: daemon.log())
    assert memory_count(daemon) == 0


def test_issue19_a_daemon_dying_during_keymemd_import_is_one_clear_line(daemons: DaemonFactory,
                                                                        tmp_path: Path) -> None:
    daemon = daemons.start()
    process = start_import(daemon, big_export(tmp_path / "big.json"))
    daemon.kill()
    stdout, stderr = process.communicate(timeout=scaled(EXIT_TIMEOUT))
    assert process.returncode == 1, (process.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    assert "went away" in stderr.splitlines()[-1], stderr
