"""``federation.Federation`` on the fast tier: a local SQLite engine and a team engine over the
in-memory repository (standing in for PostgreSQL, whose daemons ``tests/postgres/
test_federation.py`` runs), routed and merged through the tool layer as the daemon runs it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from engine_helpers import FakeClock, open_graph
from fakes import InMemoryRepository

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput, StoreError
from keymem_daemon.federation import ROUTES, Federation, NamespaceRouter
from keymem_daemon.inference.embedders import Embedder
from keymem_daemon.mcp import tools

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

HOST = Host()
T = TypeVar("T")


@pytest.fixture
def federation(tmp_path: Path, embedder: Embedder, analyzer: Analyzer, settings: Settings,
               clock: FakeClock) -> Iterator[Federation]:
    federated = settings.replace(store_url="postgresql://alice@db.example:5432/keymem",
                                 team_namespaces=("team-*", "Deploy-Rules"), tools="full")
    local = open_graph(tmp_path / "keymem.db", embedder, federated, clock, analyzer)
    team = MemoryGraph.over(InMemoryRepository(), embedder, federated,  # type: ignore[arg-type]
                            clock=clock, analyzer=analyzer)
    both = Federation(local, team, federated)
    try:
        yield both
    finally:
        both.close()
        local.close()


def ok(federation: Federation, name: str, arguments: dict[str, Any]) -> Any:
    outcome = federation.call_tool(name, arguments, HOST, None)
    assert not outcome.is_error and not (isinstance(outcome.result, dict) and "error" in outcome.result), outcome
    return json.loads(json.dumps(outcome.result))


def held_by(graph: MemoryGraph, memory_id: str) -> bool:
    return graph.store.read(lambda reader: reader.memory(memory_id)) is not None


def test_every_tool_has_a_route() -> None:
    assert set(ROUTES) == set(tools.TOOLS_BY_NAME)


def test_team_namespaces_are_names_and_prefixes_in_normal_form() -> None:
    router = NamespaceRouter(("team-*", "Deploy-Rules", "ＯＰＳ"))
    assert router.is_team("team-payments") and router.is_team("deploy-rules") and router.is_team("ops")
    assert not router.is_team("default") and not router.is_team("teams") and not router.is_team("deploy")
    assert router.split(frozenset({"default", "team-x"})) == (frozenset({"default"}), frozenset({"team-x"}))
    assert router.split(None) == (None, None)


def test_writes_go_to_the_namespace_store_and_reads_by_id_find_it(federation: Federation) -> None:
    mine = ok(federation, "remember", {"content": "I keep my notes in obsidian", "keys": ["notes", "obsidian"]})
    ours = ok(federation, "remember", {"content": "The ledger deploys need two approvals", "keys": ["ledger"],
                                       "namespace": "Team-Ledger"})["saved"]
    assert held_by(federation.local, mine["saved"]) and not held_by(federation.team, mine["saved"])
    assert held_by(federation.team, ours) and not held_by(federation.local, ours)
    assert ok(federation, "read_memory", {"memory_id": ours})["memory"]["namespace"] == "team-ledger"
    new = ok(federation, "correct", {"memory_id": ours, "content": "The ledger deploys need three approvals"})
    assert held_by(federation.team, new["new_id"])
    ok(federation, "forget", {"memory_id": mine["saved"]})
    assert not held_by(federation.local, mine["saved"])
    missing = federation.call_tool("read_memory", {"memory_id": "0123456789ab"}, HOST, None)
    assert missing.result == {"error": "Memory 0123456789ab not found"}


def test_reads_over_every_namespace_merge_both_stores(federation: Federation, clock: FakeClock) -> None:
    ids = []
    for i in range(6):  # alternately personal and team, a second apart
        clock.advance(1)
        ids.append(ok(federation, "remember", {"content": f"Fact {i} about the orchid greenhouse",
                                               "keys": ["orchid", f"bed {i}"],
                                               "namespace": "team-garden" if i % 2 else None})["saved"])
    hits = ok(federation, "recall_memories", {"query": "orchid greenhouse", "top_k": 4, "reinforce": False})
    assert len(hits) == 4 and {h["namespace"] for h in hits} == {"default", "team-garden"}
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    recalled = ok(federation, "recall", {"query": "orchid", "top_k": 2})
    assert recalled["status"] == "found" and len(recalled["keys"]) == 2 and len(recalled["memories"]) == 1
    # The concept both stores hold a key for is one cluster, with the memories of both.
    orchid = [k for k in recalled["keys"] if k["concept"] == "orchid"]
    assert len(orchid) == 1 and orchid[0]["memory_count"] == 6, recalled["keys"]
    assert orchid[0]["key_id"] in {federation.local.keys.by_norm("orchid"), federation.team.keys.by_norm("orchid")}
    listed = ok(federation, "list_memories", {"limit": 4, "offset": 1})
    assert [m["id"] for m in listed["memories"]] == ids[1:5] and listed["total"] == 6 and listed["next_offset"] == 5
    browsed = ok(federation, "browse_keys", {"limit": 3})
    assert browsed["key_count"] == 7 and len(browsed["keys"]) == 3 and browsed["next_offset"] == 3
    assert [k["concept"] for k in browsed["keys"]] == ["orchid", "bed 0", "bed 1"]
    assert browsed["keys"][0]["memory_count"] == 6
    stats = ok(federation, "memory_stats", {})
    assert stats["memories"] == 6 and stats["namespaces"] == {"default": 3, "team-garden": 3}
    one = ok(federation, "list_memories", {"namespace": "team-garden"})
    assert [m["id"] for m in one["memories"]] == ids[1::2]


def test_a_batch_spanning_both_stores_is_one_answer_in_the_order_sent(federation: Federation) -> None:
    batch = ok(federation, "remember_batch", {"items": [
        {"content": "My bike is a blue gravel bike", "keys": ["bike"]},
        {"content": "The team bike shed code is 4711", "keys": ["bike shed"], "namespace": "deploy-rules"},
        {"content": "", "keys": ["nothing"], "namespace": "team-x"},
        {"content": "My helmet is size M", "keys": ["helmet"]}]})
    assert [item["index"] for item in batch["items"]] == [0, 1, 2, 3]
    assert (batch["saved"], batch["failed"]) == (3, 1) and "error" in batch["items"][2]
    assert held_by(federation.local, batch["items"][0]["saved"]) and held_by(federation.local,
                                                                             batch["items"][3]["saved"])
    assert held_by(federation.team, batch["items"][1]["saved"])


def test_the_push_path_surfaces_from_both_stores_within_top_k(federation: Federation) -> None:
    mine = ok(federation, "remember", {"content": "My zebrafish-gateway checkout builds with make zebrafish-dev",
                                       "keys": ["zebrafish-gateway", "make zebrafish-dev"]})["saved"]
    ours = ok(federation, "remember", {"content": "zebrafish-gateway deploys after zebra-canary-check passes",
                                       "keys": ["zebrafish-gateway", "zebra-canary-check"],
                                       "namespace": "team-payments"})["saved"]
    prompt = "build zebrafish-gateway with make zebrafish-dev and deploy it after zebra-canary-check"
    both = federation.inject(prompt, scope=frozenset({"default", "team-payments"}), top_k=2, max_chars=2000,
                             project=frozenset({"team-payments"}), session=None)
    assert {m.id for m in both.memories} == {mine, ours} and both.context is not None
    assert mine in both.context and ours in both.context
    one = federation.inject(prompt, scope=frozenset({"default", "team-payments"}), top_k=1, max_chars=2000,
                            project=frozenset({"team-payments"}), session=None)
    assert len(one.memories) == 1
    local_only = federation.inject(prompt, scope=frozenset({"default"}), top_k=2, max_chars=2000,
                                   project=frozenset(), session=None)
    assert [m.id for m in local_only.memories] == [mine]


def test_a_concept_keyed_in_both_stores_reads_as_one_key(federation: Federation) -> None:
    mine = ok(federation, "remember", {"content": "My orchid needs water on sundays", "keys": ["orchid"]})["saved"]
    ours = ok(federation, "remember", {"content": "The office orchid is watered by the front desk",
                                       "keys": ["Orchid"], "namespace": "team-office"})["saved"]
    local_key, team_key = federation.local.keys.by_norm("orchid"), federation.team.keys.by_norm("orchid")
    assert local_key is not None and team_key is not None and local_key != team_key
    for key_id in (local_key, team_key):
        under = ok(federation, "read_key", {"key_id": key_id, "query": "orchid"})
        assert {h["memory_id"] for h in under["memories"]} == {mine, ours} and under["total"] == 2, under
        assert under["key"]["key_id"] == key_id and under["key"]["memory_count"] == 2
        paged = ok(federation, "read_key", {"key_id": key_id, "limit": 1, "offset": 1})
        assert len(paged["memories"]) == 1 and paged["next_offset"] is None
        for memory_id in (mine, ours):
            assert ok(federation, "read_memory", {"memory_id": memory_id, "via_key_id": key_id})["memory"]["id"] \
                == memory_id
    dismissed = ok(federation, "dismiss", {"memory_id": ours, "key_id": local_key})
    assert dismissed["key_id"] == team_key
    one = ok(federation, "read_key", {"key_id": team_key, "namespace": "default"})
    assert one["key"]["key_id"] == local_key and [h["memory_id"] for h in one["memories"]] == [mine]


def test_an_import_cut_by_store_counts_what_joins_them_and_names_records_as_sent(federation: Federation) -> None:
    memories = [{"id": f"m{i:011d}", "content": f"fact {i}", "namespace": ns}
                for i, ns in enumerate(["default", "team-a", "default", "team-a"])]
    memories[2]["superseded_by"], memories[3]["supersedes"] = memories[3]["id"], memories[2]["id"]
    cut = federation.import_parts({
        "format": "keymem-export", "version": 1, "keys": [], "memories": memories, "links": [],
        "relations": [{"from": memories[0]["id"], "to": memories[1]["id"]},
                      {"from": memories[1]["id"], "to": memories[3]["id"]}]})
    assert [graph is federation.local for graph, _ in cut.parts] == [True, False]  # the local part first
    assert (cut.across.relations, cut.across.supersessions) == (1, 1)
    report = cut.across.report()
    assert report is not None and report["relations"] == 1 and "team store" in report["why"]
    assert [r["from"] for r in cut.parts[1][1]["relations"]] == [memories[1]["id"]]
    placed = cut.placed(1, InvalidInput("memories[1] cannot be stored: refused", field="memories[1]"))
    assert (placed.message, placed.field) == ("memories[3] cannot be stored: refused", "memories[3]")


class CommitFails(InMemoryRepository):
    """A store whose commits fail after their transaction ran (a disk error at COMMIT), once
    ``failing`` is set."""

    failing = False

    def write(self, fn: Callable[[Any], T]) -> T:
        if not self.failing:
            return super().write(fn)

        def then_fail(tx: Any) -> T:
            fn(tx)
            raise StoreError("the store refused the write: disk I/O error")

        return super().write(then_fail)


def test_a_part_whose_commit_fails_after_the_next_part_committed_has_that_part_deleted_again(
        federation: Federation, embedder: Embedder, analyzer: Analyzer, clock: FakeClock) -> None:
    local = federation.local
    kept = ok(federation, "remember", {"content": "My orchid needs water on sundays", "keys": ["orchid"]})["saved"]
    before = transfer.export(local)
    store = CommitFails()
    failing = MemoryGraph.over(store, embedder, federation.settings,  # type: ignore[arg-type]
                               clock=clock, analyzer=analyzer)
    store.failing = True
    first = {"format": "keymem-export", "version": 1, "keys": [{"id": "kfirst000001", "concept": "fern"}],
             "memories": [{"id": "mfirst000001", "content": "the fern stays in the shade"}],
             "links": [{"key_id": "kfirst000001", "memory_id": "mfirst000001"}]}
    second = {"format": "keymem-export", "version": 1,
              "keys": [{"id": "korchid00001", "concept": "Orchid"}, {"id": "ktulip000001", "concept": "tulip"}],
              "memories": [{"id": "msecond00001", "content": "the tulips bloom in april beside the orchid"}],
              "links": [{"key_id": "korchid00001", "memory_id": "msecond00001"},
                        {"key_id": "ktulip000001", "memory_id": "msecond00001"}],
              "relations": []}
    with pytest.raises(StoreError) as refused:
        transfer.import_parts([(failing, first), (local, second)])
    assert "nothing was imported" in refused.value.message and "disk I/O error" in refused.value.message
    # The SQLite part had committed: its memory and its new key are gone, the key it shared
    # with a memory already there stays, and the store's export is as it was.
    assert transfer.export(local) == before
    assert local.keys.by_norm("tulip") is None and local.keys.by_norm("orchid") is not None
    assert ok(federation, "recall_memories", {"query": "tulips april orchid", "reinforce": False})[0]["id"] == kept
    failing.close()
