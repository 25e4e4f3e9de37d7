"""``keymemd`` commands against real daemons: start races, status, stop, logs, failures."""

from __future__ import annotations

import json
import plistlib
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from daemon_helpers import (
    CLI_TIMEOUT,
    READY_TIMEOUT,
    REQUEST_TIMEOUT,
    DaemonFactory,
    isolated_env,
    live_processes,
    scaled,
    wait_for,
)

from keymem_daemon import __version__, runtime

pytestmark = pytest.mark.timeout(180)

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def stopped_at_end(cli: Cli, tmp_path: Path) -> Iterator[None]:
    """Whatever a test started through the CLI is stopped (and checked) at the end."""
    yield
    result = cli("stop", "--json")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "data" / "daemon.json").exists()


def _daemon_pids(data_dir: Path) -> list[int]:
    """Every live ``keymem_daemon run`` process serving ``data_dir`` (from /proc)."""
    pids = []
    for pid, raw_cmdline, environ in live_processes():
        cmdline = raw_cmdline.split(b"\0")
        if (
            b"keymem_daemon" in cmdline
            and b"run" in cmdline
            and (str(data_dir).encode() in b" ".join(cmdline) or f"KEYMEM_DATA_DIR={data_dir}".encode() in environ)
        ):
            pids.append(pid)
    return pids


def test_two_racing_starts_end_with_one_daemon(tmp_path: Path, stopped_at_end: None) -> None:
    env = isolated_env(tmp_path)
    command = [sys.executable, "-m", "keymem_daemon", "start", "--json"]
    racers = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=scaled(CLI_TIMEOUT * 2)) for racer in racers]
    for racer, (_, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err
    reports = [json.loads(out) for out, _ in outputs]
    assert reports[0]["pid"] == reports[1]["pid"]
    assert sorted(r["started"] for r in reports) == [False, True]
    assert _daemon_pids(tmp_path / "data") == [reports[0]["pid"]]


def test_start_is_a_no_op_when_running_and_status_reports_it(cli: Cli, stopped_at_end: None) -> None:
    first = cli("start", "--json")
    assert first.returncode == 0, first.stderr
    again = cli("start")
    assert again.returncode == 0
    assert "already running" in again.stdout
    status = cli("status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["running"] is True and report["state"] == "ready"
    assert report["pid"] == json.loads(first.stdout)["pid"]
    assert report["version"] == __version__
    assert report["memories"] == 0 and report["keys"] == 0
    assert report["embedder"] and report["reranker"]["state"] == "disabled"
    human = cli("status")
    assert "ready on http://127.0.0.1:" in human.stdout and "0 memories" in human.stdout
    socket_file = Path(report["data_dir"]) / "shim.sock"
    wait_for(socket_file.exists, READY_TIMEOUT, message="the warm shim's socket")
    assert json.loads(cli("status", "--json").stdout)["warm_shim"] == str(socket_file)
    assert f"warm shim: {socket_file}" in cli("status").stdout


def test_status_and_stop_without_a_daemon(cli: Cli) -> None:
    status = cli("status", "--json")
    assert status.returncode == 1
    assert json.loads(status.stdout)["running"] is False
    stop = cli("stop", "--json")
    assert stop.returncode == 0
    assert json.loads(stop.stdout)["stopped"] is False


def test_a_failed_start_prints_the_log_tail(tmp_path: Path, cli: Cli) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("start", env=isolated_env(tmp_path, KEYMEM_PORT=str(port)))
    assert result.returncode == 1
    assert "exited with code 1" in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr  # from the log's tail
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data" / "daemon.json").exists()


def test_a_daemon_that_is_not_ready_in_time_is_reported(tmp_path: Path, cli: Cli, stopped_at_end: None) -> None:
    result = cli("start", "--timeout", "0.2")
    assert result.returncode == 1
    assert "not ready within 0.2 s" in result.stderr
    # It was left to finish loading; a later start finds it.
    again = cli("start", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["started"] is False


def test_start_port_flag_and_logs(cli: Cli, tmp_path: Path, stopped_at_end: None) -> None:
    # The port stays bound (not listening) while the daemon starts: a port released first could
    # be handed to another xdist worker's daemon (they bind port 0) before this one binds it. The
    # daemon's own bind shares it (both SO_REUSEADDR, neither listening until it does).
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        started = cli("start", "--port", str(port), "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["port"] == port
    logs = cli("logs", "-n", "200", "--json")
    report = json.loads(logs.stdout)
    assert report["path"] == str(tmp_path / "data" / "logs" / "daemon.log")
    assert any(f"listening on http://127.0.0.1:{port}" in line for line in report["lines"])
    info = runtime.read_daemon_info(tmp_path / "data")
    assert not any(info.token in line for line in report["lines"]), "the token leaked into the log"
    assert len(cli("logs", "-n", "3").stdout.splitlines()) == 3


def test_logs_follow_prints_new_lines(cli: Cli, tmp_path: Path) -> None:
    log = tmp_path / "data" / "logs" / "daemon.log"
    log.parent.mkdir(parents=True)
    log.write_text("old line\n")
    follower = subprocess.Popen(
        [sys.executable, "-m", "keymem_daemon", "logs", "-n", "1", "-f"],
        env=isolated_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "old line\n"
        with open(log, "a") as handle:
            handle.write("new line\n")
        assert follower.stdout.readline() == "new line\n"
        log.rename(log.with_suffix(".log.1"))  # rotation
        log.write_text("after rotation\n")
        assert follower.stdout.readline() == "after rotation\n"
    finally:
        follower.kill()
        follower.wait(timeout=scaled(10))
        if follower.stdout is not None:
            follower.stdout.close()


def test_export_and_import_through_the_cli(cli: Cli, tmp_path: Path, stopped_at_end: None) -> None:
    assert cli("start").returncode == 0
    info = runtime.read_daemon_info(tmp_path / "data")
    with httpx.Client(base_url=info.url, headers=info.headers, timeout=scaled(REQUEST_TIMEOUT)) as client:
        for text, keys in (
            ("Mina likes green tea", ["Mina", "tea"]),
            ("The API runs on port 8080", ["api", "port"]),
        ):
            assert (
                client.post("/v1/tools/remember", json={"arguments": {"content": text, "keys": keys}}).json()[
                    "is_error"
                ]
                is False
            )
    out = tmp_path / "export.json"
    exported = cli("export", "-o", str(out), "--json")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["counts"]["memories"] == 2
    assert len(json.loads(out.read_text())["memories"]) == 2
    to_stdout = cli("export")
    assert json.loads(to_stdout.stdout) == json.loads(out.read_text())

    other = tmp_path / "other"
    env = isolated_env(tmp_path, KEYMEM_DATA_DIR=str(other))
    assert cli("start", env=env).returncode == 0
    try:
        imported = cli("import", str(out), "--json", env=env)
        assert imported.returncode == 0, imported.stderr
        assert json.loads(imported.stdout)["result"]["imported"]["memories"] == 2
        assert "writing" in imported.stderr  # progress went to stderr
        assert json.loads(cli("export", env=env).stdout)["memories"] == json.loads(out.read_text())["memories"]

        bad = tmp_path / "bad.json"
        bad_export = {
            "format": "keymem-export",
            "version": 1,
            "keys": [],
            "memories": [{"id": 3}],
            "links": [],
        }
        bad.write_text(json.dumps(bad_export))
        failed = cli("import", str(bad), env=env)
        assert failed.returncode == 1
        assert "memories[0]" in failed.stderr and "Traceback" not in failed.stderr
        garbage = tmp_path / "garbage.json"
        garbage.write_text("{not json")
        failed = cli("import", str(garbage), env=env)
        assert failed.returncode == 1 and "not valid JSON" in failed.stderr
        status = json.loads(cli("status", "--json", env=env).stdout)
        assert status["memories"] == 2, "a rejected import changed the store"
    finally:
        assert cli("stop", env=env).returncode == 0


def test_status_lists_the_loanwords_the_store_taught_kiwi_across_restarts(
    cli: Cli, tmp_path: Path, stopped_at_end: None
) -> None:
    assert cli("start").returncode == 0
    info = runtime.read_daemon_info(tmp_path / "data")
    with httpx.Client(base_url=info.url, headers=info.headers, timeout=scaled(REQUEST_TIMEOUT)) as client:
        result = client.post("/v1/tools/remember", json={"arguments": {
            "content": "스프린트 작업은 전부 지라에서 관리한다.", "keys": ["지라", "Jira", "스프린트"]}}).json()
        assert result["is_error"] is False
    assert json.loads(cli("status", "--json").stdout)["learned_words"] == ["지라"]
    assert cli("stop").returncode == 0
    assert cli("start").returncode == 0
    assert "loanwords: 지라" in cli("status").stdout


def test_install_service_prints_and_writes_units(cli: Cli, tmp_path: Path) -> None:
    unit = cli("install-service", "--systemd")
    assert unit.returncode == 0
    assert f'ExecStart="{sys.executable}" -m keymem_daemon run' in unit.stdout
    assert f'Environment="KEYMEM_DATA_DIR={tmp_path / "data"}"' in unit.stdout
    written = cli("install-service", "--systemd", "--write", "--json")
    report = json.loads(written.stdout)
    target = tmp_path / "home" / ".config" / "systemd" / "user" / "keymemd.service"
    assert report["written"] is True and report["path"] == str(target)
    assert target.read_text() == unit.stdout
    assert any("systemctl --user enable --now keymemd.service" in c for c in report["commands"])
    target.write_text("something else\n")
    refused = cli("install-service", "--systemd", "--write")
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert cli("install-service", "--systemd", "--write", "--force").returncode == 0

    plist = cli("install-service", "--launchd")
    data = plistlib.loads(plist.stdout.encode())
    assert data["ProgramArguments"] == [sys.executable, "-m", "keymem_daemon", "run"]
    assert data["EnvironmentVariables"] == {"KEYMEM_DATA_DIR": str(tmp_path / "data")}
    assert data["Label"] == "dev.keymem.keymemd"


def test_stop_escalates_to_sigterm_when_shutdown_is_not_answered(tmp_path: Path) -> None:
    """A daemon that does not answer HTTP is stopped with SIGTERM (and never left behind)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    # A process that owns the data dir (it holds daemon.lock) but serves nothing: a hung
    # daemon, whose shutdown requests fail.
    fake = subprocess.Popen(
        [sys.executable, "-c", "import filelock, sys, time\nlock = filelock.FileLock(sys.argv[1])\nlock.acquire()\n"
         "print('locked', flush=True)\nwhile True: time.sleep(1)", str(data_dir / runtime.LOCK_FILE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "locked"
        info = runtime.DaemonInfo(
            pid=fake.pid,
            port=9,
            token="t" * 43,
            version=__version__,
            started_at=0.0,
            data_dir=str(data_dir),
        )
        runtime.write_daemon_info(data_dir, info)
        outcome = runtime.stop_daemon(info, data_dir, grace=0.5)
        assert outcome == "terminated"
        assert fake.wait(timeout=scaled(10)) == -15
        assert not (data_dir / "daemon.json").exists()
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait()
        if fake.stdout is not None:
            fake.stdout.close()


def test_stop_never_signals_a_recycled_pid(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    bystander = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    try:
        info = runtime.DaemonInfo(
            pid=bystander.pid,
            port=9,
            token="t" * 43,
            version=__version__,
            started_at=0.0,
            data_dir=str(data_dir),
        )
        assert runtime.stop_daemon(info, data_dir, grace=0.2) == "not_running"
        assert bystander.poll() is None, "an unrelated process was signalled"
        assert not (data_dir / "daemon.json").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_waits_for_a_daemon_that_is_still_starting(tmp_path: Path, cli: Cli) -> None:
    factory = DaemonFactory(tmp_path)
    process, output = factory.spawn()
    try:
        # The lock is taken before daemon.json is written: stop right then.
        wait_for(
            lambda: not runtime.lock_is_free(tmp_path / "data"),
            READY_TIMEOUT,
            interval=0.01,
            message="the daemon to take its lock",
        )
        result = cli("stop", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["stopped"] is True
        assert process.wait(timeout=scaled(30)) == 0, output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not (tmp_path / "data" / "daemon.json").exists()
