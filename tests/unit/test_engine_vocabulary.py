"""The lexical index's document frequencies are kept in memory between the writes that change
the index (``store.sqlite.search.Vocabulary``): every read after a remember, a forget or a
failed write sees the index as it is, and a vocabulary past the cap is not kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from engine_helpers import db_read, db_write, remember

from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.ports import Writer
from keymem_daemon.engine.reads import inject as push
from keymem_daemon.store.sqlite.database import Store
from keymem_daemon.store.sqlite.replica import REPLICA_COLUMNS
from keymem_daemon.store.sqlite.search import Vocabulary

_MATCH = "SELECT COUNT(*) FROM memory_fts WHERE memory_fts MATCH ?"
SQLITE_VOCABULARY = "the SQLite store's in-memory copy of its FTS5 vocabulary (store.sqlite.search.Vocabulary)"


def _vocabulary(graph: MemoryGraph) -> Vocabulary:
    store = graph.store
    assert isinstance(store, Store)
    return store.vocabulary


def _indexed(graph: MemoryGraph, token: str) -> int:
    """What the index itself says: the memories whose tokens hold ``token`` (no vocabulary)."""
    store = graph.store
    assert isinstance(store, Store)
    return int(db_read(store, lambda conn: conn.execute(_MATCH, (f'"{token}"',)).fetchone()[0]))


@pytest.mark.sqlite_only(SQLITE_VOCABULARY)
def test_a_remembered_memory_counts_in_the_very_next_read_and_a_forgotten_one_stops(graph: MemoryGraph) -> None:
    remember(graph, "The zanzibar cluster runs the nightly export", ["zanzibar cluster"])
    assert graph.token_stats(["zanzibar"])[0] == {"zanzibar": 1}
    assert _vocabulary(graph).held > 0, "between writes the vocabulary is kept"
    second = remember(graph, "Zanzibar alerts page the platform team", ["zanzibar alerts"])
    assert graph.token_stats(["zanzibar"])[0] == {"zanzibar": 2} == {"zanzibar": _indexed(graph, "zanzibar")}
    graph.forget(second)
    assert graph.token_stats(["zanzibar", "alerts"])[0] == {"zanzibar": 1}
    assert _indexed(graph, "alerts") == 0


def test_a_memory_remembered_is_surfaced_by_the_next_inject_and_gone_after_forget(graph: MemoryGraph) -> None:
    remember(graph, "The user prefers dark mode in every editor", ["dark mode", "editor", "preference"])
    remember(graph, "Deploys of the billing api go through ArgoCD", ["billing api", "ArgoCD", "deployment"])
    prompt = "the quokka-relay webhook keeps failing with QUOKKA_RELAY_TIMEOUT, what do we know?"
    assert push.inject(graph, prompt, scope=None).memories == []
    mid = remember(graph, "quokka-relay times out when the upstream queue is paused: resume the queue first",
                   ["quokka-relay", "QUOKKA_RELAY_TIMEOUT", "webhook"])
    assert [m.id for m in push.inject(graph, prompt, scope=None).memories] == [mid]
    graph.forget(mid)
    assert push.inject(graph, prompt, scope=None).memories == []


@pytest.mark.sqlite_only(SQLITE_VOCABULARY)
def test_a_write_that_fails_after_changing_the_index_leaves_the_frequencies_as_they_were(
        graph: MemoryGraph) -> None:
    remember(graph, "The marmot service keeps its state in Redis", ["marmot service", "Redis"])
    assert graph.token_stats(["marmot"])[0] == {"marmot": 1}

    def failing(writer: Writer) -> None:
        writer.set_key_tokens(_only_memory(graph), "marmot marmot heron")
        assert writer.document_frequencies(["heron"]) == {"heron": 1}, "the write sees its own change"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        graph.store.write(failing)
    assert graph.token_stats(["marmot", "heron"])[0] == {"marmot": 1}
    assert _vocabulary(graph).held > 0, "after the rollback the vocabulary is kept again"


def _only_memory(graph: MemoryGraph) -> str:
    ids = graph.store.read(lambda reader: reader.indexed_tokens(list(graph.bodies.snapshot().ids)))
    (mid,) = ids
    return mid


def test_a_vocabulary_past_its_capacity_is_not_kept_but_still_answers(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "keymem.db")
    try:
        def fill(conn: sqlite3.Connection) -> None:
            for rowid, text in enumerate(["alpha beta", "gamma delta", "alpha epsilon"], start=1):
                conn.execute("INSERT INTO memory_fts(rowid, content_tokens, key_tokens) VALUES (?, ?, '')",
                             (rowid, text))

        db_write(store, fill)

        def frequencies(tokens: list[str]) -> dict[str, int]:
            return store.read(lambda reader: reader.document_frequencies(tokens))

        store.vocabulary = Vocabulary(capacity=4)
        assert frequencies(["alpha", "delta", "zeta"]) == {"alpha": 2, "delta": 1}
        assert store.vocabulary.held == 0, "five terms do not fit a capacity of four"
        store.vocabulary = Vocabulary(capacity=5)
        assert frequencies(["alpha", "epsilon"]) == {"alpha": 2, "epsilon": 1}
        assert store.vocabulary.held == 5
    finally:
        store.close()


def test_a_replicas_index_rows_count_in_the_very_next_read(tmp_path: Path) -> None:
    """A daemon on a shared PostgreSQL store answers from its local SQLite replica, whose
    lexical index the follower writes (store.sqlite.replica): those writes must drop the kept
    document frequencies as the engine's own index writes do."""
    store = Store.open(tmp_path / "keymem.db")
    try:
        columns = REPLICA_COLUMNS["memories"]
        values = {"content": "", "dedup_hash": "", "namespace": "default", "depth": 0.0, "access_count": 0,
                  "created_at": 1.0, "updated_at": 1.0, "last_confirmed_at": 1.0, "confirmation_count": 1,
                  "decay_profile": "standard"}
        rows = [tuple({**values, "rowid": n, "id": f"m{n}"}.get(c) for c in columns) for n in (1, 2)]
        store.write(lambda writer: writer.put_rows("memories", rows))

        def frequencies() -> dict[str, int]:
            return store.read(lambda reader: reader.document_frequencies(["alpha", "gamma"]))

        store.write(lambda writer: writer.put_index_rows([("m1", "alpha beta", "")]))
        assert frequencies() == {"alpha": 1}
        assert store.vocabulary.held > 0, "between writes the vocabulary is kept"
        store.write(lambda writer: writer.put_index_rows([("m2", "alpha gamma", "")]))
        assert frequencies() == {"alpha": 2, "gamma": 1}
        store.write(lambda writer: writer.drop_memory_rows(["m1"]))
        assert frequencies() == {"alpha": 1, "gamma": 1}
        store.write(lambda writer: writer.clear_replica())
        assert frequencies() == {}
    finally:
        store.close()
