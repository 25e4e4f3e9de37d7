"""Opening a store: the one place that names a storage implementation and builds it.

The engine types against ``engine/ports.py`` and is handed an opened ``Repository``
(``MemoryGraph.over``); the service, the CLI, the tests and the scripts open it here.
``open_store`` picks from ``Settings``: PostgreSQL at ``KEYMEM_STORE_URL`` when it is set,
else SQLite at the data dir's ``keymem.db``. PostgreSQL's module (and so psycopg, an optional
dependency) is imported only when a PostgreSQL store is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from keymem_daemon.config import Settings
from keymem_daemon.engine.ports import Repository
from keymem_daemon.store.sqlite.database import Store

if TYPE_CHECKING:
    from keymem_daemon.store.postgres.repository import PostgresRepository


def open_sqlite(settings: Settings, path: Path | None = None) -> Store:
    """The SQLite store at ``path`` (default: ``settings.db_path``), created and migrated as
    needed; backups before a migration go to ``settings.backup_dir``."""
    return Store.open(settings.db_path if path is None else path, backup_dir=settings.backup_dir)


def open_postgres(url: str, settings: Settings | None = None) -> PostgresRepository:
    """The PostgreSQL store at ``url``, its schema brought up to date, its sessions' limits
    from ``settings`` (default: the defaults)."""
    from keymem_daemon.store.postgres.repository import PostgresRepository

    if settings is None:
        return PostgresRepository.open(url)
    return PostgresRepository.open(url, lock_timeout=settings.store_lock_timeout,
                                   idle_timeout=settings.store_idle_timeout)


def open_store(settings: Settings) -> Repository:
    """The store ``settings`` names: PostgreSQL at ``store_url`` when set, else SQLite."""
    if settings.store_url is not None:
        return open_postgres(settings.store_url, settings)
    return open_sqlite(settings)
