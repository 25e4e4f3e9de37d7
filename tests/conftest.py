"""Shared fixtures: real daemons in real processes (``daemon``, ``daemons``), the ``keymemd``
command line (``cli``) and ``wait_for``. What they are built from -- and what tests import
by name -- is in ``daemon_helpers``. A throwaway PostgreSQL cluster (``pg_cluster``, and a
fresh database per test, ``pg_database``) comes from ``pg_cluster``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
from daemon_helpers import CLI_TIMEOUT, DaemonFactory, DaemonProcess, isolated_env, scaled, shared_daemon, wait_for
from pg_cluster import factories, own_pg_cluster, pg_cluster, pg_database, pg_fresh_databases, pg_template  # noqa: F401 - fixtures, found by pytest through this import
from tcp_proxy import pg_proxy  # noqa: F401 - a fixture, found by pytest through this import

FAST_TIER = Path(__file__).parent / "unit" / "fast"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``pytest -m fast`` imports only the fast tier: importing the rest of the suite just to
    deselect it takes longer than the tier runs (~20 s on a busy 2-core machine). The
    ``fast`` marker lives only under ``tests/unit/fast`` (test_fast_tier.py checks it)."""
    if config.option.markexpr != "fast":
        return None
    inside = collection_path == FAST_TIER or FAST_TIER in collection_path.parents
    return None if inside or collection_path in FAST_TIER.parents else True


SLOWEST_FILES: Final = (
    "integration/test_daemon_reembed.py",
    "integration/test_daemon_crash.py",
    "integration/test_inspector_browser.py",
    "install/test_launcher.py",
    "integration/test_issue_19_store_safety.py",
    "postgres/test_team_daemons.py",
    "integration/test_issue19_hardening.py",
    "postgres/test_federation.py",
    "install/test_readme_commands.py",
    "install/test_real_hosts.py",
    "integration/test_daemon_lifecycle.py",
    "integration/test_shim_mcp.py",
    "integration/test_daemon_transfer.py",
    "integration/test_inspector_cli.py",
    "unit/test_models_use.py",
    "integration/test_issue19_trust.py",
    "integration/test_daemon_cli.py",
    "integration/test_rerank_budget.py",
    "unit/test_engine_loanwords.py",
    "postgres/test_migrate_store.py",
)
"""The files that take minutes, longest first (one run's figures, two workers at load 20),
then the rest in their usual order: collected first, so pytest-xdist's loadfile hands them
out first and the many short files fill in behind them. Handed out last (xdist's own order
is by test count, and these hold few tests), one of them alone kept a worker busy for
minutes after the other had run out of files."""


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist's loadfile hands out files in collection order (``SLOWEST_FILES``) rather
    than re-sorting them by test count (its ``--no-loadscope-reorder``)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``SLOWEST_FILES`` first, longest first, each file's tests in their own order.
    Each test's pytest-timeout deadline (its ``timeout`` mark, else ``--timeout`` or the
    ini's) is a quiet machine's figure, like every deadline in the tests: stretch it by
    ``scaled``."""
    tests = Path(__file__).parent
    rank = {tests / name: place for place, name in enumerate(SLOWEST_FILES)}
    missing = [str(path) for path in rank if not path.is_file()]
    if missing:
        raise pytest.UsageError(f"SLOWEST_FILES names files that are gone: {missing}")
    items.sort(key=lambda item: rank.get(item.path, len(rank)))
    default = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker is not None and marker.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(scaled(seconds)), append=False)


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    return wait_for


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[DaemonFactory]:
    """Start (and restart) daemons on one data directory under ``tmp_path``."""
    factory = DaemonFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.teardown()


@pytest.fixture
def daemon(daemons: DaemonFactory) -> DaemonProcess:
    """A ready daemon on a fresh data directory; stopped and checked at teardown."""
    return daemons.start()


@pytest.fixture(scope="module")
def module_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon (default settings) for the tests of a module that take ``module_store``: a
    start costs more than most such tests do. Stopped and checked after the module."""
    with shared_daemon(tmp_path_factory.mktemp("module-daemon")) as running:
        yield running


@pytest.fixture
def module_store(module_daemon: DaemonProcess) -> Iterator[DaemonProcess]:
    """The module's daemon with its store emptied, as a fresh daemon's is (a module that
    shares one names this its ``daemon``)."""
    module_daemon.forget_all()
    yield module_daemon
    module_daemon.close_clients()


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``keymemd`` (as ``python -m keymem_daemon``) with the test environment."""

    def run(
        *args: str,
        env: Mapping[str, str] | None = None,
        timeout: float = CLI_TIMEOUT,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keymem_daemon", *args],
            env=dict(env) if env is not None else isolated_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=scaled(timeout),
            input=input,
            check=False,
        )

    return run
