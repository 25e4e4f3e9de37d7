"""Where a daemon's local replica is in the change log, kept in the replica, so that a daemon
restarted on the same data dir resumes from it instead of fetching the whole store again.

The replica (``offline.py``) keeps one meta row, ``POSITION``: the change-log ``cursor``
(``changes.py``) below which every change has been copied into it, the ``anchor`` (the
``seq`` of the newest change row it has seen), and what it is a copy of (``identity``: the
role, the database's oid, the namespaces the role may read, the schema version). A daemon
that starts resumes from it -- loads its in-memory tables from the replica and reads the
change log from ``cursor`` on -- only when every part still holds on the server:

- the same database (its oid) and role, and the same readable namespaces: a grant or revoke
  while the daemon was down changes what it may hold, and the change log does not say so;
- the same schema version;
- the anchor row is still in the change log: a log pruned or truncated past the cursor has
  lost changes the replica never saw (rows go oldest first, so the anchor, older than every
  change still to read, goes with them);
- and at most ``CATCH_UP_LIMIT`` change rows to read since: past that, loading everything
  again is quicker than catching up one changed row at a time.

Otherwise the replica is made afresh and filled again, as at a first start. Without an
anchor (a store whose change log held nothing the role can read) there is nothing to resume.
"""
from __future__ import annotations

import json
from typing import Any, Final

import psycopg

POSITION: Final = "replica:position"
"""The replica's meta row holding its position (a JSON object); no keymem meta name starts
with ``replica:``, so the server's rows the replica copies never collide with it."""
CATCH_UP_LIMIT: Final = 5000
"""Change rows since the cursor past which a restart loads everything again: catching up reads
each changed memory's rows one statement at a time (a few ms each), so 5,000 take about as
long as a full load of 100k memories in one streamed statement per table."""


def identity(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """What the rows a role reads depend on: the role, the database, its readable namespaces,
    the schema version (in ``conn``'s snapshot)."""
    row = conn.execute("SELECT current_user, (SELECT oid FROM pg_database WHERE datname = current_database())::bigint, "
                       "keymem_namespaces('read'), (SELECT version FROM keymem_schema)").fetchone()
    assert row is not None  # a SELECT without FROM always has its row
    return {"role": row[0], "database": int(row[1]), "namespaces": sorted(row[2]), "schema": int(row[3])}


def newest_change(conn: psycopg.Connection[Any]) -> int | None:
    """The ``seq`` of the newest change row the role can read (None: none)."""
    row = conn.execute("SELECT max(seq) FROM changes").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def encode(who: dict[str, Any], cursor: int, anchor: int) -> str:
    return json.dumps({**who, "cursor": cursor, "anchor": anchor}, sort_keys=True)


def resumable(conn: psycopg.Connection[Any], saved: str | None) -> tuple[int | None, str]:
    """The cursor to resume from (None: load everything) and, when None, why."""
    if saved is None:
        return None, "it records no position in the change log"
    try:
        position = json.loads(saved)
        cursor, anchor = int(position["cursor"]), int(position["anchor"])
    except (ValueError, TypeError, KeyError):
        return None, "its position in the change log is unreadable"
    now = identity(conn)
    changed = [name for name, value in now.items() if position.get(name) != value]
    if changed:
        return None, f"the server's {', '.join(changed)} changed since it was copied"
    found = conn.execute("SELECT EXISTS (SELECT 1 FROM changes WHERE seq = %s)", (anchor,)).fetchone()
    if not (found and found[0]):
        return None, f"the change log no longer holds its last change ({anchor}): it was pruned or truncated"
    behind = conn.execute("SELECT count(*) FROM (SELECT 1 FROM changes WHERE tx >= %s::text::xid8 LIMIT %s) c",
                          (str(cursor), CATCH_UP_LIMIT + 1)).fetchone()
    if behind and int(behind[0]) > CATCH_UP_LIMIT:
        return None, f"more than {CATCH_UP_LIMIT} changes were made since"
    return cursor, ""
