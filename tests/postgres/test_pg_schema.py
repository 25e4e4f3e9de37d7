"""The PostgreSQL schema (keymem_daemon/store/postgres/schema.py) on a real server: its
migrations, row-level security by namespace grant -- through plain SQL, as a person connecting
with ``psql`` would -- the change log with its NOTIFY, and the lexical index's tsvector."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_cluster import PgCluster
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict

from keymem_daemon.errors import StoreError
from keymem_daemon.store.postgres import changes, schema
from keymem_daemon.store.postgres.repository import PostgresRepository
from keymem_daemon.store.sqlite import database as sqlite_database

NOTIFY_TIMEOUT = 30.0
"""Seconds a NOTIFY may take to reach a listener on a loaded machine (it takes milliseconds)."""


def _dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


@pytest.fixture
def store_url(pg_database: str) -> str:
    """A fresh database, migrated by its owner."""
    with psycopg.connect(pg_database) as conn:
        schema.migrate(conn, where="test")
    return pg_database


def _person(cluster: PgCluster, url: str, *grants: tuple[str, str]) -> str:
    """A new role that may connect to the database at ``url``, with ``grants`` (namespace,
    mode) made by the owner through plain SQL; the role's own URL."""
    role = cluster.create_role()
    with psycopg.connect(url) as owner:
        owner.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(_dbname(url)), sql.Identifier(role)))
        for namespace, mode in grants:
            owner.execute("INSERT INTO grants(namespace, role, mode) VALUES (%s, %s, %s)", (namespace, role, mode))
    return cluster.url_for(role, _dbname(url))


def _add_memory(conn: psycopg.Connection[Any], memory_id: str, namespace: str) -> None:
    conn.execute("INSERT INTO memories(id, content, dedup_hash, namespace, created_at, updated_at, last_confirmed_at) "
                 "VALUES (%s, %s, %s, %s, 1, 1, 1)", (memory_id, f"content of {memory_id}", memory_id, namespace))


def _add_key(conn: psycopg.Connection[Any], key_id: str) -> None:
    conn.execute("INSERT INTO keys(id, concept, norm, compact, vector, created_at) VALUES (%s, %s, %s, %s, %s, 1)",
                 (key_id, key_id, key_id, key_id, b"\0" * 8))


@pytest.fixture
def seeded(store_url: str) -> str:
    """Two namespaces' memories (with a key, a link, a relation and an index row), by the owner."""
    with psycopg.connect(store_url) as owner:
        _add_key(owner, "k-deploy")
        for memory_id, namespace in (("m-proj", "proj"), ("m-secret", "secret")):
            _add_memory(owner, memory_id, namespace)
            owner.execute("INSERT INTO links(key_id, memory_id) VALUES ('k-deploy', %s)", (memory_id,))
            owner.execute("INSERT INTO memory_fts(memory_id, content_tokens, key_tokens) VALUES (%s, 'deploy', '')",
                          (memory_id,))
        owner.execute("INSERT INTO relations(from_id, to_id) VALUES ('m-proj', 'm-secret')")
    return store_url


_COUNTED = ("memories", "links", "relations", "memory_fts", "keys", "changes", "grants")


def _visible(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """How many rows of each table ``conn``'s role sees."""
    return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in _COUNTED}  # type: ignore[index]


def _catalog(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    columns = conn.execute("SELECT table_name, column_name, data_type, is_nullable, column_default "
                           "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2").fetchall()
    policies = conn.execute("SELECT tablename, policyname, cmd, qual, with_check FROM pg_policies "
                            "ORDER BY 1, 2").fetchall()
    indexes = conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                           "ORDER BY 1").fetchall()
    return [*columns, *policies, *indexes]


# -- migrations ------------------------------------------------------------------------------

def test_migrations_reach_the_sqlite_schema_version_and_running_them_again_changes_nothing(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        assert schema.schema_version(conn) == 0
        assert schema.migrate(conn, where="test") == sqlite_database.SCHEMA_VERSION == schema.SCHEMA_VERSION
        before = _catalog(conn)
        assert schema.migrate(conn, where="test") == schema.SCHEMA_VERSION
        assert _catalog(conn) == before
        assert conn.execute("SELECT count(*) FROM keymem_schema").fetchone() == (1,)


def test_migrations_resume_from_an_older_schema_version(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn, conn.transaction():
        conn.execute(schema.MIGRATIONS[0].encode())
        conn.execute("UPDATE keymem_schema SET version = 1")
    with psycopg.connect(pg_database) as conn:
        assert schema.migrate(conn, where="test") == schema.SCHEMA_VERSION
        columns = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                              "WHERE table_name = 'idempotency'")}
        assert "fingerprint" in columns
        assert conn.execute("SELECT to_regclass('activity') IS NOT NULL").fetchone() == (True,)


def test_every_sqlite_table_and_column_has_its_postgres_counterpart(tmp_path: Path, store_url: str) -> None:
    store = sqlite_database.Store.open(tmp_path / "keymem.db")
    store.close()
    lite = sqlite3.connect(tmp_path / "keymem.db")
    try:
        tables = [r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE "
                                             "'CREATE VIRTUAL%' AND name NOT LIKE 'memory_fts%' AND name NOT LIKE "
                                             "'memory_vocab%' AND name NOT LIKE 'sqlite_%'")]
        wanted = {(t, r[1]) for t in tables for r in lite.execute(f"PRAGMA table_info({t})")}
    finally:
        lite.close()
    assert {"memories", "keys", "aliases", "links", "relations", "idempotency", "meta", "activity"} <= set(tables)
    with psycopg.connect(store_url) as conn:
        have = {(r[0], r[1]) for r in conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                                                   "WHERE table_schema = 'public'")}
        fts = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                          "WHERE table_name = 'memory_fts'")}
    assert wanted - have == set()
    assert {"content_tokens", "key_tokens", "lexemes"} <= fts


def test_the_owner_creates_keymem_expect_without_a_schema_version_and_writers_trust_no_other_roles(
        pg_cluster: PgCluster, store_url: str) -> None:
    member = _person(pg_cluster, store_url, ("proj", "write"))
    with psycopg.connect(store_url) as conn:
        assert schema.can_expect(conn)
        assert schema.schema_version(conn) == sqlite_database.SCHEMA_VERSION
        # As a store whose owner last ran a keymem before it: a member neither makes it nor
        # speculates, and its writes work (they read every answer).
        conn.execute("DROP FUNCTION keymem_expect(boolean, text)")
        conn.commit()
    with psycopg.connect(member) as conn:
        assert schema.migrate(conn, where="test") == schema.SCHEMA_VERSION
        assert not schema.can_expect(conn)
    repo = PostgresRepository.open(member)
    try:
        assert not repo.speculative
        repo.write(lambda w: _add_memory(w._conn, "m-member", "proj"))  # type: ignore[attr-defined]
        assert repo.read(lambda r: r.is_current("m-member"))
    finally:
        repo.close()
    # A function of that name another role made would run in every writer's transaction with
    # the writer's privileges: no writer calls it, and the owner does not take it for its own.
    with psycopg.connect(pg_cluster.superuser_url.rsplit("/", 1)[0] + "/" + _dbname(store_url),
                         autocommit=True) as superuser:
        superuser.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
            sql.Identifier(str(conninfo_to_dict(member)["user"]))))
    with psycopg.connect(member) as conn:
        conn.execute("CREATE FUNCTION keymem_expect(ok boolean, what text) RETURNS void LANGUAGE sql AS $$ $$")
        conn.commit()
        assert not schema.can_expect(conn)
    with psycopg.connect(store_url) as conn:
        schema.migrate(conn, where="test")
        assert not schema.can_expect(conn)
        conn.execute("DROP FUNCTION keymem_expect(boolean, text)")
        conn.commit()
        schema.migrate(conn, where="test")  # the owner, again: its own
        assert schema.can_expect(conn)


def test_a_database_with_foreign_tables_is_refused_and_left_unchanged(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
        conn.commit()
        with pytest.raises(StoreError, match="not a keymem store .*invoices"):
            schema.migrate(conn, where="the test server")
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    assert tables == ["invoices"]


def test_a_database_from_a_newer_keymem_is_refused(store_url: str) -> None:
    with psycopg.connect(store_url) as conn:
        conn.execute("UPDATE keymem_schema SET version = %s", (schema.SCHEMA_VERSION + 1,))
        conn.commit()
        with pytest.raises(StoreError, match="newer keymem"):
            schema.migrate(conn, where="test")


# -- row-level security ----------------------------------------------------------------------

def test_a_role_without_a_grant_sees_nothing_and_cannot_write(pg_cluster: PgCluster, seeded: str) -> None:
    url = _person(pg_cluster, seeded)
    with psycopg.connect(url, autocommit=True) as conn:
        assert _visible(conn) == dict.fromkeys(_COUNTED, 0)
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            _add_memory(conn, "m-intruder", "proj")
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            _add_key(conn, "k-intruder")
        assert conn.execute("UPDATE memories SET content = 'x'").rowcount == 0
        assert conn.execute("DELETE FROM memories").rowcount == 0
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("INSERT INTO grants(namespace, role, mode) VALUES ('proj', current_user, 'write')")
    with psycopg.connect(seeded) as owner:
        assert owner.execute("SELECT count(*) FROM memories").fetchone() == (2,)
        assert owner.execute("SELECT count(*) FROM memories WHERE content = 'x'").fetchone() == (0,)


def test_a_read_grant_shows_its_namespace_only_and_refuses_writes(pg_cluster: PgCluster, seeded: str) -> None:
    url = _person(pg_cluster, seeded, ("proj", "read"))
    with psycopg.connect(url, autocommit=True) as conn:
        assert [r[0] for r in conn.execute("SELECT id FROM memories")] == ["m-proj"]
        counts = _visible(conn)
        # The relation points into a namespace it may not read: not shown. Keys are shared.
        assert counts == {"memories": 1, "links": 1, "relations": 0, "memory_fts": 1, "keys": 1,
                          "changes": counts["changes"], "grants": 1}
        namespaces = {r[0] for r in conn.execute("SELECT DISTINCT namespace FROM changes")}
        assert namespaces <= {"proj", None}
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            _add_memory(conn, "m-new", "proj")
        assert conn.execute("UPDATE memories SET content = 'changed'").rowcount == 0
        assert conn.execute("UPDATE links SET weight = weight + 1").rowcount == 0
        assert conn.execute("DELETE FROM memories").rowcount == 0
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            _add_key(conn, "k-new")


def test_a_write_grant_allows_writes_in_its_namespace_only(pg_cluster: PgCluster, seeded: str) -> None:
    url = _person(pg_cluster, seeded, ("proj", "write"))
    with psycopg.connect(url, autocommit=True) as conn:
        _add_memory(conn, "m-new", "proj")
        conn.execute("INSERT INTO links(key_id, memory_id) VALUES ('k-deploy', 'm-new')")
        assert conn.execute("UPDATE links SET weight = weight + 1 WHERE memory_id = 'm-proj'").rowcount == 1
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            _add_memory(conn, "m-elsewhere", "secret")
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("UPDATE memories SET namespace = 'secret' WHERE id = 'm-new'")
        # A link to a memory it cannot see is refused like the memory itself.
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO links(key_id, memory_id) VALUES ('k-deploy', 'm-secret')")
    with psycopg.connect(seeded) as owner:
        rows = owner.execute("SELECT id, namespace FROM memories ORDER BY id").fetchall()
    assert rows == [("m-new", "proj"), ("m-proj", "proj"), ("m-secret", "secret")]


def test_a_grant_to_a_group_role_covers_its_members(pg_cluster: PgCluster, seeded: str) -> None:
    url = _person(pg_cluster, seeded)
    group = pg_cluster.create_role("team")
    pg_cluster.admin(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group),
                                                      sql.Identifier(str(conninfo_to_dict(url)["user"]))))
    with psycopg.connect(seeded) as owner:
        owner.execute("INSERT INTO grants(namespace, role, mode) VALUES ('secret', %s, 'read')", (group,))
    with psycopg.connect(url) as conn:
        assert [r[0] for r in conn.execute("SELECT id FROM memories")] == ["m-secret"]


def test_idempotency_records_are_private_to_their_role(pg_cluster: PgCluster, seeded: str) -> None:
    first = _person(pg_cluster, seeded, ("proj", "write"))
    second = _person(pg_cluster, seeded, ("proj", "write"))
    with psycopg.connect(first) as conn:
        conn.execute("INSERT INTO idempotency(key, result, created_at) VALUES ('k1', 'first answer', 1)")
    with psycopg.connect(second) as conn:
        assert conn.execute("SELECT count(*) FROM idempotency").fetchone() == (0,)
        # The same key from another role is its own row, not a replay of the first.
        conn.execute("INSERT INTO idempotency(key, result, created_at) VALUES ('k1', 'second answer', 1)")
        with pytest.raises(errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO idempotency(actor, key, result, created_at) VALUES ('someone', 'k2', 'x', 1)")


# -- the change log --------------------------------------------------------------------------

def test_every_write_adds_to_the_change_log_in_its_transaction_and_notifies(store_url: str) -> None:
    with psycopg.connect(store_url, autocommit=True) as listener, psycopg.connect(store_url) as writer:
        listener.execute(f"LISTEN {schema.NOTIFY_CHANNEL}")
        start = writer.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0]  # type: ignore[index]
        writer.commit()
        with writer.transaction():
            _add_key(writer, "k1")
            _add_memory(writer, "m1", "proj")
            writer.execute("INSERT INTO links(key_id, memory_id) VALUES ('k1', 'm1')")
        with writer.transaction():
            _add_memory(writer, "m2", "proj")
            raise psycopg.Rollback()
        notes = list(listener.notifies(timeout=NOTIFY_TIMEOUT, stop_after=1))
        assert [n.channel for n in notes] == [schema.NOTIFY_CHANNEL]
        rows = writer.execute("SELECT seq, namespace, kind, id, op FROM changes WHERE seq > %s ORDER BY seq",
                              (start,)).fetchall()
        txs = writer.execute("SELECT DISTINCT tx FROM changes WHERE seq > %s", (start,)).fetchall()
    assert [r[1:] for r in rows] == [(None, "key", "k1", "insert"), ("proj", "memory", "m1", "insert"),
                                     ("proj", "link", "m1", "insert")]
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    assert len(txs) == 1  # the three changes of one transaction carry its id; the rolled-back one left none


def test_a_deleted_memory_is_one_change_row_and_a_moved_one_leaves_its_old_namespace(store_url: str) -> None:
    with psycopg.connect(store_url) as conn:
        _add_key(conn, "k1")
        _add_memory(conn, "m1", "proj")
        conn.execute("INSERT INTO links(key_id, memory_id) VALUES ('k1', 'm1')")
        _add_memory(conn, "m2", "proj")
        conn.commit()
        start = conn.execute("SELECT max(seq) FROM changes").fetchone()[0]  # type: ignore[index]
        conn.execute("DELETE FROM memories WHERE id = 'm1'")
        conn.execute("UPDATE memories SET namespace = 'other' WHERE id = 'm2'")
        rows = conn.execute("SELECT namespace, kind, id, op FROM changes WHERE seq > %s ORDER BY seq",
                            (start,)).fetchall()
    assert rows == [("proj", "memory", "m1", "delete"), ("proj", "memory", "m2", "delete"),
                    ("other", "memory", "m2", "insert")]


# -- the lexical index -----------------------------------------------------------------------

def test_the_tsvector_holds_the_stored_tokens_as_they_are_with_their_frequencies(store_url: str) -> None:
    with psycopg.connect(store_url) as conn:
        _add_memory(conn, "m1", "proj")
        conn.execute("INSERT INTO memory_fts(memory_id, content_tokens, key_tokens) VALUES "
                     "('m1', %s, %s)", ("서울 deploy deploy it's c++ v1.2", "seoul"))
        lexemes = conn.execute("SELECT lexemes FROM memory_fts").fetchone()[0]  # type: ignore[index]
        # No parser ran over the tokens: punctuation inside a token stays, nothing is split.
        assert lexemes == "'c++':5A 'deploy':2A,3A 'it''s':4A 'seoul':7B 'v1.2':6A '서울':1A"
        found = conn.execute("SELECT memory_id FROM memory_fts WHERE lexemes @@ %s::tsquery",
                             ("'서울' | 'c++'",)).fetchall()
        assert found == [("m1",)]
        conn.execute("UPDATE memory_fts SET key_tokens = 'busan' WHERE memory_id = 'm1'")
        assert conn.execute("SELECT lexemes @@ 'busan'::tsquery AND NOT lexemes @@ 'seoul'::tsquery "
                            "FROM memory_fts").fetchone() == (True,)
        assert conn.execute("SELECT indexdef LIKE '%%USING gin (lexemes)%%' FROM pg_indexes "
                            "WHERE indexname = 'memory_fts_lexemes'").fetchone() == (True,)



def test_a_follower_never_skips_a_change_whose_transaction_commits_late(store_url: str) -> None:
    with psycopg.connect(store_url, autocommit=True) as follower, psycopg.connect(store_url) as slow, \
            psycopg.connect(store_url) as fast:
        cursor = changes.horizon(follower)
        _add_memory(slow, "m-slow", "proj")  # takes the lower seq, commits last
        _add_memory(fast, "m-fast", "proj")
        fast.commit()
        seen, cursor = changes.read_changes(follower, cursor)
        # Reading m-fast now would move a seq cursor past m-slow's lower seq for good.
        assert seen == []
        slow.commit()
        seen, cursor = changes.read_changes(follower, cursor)
        assert [(c.id, c.namespace, c.kind, c.op) for c in seen] == [
            ("m-slow", "proj", "memory", "insert"), ("m-fast", "proj", "memory", "insert")]
        assert seen[0].seq < seen[1].seq
        again, _ = changes.read_changes(follower, cursor)
        assert again == []


def test_a_follower_reads_only_the_changes_of_namespaces_it_may_read(pg_cluster: PgCluster, store_url: str) -> None:
    url = _person(pg_cluster, store_url, ("proj", "read"))
    with psycopg.connect(url, autocommit=True) as follower:
        cursor = changes.horizon(follower)
        with psycopg.connect(store_url) as owner:
            _add_memory(owner, "m-proj", "proj")
            _add_memory(owner, "m-secret", "secret")
            _add_key(owner, "k1")
        seen, _ = changes.read_changes(follower, cursor)
    assert [(c.kind, c.id) for c in seen] == [("memory", "m-proj"), ("key", "k1")]
