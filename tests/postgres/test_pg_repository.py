"""The PostgreSQL repository (store/postgres/repository.py) on a real server: units of work,
the memory and key operations of engine/ports.py, and the races of many daemons on one
database -- handled by PostgreSQL (serializable transactions, retried), not by luck."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pg_cluster import PgCluster
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from keymem_daemon.engine.ports import (
    InspectReads,
    InspectWrites,
    KeyReads,
    KeyRow,
    KeyWrites,
    MemoryReads,
    MemoryRow,
    MemoryWrites,
)
from keymem_daemon.errors import Refused
from keymem_daemon.store.postgres.repository import PgReader, PgWriter, PostgresRepository

RACE_TIMEOUT = 60.0
"""Seconds two threads may take to meet at a barrier on a loaded machine (milliseconds)."""


def _ports(reader: PgReader, writer: PgWriter
           ) -> tuple[MemoryReads, KeyReads, InspectReads, MemoryWrites, KeyWrites, InspectWrites]:
    # mypy checks here that the PostgreSQL reader and writer implement these ports.
    return reader, reader, reader, writer, writer, writer


@pytest.fixture
def repository(pg_database: str) -> Iterator[PostgresRepository]:
    repo = PostgresRepository.open(pg_database)
    try:
        yield repo
    finally:
        repo.close()


def _memory(memory_id: str, namespace: str = "proj", content: str = "deploy on fridays") -> MemoryRow:
    return MemoryRow(id=memory_id, content=content, dedup_hash=f"h-{memory_id}", namespace=namespace, at=100.0,
                     observed_at=None, decay_profile="standard", source={"agent": "test", "batch_id": "b1"},
                     expires_at=None, vector=b"\x00" * 8)


def _key(key_id: str, concept: str = "deploy") -> KeyRow:
    return KeyRow(id=key_id, concept=concept, norm=concept, compact=concept, key_type="concept",
                  vector=b"\x01" * 8, created_at=100.0)


def test_a_write_commits_as_one_unit_and_reads_see_it(repository: PostgresRepository) -> None:
    assert repository.found == "missing"  # a fresh database: the repository created the schema
    committed: list[str] = []

    def remember(w: PgWriter) -> str:
        w.insert_key(_key("k1"))
        w.insert_memory(_memory("m1"))
        w.insert_memory(_memory("m2", content="배포는 금요일"))
        assert w.link("k1", "m1", 1.0, False) and not w.link("k1", "m1", 2.0, False)
        w.add_links([("k1", "m2", 0.5, True)])
        w.index_memory("m1", "deploy friday", "deploy")
        w.index_memory("m2", "배포 금요일", "deploy")
        w.add_relations("m1", ["m2", "m1"])
        w.after_commit(lambda: committed.append("done"))
        assert committed == []
        return "saved"

    assert repository.write(remember) == "saved" and committed == ["done"]

    def look(r: PgReader) -> dict[str, Any]:
        m1 = r.memory("m1")
        assert m1 is not None and m1.source == {"agent": "test", "batch_id": "b1"} and m1.rowid is not None
        return {
            "memories": sorted(r.memories(["m1", "m2", "nope"])),
            "links": r.links_of("m1"),
            "key": (r.key_info("k1").link_count, r.key_concept("k1")),
            "counts": r.counts(200.0),
            "df": r.document_frequencies(["deploy", "금요일", "absent"]),
            "holding": r.indexed_holding(["금요일"]),
            "related": (r.related_ids("m1"), r.explicit_neighbours("m2")),
            "siblings": r.batch_siblings("b1", m1, 200.0),
            "state": r.member_state("m2"),
            "hangul": r.has_hangul_keys(),
        }

    seen = repository.read(look)
    assert seen["memories"] == ["m1", "m2"]
    assert seen["links"] == [("k1", 1.0, False)]
    assert seen["key"] == (2, "deploy")
    assert (seen["counts"].keys, seen["counts"].links, seen["counts"].namespaces) == (1, 2, {"proj": 2})
    assert seen["df"] == {"deploy": 2, "금요일": 1}
    assert seen["holding"] == {"m2"}
    assert seen["related"] == (["m2"], ["m1"])
    assert seen["siblings"] == ["m2"]
    assert seen["state"] is not None and seen["state"].keys == ("k1",)
    assert seen["hangul"] is False


def test_a_failing_write_leaves_nothing_and_runs_no_after_commit_step(repository: PostgresRepository) -> None:
    ran: list[str] = []

    def broken(w: PgWriter) -> None:
        w.insert_memory(_memory("m1"))
        w.after_commit(lambda: ran.append("after"))
        raise ValueError("the engine refused halfway")

    with pytest.raises(ValueError, match="halfway"):
        repository.write(broken)
    assert ran == [] and repository.read(lambda r: r.memory("m1")) is None


def test_two_daemons_creating_the_same_key_at_once_get_one_key(pg_database: str) -> None:
    first, second = PostgresRepository.open(pg_database), PostgresRepository.open(pg_database)
    both_looked = threading.Barrier(2, timeout=RACE_TIMEOUT)
    attempts: list[str] = []
    lock = threading.Lock()

    def create(key_id: str) -> Any:
        def fn(w: PgWriter) -> str:
            with lock:
                attempts.append(key_id)
                first_try = attempts.count(key_id) == 1
            existing = [k for k, concept in w.keys_holding(["deploy"]) if concept == "deploy"]
            if first_try:
                both_looked.wait()  # both saw no key before either creates one
            if existing:
                return existing[0]
            w.insert_key(_key(key_id))
            return key_id
        return fn

    results: dict[str, str] = {}

    def run(repo: PostgresRepository, key_id: str) -> None:
        results[key_id] = repo.write(create(key_id))

    try:
        threads = [threading.Thread(target=run, args=(repo, key_id))
                   for repo, key_id in ((first, "k-first"), (second, "k-second"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RACE_TIMEOUT)
        keys = first.read(lambda r: r.key_concepts())
    finally:
        first.close()
        second.close()
    assert len(keys) == 1
    assert set(results.values()) == {keys[0][0]}
    assert len(attempts) == 3  # the loser was refused once and found the winner's key


def test_concurrent_reinforcements_of_one_link_all_count(pg_database: str) -> None:
    repos = [PostgresRepository.open(pg_database) for _ in range(2)]
    bumps = 15

    def setup(w: PgWriter) -> None:
        w.insert_key(_key("k1"))
        w.insert_memory(_memory("m1"))
        w.link("k1", "m1", 1.0, False)

    def bump(w: PgWriter) -> None:
        weight = w.link_weight("k1", "m1")
        assert weight is not None
        w.set_link_weight("k1", "m1", weight + 1.0)

    def run(repo: PostgresRepository) -> None:
        for _ in range(bumps):
            repo.write(bump)

    try:
        repos[0].write(setup)
        threads = [threading.Thread(target=run, args=(repo,)) for repo in repos]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RACE_TIMEOUT)
        weight = repos[0].read(lambda r: r.link_weight("k1", "m1"))
    finally:
        for repo in repos:
            repo.close()
    assert weight == 1.0 + 2 * bumps  # no read-modify-write lost to the other daemon


def test_a_role_reads_and_writes_only_what_it_was_granted_through_the_repository(
        pg_cluster: PgCluster, repository: PostgresRepository, pg_database: str) -> None:
    def seed(w: PgWriter) -> None:
        w.insert_memory(_memory("m-proj"))
        w.insert_memory(_memory("m-secret", "secret"))

    repository.write(seed)
    role = pg_cluster.create_role()
    database = str(conninfo_to_dict(pg_database)["dbname"])
    with psycopg.connect(pg_database) as owner:
        owner.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database),
                                                                            sql.Identifier(role)))
        owner.execute("INSERT INTO grants(namespace, role, mode) VALUES ('proj', %s, 'read')", (role,))
    reader = PostgresRepository.open(pg_cluster.url_for(role, database))
    try:
        assert reader.found == "store"
        assert reader.read(lambda r: (sorted(r.memories(["m-proj", "m-secret"])), r.counts(200.0).namespaces)) == (
            ["m-proj"], {"proj": 1})
        with pytest.raises(Refused, match="row-level security.*keymemd team grant"):
            reader.write(lambda w: w.insert_memory(_memory("m-new")))
    finally:
        reader.close()
    assert repository.read(lambda r: r.memory("m-new")) is None
