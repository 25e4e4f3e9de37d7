"""Serving reads while the PostgreSQL server does not answer: a local read replica, the
repository that switches to it, and the connector that finds a server which was down when the
daemon started.

- **The replica** (``Replica``) is a SQLite file in the daemon's data dir
  (``<data>/team-replica.db``) with the keymem schema, read through the SQLite store's
  ordinary ``SqliteReader``: so every read port -- the lexical index included -- answers from
  it as the SQLite store would. It is filled in the background once the daemon is ready (one
  snapshot of the server, streamed in chunks) and kept in step by the change follower: each
  batch of changes names the memories and keys it touched, and their rows are read again
  from the server and put in place (deleted ones deleted). Memories are copied with their
  vectors, so that a daemon that starts while the server is down loads its in-memory tables
  from it. A file rather than an in-memory copy: what the daemon holds in RAM stays its key
  and vector tables (SQLite's page cache is bounded), and the copy is SQLite's own engine,
  not a second one. It outlives the daemon: a file beside it (``REPLICA_FILE`` +
  ``FILLED_SUFFIX``) records which server and role it copies and when its fill ended, written
  once a fill is complete and removed when one begins, so the next start uses the file only
  if it is a whole copy of what the same role may read on the same server. It records where it
  is in the change log too: a daemon restarted on the same data dir while the server answers
  loads from it and reads only what changed since, when that is safe (``resume.py``).
- **The repository** (``FailoverRepository``) is what the engine sees. While the server
  answers, every unit goes to it (``PostgresRepository``). Once it is known not to -- the
  follower's connection is lost, a unit failed to reach it, or it did not answer when the
  daemon started -- reads go straight to the replica (no wait for the pool's timeout) and
  writes are refused at once with ``StoreUnavailable`` naming the server; ``offline()`` says
  why, for ``status`` and ``/health`` (possibly stale). When the follower is connected again
  and has read the change log to its end after the outage began, the replica and the
  in-memory tables have caught up and units go to the server again.
- **The connector** (``Connector``): a daemon whose server does not answer at start starts
  anyway, on what its replica holds (an earlier run's copy, or nothing), and a thread tries
  the server again with backoff; once it answers, the service brings the tables in step
  with it and starts following its change log (``service.py``).

What the replica cannot know is a change committed on the server that the follower had not
read when the server went away (it reads within milliseconds of each COMMIT): that is why
answers from it are marked possibly stale. Link weight changes (recall's reinforcement) are
not copied, as the in-memory tables skip them too.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import psycopg

from keymem_daemon.engine.ports import Reader, Writer
from keymem_daemon.errors import StoreError, StoreUnavailable
from keymem_daemon.store.postgres import resume
from keymem_daemon.store.postgres.changes import MAX_RECONNECT_BACKOFF, RECONNECT_BACKOFF, Change, ChangeFollower
from keymem_daemon.store.postgres.memories import streamed
from keymem_daemon.store.postgres.repository import PostgresRepository
from keymem_daemon.store.sqlite.database import FILE_SUFFIXES, Store
from keymem_daemon.store.sqlite.replica import REPLICA_COLUMNS
from keymem_daemon.store.sqlite.session import SqliteWriter

logger = logging.getLogger(__name__)

T = TypeVar("T")

REPLICA_FILE: Final = "team-replica.db"
FILLED_SUFFIX: Final = ".filled"
"""Beside the replica: ``{"where": server and role, "filled_at": time}`` once a fill ended."""
POSITION_INTERVAL: Final = 60.0
"""Seconds between records of the replica's position while no change reaches it: a restart
then reads at most a minute of the change log again for nothing."""
_INDEX_COLUMNS: Final = "memory_id, content_tokens, key_tokens"


def _select(table: str, where: str = "") -> str:
    return f"SELECT {', '.join(REPLICA_COLUMNS[table])} FROM {table} {where}"


ReplicaState = Literal["empty", "filling", "partial", "ready", "kept"]
"""What a replica holds: nothing; a fill in progress; part of a fill that failed; a whole copy
kept in step; or an earlier run's whole copy, not followed since."""


class Replica:
    """The SQLite copy of what this daemon's role may read on the server."""

    def __init__(self, store: Store, source: PostgresRepository | None, *, where: str | None = None,
                 kept_at: float | None = None) -> None:
        self.store = store
        self.state: ReplicaState = "kept" if kept_at is not None else "empty"
        self.kept_at = kept_at
        """When (time.time) the fill of an earlier run's copy ended (``kept`` only)."""
        self._source = source
        self._where = where if where is not None else source.where if source is not None else None
        self._lock = threading.Lock()  # one copy step at a time, in the order they are read
        self._pending: list[Change] = []
        # Where it is in the change log (resume.py), once it holds a full copy.
        self._who: dict[str, Any] | None = None
        self._anchor: int | None = None
        self._saved: int | None = None  # the cursor last saved
        self._saved_at = float("-inf")
        self._dirty = False  # rows copied since

    @property
    def ready(self) -> bool:
        """Whether it holds a full copy (filled, and kept in step since)."""
        return self.state == "ready"

    @property
    def _marker(self) -> Path:
        return Path(f"{self.store.path}{FILLED_SUFFIX}")

    @classmethod
    def create(cls, path: Path, source: PostgresRepository) -> Replica:
        """An empty replica at ``path`` (a previous daemon's file is replaced)."""
        _remove(path)
        return cls(Store.open(path), source)

    @classmethod
    def resume(cls, path: Path, source: PostgresRepository) -> tuple[Replica, int | None]:
        """The replica a previous daemon left at ``path``, full and ready, with the change-log
        cursor it is current to -- when it may be resumed (resume.py says when); else an
        empty one (``create``) and None."""
        if path.exists():
            try:
                store = Store.open(path)
            except Exception as exc:  # damaged, or from a newer keymem: made afresh
                logger.warning("the local replica %s cannot be opened (%s); it is made afresh", path, exc)
            else:
                try:
                    saved = store.read(lambda reader: reader.meta_value(resume.POSITION))
                    cursor, why = source.snapshot(lambda conn: resume.resumable(conn, saved))
                except BaseException:
                    store.close()
                    raise
                if cursor is not None:
                    replica = cls(store, source)
                    assert saved is not None
                    position = json.loads(saved)
                    replica._who = {name: position[name] for name in ("role", "database", "namespaces", "schema")}
                    replica._anchor, replica._saved, replica.state = int(position["anchor"]), cursor, "ready"
                    logger.info("resuming from the local replica %s at change-log cursor %d", path, cursor)
                    return replica, cursor
                logger.info("not resuming from the local replica %s: %s; loading everything from the server",
                            path, why)
                store.close()
        return cls.create(path, source), None

    @classmethod
    def kept(cls, path: Path, where: str) -> Replica:
        """The replica at ``path`` an earlier run filled from ``where`` (the server and role:
        ``describe_store_url``), or an empty one in its place when there is none, its fill did
        not end, or it copies another server or role."""
        marker = Path(f"{path}{FILLED_SUFFIX}")
        try:
            record = json.loads(marker.read_text(encoding="utf-8"))
            kept_at = float(record["filled_at"]) if record.get("where") == where else None
        except (OSError, ValueError, KeyError, TypeError):
            kept_at = None
        if kept_at is None:
            _remove(path)
            return cls(Store.open(path), None, where=where)
        try:
            return cls(Store.open(path), None, where=where, kept_at=kept_at)
        except StoreError as exc:
            logger.warning("the local replica %s kept from the last run cannot be used (%s); starting without",
                           path, exc)
            _remove(path)
            return cls(Store.open(path), None, where=where)

    def attach(self, source: PostgresRepository) -> None:
        """Copy from ``source`` from now on (a server that answered after the daemon started)."""
        self._source = source

    def fill_in_background(self) -> threading.Thread:
        """Copy everything the server holds (changes meanwhile are applied after)."""
        with self._lock:
            return self._start_fill()

    def _start_fill(self) -> threading.Thread:
        self._marker.unlink(missing_ok=True)
        self.state = "filling"
        thread = threading.Thread(target=self._fill, name="keymem-replica", daemon=True)
        thread.start()
        return thread

    def _fill(self) -> None:
        started = time.perf_counter()
        source = self._source
        try:
            assert source is not None, "a replica is filled from a server it was attached to"
            self.store.write(lambda writer: writer.clear_replica())
            who, anchor = source.snapshot(self._copy_all)
        except Exception:
            # Tried again with the next change the follower reads (the server answers then).
            logger.exception("could not fill the local replica; until it is, reads need the server")
            with self._lock:
                self.state = "partial"
            return
        with self._lock:
            self.state = "ready"
            self._who, self._anchor, self._saved, self._dirty = who, anchor, None, True
            self._bring_in_step([])
        self._marker.write_text(json.dumps({"where": self._where, "filled_at": time.time()}), encoding="utf-8")
        logger.info("local replica filled in %.2f s (%s)", time.perf_counter() - started, self.store.path)

    def _copy_all(self, conn: psycopg.Connection[Any]) -> tuple[dict[str, Any], int | None]:
        who, anchor = resume.identity(conn), resume.newest_change(conn)
        for table, rows in source_rows(conn):
            if table == "memory_fts":
                self.store.write(functools.partial(_put_index_rows, rows=rows))
            else:
                self.store.write(functools.partial(_put_rows, table=table, rows=rows))
        return who, anchor

    def apply(self, batch: Sequence[Change]) -> None:
        """Bring the rows ``batch`` names in step with the server (the follower's thread)."""
        with self._lock:
            if self.state == "filling":
                self._pending.extend(batch)
            elif self.state != "ready":
                self._start_fill()  # an earlier fill failed; the server answers again
            else:
                self._bring_in_step(batch)

    def _bring_in_step(self, batch: Sequence[Change]) -> None:
        """Copy what ``batch`` and the changes still pending name (holding the lock). When the
        server does not answer they stay pending, for the next batch; when the replica refuses
        them (it has gone out of step) it is filled again."""
        work, self._pending = [*self._pending, *batch], []
        if not work:
            return
        try:
            self._copy(work)
        except StoreUnavailable:
            self._pending = work
            return
        except Exception:
            logger.exception("could not bring the local replica in step; it is filled again")
            self._start_fill()
            return
        self._anchor = max(self._anchor or 0, *(c.seq for c in work))
        self._dirty = True

    def note_position(self, cursor: int) -> None:
        """The follower read the change log up to ``cursor`` and handed every change below it
        to ``apply``: once those are all copied, record the position (``resume.py``) -- at
        once after copying rows, else at most every ``POSITION_INTERVAL`` (the cursor moves
        with every transaction on the server)."""
        with self._lock:
            if (not self.ready or self._pending or self._who is None or self._anchor is None
                    or cursor == self._saved):
                return
            if not self._dirty and time.monotonic() - self._saved_at < POSITION_INTERVAL:
                return
            position = resume.encode(self._who, cursor, self._anchor)
            try:
                self.store.write(lambda writer: writer.set_meta({resume.POSITION: position}))
            except Exception:
                logger.exception("could not record the local replica's position; a restart loads everything")
                return
            self._saved, self._saved_at, self._dirty = cursor, time.monotonic(), False

    def _copy(self, batch: Sequence[Change]) -> None:
        memory_ids = sorted({c.id for c in batch if c.kind in ("memory", "relation")
                             or (c.kind == "link" and c.op != "update")})
        key_ids = {c.id for c in batch if c.kind in ("key", "alias")}
        names = sorted({c.id for c in batch if c.kind == "meta"})
        if not (memory_ids or key_ids or names):
            return
        source = self._source
        assert source is not None, "changes are read from a server the replica was attached to"
        rows = source.snapshot(lambda conn: _changed_rows(conn, memory_ids, key_ids, names))
        self.store.write(lambda writer: _put_changed(writer, rows, memory_ids, names))

    def read(self, fn: Callable[[Reader], T]) -> T:
        return self.store.read(fn)

    def write(self, fn: Callable[[Writer], T]) -> T:
        """A write to the copy alone (what opening the engine repairs while the server is down;
        it repairs the server's rows again once that answers)."""
        return self.store.write(fn)

    def describe(self) -> str:
        """``STATE PATH`` (for ``/v1/stats``)."""
        return f"{self.state} {self.store.path}"

    def close(self) -> None:
        self.store.close()


def _remove(path: Path) -> None:
    for suffix in (*FILE_SUFFIXES, FILLED_SUFFIX):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def source_rows(conn: psycopg.Connection[Any]) -> Iterator[tuple[str, list[Any]]]:
    """Every row a replica copies from the server, as ``(table, rows)`` chunks in the order
    their foreign keys need (``memory_fts``: ``(memory_id, content_tokens, key_tokens)``)."""
    for table in REPLICA_COLUMNS:
        for rows in streamed(conn, _select(table)):
            yield table, rows
    for rows in streamed(conn, f"SELECT {_INDEX_COLUMNS} FROM memory_fts"):
        yield "memory_fts", rows


def _put_rows(writer: SqliteWriter, *, table: str, rows: list[Any]) -> None:
    writer.put_rows(table, rows)


def _put_index_rows(writer: SqliteWriter, *, rows: list[Any]) -> None:
    writer.put_index_rows(rows)


def _changed_rows(conn: psycopg.Connection[Any], memory_ids: list[str], key_ids: set[str],
                  names: list[str]) -> dict[str, list[Any]]:
    """The server's rows now for the named memories (with their links, relations and index
    rows), keys (with their aliases, and every key those links name) and meta entries."""
    def fetch(sql: str, values: Sequence[Any]) -> list[Any]:
        return conn.execute(sql.encode(), (list(values),)).fetchall() if values else []

    rows: dict[str, list[Any]] = {
        "memories": fetch(_select("memories", "WHERE id = ANY(%s)"), memory_ids),
        "links": fetch(_select("links", "WHERE memory_id = ANY(%s)"), memory_ids),
        "relations": fetch(_select("relations", "WHERE from_id = ANY(%s)"), memory_ids),
        "memory_fts": fetch(f"SELECT {_INDEX_COLUMNS} FROM memory_fts WHERE memory_id = ANY(%s)", memory_ids),
        "meta": fetch(_select("meta", "WHERE name = ANY(%s)"), names),
    }
    wanted = sorted(key_ids | {link[0] for link in rows["links"]})
    rows["keys"] = fetch(_select("keys", "WHERE id = ANY(%s)"), wanted)
    rows["aliases"] = fetch(_select("aliases", "WHERE key_id = ANY(%s)"), wanted)
    rows["alias_candidates"] = fetch(_select("alias_candidates", "WHERE key_id = ANY(%s)"), wanted)
    rows["asked_keys"] = wanted
    return rows


def _put_changed(writer: SqliteWriter, rows: dict[str, list[Any]], memory_ids: list[str], names: list[str]) -> None:
    """Put the rows ``_changed_rows`` read in place of the replica's, and delete what the
    server no longer has (``writer``: a ``SqliteWriter`` of the replica)."""
    asked_keys: list[str] = rows["asked_keys"]
    found_keys = {r[1] for r in rows["keys"]}
    writer.put_rows("keys", rows["keys"])
    writer.drop_aliases_of(asked_keys)
    writer.put_rows("aliases", rows["aliases"])
    writer.put_rows("alias_candidates", rows["alias_candidates"])
    writer.drop_key_rows([k for k in asked_keys if k not in found_keys])
    found = {r[1] for r in rows["memories"]}
    writer.put_rows("memories", rows["memories"])
    writer.drop_memory_rows([m for m in memory_ids if m not in found])
    writer.drop_memory_edges(found)
    writer.put_rows("links", rows["links"])
    writer.put_rows("relations", rows["relations"])
    writer.put_index_rows(rows["memory_fts"])
    writer.put_rows("meta", rows["meta"])
    writer.drop_meta_rows([n for n in names if n not in {r[0] for r in rows["meta"]}])


class FailoverRepository:
    """The engine's repository on a shared store: the server while it answers, the local
    replica for reads (and a prompt refusal for writes) once it is known not to. ``primary``
    is None while the server has not answered since the daemon started (``attach`` it then)."""

    def __init__(self, primary: PostgresRepository | None, replica: Replica, *, where: str | None = None) -> None:
        self.primary = primary
        self.replica = replica
        self.where = primary.where if primary is not None else str(where)
        self.found: Literal["store", "missing", "empty"] = primary.found if primary is not None else "store"
        self.shared = True
        self.lost: str | None = None
        self.follower: ChangeFollower | None = None
        # The replica was resumed (Replica.resume): the in-memory tables load from it.
        self.resumed = False
        # time.monotonic() of the failure that showed it (a start without the server: at once).
        self._down_since: float | None = None if primary is not None else time.monotonic()
        self._local = threading.local()

    def attach(self, server: PostgresRepository) -> None:
        """The server answers (after a start without it): units of ``from_server`` go to it at
        once, the others once the follower has caught up (``offline``)."""
        self.primary = server
        self.replica.attach(server)

    def detach(self) -> PostgresRepository | None:
        """Undo ``attach`` (the server went away again before the daemon followed it)."""
        server, self.primary = self.primary, None
        return server

    # -- is the server there? -------------------------------------------------------------

    def refused(self) -> str | None:
        """The server's reason when it answers but refuses this daemon's connections now (a
        password changed while it ran: ``ChangeFollower.refused``), else None."""
        follower = self.follower
        return follower.refused if follower is not None and not follower.connected else None

    def unavailable(self, why: str) -> str:
        """What a refused unit says about the server, ``offline``'s ``why`` given."""
        reason = self.refused()
        if reason is not None:
            return (f"the store at {self.where} refuses this daemon: {reason} (fix the role's password in "
                    "KEYMEM_STORE_URL, PGPASSFILE or PGPASSWORD; a PGPASSFILE is read again at every try, so "
                    "keymemd reconnects by itself once it holds the new one)")
        return f"the store at {self.where} does not answer ({why})"

    def offline(self) -> str | None:
        """Why units do not go to the server now (None: they do)."""
        if self.primary is None or (self.follower is None and self._down_since is not None):
            return "it has not answered since this daemon started"
        follower = self.follower
        # A follower that has not connected yet (the daemon is starting) has lost nothing.
        if follower is not None and not follower.connected and follower.caught_up_at > float("-inf"):
            if self._down_since is None:
                self._down_since = time.monotonic()
            return "its change-log connection is lost"
        down = self._down_since
        if down is None:
            return None
        if follower is not None and follower.caught_up_at > down:
            self._down_since = None  # back, and what changed meanwhile has been read
            return None
        return "it did not answer the last request"

    def _went_away(self) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            logger.warning("the store at %s does not answer: reads come from the local replica, writes are "
                           "refused until it is back", self.where)

    @contextlib.contextmanager
    def from_server(self) -> Iterator[None]:
        """Units of this thread go to the server whatever ``offline`` says (the follower's own
        reads, which bring the tables in step with the server)."""
        self._local.direct = "server"
        try:
            yield
        finally:
            self._local.direct = None

    @contextlib.contextmanager
    def on_replica(self) -> Iterator[None]:
        """Units of this thread, writes too, go to the replica (opening the engine while the
        server does not answer: what it repairs then, it repairs on the server once it answers)."""
        self._local.direct = "replica"
        try:
            yield
        finally:
            self._local.direct = None

    # -- units of work ----------------------------------------------------------------------

    def read(self, fn: Callable[[Reader], T]) -> T:
        direct = getattr(self._local, "direct", None)
        primary = self.primary
        if direct == "server" and primary is not None:
            return primary.read(fn)
        if direct != "replica" and primary is not None and self.offline() is None:
            try:
                return primary.read(fn)
            except StoreUnavailable:
                self._went_away()
        # Whatever the replica holds, however little (``Service.stale`` says which): a memory
        # the in-memory tables name but the copy lacks is one the engine does not find.
        return self.replica.read(fn)

    def load(self, fn: Callable[[Reader], T]) -> T:
        """The first load of a daemon that resumes (``resumed``) reads the replica; the
        follower's catch-up then brings the tables to the server's state."""
        if self.resumed:
            self.resumed = False
            return self.replica.read(fn)
        return self.read(fn)

    def write(self, fn: Callable[[Writer], T]) -> T:
        direct = getattr(self._local, "direct", None)
        if direct == "replica":
            return self.replica.write(fn)
        why = self.offline()
        primary = self.primary
        if primary is None or (why is not None and direct != "server"):
            raise StoreUnavailable(f"{self.unavailable(str(why))}; nothing was written, and keymemd tries "
                                   "again by itself")
        try:
            return primary.write(fn)
        except StoreUnavailable:
            self._went_away()
            raise

    def _server(self) -> PostgresRepository:
        if self.primary is None:
            raise StoreUnavailable(f"the store at {self.where} has not answered since this daemon started")
        return self.primary

    def change_cursor(self) -> int:
        return self._server().change_cursor()

    def wait_for_commits(self) -> None:
        if self.primary is not None:
            self.primary.wait_for_commits()

    def analyze(self) -> None:
        if self.primary is not None:
            self.primary.analyze()

    def check_files(self) -> str | None:
        return self.primary.check_files() if self.primary is not None else None

    def checkpoint(self) -> None:
        if self.primary is not None:
            self.primary.checkpoint()

    def backup_to(self, dest: Path) -> None:
        self._server().backup_to(dest)

    def integrity_check(self) -> str:
        return self._server().integrity_check()

    def close(self) -> None:
        try:
            self.replica.close()
        finally:
            if self.primary is not None:
                self.primary.close()


class Connector:
    """Tries a server that did not answer at start again, with backoff, in a thread, until
    ``on_connected`` (handed the opened server) returns; a failure of either (the server went
    away again meanwhile) is tried again later."""

    def __init__(self, open_server: Callable[[], PostgresRepository],
                 on_connected: Callable[[PostgresRepository], None]) -> None:
        self._open = open_server
        self._on_connected = on_connected
        # Why it stopped trying: the server answered and refused this daemon (a wrong
        # password, an unknown role or database: ``PostgresRepository.open``), which trying
        # again cannot cure.
        self.refused: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keymem-connect", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        delay = RECONNECT_BACKOFF
        while not self._stop.wait(delay):
            delay = min(delay * 2, MAX_RECONNECT_BACKOFF)
            try:
                server = self._open()
            except StoreUnavailable as exc:
                logger.info("the store still does not answer (%s); trying again in %.1f s", exc, delay)
                continue
            except StoreError as exc:
                self.refused = exc.message
                logger.error("%s; not trying again (reads keep coming from the local replica)", exc.message)
                return
            try:
                self._on_connected(server)
            except StoreError as exc:
                logger.warning("the store went away again while this daemon caught up (%s); trying again", exc)
                server.close()
                continue
            except Exception:
                # Whatever it was, the daemon stays on its replica: tried again rather than never.
                logger.exception("catching up with the store failed; trying again in %.1f s", delay)
                server.close()
                continue
            return
