"""One host session of the shim on this process's stdin/stdout (``keymem_shim.serve``).

Its own module so that ``main()`` and the warm shim's forked children (``_forkserver``) both
run it without importing each other. It stays light until called: everything heavy is
imported inside ``serve``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from keymem_daemon.config import Settings

STARTUP_WAIT: Final = 3.0
"""Seconds from start until the shim serves MCP whether or not a daemon answers."""


def serve(settings: Settings, *, started: float, cwd: str | None) -> None:
    """Serve one host session on this process's stdin/stdout until the host closes stdin."""
    import logging

    from keymem_shim._client import Bootstrap, DaemonClient, HostIdentity, Launcher

    # Only keymem's own loggers follow KEYMEM_LOG_LEVEL: httpx would log every request.
    # ``force``: a forked warm shim replaces the fork server's handler with this one.
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="keymem-shim[%(process)d] %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    for name in ("keymem_shim", "keymem_daemon"):
        logging.getLogger(name).setLevel(settings.log_level.upper())
    identity = HostIdentity.from_env(os.environ, cwd=cwd, hook_installed=settings.hook_installed)
    launcher = Launcher(settings)
    bootstrap = Bootstrap(launcher, identity, deadline=started + STARTUP_WAIT)
    bootstrap.start()

    import anyio

    from keymem_shim import _server  # the MCP SDK: most of the start-up time

    info, instructions = bootstrap.result()
    if instructions is None:
        instructions = _server.fallback_instructions(hook_installed=settings.hook_installed)
    client = DaemonClient(launcher, identity, info=info)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(lambda: _server.serve(client, instructions=instructions))
