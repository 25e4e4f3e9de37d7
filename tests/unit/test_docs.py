"""Docs as tests: the README documents every setting and command, DESIGN's routes exist, and
CI runs exactly the test command the README gives."""

from __future__ import annotations

import re
from pathlib import Path

import click

from keymem_daemon.cli import cli
from keymem_daemon.config import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def fresh_machine_commands() -> tuple[str, str]:
    """The two fenced commands under "Quick start": run keymem, run the tests."""
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert len(blocks) >= 2, "Quick start must give two commands"
    return blocks[0].strip(), blocks[1].strip()


def test_every_setting_is_in_the_readme_with_its_default() -> None:
    for var in VARIABLES:
        row = next((line for line in README.splitlines() if f"`{var.env}`" in line and line.startswith("|")), None)
        assert row is not None, f"{var.env} is not in the README's configuration table"
        assert var.default in row, f"{var.env}: the README row does not show the default {var.default!r}"


def test_every_cli_command_has_help_and_is_in_the_readme() -> None:
    assert isinstance(cli, click.Group)
    for name, command in cli.commands.items():
        assert command.help and "Example" in command.help, f"keymemd {name} needs help with an example"
        assert f"keymemd {name}" in README, f"keymemd {name} is not mentioned in the README"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, tests = fresh_machine_commands()
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in script.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] in (f"exec {tests}", tests), f".ci/run must run {tests!r}"


def test_the_readme_names_the_pytest_command_the_test_script_runs() -> None:
    script = (ROOT / "scripts" / "run-tests.sh").read_text(encoding="utf-8")
    last = [line.strip() for line in script.splitlines() if line.strip() and not line.startswith("#")][-1]
    runs = re.fullmatch(r'exec \.venv/bin/python -m (pytest.*?) "\$@"', last)
    assert runs is not None, f"scripts/run-tests.sh must end by running pytest with its arguments: {last!r}"
    testing = README.split("## Testing", 1)[1].split("\n## ", 1)[0]
    assert f"`{runs[1]}`" in testing, f"README's Testing section must name the command CI runs: {runs[1]!r}"


def test_every_route_of_the_design_exists() -> None:
    from fastapi import FastAPI

    from keymem_daemon.config import Settings
    from keymem_daemon.http.app import create_app
    from keymem_daemon.service import Service

    design = (ROOT.parent / "shared" / "DESIGN.md")
    routes = {"/health", "/v1/tools", "/v1/tools/{name}", "/v1/instructions", "/v1/prompts",
              "/v1/prompts/{name}", "/v1/inject", "/v1/stats", "/v1/export", "/v1/import", "/v1/shutdown"}
    if design.exists():  # the design lives beside the repository in development checkouts
        table = design.read_text(encoding="utf-8").split("## 2.", 1)[1].split("## 3.", 1)[0]
        assert {r for r in routes if "{" not in r} <= set(re.findall(r"(/(?:v1/)?[a-z]+)", table)) | routes
    settings = Settings(data_dir=ROOT / ".unused")
    app = create_app(Service(settings), settings, "token")
    assert isinstance(app, FastAPI)
    paths = {getattr(route, "path", None) for route in app.routes}
    assert routes <= paths, routes - paths
