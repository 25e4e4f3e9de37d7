"""keymem-shim: the MCP stdio server that Claude Code, Codex and other MCP hosts spawn.

It speaks MCP on stdin/stdout and forwards everything to the per-user daemon (keymemd)
over loopback HTTP: tool definitions, tool calls, prompts and the server instructions all
come from the daemon. It finds the daemon through ``<data>/daemon.json`` and starts one
(``keymemd start``, detached) when none answers; it never loads a model itself.

Start-up overlaps the two slow things: the daemon is found (or spawned) in a thread while
the MCP SDK is imported, and the ``initialize`` answer waits for the daemon only until
``_session.STARTUP_WAIT`` has passed since start -- the daemon answers as soon as it listens, long
before its models are loaded. A daemon that is not up by then is reported by the tool
calls, and the instructions fall back to the daemon's text without live counts.

Even the SDK import is usually skipped: when keymemd keeps a warm shim (``_forkserver``),
``main()`` hands this process's stdio to a forked copy of it that has everything imported,
and ``serve()`` runs there.

``main()`` and ``serve()`` are public. Logs go to stderr: stdout is the MCP stream.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from keymem_shim._session import serve

if TYPE_CHECKING:
    from keymem_daemon.config import Settings

__all__ = ["main", "serve"]


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    from keymem_daemon import __version__

    parser = argparse.ArgumentParser(
        prog="keymem-shim",
        description="keymem's MCP server over stdio, backed by the keymemd daemon. MCP hosts "
        "spawn it with no arguments; it reads the same KEYMEM_* variables as keymemd "
        "(KEYMEM_DATA_DIR, KEYMEM_AUTOSTART, KEYMEM_START_TIMEOUT) and starts the daemon "
        "when none answers. Example: claude mcp add keymem -- keymem-shim",
    )
    parser.add_argument("--version", action="version", version=f"keymem-shim {__version__}")
    return parser.parse_args(argv)


def _host_cwd(settings: Settings) -> str | None:
    """``KEYMEM_HOST_CWD`` if set (empty: none), else the directory the host started us in."""
    if settings.host_cwd is not None:
        return settings.host_cwd or None
    try:
        return os.getcwd()
    except OSError:  # the host's directory was deleted
        return None


def main(argv: Sequence[str] | None = None) -> None:
    """Run the shim until the host closes stdin (console script ``keymem-shim``).

    With a warm shim running beside the daemon, this process hands its stdio over and only
    waits; otherwise it serves the session itself.
    """
    started = time.monotonic()
    _arguments(argv)

    from keymem_daemon.config import Settings
    from keymem_daemon.errors import KeymemError
    from keymem_shim import _forkserver

    try:
        settings = Settings.from_env(os.environ)
    except KeymemError as exc:
        print(f"keymem-shim: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from None
    cwd = _host_cwd(settings)
    if settings.warm_shim:
        code = _forkserver.hand_over(settings.warm_shim_socket, cwd=cwd)
        if code is not None:
            raise SystemExit(code)
    serve(settings, started=started, cwd=cwd)
