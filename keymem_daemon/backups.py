"""The backups of a store under ``<data>/backups``: what each holds, rotation, restoring.

===================================  =====================================================
file                                 written by
===================================  =====================================================
``keymem-<UTC stamp>.db``            the scheduler's backup job; the newest
                                     ``KEYMEM_BACKUP_KEEP`` are kept (``rotate``)
``keymem-before-schema-<n>.db``      a start that migrates the schema
``keymem-before-reembed-*.db``       a start that re-embeds the store for a new embedder
``keymem-rescued-<UTC stamp>.db``    a daemon whose ``keymem.db`` was deleted or replaced
                                     under it (it still had the old file open)
===================================  =====================================================

Rotation never deletes the newest backup that holds more memories than the store: after a
start on an empty store (a deleted or zero-length ``keymem.db``), daily backups of the empty
store must not push the last good one out.

``restore`` puts a backup in place of ``keymem.db``; the files it replaces (the database and
its ``-wal``/``-shm``) are moved aside to ``<data>/replaced/<UTC stamp>/``, never deleted.
The caller (``keymemd restore``) makes sure no daemon owns the directory meanwhile.

Only the standard library: the CLI imports this without the engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Final

from keymem_daemon.store.sqlite.database import FILE_SUFFIXES, copy_file, file_memories

logger = logging.getLogger(__name__)

ROTATED_GLOB: Final = "keymem-2*.db"
"""The scheduler's dated backups (the only ones rotation deletes)."""
ANY_GLOB: Final = "keymem-*.db"
REPLACED_DIR: Final = "replaced"
STAMP_FORMAT: Final = "%Y%m%dT%H%M%SZ"


def stamp(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).strftime(STAMP_FORMAT)


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """One backup file: when it was written and how many memories it holds."""

    path: Path
    mtime: float
    memories: int | None
    """None when the file cannot be read as a keymem store (``problem`` says why)."""
    problem: str | None = None


def inspect(path: Path, *, full_check: bool = False) -> BackupInfo:
    """What ``path`` holds; ``full_check`` runs SQLite's integrity check too (slower)."""
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        return BackupInfo(path, 0.0, None, f"cannot read it: {exc.strerror or exc}")
    try:
        return BackupInfo(path, mtime, file_memories(path, full_check=full_check))
    except ValueError as exc:
        return BackupInfo(path, mtime, None, str(exc))


def backups(backup_dir: Path) -> list[Path]:
    """Every backup file, newest first."""
    found = []
    for path in backup_dir.glob(ANY_GLOB):
        with contextlib.suppress(OSError):  # rotated away meanwhile
            if path.is_file():
                found.append((path.stat().st_mtime, path.name, path))
    return [path for *_, path in sorted(found, reverse=True)]


def newest_holding_more(backup_dir: Path, memories: int) -> BackupInfo | None:
    """The newest readable backup holding more than ``memories`` memories, if any."""
    for path in backups(backup_dir):
        info = inspect(path)
        if info.memories is not None and info.memories > memories:
            return info
    return None


def rotate(backup_dir: Path, keep: int, store_memories: int) -> list[Path]:
    """Delete all but the newest ``keep`` dated backups -- except the newest backup that
    holds more memories than the store (``store_memories``). Returns what was deleted."""
    dated = sorted(backup_dir.glob(ROTATED_GLOB), reverse=True)  # the stamp sorts by time
    doomed = dated[keep:]
    if not doomed:
        return []
    spared = newest_holding_more(backup_dir, store_memories)
    deleted = []
    for path in doomed:
        if spared is not None and path == spared.path:
            logger.warning("kept %s beyond KEYMEM_BACKUP_KEEP: it holds %d memories, the store %d",
                           path, spared.memories, store_memories)
            continue
        path.unlink(missing_ok=True)
        deleted.append(path)
    return deleted


def choose(backup_dir: Path, requested: Path | None) -> BackupInfo:
    """The backup to restore: ``requested`` (a path, or a file name in ``backup_dir``) after a
    full check, else the newest backup that passes one. ``ValueError`` says why none can."""
    if requested is not None:
        path = requested if requested.exists() or requested.is_absolute() else backup_dir / requested
        if not path.is_file():
            raise ValueError(f"{requested} does not exist (the backups are in {backup_dir})")
        info = inspect(path, full_check=True)
        if info.problem is not None:
            raise ValueError(f"{path} cannot be restored: {info.problem}")
        return info
    rejected = []
    for path in backups(backup_dir):
        info = inspect(path, full_check=True)
        if info.problem is None:
            return info
        rejected.append(f"{path.name}: {info.problem}")
    detail = f" ({'; '.join(rejected[:3])})" if rejected else ""
    raise ValueError(f"no usable backup in {backup_dir}{detail}")


@dataclass(frozen=True, slots=True)
class Restored:
    backup: BackupInfo
    set_aside: list[Path]
    """Where the files that were at the store's path went."""


def restore(backup: BackupInfo, db_path: Path, *, now: float) -> Restored:
    """Copy ``backup`` into place at ``db_path``, moving what was there aside first.

    No daemon may own the data directory meanwhile (the caller holds its lock)."""
    aside_dir = db_path.parent / REPLACED_DIR / stamp(now)
    partial = db_path.with_name(f".{db_path.name}.restoring")
    partial.unlink(missing_ok=True)
    copy_file(backup.path, partial)
    os.chmod(partial, 0o600)
    moved = _set_aside(db_path, aside_dir)
    partial.replace(db_path)
    with contextlib.suppress(OSError):  # durability of the rename, where the OS allows it
        fd = os.open(db_path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    logger.info("restored %s to %s (replaced files moved to %s)", backup.path, db_path, aside_dir)
    return Restored(backup, moved)


def _set_aside(db_path: Path, aside_dir: Path) -> list[Path]:
    moved = []
    for name in (db_path.with_name(db_path.name + suffix) for suffix in FILE_SUFFIXES):
        if name.exists():
            aside_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            target = aside_dir / name.name
            name.replace(target)
            moved.append(target)
    return moved

