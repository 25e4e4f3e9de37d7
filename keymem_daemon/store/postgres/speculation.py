"""A write's reads whose answer is nearly always known, sent as assertions instead of waited
for: on a server each read a write waits for is a round trip (store/postgres/pipeline.py),
and a remember of a new memory used to wait for three -- is there an Idempotency-Key record,
an identical memory, a stored key of a text the index lacks -- whose answer is "no" but for a
retry, a duplicate or a key another daemon made a moment ago, and for its keys' texts, which
the daemon's key index holds.

A speculating writer (``PgSpeculation``) answers such a read with the likely answer at once
and queues a statement ``keymem_expect(<the read's condition>, ...)`` (schema.py) in its
place: the same rows read, by the same statement shape, in the same transaction, under the
same row-level security -- so under SERIALIZABLE it conflicts with a concurrent write exactly
as the read did. The statement goes out with the unit's next read or its COMMIT. When the
answer was not the likely one, it raises ``EXPECT_FAILED``, the unit rolls back (nothing it
did counts: it was built on a wrong answer) and ``PostgresRepository.write`` runs it again at
once without speculating, reading each answer as before. A remember of a new memory whose
keys the index holds is then one round trip: everything, COMMIT included, in one message.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg

from keymem_daemon.store.postgres.keys import PgKeyRows
from keymem_daemon.store.postgres.memories import ACTIVE, PgMemoryRows
from keymem_daemon.store.postgres.schema import EXPECT_FAILED


class Misspeculated(Exception):
    """A speculating write unit's assumption was wrong: it was rolled back, run it again reading."""


def misspeculation(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the server refusing a speculating unit's assumption."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate == EXPECT_FAILED


_NO_IDEMPOTENCY_RECORD: Final = (b"SELECT keymem_expect(NOT EXISTS (SELECT 1 FROM idempotency WHERE key = %s), "
                                 b"'an Idempotency-Key record')")
_NO_TWIN: Final = (f"SELECT keymem_expect(NOT EXISTS (SELECT 1 FROM memories m WHERE m.namespace = %s "
                   f"AND m.dedup_hash = %s AND {ACTIVE}), 'an identical memory')").encode()
_NO_KEY_NAMED: Final = (b"SELECT keymem_expect(NOT EXISTS (SELECT 1 FROM keys WHERE norm = ANY(%s)), "
                        b"'a key of these texts')")
# As many of each text, in any order: what ``key_texts_of`` reads (keys, then their aliases).
_KEY_TEXTS: Final = (b"SELECT keymem_expect(ARRAY(SELECT t FROM unnest(%s::text[]) t ORDER BY t) = ARRAY("
                     b"SELECT t FROM (SELECT k.concept AS t FROM links l JOIN keys k ON k.id = l.key_id "
                     b"WHERE l.memory_id = %s UNION ALL SELECT a.alias FROM links l JOIN aliases a "
                     b"ON a.key_id = l.key_id WHERE l.memory_id = %s) s ORDER BY t), 'a memory''s key texts')")


class PgSpeculation(PgMemoryRows, PgKeyRows):
    """The reads a PostgreSQL writer answers speculatively while ``_speculating``."""

    _conn: psycopg.Connection[Any]
    _speculating: bool

    def idempotent_result(self, key: str) -> tuple[dict[str, Any], str | None] | None:
        if not self._speculating:
            return super().idempotent_result(key)
        self._conn.execute(_NO_IDEMPOTENCY_RECORD, (key,))
        return None

    def active_twin(self, namespace: str, digest: str, now: float) -> str | None:
        if not self._speculating:
            return super().active_twin(namespace, digest, now)
        self._conn.execute(_NO_TWIN, (namespace, digest, now))
        return None

    def keys_named(self, norms: Sequence[str]) -> dict[str, str]:
        if not self._speculating:
            return super().keys_named(norms)
        self._conn.execute(_NO_KEY_NAMED, (list(dict.fromkeys(norms)),))
        return {}

    def key_texts_of(self, memory_id: str, *, likely: Sequence[str] | None = None) -> list[str]:
        if not self._speculating or likely is None:
            return super().key_texts_of(memory_id)
        self._conn.execute(_KEY_TEXTS, (list(likely), memory_id, memory_id))
        return list(likely)
