"""``keymemd migrate-store --to URL``: copy the local SQLite store into a PostgreSQL one (issue 22).

The copy is an export of the SQLite store (vectors included) written into the PostgreSQL
store by the import's own code (``engine.transfer.copy_into``), a batch per transaction, so
the two stores hold the same thing in the same schema version. It runs with the daemon
stopped: it takes the data directory's ``daemon.lock``, so nothing changes the SQLite store
while it is read.

- **Resumable.** The first run marks the target as this migration's (meta
  ``migrated_from``: the machine and the SQLite file); a run cut short (a signal, a lost
  connection) and started again finds its mark, skips what is there and continues after
  the last batch committed. A target holding keys or memories without that mark -- a team's
  database in use, another person's migration -- is refused and left unchanged.
- **Verified.** At the end both stores are exported again in canonical form (every table in
  id order, vectors included, JSON with sorted keys) and compared: per-table counts and a
  SHA-256 of each export. A difference fails the command, naming the tables that differ.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from keymem_daemon import runtime
from keymem_daemon.config import Settings, describe_store_url
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.ports import Repository, Writer
from keymem_daemon.errors import Conflict, KeymemError, StoreError
from keymem_daemon.store import opening

MIGRATION_META: Final = "migrated_from"
"""The target's meta entry naming the migration that fills it (``host:path`` of the source)."""
COPY_BATCH: Final = 500
"""Keys or memories per transaction: one batch is about a second of round trips on a
PostgreSQL across a LAN, small enough that an interrupted run redoes little, large enough
that a commit per batch costs nothing measurable."""
TABLES: Final = ("keys", "aliases", "memories", "links", "relations", "alias_candidates")
"""What the verification counts, as an export holds them (aliases inside their keys)."""

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A store's canonical export, summed up."""

    counts: dict[str, int]
    sha256: str


@dataclass(frozen=True, slots=True)
class Migration:
    target: str
    """The target as ``postgresql HOST:PORT/DATABASE as ROLE`` (never the password)."""
    resumed: bool
    result: dict[str, Any]
    """``copy_into``'s imported/skipped counts of this run."""
    verified: Fingerprint
    seconds: float


def fingerprint(export: Mapping[str, Any]) -> Fingerprint:
    """Per-table counts and the SHA-256 of an export in canonical JSON."""
    counts = {name: len(export[name]) for name in TABLES if name != "aliases"}
    counts["aliases"] = sum(len(k["aliases"]) for k in export["keys"])
    text = json.dumps(export, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return Fingerprint({name: counts[name] for name in TABLES}, hashlib.sha256(text.encode()).hexdigest())


def _claim(store: Repository, identity: str, where: str) -> bool:
    """Mark the target as this migration's, or find it marked so (True: resuming). A target
    with keys or memories of anything else is refused."""

    def claim(writer: Writer) -> bool:
        mark = writer.meta_value(MIGRATION_META)
        if mark == identity:
            return True
        memories, keys = writer.memory_rows(), writer.key_count()
        if mark is not None:
            raise Conflict(f"{where} is the target of another migration (from {mark}); nothing was copied -- "
                           "migrate into an empty database")
        if memories or keys:
            raise Conflict(f"{where} already holds {memories} memories and {keys} keys that are not from this "
                           "migration; nothing was copied -- migrate into an empty database")
        writer.set_meta({MIGRATION_META: identity})
        return False

    return store.write(claim)


def migrate_store(settings: Settings, url: str, *, progress: Progress) -> Migration:
    """Copy ``settings``' SQLite store into the PostgreSQL store at ``url`` and verify it."""
    from keymem_daemon.inference.embedders import load_embedder_or_default

    started = time.monotonic()
    where = describe_store_url(url)
    source_path = settings.db_path
    if not source_path.is_file():
        raise StoreError(f"there is no SQLite store at {source_path} to migrate (KEYMEM_DATA_DIR is "
                         f"{settings.data_dir})")
    try:
        lock = runtime.acquire_daemon_lock(settings.data_dir)
    except Conflict as exc:
        raise Conflict(f"{exc.message}: stop it (keymemd stop) so the store does not change while it is copied, "
                       "then migrate again") from None
    try:
        embedder, _ = load_embedder_or_default(settings)
        source = MemoryGraph.over(opening.open_sqlite(settings, source_path), embedder, settings)
        try:
            repository = opening.open_postgres(url, settings)
            try:
                resumed = _claim(repository, f"{socket.gethostname()}:{source_path}", where)
            except BaseException:
                repository.close()
                raise
            target = MemoryGraph.over(repository, embedder, settings)  # closes the repository if it fails
            try:
                versions = (source.store.read(lambda r: r.schema_version()),
                            target.store.read(lambda r: r.schema_version()))
                if versions[0] != versions[1]:
                    raise StoreError(f"the SQLite store is at schema {versions[0]} and {where} at {versions[1]}; "
                                     "both must be this keymem's: upgrade keymem where it is older")
                progress("reading", 0, 1)
                export = transfer.export(source, include_vectors=True)
                expected = fingerprint(export)
                progress("reading", 1, 1)
                try:
                    result = transfer.copy_into(target, export, batch=COPY_BATCH, progress=progress)
                except KeymemError as exc:
                    raise StoreError(f"{exc.message} -- the batches committed before stay in {where}; run the same "
                                    "command again to continue after them") from None
                progress("verifying", 0, 1)
                found = fingerprint(transfer.export(target, include_vectors=True))
                progress("verifying", 1, 1)
            finally:
                target.close()
        finally:
            source.close()
    finally:
        lock.release()
    if found != expected:
        differ = [f"{name} {expected.counts[name]} in SQLite, {found.counts[name]} there" for name in TABLES
                  if expected.counts[name] != found.counts[name]]
        raise StoreError(f"the copy in {where} does not match the SQLite store: "
                         f"{'; '.join(differ) or 'same counts, different content (checksums differ)'}; a write "
                         "after the migration began, or keymem's own writes there, can cause this")
    return Migration(where, resumed, result, found, time.monotonic() - started)
