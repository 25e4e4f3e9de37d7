"""The SQLite store: WAL, versioned migrations, one transaction per operation, and a
reopened store that lost nothing."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from daemon_helpers import scaled
from engine_helpers import FakeClock, StoreAt, db_read, db_write, key_id, link_weight, open_graph, remember, state
from pg_cluster import OWNER, DatabaseSupply, PgCluster

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.records import CorrectResult
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput, StoreError
from keymem_daemon.inference.embedders import Embedder
from keymem_daemon.store.opening import open_sqlite
from keymem_daemon.store.sqlite.database import MIGRATIONS, SCHEMA_VERSION, Store, Tx, migrate
from keymem_daemon.store.sqlite.rows import rows_in

pytestmark = pytest.mark.timeout(60)


def schema_of(path: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master "
            "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
        return [(t, n, " ".join((s or "").split())) for t, n, s in rows]
    finally:
        conn.close()


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def test_the_store_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "keymem.db")
    try:
        # The store's own connections (a test's would not have foreign_keys on).
        assert store.read(lambda r: r._conn.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
        assert store.read(lambda r: r._conn.execute("PRAGMA foreign_keys").fetchone()[0]) == 1
        assert store.write(lambda tx: tx._conn.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
    finally:
        store.close()


def test_a_new_store_is_stamped_with_the_current_schema_version(tmp_path: Path) -> None:
    Store.open(tmp_path / "keymem.db").close()
    assert SCHEMA_VERSION == len(MIGRATIONS) >= 1
    assert user_version(tmp_path / "keymem.db") == SCHEMA_VERSION


def test_a_store_written_by_a_newer_keymem_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "keymem.db"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    before = schema_of(path)
    with pytest.raises(StoreError) as caught:
        Store.open(path)
    message = str(caught.value)
    assert "newer" in message and str(SCHEMA_VERSION + 1) in message
    assert user_version(path) == SCHEMA_VERSION + 1, "a newer store must never be downgraded"
    assert schema_of(path) == before


def test_a_graph_refuses_a_newer_store_with_a_store_error(
    tmp_path: Path, embedder: Embedder, settings: Settings, clock: FakeClock
) -> None:
    path = tmp_path / "keymem.db"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        MemoryGraph.over(open_sqlite(settings, path), embedder, settings, clock=clock)


@pytest.mark.parametrize("version", range(SCHEMA_VERSION))
def test_a_store_migrated_from_each_older_version_has_the_fresh_schema(
    tmp_path: Path, version: int
) -> None:
    fresh = tmp_path / "fresh.db"
    Store.open(fresh).close()
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old, isolation_level=None)
    for step in range(version):
        conn.execute("BEGIN")
        MIGRATIONS[step](conn)
        conn.execute(f"PRAGMA user_version = {step + 1}")
        conn.execute("COMMIT")
    conn.close()
    assert user_version(old) == version
    Store.open(old, backup_dir=tmp_path / "backups").close()
    assert user_version(old) == SCHEMA_VERSION
    assert schema_of(old) == schema_of(fresh)


def test_a_failing_migration_rolls_back_and_stays_pending(tmp_path: Path) -> None:
    path = tmp_path / "keymem.db"
    conn = sqlite3.connect(path, isolation_level=None)

    def broken(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("migration failed midway")

    import keymem_daemon.store.sqlite.database as store_module

    original = store_module.MIGRATIONS
    store_module.MIGRATIONS = (broken,)  # type: ignore[misc]
    try:
        with pytest.raises(RuntimeError):
            migrate(conn, path)
    finally:
        store_module.MIGRATIONS = original  # type: ignore[misc]
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert (
        conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[0]
        == 0
    )
    conn.close()


def test_a_failing_write_leaves_no_partial_rows(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "keymem.db")
    ran: list[str] = []

    def write(tx: Tx) -> None:
        tx.set_meta({"half": "written"})
        tx.after_commit(lambda: ran.append("after"))
        raise ValueError("boom")

    try:
        with pytest.raises(ValueError, match="boom"):
            store.write(write)
        assert (
            db_read(store,
                lambda c: c.execute("SELECT COUNT(*) FROM meta WHERE name = 'half'").fetchone()[0]
            )
            == 0
        )
        assert ran == [], "after-commit work must not run for a rolled-back write"
        # The writer is still usable afterwards.
        store.write(lambda tx: tx.set_meta({"ok": "1"}))
        assert (
            db_read(store,
                lambda c: c.execute("SELECT value FROM meta WHERE name = 'ok'").fetchone()[0]
            )
            == "1"
        )
    finally:
        store.close()


def test_a_database_error_inside_a_write_becomes_a_store_error(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "keymem.db")
    try:
        db_write(store, lambda c: c.execute("DROP TABLE meta"))
        with pytest.raises(StoreError):
            store.write(lambda tx: tx.set_meta({"ok": "1"}))
    finally:
        store.close()


def test_a_correction_that_fails_validation_midway_changes_nothing(graph: MemoryGraph) -> None:
    first = remember(graph, "The team deploys on Fridays", ["deployment", "schedule", "배포"])
    second = graph.correct(
        first,
        graph.prepare(content="The team deploys on Thursdays", keys=None, require_keys=False),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    )
    before = state(graph)
    keys_before = {k.id for k in graph.keys.all()}
    # The grandparent (first) would be deleted before related_to is checked: the whole
    # correction must roll back, including that deletion.
    bad = graph.prepare(
        content="The team deploys on Wednesdays",
        keys=None,
        related_to=["0123456789ab"],
        require_keys=False,
    )
    assert isinstance(second, CorrectResult)
    with pytest.raises(InvalidInput) as caught:
        graph.correct(
            second.new_id,
            bad,
            keys_given=False,
            related_given=True,
            ttl_given=False,
            decay_given=False,
        )
    assert caught.value.field == "related_to"
    assert state(graph) == before
    assert {k.id for k in graph.keys.all()} == keys_before


def test_a_store_can_be_closed_twice_and_refuses_work_afterwards(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "keymem.db")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.write(lambda tx: None)


def test_reopening_the_store_after_close_loses_nothing(
    store_at: StoreAt,
    embedder: Embedder,
    analyzer: Analyzer,
    settings: Settings,
    clock: FakeClock,
) -> None:
    g = open_graph(store_at, embedder, settings, clock, analyzer)
    host = Host(agent="claude", session="4f1c2d3e-5a6b-4c7d-8e9f-0a1b2c3d4e5f", turn=3)
    a = remember(
        g, "The user writes Python every day", ["Python", "파이썬", "programming"], host=host
    )
    b = remember(
        g,
        "Deploys go out on Fridays",
        ["deployment", "배포", "Friday"],
        related_to=[a],
        source={"origin": "chat"},
    )
    c = remember(
        g,
        "Dongkun prefers dark roast coffee",
        ["Dongkun", "coffee"],
        key_types={"Dongkun": "name"},
        decay_profile="stable",
        ttl_seconds=30 * 86400,
    )
    g.read_memory(a, via_key_id=key_id(g, "Python"))
    g.read_memory(a, via_key_id=key_id(g, "Python"))
    g.confirm_memory(b, "user", host=host)
    fixed = g.correct(
        b,
        g.prepare(content="Deploys go out on Thursdays", keys=None, require_keys=False),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    )
    g.dismiss(c, key_id(g, "coffee"))
    before = transfer.export(g)
    python_weight = link_weight(g, key_id(g, "Python"), a)
    g.close()

    reopened = open_graph(store_at, embedder, settings, clock, analyzer)
    try:
        assert transfer.export(reopened) == before
        python = key_id(reopened, "파이썬")
        assert python == key_id(reopened, "Python")
        assert link_weight(reopened, python, a) == python_weight == pytest.approx(1.2)
        view = reopened.read_memory(a)
        assert view.memory.access_count == 3
        assert reopened.keys.get(key_id(reopened, "Dongkun")).key_type == "name"  # type: ignore[union-attr]
        new = reopened.read_memory(fixed.new_id)  # type: ignore[union-attr]
        assert new.memory.supersedes == b
        assert new.memory.related_to == [a]
        old = db_read(reopened.store,
            lambda conn: conn.execute(
                "SELECT superseded_by, depth, confirmation_count FROM memories WHERE id = ?", (b,)
            ).fetchone()
        )
        assert old[0] == fixed.new_id  # type: ignore[union-attr]
        assert old[1] == pytest.approx(0.05 * 0.3)
        assert old[2] == 2
        assert view.memory.source is not None and view.memory.source["host_session"] == host.session
        # The in-memory indexes were rebuilt: recall works on the reopened store.
        found = recall(reopened, "파이썬")
        assert found.keys[0].key_id == python
        assert found.memories[0].id == a
    finally:
        reopened.close()


def open_fds_to(path: Path) -> list[str]:
    import os

    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            out.append(target)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc")
def test_closing_the_graph_closes_every_connection_it_opened(
    tmp_path: Path,
    embedder: Embedder,
    analyzer: Analyzer,
    settings: Settings,
    clock: FakeClock,
) -> None:
    import threading

    path = tmp_path / "keymem.db"
    g = open_graph(path, embedder, settings, clock, analyzer)
    remember(g, "Deploys go out on Fridays", ["deployment", "Friday"])

    def read() -> None:
        recall(g, "deployment")

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=scaled(10))
    assert open_fds_to(path)
    g.close()
    assert open_fds_to(path) == []


def test_a_file_that_is_not_a_database_is_refused_with_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "keymem.db"
    path.write_bytes(b"this is not a sqlite database" * 100)
    with pytest.raises(StoreError, match="cannot open the store"):
        Store.open(path)


RE_EMBEDDING_IS_LOCAL = ("re-embedding (after a file backup) is how a store of one daemon changes model; a shared "
                         "PostgreSQL store refuses another embedder instead (test_a_shared_store_refuses_...)")


class Renamed:
    """The same vectors under another fingerprint: what a model upgrade looks like."""

    def __init__(self, inner: Embedder, fingerprint: str) -> None:
        self.inner = inner
        self.fingerprint = fingerprint
        self.name = inner.name
        self.dim = inner.dim
        self.profile = inner.profile
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += len(texts)
        return self.inner.embed(texts)


@pytest.mark.sqlite_only(RE_EMBEDDING_IS_LOCAL)
def test_a_changed_embedder_re_embeds_every_key_after_a_backup(
    store_at: StoreAt,
    tmp_path: Path,
    embedder: Embedder,
    analyzer: Analyzer,
    settings: Settings,
    clock: FakeClock,
) -> None:
    g = open_graph(store_at, embedder, settings, clock, analyzer)
    mid = remember(g, "The user writes Python every day", ["Python", "파이썬", "programming"])
    before = transfer.export(g)
    g.close()

    other = Renamed(embedder, "test:other-model")
    with pytest.raises(StoreError, match="KEYMEM_AUTO_MIGRATE"):
        open_graph(store_at, other, settings.replace(auto_migrate=False), clock)

    migrated = open_graph(store_at, other, settings, clock)
    try:
        assert other.calls >= 2, "every key was embedded again"
        assert list((tmp_path / "backups").glob("keymem-before-reembed-*.db"))
        after = transfer.export(migrated)
        assert after["embedder"] == "test:other-model"
        assert {k: v for k, v in after.items() if k != "embedder"} == {
            k: v for k, v in before.items() if k != "embedder"
        }
        assert recall(migrated, "파이썬").memories[0].id == mid
    finally:
        migrated.close()


def test_a_shared_store_refuses_a_daemon_with_another_embedder_and_changes_nothing(
    pg_cluster: PgCluster, pg_fresh_databases: DatabaseSupply, embedder: Embedder, analyzer: Analyzer,
    settings: Settings, clock: FakeClock
) -> None:
    """Its key vectors are every daemon's: one daemon re-embedding them for its own model
    would leave the others searching another model's vectors."""
    database = pg_fresh_databases.take()
    try:
        url = pg_cluster.url_for(OWNER, database)
        g = open_graph(url, embedder, settings, clock, analyzer)
        remember(g, "The user writes Python every day", ["Python", "파이썬", "programming"])
        before = transfer.export(g, include_vectors=True)
        g.close()

        other = Renamed(embedder, "test:other-model")
        with pytest.raises(StoreError, match=f"embedded with {embedder.fingerprint} but this daemon's embedder is "
                                             "test:other-model; every daemon of a team must use the same embedder"):
            open_graph(url, other, settings, clock)
        assert other.calls == 0
        again = open_graph(url, embedder, settings, clock, analyzer)
        try:
            assert transfer.export(again, include_vectors=True) == before
        finally:
            again.close()
    finally:
        pg_fresh_databases.give_back(database)


class Crashed(Exception):
    """Stands for the process dying in the middle of a re-embedding."""


class Negated(Renamed):
    """Another embedding space (every vector negated), which can die once it embedded
    ``survive`` texts (``calls`` counts texts)."""

    def __init__(self, inner: Embedder, survive: int | None = None) -> None:
        super().__init__(inner, "test:negated")
        self.survive = survive

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.survive is not None and self.calls >= self.survive:
            raise Crashed
        return -super().embed(texts)


def key_vectors_from(graph: MemoryGraph, embedder: Embedder) -> int:
    """How many of the store's key vectors are the given embedder's vector of the concept."""
    keys = list(graph.keys.all())
    fresh = embedder.embed([k.concept for k in keys])
    return sum(1 for k, v in zip(keys, fresh, strict=True) if float(graph.keys.vectors.get(k.id) @ v) > 0.99)


@pytest.fixture(scope="module")
def many_keys_file(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder, analyzer: Analyzer) -> Path:
    """A SQLite store of 600 keys: three chunks of a re-embedding (300 remembers, made once)."""
    where = tmp_path_factory.mktemp("many-keys")
    g = open_graph(where / "keymem.db", embedder, Settings(data_dir=where), FakeClock(), analyzer)
    for i in range(300):
        remember(g, f"note {i}: the deploy queue of team {i}", [f"team {i}", f"queue {i}", "deploy"])
    g.close()
    return where / "keymem.db"


@pytest.fixture
def many_keys(store_at: StoreAt, many_keys_file: Path) -> StoreAt:
    """The test's own copy of ``many_keys_file`` at its store's place (with its journal
    files, should a close have left any)."""
    assert isinstance(store_at, Path), "the re-embedding tests run on SQLite"
    for part in many_keys_file.parent.glob(f"{many_keys_file.name}*"):
        shutil.copyfile(part, store_at.with_name(store_at.name + part.name.removeprefix(many_keys_file.name)))
    return store_at


@pytest.mark.sqlite_only(RE_EMBEDDING_IS_LOCAL)
def test_a_store_left_half_re_embedded_is_embedded_again_when_the_old_model_returns(
    many_keys: StoreAt, embedder: Embedder, settings: Settings, clock: FakeClock
) -> None:
    with pytest.raises(Crashed):
        open_graph(many_keys, Negated(embedder, survive=256), settings, clock)

    # Without the mark, the old fingerprint would still stand and 256 keys keep the new
    # model's vectors; with it, going back to the old model embeds everything again.
    with pytest.raises(StoreError, match="half re-embedded for test:negated"):
        open_graph(many_keys, embedder, settings.replace(auto_migrate=False), clock)
    back = open_graph(many_keys, embedder, settings, clock)
    try:
        assert key_vectors_from(back, embedder) == len(list(back.keys.all())) == 601
    finally:
        back.close()


@pytest.mark.sqlite_only(RE_EMBEDDING_IS_LOCAL)
def test_a_re_embedding_cut_short_resumes_where_it_stopped(
    many_keys: StoreAt, tmp_path: Path, embedder: Embedder, settings: Settings, clock: FakeClock
) -> None:
    first = Negated(embedder, survive=512)
    with pytest.raises(Crashed):
        open_graph(many_keys, first, settings, clock)
    assert first.calls == 512

    again = Negated(embedder)
    resumed = open_graph(many_keys, again, settings, clock)
    try:
        # 601 keys and 300 bodies, less the two chunks the first start wrote.
        assert again.calls == 601 + 300 - 512
        assert key_vectors_from(resumed, again) == 601
        cosines = resumed.bodies.cosines([m["id"] for m in transfer.export(resumed)["memories"]],
                                         again.embed(["note 7: the deploy queue of team 7"])[0])
        assert max(float(c[0]) for c in cosines.values()) > 0.99
    finally:
        resumed.close()
    assert len(list((tmp_path / "backups").glob("keymem-before-reembed-*.db"))) == 1


def test_rows_in_asks_for_a_long_in_list_a_chunk_at_a_time() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t(n INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(n,) for n in range(3000)])
    wanted = list(range(0, 3000, 2))  # 1,500 values: more than one statement may bind

    got = sorted(n for (n,) in rows_in(conn, "SELECT n FROM t WHERE n IN ({marks})", wanted))

    assert got == wanted
    assert list(rows_in(conn, "SELECT n FROM t WHERE n IN ({marks})", [])) == []
