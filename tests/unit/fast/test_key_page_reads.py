"""A key's page (read_key, the inspector's Key view) ranks the strongest ``pool`` members of a
hub: it reads those rows, not every member's (a 3,000-member key read 3,000 rows for 150)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pytest
from engine_helpers import Tools

from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.records import Memory

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]
T = TypeVar("T")
HUB_MEMBERS = 260


class CountingReader:
    """A reader that counts the memory rows asked of it."""

    def __init__(self, reader: Any, asked: list[str]) -> None:
        self._reader = reader
        self._asked = asked

    def memories(self, ids: Iterable[str]) -> dict[str, Memory]:
        wanted = list(ids)
        self._asked.extend(wanted)
        found: dict[str, Memory] = self._reader.memories(wanted)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def test_a_hubs_page_reads_the_rows_it_ranks_not_every_member(graph: MemoryGraph, tools: Tools,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    items = [{"content": f"Service number {i} deploys from its own pipeline on weekday {i % 5}.",
              "keys": ["deployment", f"service {i}"]} for i in range(HUB_MEMBERS)]
    for start in range(0, HUB_MEMBERS, 100):
        tools.ok("remember_batch", {"items": items[start:start + 100]})
    kid = graph.keys.by_norm("deployment")
    assert kid is not None
    whole = graph.read_key(kid, limit=10)

    asked: list[str] = []
    read = graph.store.read

    def counting(fn: Callable[[Any], T]) -> T:
        return read(lambda reader: fn(CountingReader(reader, asked)))

    monkeypatch.setattr(graph.store, "read", counting)
    page = graph.read_key(kid, limit=10)
    assert page.total == HUB_MEMBERS and [h.memory_id for h in page.memories] == [
        h.memory_id for h in whole.memories]
    pool = 100  # read_key's pool for a first page of 10: max(100, 3 x 10)
    assert pool <= len(asked) < HUB_MEMBERS, len(asked)
