"""Connections that give up on a server that stopped answering mid-request.

TCP keepalives and ``tcp_user_timeout`` (``changes.LIVENESS``) catch a network that dropped
between the daemon and the server -- but only when the daemon's own kernel sees its packets
go unanswered. Behind anything that acknowledges them for the server (a proxy, a connection
pooler, a NAT or VPN box that hung, a server host that froze) a request waits for an answer
that never comes, forever: the shim's call or the hook's push with it. ``WatchedConnection``
(every connection of the daemon: the pool's and the change follower's) watches each wait on
its socket: when nothing at all arrives for ``SILENCE_TIMEOUT`` seconds, it closes the socket
and raises ``psycopg.OperationalError`` (which the store turns into ``StoreUnavailable``). A
long answer that keeps arriving -- a load streaming 100k rows -- is never cut, whatever it takes.

A hung daemon is the server's problem too: its session keeps the row locks of the write it
was in the middle of, and every other daemon's write to those rows waits. The server ends a
session that sits idle inside a transaction (``idle_in_transaction_session_timeout``, set on
every session: ``KEYMEM_STORE_IDLE_TIMEOUT``) -- but only once it told the client it is ready
for the next command, which in pipeline mode (store/postgres/pipeline.py) is after a Sync, not
after psycopg's flush request for a result it reads. ``SyncingCursor`` (the cursors of every
``WatchedConnection``) therefore reads a result in a write unit (``syncing``) by syncing the pipeline: the
same one round trip, and the server is "idle in transaction" whenever it waits for the daemon.

Not every failure to connect is worth trying again. ``refusal`` tells a server that answered
and refused this daemon -- a wrong password, a role or database that does not exist, no
CONNECT privilege, no pg_hba.conf entry -- from one that does not answer (stopped, starting
up, out of connection slots, the network): retrying the first with backoff would only fill the
log while nothing changes until someone fixes the URL or the grants.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Final, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.waiting import Ready, Wait

RV = TypeVar("RV")

SILENCE_TIMEOUT: Final = 5.0
"""Seconds a request may receive nothing from the server before the connection is given up:
a keymem statement answers in milliseconds, a busy server on a loaded machine in well under a
second, and a lock another daemon's transaction holds lasts one short transaction; as
``tcp_user_timeout`` (5 s) for a network that dropped. Within the shim's and the hook's own
timeouts, so a write behind a hung network fails with ``store_unavailable`` instead. It must
stay above every wait that is silent on purpose: the change follower's wait for a NOTIFY
(``changes.WAKE_INTERVAL``, 1 s)."""
POLL_INTERVAL: Final = 0.1
"""Seconds between two looks at the silence (psycopg's own wait interval)."""


def _watched(gen: PQGen[RV], conn: WatchedConnection, silence: float) -> PQGen[RV]:
    """``gen``, ended with ``OperationalError`` once its socket stays silent for ``silence`` s
    (the waiter sends ``Ready`` 0 after each poll interval that brought nothing)."""
    heard = time.monotonic()
    try:
        state: Wait = next(gen)
        while True:
            ready: Ready | int = yield state
            now = time.monotonic()
            if ready:
                heard = conn.heard_at = now
            elif now - heard >= silence:
                conn.pgconn.finish()
                raise psycopg.OperationalError(f"the server sent nothing for {silence:g} s (the network or the "
                                               "server hangs); the connection was closed")
            state = gen.send(ready)
    except StopIteration as done:
        result: RV = done.value
        return result


class SyncingCursor(psycopg.Cursor[Any]):
    """A cursor that reads a result in pipeline mode by syncing the pipeline, not with a flush
    request (module doc). psycopg calls ``_fetch_pipeline`` before every fetch."""

    def _fetch_pipeline(self) -> None:
        connection = self.connection
        pipeline = connection.in_pipeline if isinstance(connection, WatchedConnection) and connection.syncs else None
        if self._execmany_returning is not False and not self.pgresult and pipeline is not None:
            pipeline.sync()
        else:
            super()._fetch_pipeline()


class WatchedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose requests end when the server stays silent, and whose reads
    in pipeline mode leave the server ready for the next command (module doc)."""

    silence: float = SILENCE_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heard_at = time.monotonic()
        """When (``time.monotonic``) something last arrived from the server on it."""
        self.cursor_factory = SyncingCursor
        self.in_pipeline: psycopg.Pipeline | None = None
        """The pipeline open on this connection (``pipeline``), if any."""
        self.syncs = False
        """Whether its cursors read by syncing now (``syncing``: the write units, which hold
        row locks; a read unit holds none and keeps psycopg's flush)."""

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[psycopg.Pipeline]:
        with super().pipeline() as pipeline:
            outer, self.in_pipeline = self.in_pipeline, pipeline
            try:
                yield pipeline
            finally:
                self.in_pipeline = outer

    def wait(self, gen: PQGen[RV], interval: float = POLL_INTERVAL, timeout: float | None = None) -> RV:
        return super().wait(_watched(gen, self, self.silence), interval, timeout)


REFUSED_SQLSTATES: Final = ("28", "3D000", "42501")
"""SQLSTATEs (a class, or one state) of a refusal that trying again cannot cure: invalid
authorization (a wrong password, an unknown role, pg_hba.conf), a database that does not
exist, insufficient privilege. Connection failures (class 08), an administrator's shutdown
or a server starting up (57P01-57P03) and too many connections (53300) are worth a retry."""
REFUSED_MESSAGES: Final = (
    "authentication failed for user",  # 28P01 password, and ident/peer/SCRAM failures (28000)
    "no pg_hba.conf entry for",  # 28000
    "pg_hba.conf rejects connection",  # 28000
    "is not permitted to log in",  # 28000
    "does not exist",  # 28000 role, 3D000 database
    "permission denied for database",  # 42501 no CONNECT privilege
    "no password supplied",  # libpq itself: none in the URL, PGPASSFILE or PGPASSWORD
)
"""What libpq says when the server refuses a connection at its start: libpq reports no
SQLSTATE for it (psycopg's ``sqlstate`` is None), so the server's (English) message is read.
A message in another language is taken for a server that does not answer: tried again, as
before."""


def refusal(exc: psycopg.Error) -> str | None:
    """The server's reason when ``exc`` is a refusal that trying again cannot cure (module
    doc), else None. Never holds the password: neither the server nor libpq repeats it."""
    text = str(exc).strip()
    state = exc.sqlstate
    if state is not None:
        return text if state.startswith(REFUSED_SQLSTATES) else None
    if not any(marker in text for marker in REFUSED_MESSAGES):
        return None
    # libpq's "connection to server at ... failed: FATAL:  <reason>": the reason is what helps.
    return " ".join(text.rpartition("FATAL:")[2].split()) or text


@contextlib.contextmanager
def syncing(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Inside the block, ``conn``'s cursors read in pipeline mode by syncing (``SyncingCursor``)."""
    if not isinstance(conn, WatchedConnection):
        yield
        return
    conn.syncs = True
    try:
        yield
    finally:
        conn.syncs = False
