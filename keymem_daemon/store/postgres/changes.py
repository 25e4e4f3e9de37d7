"""Following the change log: what changed since a daemon last looked, without skipping any.

Triggers write one ``changes`` row per changed memory, key, alias, link, relation or meta entry
in the transaction of the write (schema.py). ``seq`` alone is no safe cursor: sequence values
are taken when a row is written, not when its transaction commits, so a transaction can commit
a *lower* ``seq`` after a follower already read past it. The cursor is therefore a transaction
horizon: ``pg_snapshot_xmin`` of the reading snapshot, below which every transaction has
finished. ``read_changes(conn, cursor)`` returns the rows of transactions in
``[cursor, horizon)`` -- all finished, so all visible if they committed -- and ``horizon`` as
the next cursor; a transaction still running is read next time. A follower that was away
calls it with its last cursor and catches up; one that starts loads its state and takes
``horizon(conn)`` in the same snapshot. ``ChangeFollower`` does this in a thread, woken by
``NOTIFY keymem_changes``. Row-level security applies: a role reads the change
rows of the namespaces it may read (and the shared vocabulary's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import psycopg

from keymem_daemon.store.postgres.liveness import WatchedConnection, refusal
from keymem_daemon.store.postgres.schema import NOTIFY_CHANNEL

logger = logging.getLogger(__name__)

WAKE_INTERVAL: Final = 1.0
"""Seconds a follower waits for a NOTIFY before looking anyway: the bound on how late a change
is read when its notification came while an older transaction was still open."""
CONNECT_TIMEOUT: Final = 5
LIVENESS: Final[dict[str, Any]] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                                   "keepalives_count": 3, "tcp_user_timeout": 5000}
"""libpq options that make a connection whose network dropped (no reset from the server: a
cable, a VPN, a suspended laptop) fail within seconds instead of the kernel's minutes: an idle
one is probed after 5 s (and given up after 3 missed probes 2 s apart), and unacknowledged
data is given up after 5 s. Every connection of the daemon uses them."""
RECONNECT_BACKOFF: Final = 0.5
"""Seconds before the first reconnect after the connection was lost, doubling each time."""
MAX_RECONNECT_BACKOFF: Final = 10.0
"""The longest wait between reconnects: while the follower is away the daemon serves reads from
its replica and refuses writes, so a server that is back is found again within this."""


@dataclass(frozen=True, slots=True)
class Change:
    """One changed row: ``kind`` and ``id`` say what (a link or relation change names its
    memory), ``namespace`` where (None for the shared vocabulary: keys, aliases, meta)."""

    seq: int
    namespace: str | None
    kind: Literal["memory", "key", "alias", "link", "relation", "meta"]
    id: str
    op: Literal["insert", "update", "delete"]


def horizon(conn: psycopg.Connection[Any]) -> int:
    """The cursor for state read in ``conn``'s current snapshot (call it inside that snapshot)."""
    row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
    return int(row[0]) if row else 0  # a SELECT without FROM always has its row


def read_changes(conn: psycopg.Connection[Any], cursor: int) -> tuple[list[Change], int]:
    """The changes of every transaction that finished since ``cursor``, in ``seq`` order, and
    the next cursor. One statement, so the rows and the horizon come from one snapshot."""
    rows = conn.execute(
        "WITH h AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS horizon) "
        "SELECT h.horizon::text::bigint, c.seq, c.namespace, c.kind, c.id, c.op "
        "FROM h LEFT JOIN changes c ON c.tx >= %s::text::xid8 AND c.tx < h.horizon "
        "ORDER BY c.seq", (str(cursor),)).fetchall()
    changes = [Change(seq=int(r[1]), namespace=r[2], kind=r[3], id=r[4], op=r[5]) for r in rows if r[1] is not None]
    return changes, int(rows[0][0])


class ChangeFollower:
    """Follows the change log from ``cursor`` on a connection of its own, in a thread: wakes on
    ``NOTIFY keymem_changes`` (at every COMMIT that changed something), reads what finished
    since its cursor and hands it to ``on_changes`` (in ``seq`` order, never empty). A lost
    connection is reopened with backoff and the follower catches up from its cursor, so a
    change made meanwhile arrives late rather than never. ``cursor`` is then where it got to:
    what a daemon keeps to resume after a restart."""

    def __init__(self, url: str, cursor: int, on_changes: Callable[[list[Change]], None],
                 on_cursor: Callable[[int], None] | None = None) -> None:
        self.cursor = cursor
        # Whether the follower holds a connection to the change log now: while it does not,
        # what the daemon holds in memory may lag the server (status says "possibly stale").
        self.connected = False
        # The server's reason when its last try to reconnect was refused (a password changed
        # while the daemon ran, the role dropped): kept trying -- libpq reads PGPASSFILE again
        # at every connection, so fixing the file brings the daemon back -- but said, in the
        # log once, in writes' errors and in ``stale``, not taken for a server that is down.
        self.refused: str | None = None
        # When (time.monotonic) the last round that read the change log up to its end began:
        # whatever the server held then has reached the daemon.
        self.caught_up_at = float("-inf")
        self._url = url
        self._on_changes = on_changes
        # Told the cursor after each round, once everything below it went to on_changes.
        self._on_cursor = on_cursor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keymem-changes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def catch_up(self) -> None:
        """Read what changed since the cursor now, in this thread, before ``start``: a daemon
        resuming from an old cursor is current before it serves. Raises what connecting
        raises (``psycopg.OperationalError``)."""
        with psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT, **LIVENESS) as conn:
            self._catch_up(conn)
        self.connected = True  # it answered just now; the thread's own connection follows

    def stop(self) -> None:
        """Stop following (within ``WAKE_INTERVAL``)."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        delay = RECONNECT_BACKOFF
        while not self._stop.is_set():
            try:
                with WatchedConnection.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                                               **LIVENESS) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    delay = RECONNECT_BACKOFF
                    if self.refused is not None:
                        logger.warning("the store accepts this daemon again")
                    self.refused = None
                    self.connected = True
                    while not self._stop.is_set():
                        self._catch_up(conn)
                        # Woken by a NOTIFY, or after WAKE_INTERVAL: a change whose transaction
                        # was still open behind another one is read on a later round.
                        for _ in conn.notifies(timeout=WAKE_INTERVAL, stop_after=1):
                            pass
            except psycopg.OperationalError as exc:
                self.connected = False
                reason = refusal(exc)
                if reason is not None and self.refused is None:
                    logger.error("the store refuses this daemon: %s; fix the role's password or grants (a "
                                 "PGPASSFILE is read again at every try: keymemd reconnects by itself once it "
                                 "holds the new password); trying again every %.0f s", reason, MAX_RECONNECT_BACKOFF)
                elif reason is None:
                    logger.warning("lost the change log's connection (%s); reconnecting in %.1f s",
                                   str(exc).strip(), delay)
                self.refused = reason
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_RECONNECT_BACKOFF)

    def _catch_up(self, conn: psycopg.Connection[Any]) -> None:
        began = time.monotonic()
        changes, cursor = read_changes(conn, self.cursor)
        if changes:
            try:
                self._on_changes(changes)
            except Exception:
                logger.exception("applying %d changes failed; they are read again", len(changes))
                return
        self.cursor = cursor
        self.caught_up_at = began
        if self._on_cursor is not None:
            try:
                self._on_cursor(cursor)
            except Exception:
                logger.exception("recording the change-log cursor failed")
