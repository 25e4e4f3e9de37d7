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
``horizon(conn)`` in the same snapshot. Row-level security applies: a role reads the change
rows of the namespaces it may read (and the shared vocabulary's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import psycopg


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
