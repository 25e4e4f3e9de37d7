"""Allocator settings for the daemon: one long-lived process that loads large models once.

Measured with ``scripts/bench_daemon.py`` (10k memories, resident memory at the end):
- Kiwi allocates through its own mimalloc, which keeps freed pages for a while and returns
  them only on a later allocation; building the analyser frees ~30 MB that then stayed
  resident for the daemon's life. A purge delay of 0 returns them at once: -29 MB, with no
  measurable cost to recall or remember.
- glibc gives each thread that allocates under contention an arena of its own (up to 8 per
  core), and the request threads' arenas each kept their high-water mark: two arenas, -12 MB.
  Under 16 concurrent clients (remember, recall, inject) the second arena still kept what
  the concurrent requests had used: one arena, after the load -42 MB (478 -> 436 MB).
- glibc raises its mmap threshold (up to 32 MB) each time a large block is freed, so the
  numpy temporaries of a request end up in an arena, whose high-water mark stays resident.
  A fixed threshold (128 KiB, glibc's starting value) keeps them mmapped and returns them
  when freed: one client -21 MB, under 16 clients -45 MB after the load. Both together:
  one client 395 -> 371 MB, 16 clients peak 534 -> 478 MB and after 478 -> 421 MB, with
  no throughput change measurable on the busy two-core machine.
Transparent huge pages were measured too and changed nothing worth a setting.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Final

logger = logging.getLogger(__name__)

# mallopt's parameter numbers (glibc malloc.h).
_M_ARENA_MAX: Final = -8
_M_MMAP_THRESHOLD: Final = -3
_ARENAS: Final = 1
_MMAP_THRESHOLD: Final = 128 * 1024
"""glibc's initial value; setting it fixes it (no dynamic raise)."""


def configure() -> None:
    """Apply the settings to this process; call before Kiwi is first imported.

    A value the user already put in the environment wins. Elsewhere than glibc (musl,
    macOS) the arena limit does not exist and is skipped.
    """
    # Read by mimalloc when the Kiwi extension loads, so it must be in the environment first.
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for variable, param, value in (("MALLOC_ARENA_MAX", _M_ARENA_MAX, _ARENAS),
                                   ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, _MMAP_THRESHOLD)):
        if variable not in os.environ and not mallopt(param, value):
            logger.debug("mallopt(%s) refused", variable)
