"""Shared fixtures: real daemons in real processes (``daemon``, ``daemons``), the ``keymemd``
command line (``cli``) and ``wait_for``. What they are built from -- and what tests import
by name -- is in ``daemon_helpers``. A throwaway PostgreSQL cluster (``pg_cluster``, and a
fresh database per test, ``pg_database``) comes from ``pg_cluster``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's pytest-timeout deadline (its ``timeout`` mark, else ``--timeout`` or the
    ini's) is a quiet machine's figure, like every deadline in the tests: stretch it by
    ``scaled``."""
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
