"""Small helpers for the SQL of every store/sqlite module."""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, Final

# Values bound per ``IN (...)`` list: SQLite caps a statement's parameters (999 on older builds).
_IN_CHUNK: Final = 500


def rows_in(conn: sqlite3.Connection | Any, sql: str, values: Sequence[Any]) -> Iterator[Any]:
    """The rows of ``sql`` for every value, where ``{marks}`` in ``sql`` stands for the
    placeholders of its ``IN`` list; a long list is asked for a chunk at a time."""
    for start in range(0, len(values), _IN_CHUNK):
        chunk = values[start:start + _IN_CHUNK]
        yield from conn.execute(sql.format(marks=",".join("?" * len(chunk))), chunk)
