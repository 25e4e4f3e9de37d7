"""How the PostgreSQL store's statements reach the server: every ``read`` and ``write`` unit
runs in psycopg's pipeline mode (``PostgresRepository``), so a statement whose result nobody
reads (an INSERT, an UPDATE, BEGIN, ``SET LOCAL``) is sent with the next one whose result is
read, and a unit costs one round trip per result it reads plus its COMMIT. On a loaded
machine each round trip is two context switches, a few milliseconds: a remember used to
make 18 of them.

What pipeline mode changes for the code here:
- A result read (``fetchone``, iterating a cursor) waits for every statement sent before it;
  an error of any of them is raised there, with its own SQLSTATE (a serialization failure
  still reaches ``write``'s retry), and the unit rolls back as before.
- ``cursor.rowcount`` is not known until the statement's result arrived: a statement whose
  count is used runs through ``affected``, which syncs the unit's pipeline.
- A savepoint that must see its own statement's error (an import row) syncs before it ends.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg


def affected(conn: psycopg.Connection[Any], pipeline: psycopg.Pipeline, sql: str, params: Sequence[Any] = ()
             ) -> int:
    """Run one statement in ``conn``'s ``pipeline`` and return how many rows it changed: it
    goes out with everything queued before it, in one round trip."""
    cur = conn.execute(sql.encode(), params)
    pipeline.sync()
    return cur.rowcount
