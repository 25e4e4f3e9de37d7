"""The unit of work, the same on the SQLite store and on the in-memory repository
(``fakes.InMemoryRepository``): a write commits whole or not at all, its after-commit steps
run after the commit and in order, and a row the schema refuses changes nothing. (That the
engine's answers agree on both is test_fast_engine.py's
``test_the_engine_gives_the_same_answers_on_sqlite_and_in_memory``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import InMemoryRepository, InMemoryWriter

from keymem_daemon.engine import ports
from keymem_daemon.engine.ports import KeyRow, Reader, Repository, Writer
from keymem_daemon.errors import StoreError
from keymem_daemon.store.sqlite.database import Store

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

Repo = Any  # engine.ports.Repository: a Store or an InMemoryRepository


@pytest.fixture(params=["sqlite", "memory"])
def repository(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Repo]:
    repo: Repo = Store.open(tmp_path / "keymem.db") if request.param == "sqlite" else InMemoryRepository()
    yield repo
    repo.close()


def add_key(tx: Any, key_id: str = "k1") -> None:
    tx.insert_key(KeyRow(key_id, "staging", "staging", "staging", "concept", b"\0" * 16, 1.0))


def key_ids(repo: Repo) -> list[str]:
    return [kid for kid, _ in repo.read(lambda r: r.key_concepts())]


def test_a_write_commits_then_runs_its_after_commit_steps_in_order(repository: Repo) -> None:
    seen: list[Any] = []

    def write(tx: Any) -> str:
        add_key(tx)
        tx.after_commit(lambda: seen.append(("first", key_ids(repository))))
        tx.after_commit(lambda: seen.append("second"))
        assert key_ids(repository) == [], "nothing is visible before the commit"
        return "done"

    assert repository.write(write) == "done"
    assert seen == [("first", ["k1"]), "second"], "the steps run after the commit, in order"


def test_a_write_that_fails_rolls_back_whole_and_runs_no_after_commit_step(repository: Repo) -> None:
    seen: list[str] = []
    repository.write(add_key)

    def write(tx: Any) -> None:
        add_key(tx, "k2")
        tx.set_key_compact("k1", "changed")
        tx.after_commit(lambda: seen.append("ran"))
        raise LookupError("refused")

    with pytest.raises(LookupError, match="refused"):
        repository.write(write)
    assert key_ids(repository) == ["k1"] and seen == []
    assert repository.read(lambda r: r.key_info("k1").compact) == "staging"


def test_a_row_the_schema_refuses_is_a_store_error_and_changes_nothing(repository: Repo) -> None:
    repository.write(add_key)
    for refused in (add_key, lambda tx: tx.link("k1", "no-such-memory", 1.0, False)):
        with pytest.raises(StoreError, match="refused the write"):
            repository.write(refused)
    assert key_ids(repository) == ["k1"]
    assert repository.read(lambda r: r.link_counts()) == {}
    assert repository.integrity_check() == "ok"


def test_a_failing_after_commit_step_keeps_the_commit_and_the_later_steps(repository: Repo) -> None:
    seen: list[str] = []

    def write(tx: Any) -> None:
        add_key(tx)
        tx.after_commit(lambda: 1 / 0)
        tx.after_commit(lambda: seen.append("later"))

    repository.write(write)
    assert key_ids(repository) == ["k1"] and seen == ["later"]


def test_a_write_inside_a_write_and_any_use_after_close_are_refused(repository: Repo) -> None:
    with pytest.raises(RuntimeError, match="inside a write transaction"):
        repository.write(lambda tx: repository.write(add_key))
    repository.close()
    with pytest.raises(StoreError, match="closed"):
        repository.write(add_key)


def test_the_in_memory_repository_offers_every_port_operation() -> None:
    # mypy --strict checks this assignment against engine.ports, operation by operation.
    repository: Repository = InMemoryRepository()
    declared = {name for port in (Reader, Writer) for area in port.__mro__ if area.__module__ == ports.__name__
                for name in vars(area) if not name.startswith("_")}
    assert "memory" in declared and "insert_key" in declared
    missing = sorted(name for name in declared if not hasattr(InMemoryWriter, name))
    assert missing == []
    assert repository.read(lambda r: r.key_count()) == 0
