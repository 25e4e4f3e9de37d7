"""The PostgreSQL store as the engine's repository: ``read(fn)`` and ``write(fn)`` units of
work on a psycopg connection pool, many daemons on one database.

- **Every unit is one transaction.** ``read`` runs ``fn`` in a REPEATABLE READ, READ ONLY
  transaction (one snapshot, as SQLite's deferred read transaction); ``write`` in a
  SERIALIZABLE one that commits when ``fn`` returns and rolls back on any exception.
- **Races are the database's business.** With one SQLite writer the engine's
  read-then-write steps (is there a key with this text? what is this link's weight?) never
  interleave; with many daemons they would. SERIALIZABLE makes PostgreSQL refuse the later
  of two transactions whose reads and writes overlap (SQLSTATE 40001), and a unique
  violation (23505: the same idempotency key or id from two daemons at once) or a deadlock
  (40P01) is refused the same way; ``write`` then runs ``fn`` again, from scratch, on a new
  snapshot -- where it finds the key the other daemon just created, or the weight it just
  set -- for up to ``WRITE_RETRY_BUDGET`` seconds. So two daemons creating the same key get one key
  and two reinforcements of one link both count, without the engine knowing. ``fn`` must
  therefore do nothing outside the transaction but register ``after_commit`` callbacks
  (which is how the engine's writes are built); callbacks of a failed attempt are dropped.
- **Errors name the server.** A connection that fails or drops becomes ``StoreUnavailable`` (a ``StoreError``)
  naming ``host:port/database as role`` -- never the password; a write row-level security
  refuses (no write grant on the namespace) becomes ``Refused``.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import random
import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import psycopg
from psycopg import IsolationLevel, errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from keymem_daemon.config import STORE_IDLE_TIMEOUT, STORE_LOCK_TIMEOUT, describe_store_url
from keymem_daemon.engine.ports import Reader, Writer
from keymem_daemon.engine.records import Memory
from keymem_daemon.errors import Conflict, Refused, StoreBusy, StoreError, StoreUnavailable
from keymem_daemon.store.postgres import changes, schema
from keymem_daemon.store.postgres.inspect import PgInspectRows, PgInspectWriteRows
from keymem_daemon.store.postgres.keys import PgKeyRows
from keymem_daemon.store.postgres.liveness import SILENCE_TIMEOUT, WatchedConnection, refusal, syncing
from keymem_daemon.store.postgres.memories import MEMORIES_BY_ID, PgMemoryRows
from keymem_daemon.store.postgres.search import (
    INDEXED_TOKENS,
    LINKS_BY_MEMORY,
    LexicalStatistics,
    PgSearchRows,
    PgSearchWriteRows,
    links_of_rows,
    tokens_of_rows,
)
from keymem_daemon.store.postgres.speculation import Misspeculated, PgSpeculation, misspeculation
from keymem_daemon.store.postgres.transfer import PgTransferRows, PgTransferWriteRows
from keymem_daemon.store.sqlite.memories import memory_from_row

logger = logging.getLogger(__name__)

T = TypeVar("T")

WRITE_RETRY_BUDGET: Final = 10.0
"""Seconds one write keeps running again before giving up: each refusal means another write
just won, so it ends once the contenders have committed. PostgreSQL tracks serializable
reads by index page, and on a young store's small tables writes that share no row refuse
each other too: eight clients remembering new keys at once through two daemons lost one
write in a few hundred after 30 attempts (tests/postgres/test_team_writers.py). The
budget stays below a client's request timeout: the shim and the hook never hang on it."""
RETRY_BACKOFF: Final = 0.005
"""Seconds before the first retry, doubling (with jitter) each time: long enough for the
winning transaction to commit, short against a remember's 30 ms budget."""
RETRY_BACKOFF_MAX: Final = 0.1
"""The longest wait between two runs: past it, the waits would add up to seconds without
making a winner any likelier (the contenders have committed by then)."""
POOL_SIZE: Final = 4
"""Connections per daemon: the HTTP worker threads' concurrent units, not more (the server's
max_connections is shared by every daemon of the team)."""
POOL_TIMEOUT: Final = 5.0
"""Seconds a unit waits for a connection the pool cannot make before saying the server does
not answer: a write fails clearly rather than hang the shim or the hook while the server is
down."""
BUSY_WAIT: Final = WRITE_RETRY_BUDGET
"""Seconds a unit waits for a connection while every connection of the pool is in use by this
daemon's own units and the server answers them (more concurrent requests than ``POOL_SIZE``):
a busy daemon, not a server that does not answer -- each of those units ends within the
liveness watch's silence or the write budget -- so it waits on past ``POOL_TIMEOUT``, then
says the daemon is busy (``StoreBusy``). Below a tool call's timeout; the hook gives up on its
own, shorter one."""
CONNECT_TIMEOUT: Final = 5
"""libpq's connect_timeout (whole seconds)."""
RECONNECT_TIMEOUT: Final = 24 * 3600.0
"""How long the pool keeps trying to reconnect in the background after the server went away
(with backoff) before it gives up on it: a server down for a weekend is still found again."""
# How the units begin (the pool's connections are in autocommit mode: ``_unit`` says why).
_BEGIN_READ: Final = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_BEGIN_WRITE: Final = b"BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE"
# SQLSTATEs after which running the unit again can succeed: a lock another session held past
# ``lock_timeout`` (55P03) too -- the server ends a session that hangs mid-transaction.
_RETRYABLE: Final = (errors.SerializationFailure, errors.DeadlockDetected, errors.UniqueViolation,
                     errors.LockNotAvailable)


def _check_if_closed(conn: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection it hands out: an idle connection the server closed
    (a restart, an administrator's kill) has its goodbye or EOF waiting on the socket, so
    only then is it probed with a round trip -- which fails, and the pool connects anew. A
    round trip on every checkout cost each unit of work a third of its round trips."""
    if conn.closed:
        ConnectionPool.check_connection(conn)
        return
    waiting = select.poll()  # poll, not select: a daemon's descriptors may pass FD_SETSIZE
    waiting.register(conn.fileno(), select.POLLIN)
    if waiting.poll(0):
        ConnectionPool.check_connection(conn)


def _drain(conn: psycopg.Connection[Any], pipeline: psycopg.Pipeline) -> psycopg.Error | None:
    """After a unit failed: read what its statements queued after the failing one answered
    (each "pipeline aborted", raised by ``sync``, which then stops reading) up to a Sync, so
    the error raised is the first one; return the first error read here (a statement that
    failed before the unit read its result). Each pass reads at least one answer: it ends. A
    connection that fails now is the pool's to replace."""
    first: psycopg.Error | None = None
    while not conn.broken:
        try:
            pipeline.sync()
            break
        except psycopg.Error as exc:
            first = first or exc
    return first


def _session_options(url: str, lock_timeout: float, idle_timeout: float) -> str:
    """libpq's ``options`` for every session of the pool: ``url``'s own, then keymem's limits
    (set at connection start: no round trip)."""
    own = conninfo_to_dict(url).get("options") or ""
    limits = (f"-c lock_timeout={round(lock_timeout * 1000)} "
              f"-c idle_in_transaction_session_timeout={round(idle_timeout * 1000)}")
    return f"{own} {limits}".strip()


@dataclass(frozen=True, slots=True)
class ReadAhead:
    """The lexical-index tokens and links of memories a read unit read, read with their rows:
    retrieval reads a candidate's rows, then its tokens and its links (the coverage, the keys
    it lifts, the Top-1's connected keys), so on a server in one round trip instead of three.
    One snapshot: nothing read ahead goes stale within its unit."""

    memory_ids: frozenset[str]
    tokens: list[tuple[Any, ...]]  # INDEXED_TOKENS' rows for them, in the statement's order
    links: list[tuple[Any, ...]]  # LINKS_BY_MEMORY's, in its order (memory, then key)

    def rows(self, memory_ids: list[str], of: Literal["tokens", "links"]) -> list[tuple[Any, ...]]:
        """``of`` ``memory_ids`` (all read ahead here): the rows the statement would answer
        for them, in its order -- the rows read for more memories, less the others."""
        wanted = set(memory_ids)
        return [r for r in (self.tokens if of == "tokens" else self.links) if r[0] in wanted]


@dataclass(slots=True)
class PgReader(PgMemoryRows, PgKeyRows, PgSearchRows, PgTransferRows, PgInspectRows):
    """One snapshot of the database, on a pooled connection."""

    _conn: psycopg.Connection[Any]
    _pipeline: psycopg.Pipeline  # the unit's: ``sync()`` when a statement's row count is needed
    _lexicon: LexicalStatistics
    _generation: int  # the lexicon's, before the snapshot was taken
    # A read unit's memory reads read ahead (a write's reads stay as few as they are: under
    # SERIALIZABLE each row read is one more that another daemon's write can conflict with).
    _ahead: list[ReadAhead] | None = None

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        if self._ahead is None:
            return PgMemoryRows.memories(self, ids)
        wanted = list(dict.fromkeys(ids))
        # Three statements whose answers arrive together, read by the first fetch.
        rows = self._conn.execute(MEMORIES_BY_ID.encode(), (wanted,))
        tokens = self._conn.execute(INDEXED_TOKENS, (wanted,))
        links = self._conn.execute(LINKS_BY_MEMORY, (wanted,))
        found = {m.id: m for m in map(memory_from_row, rows)}
        self._ahead.append(ReadAhead(frozenset(wanted), tokens.fetchall(), links.fetchall()))
        return found

    def _read_ahead(self, memory_ids: list[str]) -> ReadAhead | None:
        """What one memory read read ahead for all of ``memory_ids`` (the newest), if any."""
        return next((a for a in reversed(self._ahead or []) if a.memory_ids.issuperset(memory_ids)), None)

    def indexed_tokens(self, memory_ids: Iterable[str]) -> dict[str, tuple[list[str], list[str]]]:
        wanted = list(dict.fromkeys(memory_ids))
        ahead = self._read_ahead(wanted)
        if ahead is None:
            return PgSearchRows.indexed_tokens(self, wanted)
        return tokens_of_rows(ahead.rows(wanted, "tokens"))

    def links_by_memory(self, memory_ids: Iterable[str]) -> dict[str, dict[str, tuple[float, bool]]]:
        wanted = list(dict.fromkeys(memory_ids))
        ahead = self._read_ahead(wanted)
        if ahead is None:
            return PgSearchRows.links_by_memory(self, wanted)
        return links_of_rows(ahead.rows(wanted, "links"))


@dataclass(slots=True)
class PgWriter(PgSpeculation, PgReader, PgSearchWriteRows, PgTransferWriteRows, PgInspectWriteRows):
    """A write transaction in progress: its operations, and work to do after COMMIT."""

    _speculating: bool = False  # store/postgres/speculation.py
    _after: list[Callable[[], object]] = field(default_factory=list)
    index_changed: bool = False

    def after_commit(self, callback: Callable[[], object]) -> None:
        self._after.append(callback)


class PostgresRepository:
    """A keymem store on a PostgreSQL server (``KEYMEM_STORE_URL``): an ``engine.ports.Repository``
    whose readers and writers implement every port (tests/postgres checks it with mypy)."""

    def __init__(self, url: str, pool: ConnectionPool[WatchedConnection], *, speculative: bool = False) -> None:
        self.where = describe_store_url(url)
        # Whether writes speculate (store/postgres/speculation.py): the store has its owner's
        # keymem_expect.
        self.speculative = speculative
        self.found: Literal["store", "missing", "empty"] = "store"
        self.shared = True  # every daemon of the team writes here
        self.lost: str | None = None
        self._pool = pool
        self._lexicon = LexicalStatistics()
        # Reentrant: an after-commit step may write again.
        self._retrying = threading.RLock()
        # The writes between their COMMIT and the end of their after-commit steps, by ticket
        # (``wait_for_commits``); notified as each leaves.
        self._committing: set[int] = set()
        self._tickets = itertools.count()
        self._committed = threading.Condition()
        self._reading = threading.local()  # ``reader``: the read unit this thread is inside
        # The connections out with this daemon's units now: whether the server answers them
        # tells a busy daemon from a server gone (``_connection``).
        self._out: set[WatchedConnection] = set()

    @classmethod
    def open(cls, url: str, *, pool_size: int = POOL_SIZE, lock_timeout: float = STORE_LOCK_TIMEOUT,
             idle_timeout: float = STORE_IDLE_TIMEOUT) -> PostgresRepository:
        """Connect, and bring the schema up to date (the first daemon of a team, as owner,
        creates it; a member finds it there). Fails with ``StoreError`` naming the server
        (``StoreUnavailable`` when it does not answer). Every session waits at most
        ``lock_timeout`` s for a lock, and the server ends it once it sits ``idle_timeout`` s
        idle inside a transaction (``KEYMEM_STORE_LOCK_TIMEOUT``, ``KEYMEM_STORE_IDLE_TIMEOUT``)."""
        where = describe_store_url(url)
        # Autocommit: the units send their own BEGIN and COMMIT (``_unit``).
        kwargs: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT, "autocommit": True, **changes.LIVENESS,
                                  "options": _session_options(url, lock_timeout, idle_timeout)}
        found, speculative = cls._prepare(url, where, kwargs)
        pool: ConnectionPool[WatchedConnection] = ConnectionPool(
            url, min_size=1, max_size=pool_size, timeout=POOL_TIMEOUT, open=False, kwargs=kwargs, name="keymem",
            # A request the server stops answering ends (liveness.py): the shim never hangs on it.
            connection_class=WatchedConnection,
            # After the server restarts, the first unit gets a new connection instead of
            # failing on a dead one (without a round trip per checkout: _check_if_closed).
            check=_check_if_closed,
            # Reconnecting after an outage backs off from 1 s up to a minute (psycopg_pool's).
            reconnect_timeout=RECONNECT_TIMEOUT)
        try:
            pool.open(wait=True, timeout=POOL_TIMEOUT)
        except (PoolTimeout, psycopg.OperationalError) as exc:
            pool.close()
            raise StoreUnavailable(f"cannot reach the store at {where}: {str(exc).strip()}") from None
        except BaseException:
            pool.close()
            raise
        if not speculative:
            logger.info("the store at %s has no keymem_expect of its owner's (the owner has not run this keymem "
                        "yet): its writes read every answer", where)
        repository = cls(url, pool, speculative=speculative)
        repository.found = "missing" if found == 0 else "store"
        return repository

    @staticmethod
    def _prepare(url: str, where: str, kwargs: dict[str, Any]) -> tuple[int, bool]:
        """On one connection of its own (before the pool's, which would retry a refusal in the
        background for ``POOL_TIMEOUT`` and log each try): the schema version found, after
        bringing the schema up to date, and whether writes may speculate (``schema.can_expect``).
        A server that refuses this daemon -- a wrong password, an unknown role or database, no
        CONNECT privilege (``liveness.refusal``) -- raises
        ``StoreError`` at once, which nobody retries; one that does not answer,
        ``StoreUnavailable``."""
        try:
            with WatchedConnection.connect(url, **kwargs) as conn:
                found = schema.schema_version(conn)
                conn.commit()
                schema.migrate(conn, where=where)
                return found, schema.can_expect(conn)
        except psycopg.errors.LockNotAvailable as exc:
            raise StoreUnavailable(f"the store at {where} did not let this daemon bring its schema up to date: "
                                   f"{str(exc).strip()} (another session holds keymem's tables); tried again"
                                   ) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise StoreError(f"{where}: keymem's schema is missing or older than this keymem, and this role may "
                             f"not change it ({str(exc).strip()}); ask the database owner to run keymem once"
                             ) from None
        except psycopg.Error as exc:
            reason = refusal(exc)
            if reason is not None:
                raise StoreError(f"the store at {where} refuses this daemon: {reason}; fix KEYMEM_STORE_URL (or "
                                 "the role's password or grants) -- keymemd does not retry this") from None
            if isinstance(exc, psycopg.OperationalError):
                raise StoreUnavailable(f"cannot reach the store at {where}: {str(exc).strip()}") from None
            raise

    # -- units of work ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool, as ``pool.connection()``; a wait past ``POOL_TIMEOUT`` goes
        on while every connection the pool may hold is out with this daemon's units and the
        server keeps answering them (within the liveness watch's silence: a busy daemon), up
        to ``BUSY_WAIT``, then raises ``StoreBusy``. A pool short of connections it cannot
        make, or whose units hear nothing (the server or the network is gone), raises
        ``PoolTimeout`` after ``POOL_TIMEOUT``, as before."""
        since = time.monotonic()
        while True:
            try:
                with self._pool.connection(timeout=min(POOL_TIMEOUT, since + BUSY_WAIT - time.monotonic())) as conn:
                    self._out.add(conn)
                    try:
                        yield conn
                    finally:
                        self._out.discard(conn)
                    return
            except PoolTimeout:
                stats = self._pool.get_stats()
                now = time.monotonic()
                answered = any(now - c.heard_at < SILENCE_TIMEOUT for c in list(self._out))
                if stats["pool_size"] < stats["pool_max"] or stats["pool_available"] or not answered:
                    raise
                if now - since >= BUSY_WAIT:
                    raise StoreBusy(f"this daemon is busy: its {stats['pool_max']} connections to the store at "
                                    f"{self.where} were all in use by its other requests for {BUSY_WAIT:g} s "
                                    "(the server answers them); nothing was done, try again") from None

    def read(self, fn: Callable[[Reader], T]) -> T:
        """Run ``fn`` inside one read-only snapshot: this thread's open one, when it is inside
        a read already (no second connection, BEGIN and COMMIT)."""
        outer: PgReader | None = getattr(self._reading, "reader", None)
        if outer is not None:
            return fn(outer)

        def unit(conn: psycopg.Connection[Any], pipeline: psycopg.Pipeline) -> T:
            self._reading.reader = reader = PgReader(conn, pipeline, self._lexicon, self._lexicon.generation, [])
            try:
                return fn(reader)
            finally:
                self._reading.reader = None

        try:
            with self._connection() as conn:
                return self._unit(conn, _BEGIN_READ, lambda pipeline: unit(conn, pipeline))
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"the store at {self.where} does not answer: {str(exc).strip()}") from None

    def snapshot(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn`` on a pooled connection inside one read-only snapshot (the local
        replica's copy of the rows: store/postgres/offline.py)."""
        try:
            with self._connection() as conn:
                conn.isolation_level = IsolationLevel.REPEATABLE_READ
                conn.read_only = True
                with conn.transaction():
                    return fn(conn)
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"the store at {self.where} does not answer: {str(exc).strip()}") from None

    def load(self, fn: Callable[[Reader], T]) -> T:
        return self.read(fn)

    @staticmethod
    def _unit(conn: psycopg.Connection[Any], begin: bytes, fn: Callable[[psycopg.Pipeline], T]) -> T:
        """``fn`` between ``begin`` and COMMIT in pipeline mode (store/postgres/pipeline.py):
        BEGIN goes out with the first statement whose result is read, COMMIT with the Sync
        that ends the pipeline -- one round trip per result read, and one for COMMIT.
        (psycopg's ``transaction()`` would sync at its start and at its end, twice each.)
        Rolled back on any exception; a COMMIT the server refuses raises here. A speculating
        unit's wrong assumption raises ``Misspeculated`` -- also when ``fn`` failed on what it
        built on it before the server's answer was read."""
        try:
            with conn.pipeline() as pipeline:
                try:
                    conn.execute(begin)
                    result = fn(pipeline)
                    # Queued: sending it may raise the error of a statement before it.
                    conn.execute(b"COMMIT")
                except BaseException as exc:
                    drained = _drain(conn, pipeline)
                    if not conn.broken:
                        # psycopg's rollback, not a ROLLBACK statement: it also forgets the
                        # statements it prepared in this unit, whose PREPARE the server may have
                        # skipped after the error.
                        conn.rollback()
                    if misspeculation(drained) and isinstance(exc, Exception) and not isinstance(exc, psycopg.Error):
                        raise Misspeculated(str(drained).strip()) from exc
                    raise
        except psycopg.Error as exc:  # raised by a read, or at the end (the server rolled back)
            if misspeculation(exc):
                raise Misspeculated(str(exc).strip()) from exc
            raise
        return result

    def write(self, fn: Callable[[Writer], T]) -> T:
        """Run ``fn`` in one serializable transaction, again from scratch when PostgreSQL
        refuses it for a concurrent write; then its ``after_commit`` callbacks, in order.
        A refused write runs again only in its turn (``_retrying``): this daemon's writes that
        collided then never collide with each other again, so eight threads writing under one
        key settle instead of refusing each other every attempt."""
        delay, attempt, started = RETRY_BACKOFF, 0, time.monotonic()
        with contextlib.ExitStack() as turn:
            return self._write(fn, turn, delay, attempt, started)

    def _write(self, fn: Callable[[Writer], T], turn: contextlib.ExitStack, delay: float, attempt: int,
               started: float) -> T:
        speculating = self.speculative
        while True:
            attempt += 1
            committing = False
            with contextlib.ExitStack() as in_order:
                try:
                    with self._connection() as conn:
                        def run(pipeline: psycopg.Pipeline, speculate: bool = speculating) -> tuple[PgWriter, T]:
                            # A sequential scan makes a serializable transaction conflict with every
                            # write to that table (PostgreSQL's docs: encourage index scans), and on
                            # small tables the planner picks one for nearly every lookup. Priced out,
                            # a sequential scan costs 1e10, past jit_above_cost: no JIT, or a one-row
                            # DELETE of meta is compiled first (~0.5 s). (Two statements: pipeline
                            # mode sends one per message; both ride the unit's first round trip.)
                            nonlocal committing
                            conn.execute(b"SET LOCAL enable_seqscan = off")
                            conn.execute(b"SET LOCAL jit = off")
                            writer = PgWriter(conn, pipeline, self._lexicon, self._lexicon.generation,
                                              _speculating=speculate)
                            result = fn(writer)
                            committing = True  # what fails now is the COMMIT (and what was queued with it)
                            # From the COMMIT to the after-commit steps (``wait_for_commits``).
                            in_order.callback(self._left_commit, self._entered_commit())
                            return writer, result

                        with syncing(conn):  # a write holds row locks: liveness.SyncingCursor
                            try:
                                writer, result = self._unit(conn, _BEGIN_WRITE, run)
                            except BaseException:
                                # A refused COMMIT has nothing to apply: no follower waits for it
                                # while it backs off for a retry.
                                in_order.close()
                                raise
                except Misspeculated as exc:
                    # No other write won: run it again at once, reading what it had assumed.
                    logger.debug("a speculating write assumed wrong (%s), attempt %d", exc, attempt)
                    speculating = False
                    continue
                except _RETRYABLE as exc:
                    if time.monotonic() - started >= WRITE_RETRY_BUDGET:
                        if isinstance(exc, errors.LockNotAvailable):
                            raise Conflict(f"the store at {self.where} kept the rows this write changes locked for "
                                           f"{WRITE_RETRY_BUDGET:g} s: another session holds them (the server ends one "
                                           "that hangs mid-transaction after KEYMEM_STORE_IDLE_TIMEOUT); nothing was "
                                           "written, try again") from None
                        raise Conflict(f"the store at {self.where} refused the write {attempt} times in "
                                       f"{WRITE_RETRY_BUDGET:g} s for concurrent writes ({exc.sqlstate}); try again"
                                       ) from None
                    logger.debug("write refused (%s), attempt %d", exc.sqlstate, attempt)
                    if attempt == 1:
                        turn.enter_context(self._retrying)
                    time.sleep(delay * (1 + random.random()))  # noqa: S311 - jitter, not secrecy
                    delay = min(delay * 2, RETRY_BACKOFF_MAX)
                    continue
                except errors.InsufficientPrivilege as exc:
                    # Row-level security: the namespace was not granted to this role for writing.
                    raise Refused(f"the store at {self.where} refused the write: {str(exc).strip()} (ask the "
                                  "database owner for a write grant: keymemd team grant NAMESPACE ROLE --write)"
                                  ) from None
                except (PoolTimeout, psycopg.OperationalError) as exc:
                    if committing:
                        # The COMMIT was sent and its answer never came: the server may have
                        # committed it (a retry with the same Idempotency-Key gets its first answer).
                        raise StoreUnavailable(f"the store at {self.where} stopped answering while it committed the "
                                               f"write: {str(exc).strip()}; it may or may not have been saved (retry "
                                               "with the same Idempotency-Key, or read it back)") from None
                    raise StoreUnavailable(f"the store at {self.where} refused the write or does not answer: "
                                     f"{str(exc).strip()}; nothing was written") from None
                if writer.index_changed:
                    self._lexicon.renew()
                for callback in writer._after:
                    try:
                        callback()
                    except Exception:
                        logger.exception("an after-commit step failed; the in-memory index may lag")
                return result

    def wait_for_commits(self) -> None:
        """Return once each write of this daemon that had sent its COMMIT by now has run its
        after-commit steps (or failed). Not a lock: writes committing meanwhile go on, and a
        COMMIT that hangs on a silent server holds up no other write, only this wait, until
        the liveness watch ends it."""
        with self._committed:
            waiting = set(self._committing)
            self._committed.wait_for(lambda: not waiting & self._committing)

    def _entered_commit(self) -> int:
        ticket = next(self._tickets)
        with self._committed:
            self._committing.add(ticket)
        return ticket

    def _left_commit(self, ticket: int) -> None:
        with self._committed:
            self._committing.discard(ticket)
            self._committed.notify_all()

    def change_cursor(self) -> int:
        """Where a daemon that loads its tables now starts following the change log: every
        transaction below it has finished, so it is in what the load reads (a change read
        twice is applied twice, which the engine's update takes in its stride)."""
        try:
            with self._connection() as conn:
                cursor = changes.horizon(conn)
                conn.commit()
                return cursor
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"the store at {self.where} does not answer: {str(exc).strip()}") from None

    def analyze(self) -> None:
        """Nothing to do: the server's autovacuum keeps the planner's statistics."""

    # -- the Repository protocol's file-store operations ---------------------------------

    def check_files(self) -> str | None:
        """No files: the server keeps the data (None: nothing lost)."""
        return self.lost

    def checkpoint(self) -> None:
        """Nothing to fold: PostgreSQL checkpoints by itself."""

    def backup_to(self, dest: Path) -> None:
        raise StoreError(f"the store at {self.where} is backed up by its server (pg_dump), not by keymemd; "
                         f"{dest} was not written")

    def integrity_check(self) -> str:
        """The server guards its pages; what keymem can check is that the store answers."""
        self.read(lambda reader: reader.key_count())
        return "ok"

    def close(self) -> None:
        self._pool.close()
