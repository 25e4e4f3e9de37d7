"""Who may read or write which namespace of a PostgreSQL store: ``keymemd team grant|revoke|list``.

These are administrative commands, not engine operations: each opens its own connection,
does one transaction and closes it. A grant is a row of ``grants`` (schema.py), which the
row-level security policies read; granting also gives the role CONNECT on the database (the
policies, not table privileges, decide what it then sees), and revoking a role's last grant
takes CONNECT away again. Only the database's owner -- or a member of the owner's role -- may
change grants (PostgreSQL refuses anyone else); anyone may list the grants that apply to
them. Namespaces are normalized as keymem stores them, so a grant matches what the tools
write.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final, Literal

import psycopg
from psycopg import errors, sql

from keymem_daemon.config import describe_store_url
from keymem_daemon.engine.text import normalize_namespace
from keymem_daemon.errors import InvalidInput, Refused, StoreError
from keymem_daemon.store.postgres import schema

logger = logging.getLogger(__name__)

Mode = Literal["read", "write"]

CONNECT_TIMEOUT: Final = 10
"""Seconds to reach the server before saying it does not answer (libpq's connect_timeout)."""
MAX_NAME_CHARS: Final = 200
"""Longest namespace accepted: a name, not a document (PostgreSQL role names stop at 63 bytes)."""


@dataclass(frozen=True, slots=True)
class Grant:
    namespace: str
    role: str
    mode: Mode
    granted_at: str  # ISO 8601, UTC


def _connect(url: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT)
    except psycopg.OperationalError as exc:
        # libpq's message names host, port and role, never the password.
        raise StoreError(f"cannot reach the store at {describe_store_url(url)}: {str(exc).strip()}") from None


def _namespace(raw: str) -> str:
    if len(raw) > MAX_NAME_CHARS:
        raise InvalidInput(f"namespace is longer than {MAX_NAME_CHARS} characters", field="namespace")
    return normalize_namespace(raw)


def _refusal(url: str, exc: errors.InsufficientPrivilege) -> Refused:
    return Refused(f"{describe_store_url(url)} refused to change grants ({str(exc).strip()}): only the database's "
                   "owner, or a member of the owner's role, manages grants")


def _check_role(conn: psycopg.Connection[Any], role: str) -> None:
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
        raise InvalidInput(f"role {role!r} does not exist on the server (create it first: CREATE ROLE ... LOGIN)",
                           field="role")


def grant(url: str, namespace: str, role: str, mode: Mode) -> Grant:
    """Let ``role`` read (or read and write) ``namespace``; a second grant changes the mode.
    Sets up the schema first when the database has none yet (the owner runs this)."""
    name = _namespace(namespace)
    with _connect(url) as conn:
        _check_role(conn, role)  # before the schema is set up: a refused grant changes nothing
        try:
            schema.migrate(conn, where=describe_store_url(url))
            with conn.transaction():
                row = conn.execute(
                    "INSERT INTO grants(namespace, role, mode) VALUES (%s, %s, %s) "
                    "ON CONFLICT (namespace, role) DO UPDATE SET mode = excluded.mode, granted_at = now() "
                    "RETURNING to_char(granted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
                    (name, role, mode)).fetchone()
                conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                    sql.Identifier(conn.info.dbname), sql.Identifier(role)))
        except errors.InsufficientPrivilege as exc:
            raise _refusal(url, exc) from None
    logger.info("granted %s on namespace %s to %s", mode, name, role)
    return Grant(namespace=name, role=role, mode=mode, granted_at=str(row[0]) if row else "")


def revoke(url: str, namespace: str, role: str) -> bool:
    """Take ``role``'s grant on ``namespace`` away; whether there was one. With its last grant
    gone the role may no longer connect to the database."""
    name = _namespace(namespace)
    with _connect(url) as conn:
        _require_schema(conn, url)
        try:
            with conn.transaction():
                _check_role(conn, role)
                removed = conn.execute("DELETE FROM grants WHERE namespace = %s AND role = %s",
                                       (name, role)).rowcount > 0
                left = conn.execute("SELECT 1 FROM grants WHERE role = %s LIMIT 1", (role,)).fetchone()
                if left is None:
                    conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(
                        sql.Identifier(conn.info.dbname), sql.Identifier(role)))
        except errors.InsufficientPrivilege as exc:
            raise _refusal(url, exc) from None
    if removed:
        logger.info("revoked namespace %s from %s", name, role)
    return removed


def list_grants(url: str, *, namespace: str | None = None, role: str | None = None) -> list[Grant]:
    """The grants the connecting role can see (the owner: all), by namespace then role."""
    name = _namespace(namespace) if namespace is not None else None
    with _connect(url) as conn:
        _require_schema(conn, url)
        rows = conn.execute(
            "SELECT namespace, role, mode, to_char(granted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
            "FROM grants WHERE (%(ns)s::text IS NULL OR namespace = %(ns)s) "
            "AND (%(role)s::text IS NULL OR role = %(role)s) ORDER BY namespace, role",
            {"ns": name, "role": role}).fetchall()
    return [Grant(namespace=r[0], role=r[1], mode=r[2], granted_at=r[3]) for r in rows]


def _require_schema(conn: psycopg.Connection[Any], url: str) -> None:
    if schema.schema_version(conn) == 0:
        raise StoreError(f"{describe_store_url(url)} holds no keymem store yet (its owner sets it up with "
                         "the first `keymemd team grant`)")
