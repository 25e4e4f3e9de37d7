"""What the daemon's connections may cost it: a deadline for each request head, and never
more connections than its file descriptors allow.

uvicorn's h11 protocol never closes a connection that has not finished its request line:
its keep-alive timer starts only after a response. One local program opening a thousand
idle or half-written connections therefore held the daemon's 1,024 descriptors, so tool
calls and the prompt hook timed out. ``GuardedH11Protocol`` (uvicorn's ``http`` class)
adds:

- a deadline (``HEAD_TIMEOUT``) from the moment a connection waits for a request -- when
  it is opened, and again after each response on a kept-alive connection -- until the
  request head is complete; past it the connection is closed;
- a cap on all connections, from the descriptor limit in force (``max_connections``):
  beyond it a new connection closes the one that has waited longest for a request head
  (an idle flood's, or a kept-alive idle one, whose client simply reconnects), or itself
  when none waits -- so the store, the log and the models always find a descriptor, and a
  real request still gets in during a flood. A burst of real clients far below the limit
  is never touched (2,000 at once in ``test_daemon_concurrency``).

``raise_descriptor_limit`` lifts the soft ``RLIMIT_NOFILE`` towards the hard limit first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import ClassVar, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

HEAD_TIMEOUT: Final = 10.0
"""Seconds a connection may take to send a whole request head (a local client needs
microseconds; a hook on a loaded machine, milliseconds)."""
DESCRIPTOR_RESERVE: Final = 256
"""Descriptors kept from connections: SQLite (a connection per worker thread, WAL and
shm files), the log, backups, models, the warm shim's socket and its pipes."""
MIN_CONNECTIONS: Final = 64
WANTED_DESCRIPTORS: Final = 8192
"""The soft RLIMIT_NOFILE the daemon asks for (within the hard limit)."""


def raise_descriptor_limit() -> int:
    """Lift the soft ``RLIMIT_NOFILE`` to ``WANTED_DESCRIPTORS`` (at most the hard limit);
    returns the limit in force."""
    if resource is not None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = WANTED_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(WANTED_DESCRIPTORS, hard)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return descriptor_limit()


def descriptor_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` in force now (it may be changed from outside: prlimit)."""
    if resource is None:  # not POSIX
        return WANTED_DESCRIPTORS
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return WANTED_DESCRIPTORS if soft == resource.RLIM_INFINITY else int(soft)


def max_connections(descriptors: int) -> int:
    """How many connections the daemon keeps open with ``descriptors`` to spend."""
    return max(MIN_CONNECTIONS, descriptors - DESCRIPTOR_RESERVE)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and connection caps (see above)."""

    _waiting: ClassVar[dict[GuardedH11Protocol, None]] = {}
    """Connections waiting for a request head, oldest first (one event loop touches it)."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > max_connections(descriptor_limit()):
            if not self._waiting:
                logger.warning("refused a connection: %d are open and busy", len(self.connections) - 1)
                self._close()
                return
            next(iter(self._waiting))._close()  # the longest-waiting one makes room
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._stop_waiting()  # the request head is complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_head()  # kept alive: the next request's head has the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._stop_waiting()
        self._waiting[self] = None
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._close)

    def _stop_waiting(self) -> None:
        self._waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _close(self) -> None:
        self._stop_waiting()
        if not self.transport.is_closing():
            self.transport.close()
