"""Allocator settings for the daemon: one long-lived process that loads large models once.

Measured with ``scripts/bench_daemon.py`` (10k memories, resident memory at the end):
- Kiwi allocates through its own mimalloc, which keeps freed pages for a while and returns
  them only on a later allocation; building the analyser frees ~30 MB that then stayed
  resident for the daemon's life. A purge delay of 0 returns them at once: -29 MB, with no
  measurable cost to recall or remember.
- glibc gives each thread that allocates under contention an arena of its own (up to 8 per
  core), and the request threads' arenas each kept their high-water mark: two arenas, -12 MB.
Transparent huge pages were measured too and changed nothing worth a setting.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Final

logger = logging.getLogger(__name__)

# mallopt's parameter number for the arena limit (glibc malloc.h).
_M_ARENA_MAX: Final = -8
_ARENAS: Final = 2


def configure() -> None:
    """Apply the settings to this process; call before Kiwi is first imported.

    A value the user already put in the environment wins. Elsewhere than glibc (musl,
    macOS) the arena limit does not exist and is skipped.
    """
    # Read by mimalloc when the Kiwi extension loads, so it must be in the environment first.
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    if not mallopt(_M_ARENA_MAX, _ARENAS):
        logger.debug("mallopt(M_ARENA_MAX) refused")
