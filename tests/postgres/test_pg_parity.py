"""The same memory and key operations through the SQLite store and the PostgreSQL repository
give the same answers: the PostgreSQL dialect of store/postgres/memories.py and keys.py says
what store/sqlite's says. Every read of both ports is compared after a script of writes that
exercises each write (dedup folding, superseding, merging duplicate keys, alias candidates,
relations, the lexical rows)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keymem_daemon.engine.ports import ActivityRow, KeyRow, MemoryFilter, MemoryRow
from keymem_daemon.store.postgres.repository import PostgresRepository
from keymem_daemon.store.sqlite.database import Store

NOW = 1_000.0


def _memory(memory_id: str, namespace: str, content: str, *, expires_at: float | None = None,
            batch: str | None = None) -> MemoryRow:
    source: dict[str, Any] = {"host_agent": "claude" if memory_id != "m4" else "codex"} | (
        {"batch_id": batch} if batch else {})
    # Each its own instant: newest-first listings have no ties to order.
    at = 100.0 + 10 * int(memory_id[1:])
    return MemoryRow(id=memory_id, content=content, dedup_hash=f"h-{content}", namespace=namespace, at=at,
                     observed_at=50.0 if memory_id == "m2" else None, decay_profile="standard", source=source,
                     expires_at=expires_at, vector=bytes([len(memory_id)]) * 8)


def _key(key_id: str, concept: str, created_at: float, key_type: str = "concept") -> KeyRow:
    return KeyRow(id=key_id, concept=concept, norm=concept.lower(), compact=concept.lower().replace(" ", ""),
                  key_type=key_type, vector=bytes([len(key_id)]) * 8, created_at=created_at)


def _script(w: Any) -> None:
    w.insert_key(_key("k-deploy", "Deploy", 1.0))
    w.insert_key(_key("k-friday", "friday", 2.0))
    w.insert_key(_key("k-seoul", "서울", 3.0, "proper_noun"))
    w.insert_key(_key("k-deploy2", "deploy", 4.0, "name"))  # a duplicate norm, merged below
    w.insert_memory(_memory("m1", "proj", "deploy on fridays", batch="b1"))
    w.insert_memory(_memory("m2", "proj", "서울 office deploys at noon", batch="b1"))
    w.insert_memory(_memory("m3", "other", "temporary note", expires_at=500.0))
    w.insert_memory(_memory("m4", "proj", "deploy on mondays now"))
    w.add_links([("k-deploy", "m1", 1.0, False), ("k-friday", "m1", 0.5, True), ("k-seoul", "m2", 1.0, False),
                 ("k-deploy2", "m2", 0.8, False), ("k-deploy2", "m1", 2.0, True), ("k-deploy", "m4", 1.0, False)])
    w.link("k-friday", "m3", 0.3, True)
    w.set_link_weight("k-friday", "m1", 0.75)
    w.add_alias("k-deploy", "release", norm="release", compact="release", learned=False, added_at=5.0)
    w.add_alias("k-deploy2", "ship", norm="ship", compact="ship", learned=True, added_at=6.0)
    w.add_alias("k-deploy", "rollout", norm="rollout", compact="rollout", learned=True, added_at=7.0)
    w.count_alias_hits([("k-deploy", "rollout")])
    w.see_alias_candidate("k-deploy2", "push", "push it", 8.0)
    w.see_alias_candidate("k-deploy", "push", "push to prod", 9.0)
    w.see_alias_candidate("k-friday", "fri", "fri", 9.0)
    w.see_alias_candidate("k-friday", "fri", "fri.", 9.5)
    w.unsee_alias_candidate("k-friday", "fri")
    w.merge_keys_named("deploy")
    w.add_relations("m1", ["m2", "m1", "m3"])
    w.index_memory("m1", "deploy friday", "deploy friday")
    w.index_memory("m2", "서울 office deploy noon", "서울 deploy")
    w.index_memory("m4", "deploy monday", "deploy")
    w.set_key_tokens("m4", "deploy release")
    w.supersede("m1", "m4", depth_factor=0.5, now=200.0)
    w.confirm("m2", now=300.0, depth_step=0.4, evidence="agent", source={"agent": "x"}, confirmation_id="c1")
    w.confirm("m2", now=301.0, depth_step=0.9, evidence="agent", source={"agent": "x"}, confirmation_id="c2")
    w.count_access("m2", 302.0)
    w.fold_into_twin("m3", now=303.0, source={"agent": "y"}, expires_at=None)
    w.record_idempotent("idem-1", '{"ok": true}', 10.0, "fp")
    w.record_idempotent("idem-2", '{"ok": false}', 20.0, "fp2")
    w.prune_idempotency(10.0)
    w.set_meta({"embedder": "usem3", "reembed_done": "3", "reembed_total": "9"})
    w.delete_meta_prefixed("reembed_")
    w.set_memory_vectors([(b"\x09" * 8, "m4")])
    w.set_key_vectors([(b"\x07" * 8, "k-friday")])
    w.set_key_compact("k-seoul", "서울시")
    w.set_alias_compact("k-deploy", "release", "rel")
    w.set_key_type("k-friday", "name")
    w.add_activity([ActivityRow(at=float(i), kind="remember" if i % 2 else "inject", memory_id="m2" if i % 3 else None,
                                summary=f"entry {i}", detail_json=f'{{"i": {i}}}') for i in range(1, 8)], keep=5)
    w.prune_activity(before=3.5)


def _observe(r: Any) -> dict[str, Any]:
    memories = r.memories(["m1", "m2", "m3", "m4", "absent"])
    return {
        "memories": {k: (m.content, m.namespace, m.depth, m.access_count, m.confirmation_count, m.supersedes,
                         m.superseded_by, m.expires_at, m.observed_at, m.source, m.last_confirmation_source,
                         m.last_confirmation_evidence, m.last_confirmation_id, m.last_accessed)
                     for k, m in memories.items()},
        "memory": r.memory("m2") == memories["m2"], "content": r.memory_content("m3"),
        "current": [r.is_current(m) for m in ("m1", "m2", "absent")],
        "twin": r.active_twin("proj", "h-deploy on mondays now", NOW), "predecessor": r.predecessor_of("m4"),
        "member": [r.member_state(m) for m in ("m1", "m2", "absent")],
        "active": [r.count_active(ns, NOW) for ns in (None, "proj", "other")],
        "page": (lambda t: (t[0], [m.id for m in t[1]]))(r.active_page("proj", NOW, 5, 0)),
        "expired": [m.id for m in r.expired_memories(NOW)],
        "siblings": r.batch_siblings("b1", memories["m2"], NOW),
        "related": (r.related_ids("m1"), sorted(r.explicit_neighbours("m2"))),
        "counts": r.counts(NOW), "vectors": sorted(r.stored_vectors(8)), "live": r.live_vector_count(),
        "expiring": r.expiring_ids(), "after": [(m, c) for _, m, c in r.vectors_after(0)],
        "vector": r.memory_vector("m4"), "idem": (r.idempotent_result("idem-1"), r.idempotent_result("idem-2")),
        "meta": (r.meta(), r.meta_value("embedder"), r.meta_value("reembed_done")),
        "holding": sorted(r.indexed_holding(["noon", "fridays"])),
        "df": r.document_frequencies(["deploy", "서울", "release", "absent"]),
        "key_info": [r.key_info(k) for k, _ in sorted(r.key_concepts())],
        "concept": (r.key_concept("k-seoul"), r.key_concept("k-deploy2")), "keys": r.key_count(),
        "hangul": r.has_hangul_keys(), "stored": sorted((i.id, i.aliases, i.link_count, v) for i, v in r.stored_keys()),
        "concepts": sorted(r.key_concepts()), "keys_after": [(k, c) for _, k, c in r.keys_after(0)],
        "keys_holding": sorted(r.keys_holding(["epl", "울"])), "aliases_holding": sorted(r.aliases_holding(["ll"])),
        "dup_norms": r.duplicate_key_norms(),
        "learned": (r.learned_aliases("k-deploy"), r.learned_alias_count("k-deploy")),
        "stale": sorted(r.stale_learned_aliases(100.0)),
        "texts": sorted(r.key_texts_of("m2")),
        "key_ids": (r.key_ids_of("m1"), r.key_ids_of("m1", manual_only=True), r.key_ids_of("m2")),
        "links_of": r.links_of("m1"), "weight": (r.link_weight("k-deploy", "m1"), r.link_weight("k-seoul", "m1")),
        "has_links": (r.has_links("k-seoul"), r.has_links("absent")),
        "linked": (sorted(r.memories_linked_to(["k-deploy", "k-seoul"])), r.memories_linked_to(["k-deploy"], limit=2)),
        "co_members": r.co_members("k-deploy", "m1", 10), "link_counts": r.link_counts(),
        "unexpiring": sorted(r.unexpiring_counts()),
        "loanword": sorted((c, sorted(ks)) for c, ks in r.loanword_evidence("k-deploy", 10)),
        "newest": [[m.id for m in r.newest_memories(f, now=NOW, limit=10)] for f in (
            MemoryFilter(), MemoryFilter(namespace="proj"), MemoryFilter(key_id="k-deploy"),
            MemoryFilter(agent="claude"), MemoryFilter(decay_profile="stable"),
            MemoryFilter(since=115.0, until=125.0))],
        "strongest_links": (r.strongest_links(["m1", "m2"]), r.strongest_links(["m1", "m2"], per_memory=1)),
        "aliases_of": r.aliases_of("k-deploy"),
        # Sorted: SQLite's sorter leaves the order of equal counts undefined.
        "co_occurring": sorted(r.co_occurring_keys("k-deploy", sample=10, limit=5)),
        "strongest_members": [m.id for m in r.strongest_members("k-deploy", now=NOW, limit=5)],
        "activity": [(e.at, e.kind, e.memory_id, e.summary, e.detail) for e in r.activity_entries(limit=10)]
                    + [(e.summary,) for e in r.activity_entries(kind="remember", memory_id="m2", limit=10)],
        "latest_activity": len(r.activity_entries(limit=100)) and r.latest_activity_id() > 0,
    }


def _deletions(w: Any) -> int:
    """The deleting writes, after the script; how many alias candidates pruning removed."""
    pruned = int(w.prune_alias_candidates(8.5))
    w.drop_alias_candidate("k-deploy", "push")
    w.delete_aliases([("k-deploy", "ship")])
    w.delete_memory("m3")
    w.clear_supersedes("m4")
    w.restore("m1")
    w.delete_key("k-seoul")
    return pruned


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "keymem.db")
    try:
        yield store
    finally:
        store.close()


def test_every_memory_and_key_operation_answers_as_on_sqlite(sqlite_store: Store, pg_database: str) -> None:
    postgres = PostgresRepository.open(pg_database)
    try:
        sqlite_store.write(_script)
        postgres.write(_script)
        expected, got = sqlite_store.read(_observe), postgres.read(_observe)
        expected_pruned, got_pruned = sqlite_store.write(_deletions), postgres.write(_deletions)
        expected_after, got_after = sqlite_store.read(_observe), postgres.read(_observe)
    finally:
        postgres.close()
    assert {k: v for k, v in got.items() if v != expected[k]} == {}
    # Not vacuous: the script left something for each kind of read to find.
    assert all(got["newest"][i] for i in (0, 1, 2, 3, 5)) and got["activity"] and got["co_occurring"]
    assert got["df"] and got["holding"] and got["stored"] and got["loanword"] and got["expired"]
    assert got_pruned == expected_pruned
    assert {k: v for k, v in got_after.items() if v != expected_after[k]} == {}
