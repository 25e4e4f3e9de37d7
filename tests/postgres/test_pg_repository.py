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
    Reader,
    Repository,
    SearchReads,
    SearchWrites,
    Writer,
)
from keymem_daemon.errors import Refused
from keymem_daemon.store.postgres.repository import PgReader, PgWriter, PostgresRepository

RACE_TIMEOUT = 60.0
"""Seconds two threads may take to meet at a barrier on a loaded machine (milliseconds)."""


def _ports(reader: PgReader, writer: PgWriter, repository: PostgresRepository
           ) -> tuple[MemoryReads, KeyReads, SearchReads, InspectReads, MemoryWrites, KeyWrites, SearchWrites,
                      InspectWrites, Reader, Writer, Repository]:
    # mypy checks here that the PostgreSQL reader, writer and repository implement the ports.
    return reader, reader, reader, reader, writer, writer, writer, writer, reader, writer, repository


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

    def remember(w: Writer) -> str:
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

    def look(r: Reader) -> dict[str, Any]:
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

    def broken(w: Writer) -> None:
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
        def fn(w: Writer) -> str:
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

    def setup(w: Writer) -> None:
        w.insert_key(_key("k1"))
        w.insert_memory(_memory("m1"))
        w.link("k1", "m1", 1.0, False)

    def bump(w: Writer) -> None:
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
    def seed(w: Writer) -> None:
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


def test_many_concurrent_writers_on_two_daemons_store_every_memory_once_under_one_shared_key(
        pg_database: str) -> None:
    repos = [PostgresRepository.open(pg_database) for _ in range(2)]
    threads_per_repo, writes_per_thread = 4, 25
    failures: list[BaseException] = []

    def remember(memory_id: str) -> Any:
        def fn(w: Writer) -> None:
            # Get or create the shared key, as the engine resolves a key by its text.
            key = next((k for k, concept in w.keys_holding(["deploy"]) if concept == "deploy"), None)
            if key is None:
                key = f"k-{memory_id}"
                w.insert_key(_key(key))
            w.insert_memory(_memory(memory_id))
            w.link(key, memory_id, 1.0, False)
        return fn

    def run(repo: PostgresRepository, prefix: str) -> None:
        try:
            for i in range(writes_per_thread):
                repo.write(remember(f"{prefix}-{i}"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(repo, f"r{r}t{t}"))
                   for r, repo in enumerate(repos) for t in range(threads_per_repo)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RACE_TIMEOUT * 4)
        counts = repos[0].read(lambda r: r.counts(200.0))
    finally:
        for repo in repos:
            repo.close()
    total = 2 * threads_per_repo * writes_per_thread
    assert failures == []
    assert (counts.keys, counts.links, counts.namespaces) == (1, total, {"proj": total})


def test_a_write_that_must_scan_a_table_is_planned_without_jit(repository: PostgresRepository) -> None:
    """Writes price sequential scans out (``enable_seqscan = off``: 1e10 each), which puts
    every scan of a small table past ``jit_above_cost``: JIT-compiling a one-row DELETE took
    ~0.5 s, at every daemon start (the embedder stamp) and in the engine suite's every test."""

    def plan(w: Writer) -> str:
        # The writer's own connection (tests may look inside): what its statements run as.
        rows = w._conn.execute("EXPLAIN DELETE FROM meta WHERE left(name, 3) = 'zzz'").fetchall()  # type: ignore[attr-defined]
        return "\n".join(str(row[0]) for row in rows)

    explained = repository.write(plan)
    assert "Seq Scan on meta" in explained and "JIT" not in explained, explained
