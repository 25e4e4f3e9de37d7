"""BM25's index-wide statistics on PostgreSQL (store/postgres/search.py ``LexicalStatistics``):
each repository counts them once and reuses them, renewed after its own index writes. Another
daemon's writes since the count must neither break a lexical search nor, once this daemon
writes, leave its scores different from a fresh count's."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from keymem_daemon.engine.ports import MemoryRow, Writer
from keymem_daemon.store.postgres.repository import PostgresRepository

NOW = 100.0


def _indexed(memory_id: str, tokens: str) -> Callable[[Writer], None]:
    def fn(writer: Writer) -> None:
        writer.insert_memory(MemoryRow(id=memory_id, content=tokens, dedup_hash=memory_id, namespace="proj", at=1.0,
                                       observed_at=None, decay_profile="standard", source={}, expires_at=None,
                                       vector=bytes(16)))
        writer.index_memory(memory_id, tokens, "")
    return fn


def _hits(repository: PostgresRepository, tokens: list[str]) -> list[tuple[str, float]]:
    return repository.read(lambda reader: reader.lexical_hits(tokens, None, NOW, 10))


def test_statistics_counted_before_another_daemons_writes_still_score_and_renew_on_a_write(pg_database: str
                                                                                           ) -> None:
    a, b = PostgresRepository.open(pg_database), PostgresRepository.open(pg_database)
    try:
        # a's reads see an empty index (nothing to keep), then one row: a keeps "1 document".
        assert _hits(a, ["deploy"]) == []
        a.write(_indexed("m0", "release notes"))
        assert _hits(a, ["release"])[0][0] == "m0"
        # b adds rows holding a token more often than a's count has documents, and of another length.
        for i in range(1, 4):
            b.write(_indexed(f"m{i}", "deploy deploy staging"))
        stale = _hits(a, ["deploy"])
        assert [m for m, _ in stale] == ["m1", "m2", "m3"]
        assert all(score > 0 for _, score in stale)
        # a's own index write renews its count: its scores are a fresh repository's.
        a.write(_indexed("m4", "deploy"))
        fresh = PostgresRepository.open(pg_database)
        try:
            expected = _hits(fresh, ["deploy", "staging"])
        finally:
            fresh.close()
        got = _hits(a, ["deploy", "staging"])
        assert [m for m, _ in got] == [m for m, _ in expected]
        assert [s for _, s in got] == pytest.approx([s for _, s in expected])
    finally:
        a.close()
        b.close()
