"""What every ``keymemd`` command shares: its state (the environment and ``--data-dir``),
``--json`` output, and reaching the running daemon. Light (click, config, errors, runtime):
``start``, ``stop`` and ``status`` import it (see cli.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from keymem_daemon import runtime
from keymem_daemon.config import Settings
from keymem_daemon.errors import DaemonNotRunning, KeymemError

if TYPE_CHECKING:
    # Imported where a command makes a request: ``keymemd run`` is the daemon, which makes
    # none and would carry httpx for nothing (see runtime.py).
    import httpx

F = TypeVar("F", bound=Callable[..., Any])

REQUEST_TIMEOUT: Final = 30.0


@dataclass
class CliState:
    """What every command shares: the environment, and ``--data-dir`` if given."""

    environ: Mapping[str, str]
    data_dir: Path | None = None
    _settings: Settings | None = field(default=None, repr=False)

    def settings(self, **overrides: Any) -> Settings:
        """``Settings.from_env`` once; CLI flags override fields explicitly."""
        if self._settings is None or overrides:
            try:
                built = Settings.from_env(self.environ, data_dir=self.data_dir, **overrides)
            except KeymemError as exc:
                raise click.ClickException(exc.message) from None
            if overrides:
                return built
            self._settings = built
        return self._settings


pass_state = click.make_pass_decorator(CliState, ensure=True)


def json_option(fn: F) -> F:
    """``--json``: print one JSON object on stdout instead of text."""
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(fn)


def emit(as_json: bool, data: Mapping[str, Any], human: str | Sequence[str]) -> None:
    """The commands' only output: ``data`` as JSON, or the human text."""
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, sort_keys=True))
    else:
        click.echo(human if isinstance(human, str) else "\n".join(human))


def daemon_error(response: httpx.Response) -> click.ClickException:
    try:
        error = response.json()["error"]
        message = f"{error['message']} ({error['code']}, HTTP {response.status_code})"
    except (ValueError, KeyError, TypeError):
        message = f"the daemon answered HTTP {response.status_code}"
    return click.ClickException(message)


def ready_daemon(settings: Settings) -> runtime.DaemonInfo:
    """The running daemon, once ready (it may still be loading); a ClickException if none."""
    try:
        runtime.read_daemon_info(settings.data_dir)
        return runtime.wait_until_ready(settings.data_dir, timeout=settings.start_timeout)
    except DaemonNotRunning as exc:
        raise click.ClickException(f"{exc.message} (start it with: keymemd start)") from None


def daemon_client(info: runtime.DaemonInfo, timeout: float = REQUEST_TIMEOUT) -> httpx.Client:
    """A client for ``info``'s daemon; each connection proves it reaches that daemon first."""
    import httpx

    from keymem_daemon.verified import verified_transport

    return httpx.Client(
        base_url=info.url,
        headers=info.headers,
        timeout=httpx.Timeout(timeout, connect=runtime.HEALTH_TIMEOUT * 5),
        transport=verified_transport(info),
        trust_env=False,  # never route loopback traffic through an HTTP(S)_PROXY
    )
