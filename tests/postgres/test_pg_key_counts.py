"""A key's link count in the in-memory index stays the store's when writes of one daemon on a
shared store race: the after-commit steps of two writes, and of a write and the change log's
follower, may run in either order (engine/keys.py ``put_created`` / ``put_written``,
PostgresRepository.wait_for_commits)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import scaled

from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.keys import KeyIndex
from keymem_daemon.engine.text import normalize
from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder
from keymem_daemon.store.opening import open_postgres


@pytest.fixture
def graph(pg_database: str, tmp_path: Path) -> Iterator[MemoryGraph]:
    g = MemoryGraph.over(open_postgres(pg_database), CachedEmbedder(UseEmbedder()), Settings(data_dir=tmp_path))
    try:
        yield g
    finally:
        g.close()


def _remember(graph: MemoryGraph, content: str, keys: list[str]) -> None:
    graph.remember(graph.prepare(content=content, keys=keys))


def _link_count(graph: MemoryGraph, concept: str) -> int:
    key_id = graph.keys.by_norm(normalize(concept))
    assert key_id is not None, f"no key {concept!r}"
    info = graph.keys.get(key_id)
    assert info is not None
    return info.link_count


def _stored_link_count(graph: MemoryGraph, concept: str) -> int:
    key_id = graph.keys.by_norm(normalize(concept))
    assert key_id is not None
    return graph.store.read(lambda reader: reader.key_rows([key_id])[key_id][0].link_count)


def _before_first_index_step(monkeypatch: pytest.MonkeyPatch, keys: KeyIndex, concept: str,
                             step: Callable[[], object]) -> list[str]:
    """Run ``step`` once, just before the index first takes in the key ``concept`` as a write
    left it (any of the index's write-path entries); returns the entries seen, in order."""
    seen: list[str] = []
    for name in ("put", "put_created", "put_written"):
        original = getattr(keys, name, None)
        if original is None:
            continue

        def hooked(info: Any, *args: Any, _original: Callable[..., None] = original, _name: str = name,
                   **kwargs: Any) -> None:
            if info.concept == concept:
                seen.append(_name)
                if len(seen) == 1:
                    step()
            _original(info, *args, **kwargs)

        monkeypatch.setattr(keys, name, hooked)
    return seen


def test_a_write_that_finds_a_key_another_just_created_keeps_both_links_whichever_applies_first(
        graph: MemoryGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """The creator committed; a second write found the key in the store and read its count
    (both links), and its after-commit step ran before the creator's: the creator's count of
    one must not replace it. (The second write runs inside the first's after-commit step, so
    the order is the one the race gave; on the server they are two sessions.)"""
    seen = _before_first_index_step(monkeypatch, graph.keys, "deploy window", lambda: _remember(
        graph, "Production deploys only happen on Tuesdays", ["deploy window", "production"]))
    _remember(graph, "Deploys freeze from Friday noon", ["deploy window", "freeze"])
    assert len(seen) == 2, seen  # each write took the key in once
    assert _stored_link_count(graph, "deploy window") == 2
    assert _link_count(graph, "deploy window") == 2


def test_the_change_log_applies_what_it_read_only_after_the_writes_it_saw_applied_theirs(
        graph: MemoryGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's apply waits for each write that had sent its COMMIT to run its
    after-commit steps (else the follower's count, read after the commit, would be moved
    again by the write's delta); a write committing meanwhile does not wait for it."""
    _remember(graph, "Grafana dashboards live in infra/dashboards", ["grafana", "dashboards"])
    entered = threading.Event()
    inside: list[bool] = []
    original = graph.keys.add_links

    def delta_with_a_follower(key_id: str, delta: int) -> None:
        monkeypatch.setattr(graph.keys, "add_links", original)  # once
        follower = threading.Thread(target=lambda: _hold(graph, entered))
        follower.start()
        follower_threads.append(follower)
        # The write is between its COMMIT and its steps: the follower must not apply yet.
        inside.append(entered.wait(0.5))
        # Another write commits and applies meanwhile, waiting for neither.
        other = threading.Thread(target=_remember, args=(graph, "Grafana runs on port 3000", ["grafana", "port"]))
        other.start()
        other.join(scaled(30))
        others_done.append(not other.is_alive())
        original(key_id, delta)

    follower_threads: list[threading.Thread] = []
    others_done: list[bool] = []
    monkeypatch.setattr(graph.keys, "add_links", delta_with_a_follower)
    _remember(graph, "Grafana alerts page the on-call channel", ["grafana", "alerts"])
    for follower in follower_threads:
        follower.join(scaled(30))
    assert inside == [False]
    assert others_done == [True]
    assert entered.is_set()  # and once the write was done, it applied
    assert _link_count(graph, "grafana") == _stored_link_count(graph, "grafana") == 3


def _hold(graph: MemoryGraph, entered: threading.Event) -> None:
    graph.store.wait_for_commits()
    entered.set()
