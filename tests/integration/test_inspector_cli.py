"""``keymemd ui/search/show/forget/keys/activity`` as subprocesses against a real daemon.

One daemon serves the module, its store emptied before each test (a start is most of what a
test here costs); the activity test has its own, since it reads the log from the first entry."""

from __future__ import annotations

import functools
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import CLI_TIMEOUT, DaemonFactory, DaemonProcess, isolated_env, scaled, wait_for

pytestmark = pytest.mark.timeout(180)

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def daemon(module_store: DaemonProcess) -> DaemonProcess:
    """The module's daemon, its store emptied."""
    return module_store


@pytest.fixture
def cli(cli: Cli, request: pytest.FixtureRequest) -> Cli:
    """conftest's ``keymemd``, with the module daemon's environment in the tests that take
    ``daemon`` (the others run it on their own ``tmp_path``)."""
    if "daemon" not in request.fixturenames:
        return cli
    daemon: DaemonProcess = request.getfixturevalue("daemon")
    return functools.partial(cli, env=daemon.env)


def _seed(daemon: DaemonProcess) -> tuple[str, str]:
    apple = daemon.remember("An apple is a crisp fruit that grows on trees in an orchard.", ["apple", "fruit"])
    deploy = daemon.remember("The deploy window is Tuesday 10:00 for the billing service.",
                             ["deploy", "billing", "schedule"], namespace="work")
    return apple, deploy


def test_search_prints_a_table_and_json_and_filters_by_namespace(daemon: DaemonProcess, cli: Cli) -> None:
    apple, deploy = _seed(daemon)
    human = cli("search", "apple orchard")
    assert human.returncode == 0, human.stderr
    header, _, first = human.stdout.splitlines()[:3]
    assert header.split()[:3] == ["id", "validity", "namespace"] and first.startswith(apple)
    data = json.loads(cli("search", "deploy", "--namespace", "work", "--limit", "5", "--json").stdout)
    assert [r["id"] for r in data["results"]] == [deploy] and data["results"][0]["keys"]
    assert "no memories found" in cli("search", "deploy", "--namespace", "elsewhere").stdout


def test_show_prints_one_memory_and_unknown_ids_fail_clearly(daemon: DaemonProcess, cli: Cli) -> None:
    apple, _ = _seed(daemon)
    shown = cli("show", apple)
    assert shown.returncode == 0 and "crisp fruit" in shown.stdout
    assert "apple (1.0)" in shown.stdout and "fruit (1.0)" in shown.stdout
    assert json.loads(cli("show", apple, "--json").stdout)["memory"]["id"] == apple
    assert daemon.call("read_memory", {"memory_id": apple})["result"]["memory"]["access_count"] == 1, \
        "show must not count an access (only this read did)"
    missing = cli("show", "000000000000")
    assert missing.returncode == 1 and "Memory 000000000000 not found" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_forget_asks_first_unless_yes(daemon: DaemonProcess, cli: Cli) -> None:
    apple, deploy = _seed(daemon)
    declined = cli("forget", apple, input="n\n")
    assert declined.returncode == 1 and "crisp fruit" in declined.stderr
    assert "error" not in daemon.call("read_memory", {"memory_id": apple})["result"]
    accepted = cli("forget", apple, input="y\n")
    assert accepted.returncode == 0 and f"forgot {apple}" in accepted.stdout
    assert "not found" in daemon.call("read_memory", {"memory_id": apple})["result"]["error"]
    assert json.loads(cli("forget", deploy, "--yes", "--json").stdout)["deleted"] is True
    again = cli("forget", deploy, "--yes")
    assert again.returncode == 1 and f"Memory {deploy} not found" in again.stderr


def test_keys_lists_the_vocabulary_and_hubs(daemon: DaemonProcess, cli: Cli) -> None:
    _seed(daemon)
    for i in range(3):
        daemon.remember(f"Fruit fact number {i}: orchards need bees.", ["fruit", f"fact {i}"])
    listed = cli("keys")
    assert listed.returncode == 0 and "fruit" in listed.stdout and "orchard" not in listed.stdout.split()
    hubs = json.loads(cli("keys", "--hubs", "--json").stdout)
    assert [k["concept"] for k in hubs["keys"]] == ["fruit"] and hubs["keys"][0]["is_hub"]
    work = json.loads(cli("keys", "--namespace", "work", "--json").stdout)
    assert {k["concept"] for k in work["keys"]} == {"deploy", "billing", "schedule"}


def test_activity_lists_and_follows_the_log(daemons: DaemonFactory, cli: Cli, tmp_path: Path) -> None:
    daemon = daemons.start()  # its own: the follower replays the log from the first entry
    apple, _ = _seed(daemon)
    listed = cli("activity")
    assert listed.returncode == 0 and f"remembered {apple}" in listed.stdout
    assert json.loads(cli("activity", "--kind", "remember", "--json").stdout)["entries"][0]["kind"] == "remember"
    follower = subprocess.Popen([sys.executable, "-m", "keymem_daemon", "activity", "-f", "--json"],
                                env=isolated_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout or ()], daemon=True)
    reader.start()
    seen: list[dict[str, Any]] = []

    def arrived(kind: str) -> bool:
        while not lines.empty():
            seen.append(json.loads(lines.get()))
        return any(e["kind"] == kind for e in seen)

    try:
        wait_for(lambda: arrived("remember"), CLI_TIMEOUT, message="the log so far")
        daemon.call("forget", {"memory_id": apple})
        wait_for(lambda: arrived("forget"), CLI_TIMEOUT, message="the forget to be followed")
    finally:
        follower.terminate()
        follower.wait(timeout=scaled(CLI_TIMEOUT))
        reader.join(timeout=scaled(CLI_TIMEOUT))
        for pipe in (follower.stdout, follower.stderr):
            if pipe is not None:
                pipe.close()
    assert next(e for e in seen if e["kind"] == "forget")["memory_id"] == apple


def test_ui_prints_a_one_time_login_link(daemon: DaemonProcess, cli: Cli) -> None:
    printed = cli("ui", "--print")
    assert printed.returncode == 0, printed.stderr
    url = printed.stdout.strip()
    assert url.startswith(f"{daemon.url}/ui/login?token=")
    browser = daemon.client(token="")
    assert browser.get(url[len(daemon.url):], follow_redirects=False).status_code == 303
    assert browser.get(url[len(daemon.url):], follow_redirects=False).status_code == 401
    assert json.loads(cli("ui", "--json").stdout)["url"] != url


def test_the_commands_say_when_no_daemon_runs(cli: Cli) -> None:
    for args in (("search", "x"), ("show", "000000000000"), ("keys",), ("activity",), ("ui", "--print")):
        result = cli(*args)
        assert result.returncode == 1 and "keymemd start" in result.stderr, (args, result.stderr)
