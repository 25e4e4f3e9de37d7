"""The SQLite store: connections, the single writer, transactions and migrations.

SQLite in WAL mode is the only source of truth. One thread owns the only write
connection; ``Store.write(fn)`` hands ``fn`` to it, and it runs ``fn`` inside ``BEGIN
IMMEDIATE`` ... ``COMMIT`` -- so every tool call is one transaction and writes never
interleave. Callbacks registered with ``Tx.after_commit`` run on the writer thread only once
the commit succeeded: that is where the in-memory vector tables are changed, so they never
show a write that was rolled back. Reads use one connection per thread, each read in its
own deferred transaction (a consistent snapshot).

Migrations are an ordered list; ``PRAGMA user_version`` counts those applied, and each one
commits together with its version bump. A database from a newer keymem is refused, and so is
an SQLite file that is not a keymem store -- before anything (its journal mode included) is
changed in it.

The store remembers which file it opened (device and inode of ``keymem.db`` and its
``-wal``/``-shm``): once one of them is deleted or replaced under a running daemon, a write
would land in a file no path leads to any more, so ``write`` refuses with ``StoreError``
(``lost``) instead of answering "saved".
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from keymem_daemon.errors import StoreError
from keymem_daemon.store.sqlite.search import Vocabulary
from keymem_daemon.store.sqlite.session import SqliteReader, SqliteWriter

logger = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS: Final = 10_000
ANALYSIS_LIMIT: Final = 400
"""Rows ANALYZE samples per index: SQLite's recommended bound (about 20 ms at 10k memories)."""
# SQLite's primary result codes for a damaged file (``sqlite3.Error.sqlite_errorcode``), and
# their messages (Python 3.10 has no error codes).
_DAMAGED_CODES: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_DAMAGED_MESSAGES: Final = ("database disk image is malformed", "file is not a database")
# The tables every keymem schema has had since the first: a file without them is not a store.
_KEYMEM_TABLES: Final = frozenset({"meta", "keys", "memories", "links"})
# The files SQLite keeps for one WAL database, by suffix.
FILE_SUFFIXES: Final = ("", "-wal", "-shm")

_SCHEMA_V1: Final = """
CREATE TABLE meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE keys (
    id TEXT PRIMARY KEY,
    concept TEXT NOT NULL,
    norm TEXT NOT NULL,
    compact TEXT NOT NULL,
    key_type TEXT NOT NULL DEFAULT 'concept' CHECK (key_type IN ('concept', 'name', 'proper_noun')),
    vector BLOB NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX keys_by_norm ON keys(norm);

CREATE TABLE aliases (
    key_id TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
    alias TEXT NOT NULL,
    norm TEXT NOT NULL,
    compact TEXT NOT NULL,
    learned INTEGER NOT NULL DEFAULT 0,
    added_at REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, norm)
) WITHOUT ROWID;
CREATE INDEX aliases_by_norm ON aliases(norm);

CREATE TABLE memories (
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    content TEXT NOT NULL,
    dedup_hash TEXT NOT NULL,
    namespace TEXT NOT NULL,
    depth REAL NOT NULL DEFAULT 0,
    access_count INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    last_accessed REAL,
    observed_at REAL,
    last_confirmed_at REAL NOT NULL,
    confirmation_count INTEGER NOT NULL DEFAULT 1,
    decay_profile TEXT NOT NULL DEFAULT 'standard'
        CHECK (decay_profile IN ('transient', 'standard', 'stable', 'permanent')),
    last_confirmation_evidence TEXT,
    last_confirmation_source TEXT,
    last_confirmation_id TEXT,
    expires_at REAL,
    supersedes TEXT,
    superseded_by TEXT,
    source TEXT,
    vector BLOB
);
CREATE INDEX memories_by_dedup ON memories(namespace, dedup_hash);
CREATE INDEX memories_by_expiry ON memories(expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memories_by_supersedes ON memories(supersedes) WHERE supersedes IS NOT NULL;

CREATE TABLE links (
    key_id TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
    memory_id TEXT NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
    weight REAL NOT NULL DEFAULT 1.0,
    auto INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, memory_id)
) WITHOUT ROWID;
CREATE INDEX links_by_memory ON links(memory_id, key_id, weight, auto);

CREATE TABLE relations (
    from_id TEXT NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
    to_id TEXT NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
    PRIMARY KEY (from_id, to_id)
) WITHOUT ROWID;
CREATE INDEX relations_by_target ON relations(to_id);

CREATE TABLE alias_candidates (
    key_id TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
    norm TEXT NOT NULL,
    query_text TEXT NOT NULL,
    count INTEGER NOT NULL DEFAULT 0,
    last_seen REAL NOT NULL,
    PRIMARY KEY (key_id, norm)
) WITHOUT ROWID;

CREATE TABLE idempotency (
    key TEXT PRIMARY KEY,
    result TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;

CREATE VIRTUAL TABLE memory_fts USING fts5(
    content_tokens, key_tokens, tokenize = 'unicode61 remove_diacritics 0'
);

CREATE VIRTUAL TABLE memory_vocab USING fts5vocab(memory_fts, 'row');

CREATE INDEX memories_by_when ON memories(namespace, COALESCE(observed_at, created_at));
"""


def _execute_script(conn: sqlite3.Connection, script: str) -> None:
    # Not executescript(): it COMMITs first, and a migration must commit with its version.
    for statement in script.split(";\n"):
        if statement.strip():
            conn.execute(statement)


def _migrate_v1(conn: sqlite3.Connection) -> None:
    _execute_script(conn, _SCHEMA_V1)


def _migrate_idempotency_fingerprint(conn: sqlite3.Connection) -> None:
    # What request an Idempotency-Key came with, so the same key on another request is refused
    # instead of replaying the first answer. Rows recorded before it have none (NULL).
    conn.execute("ALTER TABLE idempotency ADD COLUMN fingerprint TEXT")


_SCHEMA_ACTIVITY: Final = """
CREATE TABLE activity (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    memory_id TEXT,
    summary TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX activity_by_at ON activity(at);
CREATE INDEX activity_by_memory ON activity(memory_id) WHERE memory_id IS NOT NULL
"""


def _migrate_activity(conn: sqlite3.Connection) -> None:
    """The inspector's activity log: writes and what the push path surfaced (bounded)."""
    _execute_script(conn, _SCHEMA_ACTIVITY)


# Ordered: MIGRATIONS[i] takes a database from user_version i to i + 1.
MIGRATIONS: Final[tuple[Callable[[sqlite3.Connection], None], ...]] = (
    _migrate_v1,
    _migrate_idempotency_fingerprint,
    _migrate_activity,
)
SCHEMA_VERSION: Final = len(MIGRATIONS)


def _connect(path: Path, *, create: bool = True) -> sqlite3.Connection:
    # Only the writer may create the file: a reader opened after keymem.db was deleted must
    # fail, not make an empty database at the path.
    uri = f"file:{path}" if create else f"file:{path}?mode=rw"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


# A write transaction, as the engine sees it (kept as the name the write code uses).
Tx = SqliteWriter


_SHUTDOWN: Final = object()


class Store:
    """One SQLite database file, with its writer thread and per-thread readers."""

    def __init__(self, path: Path, *, backup_dir: Path | None = None) -> None:
        self.path = path
        self.backup_dir = backup_dir
        # Whether open() found no database at the path (missing, or a zero-length file).
        self.found: Literal["store", "missing", "empty"] = "store"
        # One daemon is the only writer (daemon.lock): its in-memory tables are the whole truth.
        self.shared = False
        # Why writes are refused, once the opened file is no longer the one at the path.
        self.lost: str | None = None
        self._identity: dict[str, tuple[int, int]] = {}
        self._writer_conn = _connect(path)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        # Document frequencies of the lexical index, kept between the writes that change it.
        self.vocabulary = Vocabulary()
        self._thread = threading.Thread(target=self._run_writer, name="keymem-writer", daemon=True)

    @classmethod
    def open(cls, path: Path, *, backup_dir: Path | None = None) -> Store:
        """Open (creating if needed) and migrate the database at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            size: int | None = path.stat().st_size
        except FileNotFoundError:
            size = None
        store: Store | None = None
        try:
            store = cls(path, backup_dir=backup_dir)
            store.found = "missing" if size is None else "empty" if size == 0 else "store"
            conn = store._writer_conn
            # Read-only questions first: a file that is not a keymem store is left as it was.
            _check_is_keymem(conn, path)
            # journal_mode cannot change inside a transaction; set it before anything else.
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"{path}: could not enable WAL journaling (got {mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            migrate(conn, path, backup_dir=backup_dir)
        except sqlite3.DatabaseError as exc:
            if store is not None:
                store._writer_conn.close()
            raise StoreError(f"cannot open the store at {path}: {exc}{damage_hint(exc, backup_dir)}") from exc
        except BaseException:
            if store is not None:
                store._writer_conn.close()
            raise
        store._remember_files()
        store._thread.start()
        return store

    # -- the opened file -----------------------------------------------------------------

    def _remember_files(self) -> None:
        for suffix in FILE_SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(f"{self.path}{suffix}")
                self._identity[suffix] = (st.st_dev, st.st_ino)

    def wait_for_commits(self) -> None:
        """Nothing to wait for: the one writer thread commits and runs the after-commit steps
        of one write at a time, and no change log is followed."""

    def check_files(self) -> str | None:
        """Why the files this store opened are no longer the ones at its path (None: they
        are). Once a problem is seen it stays: the open handles point at the old file."""
        if self.lost is not None:
            return self.lost
        for suffix in FILE_SUFFIXES:
            name = f"{self.path}{suffix}"
            try:
                st = os.stat(name)
            except FileNotFoundError:
                if suffix not in self._identity:
                    continue  # SQLite has not made it yet
                what = "was deleted"
            else:
                known = self._identity.setdefault(suffix, (st.st_dev, st.st_ino))
                if known == (st.st_dev, st.st_ino):
                    continue
                what = "was replaced by another file"
            self.lost = (f"{name} {what} while keymemd was running; writes are refused, because "
                         "they would go to a file no path leads to any more")
            logger.error("%s", self.lost)
            return self.lost
        return None

    # -- writing -------------------------------------------------------------------------

    def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one write transaction on the writer thread; return its result."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("Store.write called from inside a write transaction")
        if self._closed:
            raise StoreError("the store is closed")
        lost = self.check_files()
        if lost is not None:
            raise StoreError(lost)
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future.result()

    def _run_writer(self) -> None:
        conn = self._writer_conn
        while True:
            item = self._queue.get()
            if item is _SHUTDOWN:
                break
            if isinstance(item, _Exclusive):
                item.run()
                continue
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            tx = SqliteWriter(conn, self.vocabulary)
            try:
                conn.execute("BEGIN IMMEDIATE")
                result = fn(tx)
                conn.execute("COMMIT")
            except BaseException as exc:  # noqa: BLE001 - every failure rolls back
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                self.vocabulary.settle()
                if isinstance(exc, sqlite3.DatabaseError):
                    exc = StoreError(f"the store refused the write: {exc}{damage_hint(exc, self.backup_dir)}")
                future.set_exception(exc)
                continue
            self.vocabulary.settle()
            for callback in tx.run_after_commit():
                try:
                    callback()
                except Exception:
                    logger.exception("an after-commit step failed; the in-memory index may lag")
            future.set_result(result)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.DatabaseError:
            logger.warning("final WAL checkpoint failed; SQLite will recover it on next open")
        conn.close()

    # -- reading -------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreError("the store is closed")
            try:
                conn = _connect(self.path, create=False)
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"cannot read the store at {self.path}: {exc}") from exc
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def load(self, fn: Callable[[SqliteReader], T]) -> T:
        """The in-memory tables' load: a ``read`` (the file is the store)."""
        return self.read(fn)

    def read(self, fn: Callable[[SqliteReader], T]) -> T:
        """Run ``fn`` on this thread's read connection inside one snapshot (the open one's,
        when this thread is inside a read already)."""
        outer: SqliteReader | None = getattr(self._local, "reading", None)
        if outer is not None:
            return fn(outer)
        conn = self._reader()
        seen = self.vocabulary.generation  # before the snapshot begins (see Vocabulary)
        conn.execute("BEGIN")
        self._local.reading = reader = SqliteReader(conn, self.vocabulary, seen)
        try:
            return fn(reader)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"the store refused a read: {exc}{damage_hint(exc, self.backup_dir)}") from exc
        finally:
            self._local.reading = None
            conn.execute("COMMIT")

    # -- maintenance ---------------------------------------------------------------------

    def analyze(self) -> None:
        """Refresh the query planner's statistics (by the scheduler's cleanup and after an
        import). Without them SQLite takes ``namespace = ?`` for a selective index, and a
        namespace-scoped recall scans the namespace for each key (a hub key's members at 10k
        memories: 145 ms against 47 ms)."""
        def analyze(conn: sqlite3.Connection) -> None:
            conn.execute(f"PRAGMA analysis_limit = {ANALYSIS_LIMIT}")
            conn.execute("ANALYZE")

        self._exclusive(analyze)

    def checkpoint(self) -> None:
        """Fold the WAL into the main file (called by the scheduler and at close)."""
        self._exclusive(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))

    def backup_to(self, dest: Path) -> None:
        """A consistent online copy of the database at ``dest``."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_suffix(dest.suffix + ".partial")

        def copy(conn: sqlite3.Connection) -> None:
            target = sqlite3.connect(partial)
            try:
                conn.backup(target)
            finally:
                target.close()

        self._exclusive(copy)
        partial.replace(dest)

    def integrity_check(self) -> str:
        return self.read(lambda reader: reader.integrity_check())

    def _exclusive(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        """Run ``fn`` on the writer connection outside any transaction (between writes)."""
        future: Future[None] = Future()

        def run() -> None:
            try:
                fn(self._writer_conn)
            except BaseException as exc:  # noqa: BLE001
                future.set_exception(exc)
            else:
                future.set_result(None)

        self._queue.put(_Exclusive(run))
        future.result()

    def close(self) -> None:
        """Finish queued writes, checkpoint, and close every connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_SHUTDOWN)
        self._thread.join()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()


@dataclass(frozen=True, slots=True)
class _Exclusive:
    run: Callable[[], None]


def damage_hint(exc: sqlite3.Error, backup_dir: Path | None) -> str:
    """For an error that says the file is damaged: where the backups are and how to restore."""
    code = getattr(exc, "sqlite_errorcode", None)
    damaged = any(m in str(exc) for m in _DAMAGED_MESSAGES) if code is None else code & 0xFF in _DAMAGED_CODES
    if backup_dir is None or not damaged:
        return ""
    return (f". The store file is damaged; backups are in {backup_dir}: `keymemd restore` puts the newest good "
            "one back (it keeps the damaged file aside), `keymemd restore FILE` a given one")


def keymem_tables_missing(tables: set[str]) -> list[str]:
    """The tables of every keymem schema that a database with ``tables`` lacks."""
    return sorted(_KEYMEM_TABLES - tables)


def _open_immutable(path: Path) -> sqlite3.Connection:
    # immutable: nobody writes a backup, and a plain read-only open of a WAL-mode file would
    # create -wal/-shm files next to it.
    return sqlite3.connect(f"file:{path}?immutable=1", uri=True)


def file_memories(path: Path, *, full_check: bool = False) -> int:
    """How many memories the store file at ``path`` (a backup, which nobody writes) holds;
    ``full_check`` runs SQLite's integrity check too (slower). ``ValueError`` says why the
    file cannot be read as a keymem store."""
    try:
        conn = _open_immutable(path)
    except sqlite3.Error as exc:
        raise ValueError(f"cannot open it: {exc}") from exc
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = keymem_tables_missing(tables)
        if missing:
            raise ValueError(f"not a keymem store (no table {', '.join(missing)})")
        if version > SCHEMA_VERSION:
            raise ValueError(f"written by a newer keymem (schema {version})")
        if full_check:
            verdict = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
            if verdict != ["ok"]:
                raise ValueError(f"damaged: {'; '.join(verdict)}")
        return int(conn.execute("SELECT COUNT(*) FROM memories").fetchone()[0])
    except sqlite3.Error as exc:
        raise ValueError(f"damaged: {exc}") from exc
    finally:
        conn.close()


def copy_file(source: Path, target: Path) -> None:
    """Copy the store file ``source`` (a backup, which nobody writes) to a new file ``target``."""
    conn = _open_immutable(source)
    try:
        copy = sqlite3.connect(target)
        try:
            conn.backup(copy)
        finally:
            copy.close()
    finally:
        conn.close()


def _check_is_keymem(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a database that is not a keymem store, asking only read-only questions."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version == 0 and not tables:
        return  # a new (or empty) file: it becomes a store
    if keymem_tables_missing(tables):
        shown = ", ".join(sorted(tables)[:5]) or "none"
        raise StoreError(
            f"{path} is an SQLite database but not a keymem store (schema version {version}, tables: {shown}); "
            "it was left unchanged -- move it elsewhere, or point KEYMEM_DATA_DIR at another directory")


def migrate(conn: sqlite3.Connection, path: Path, *, backup_dir: Path | None = None) -> None:
    """Apply every pending migration, each in its own transaction with its version bump."""
    current = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer keymem (schema {current}, this version knows "
            f"{SCHEMA_VERSION}); upgrade keymem instead of downgrading the store"
        )
    if current < SCHEMA_VERSION and current > 0 and backup_dir is not None:
        backup_dir.mkdir(parents=True, exist_ok=True)
        target = backup_dir / f"keymem-before-schema-{current + 1}.db"
        copy = sqlite3.connect(target)
        try:
            conn.backup(copy)
        finally:
            copy.close()
        logger.info("backed up the store to %s before migrating", target)
    for version in range(current, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        logger.info("store migrated to schema %d", version + 1)

