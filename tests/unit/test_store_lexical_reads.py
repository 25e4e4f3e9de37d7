"""The lexical search reads the memories of its best-ranked index rows a part at a time
(``store.sqlite.search.SearchRows.lexical_hits``), and its hits are still the best active
memories in scope: rows whose memories are expired or in another namespace give way to the
next ones, however many of the first part they are."""

from __future__ import annotations

from engine_helpers import FakeClock, remember

from keymem_daemon.engine.graph import MemoryGraph

# Shortest first: with the same one hit of the token each, BM25 ranks the shorter memory higher.
_FILLERS = ["", "amber", "amber basalt", "amber basalt cobalt", "amber basalt cobalt dune",
            "amber basalt cobalt dune ember", "amber basalt cobalt dune ember fjord",
            "amber basalt cobalt dune ember fjord garnet"]


def _lexical(graph: MemoryGraph, scope: frozenset[str] | None, limit: int) -> list[str]:
    now = graph.clock()
    return [mid for mid, _ in graph.store.read(lambda r: r.lexical_hits(["ocelot"], scope, now, limit))]


def test_hits_past_a_first_part_of_expired_and_out_of_scope_rows_are_the_next_best(
        graph: MemoryGraph, clock: FakeClock) -> None:
    ids = [remember(graph, f"ocelot {filler}".strip(), [f"ocelot note {i}"],
                    namespace="elsewhere" if i < 2 else None, ttl_seconds=60 if i in (2, 3) else None)
           for i, filler in enumerate(_FILLERS)]
    assert _lexical(graph, None, 3) == ids[:3], "ranked shortest first"
    home = frozenset({"default"})
    assert _lexical(graph, home, 2) == ids[2:4]
    clock.advance(120)
    # The first part (the best 2 rows) holds no hit at all; the next rows fill the limit.
    assert _lexical(graph, home, 2) == ids[4:6]
    assert _lexical(graph, None, 3) == [ids[0], ids[1], ids[4]]
    assert _lexical(graph, home, 10) == ids[4:]
