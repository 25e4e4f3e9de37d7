"""The engine's logic on the fast tier: remember, recall, read_key, read_memory, correct,
forget, confirm, dismiss, cleanup and the push decision, through the tool layer as the
daemon runs it, on a real SQLite file with the deterministic ``HashingEmbedder`` (so what
is asserted follows from the engine's rules and shared words, not from a model's sense)."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import DAY, FakeClock, Tools, link_weight, memory_row, state

from keymem_daemon.engine import push
from keymem_daemon.engine.graph import MemoryGraph

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

DEPLOY = {"content": "Deploys go out on Fridays from the release branch",
          "keys": ["deployment", "Friday", "release branch"]}
CERT = {"content": "The staging server uses a self-signed certificate", "keys": ["staging", "certificate"]}
DARK = {"content": "The user prefers dark mode in every editor", "keys": ["dark mode", "editor"]}


def seed(tools: Tools) -> dict[str, str]:
    return {name: tools.ok("remember", item)["saved"]
            for name, item in (("deploy", DEPLOY), ("cert", CERT), ("dark", DARK))}


def keys_of(result: Any) -> dict[str, str]:
    return {k["concept"]: k["key_id"] for k in result["keys"]}


def recalled(tools: Tools, query: str) -> list[str]:
    return [m["id"] for m in tools.ok("recall_memories", {"query": query})]


def test_a_remembered_fact_is_recalled_under_its_key_and_by_its_words(tools: Tools) -> None:
    ids = seed(tools)
    found = tools.ok("recall", {"query": "certificate"})
    assert found["status"] == "found"
    assert found["keys"][0]["concept"] == "certificate"
    assert [m["id"] for m in found["memories"]] == [ids["cert"]]
    assert recalled(tools, "when do deploys go out")[:1] == [ids["deploy"]]


def test_a_query_sharing_nothing_with_any_memory_finds_no_match(tools: Tools) -> None:
    seed(tools)
    assert tools.ok("recall", {"query": "quarterly tax"})["status"] == "no_match"


def test_the_same_fact_remembered_twice_is_stored_once(tools: Tools, graph: MemoryGraph) -> None:
    first = tools.ok("remember", DEPLOY)["saved"]
    again = tools.ok("remember", DEPLOY)
    assert again["saved"] == first and again["deduplicated"]
    assert graph.stats().memories == 1


def test_read_key_lists_the_memories_under_a_key_and_read_memory_shows_one(tools: Tools) -> None:
    ids = seed(tools)
    other = tools.ok("remember", {"content": "Staging is rebuilt every night", "keys": ["staging", "nightly"]})
    staging = keys_of(other)["staging"]
    handles = tools.ok("read_key", {"key_id": staging, "query": "certificate"})
    assert {h["memory_id"] for h in handles["memories"]} == {ids["cert"], other["saved"]}
    assert handles["memories"][0]["memory_id"] == ids["cert"], "the handle sharing the query's words ranks first"
    shown = tools.ok("read_memory", {"memory_id": ids["cert"], "via_key_id": staging})
    assert shown["memory"]["content"] == CERT["content"]
    assert {k["concept"] for k in shown["keys"]} == {"staging", "certificate"}


def test_reading_through_a_key_reinforces_that_link_only(tools: Tools, graph: MemoryGraph) -> None:
    saved = tools.ok("remember", CERT)
    keys = keys_of(saved)
    before = {c: link_weight(graph, k, saved["saved"]) for c, k in keys.items()}
    tools.ok("read_memory", {"memory_id": saved["saved"], "via_key_id": keys["staging"]})
    after = {c: link_weight(graph, k, saved["saved"]) for c, k in keys.items()}
    assert after["staging"] > before["staging"]  # type: ignore[operator]
    assert after["certificate"] == before["certificate"]


def test_a_correction_supersedes_the_old_version_which_reading_refuses(tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    new = tools.ok("correct", {"memory_id": ids["deploy"], "content": "Deploys go out on Tuesdays from main"})
    new_id = new["new_id"]
    assert new_id != ids["deploy"]
    assert recalled(tools, "deploys go out")[:1] == [new_id]
    assert ids["deploy"] not in recalled(tools, "deploys go out")
    old = memory_row(graph, ids["deploy"])
    assert old is not None and old["superseded_by"] == new_id
    assert old["content"] == DEPLOY["content"], "the old record still exists"
    refused = tools("read_memory", {"memory_id": ids["deploy"]})
    assert f"superseded by {new_id}" in str(refused.result)


def test_forgetting_a_correction_brings_back_the_version_it_replaced(tools: Tools) -> None:
    ids = seed(tools)
    new_id = tools.ok("correct", {"memory_id": ids["deploy"], "content": "Deploys go out on Tuesdays"})["new_id"]
    tools.ok("forget", {"memory_id": new_id})
    assert recalled(tools, "deploys go out")[:1] == [ids["deploy"]]


def test_a_forgotten_memory_is_gone_and_the_rest_unchanged(tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    tools.ok("forget", {"memory_id": ids["dark"]})
    assert memory_row(graph, ids["dark"]) is None
    assert ids["dark"] not in recalled(tools, "dark mode editor")
    assert {m["id"] for m in tools.ok("list_memories")["memories"]} == {ids["deploy"], ids["cert"]}
    assert tools.ok("forget", {"memory_id": ids["dark"]}) == {"deleted": False}


def test_confirming_with_evidence_refreshes_and_deepens_a_memory(
        tools: Tools, graph: MemoryGraph, clock: FakeClock) -> None:
    mid = seed(tools)["cert"]
    clock.advance(30 * DAY)
    tools.ok("confirm_memory", {"memory_id": mid, "evidence": "user"})
    row = memory_row(graph, mid)
    assert row is not None
    assert row["confirmation_count"] == 2 and row["last_confirmed_at"] == clock.now
    assert row["depth"] > 0.0


def test_dismissing_weakens_one_link_and_leaves_the_memory(tools: Tools, graph: MemoryGraph) -> None:
    saved = tools.ok("remember", CERT)
    keys = keys_of(saved)
    before = link_weight(graph, keys["staging"], saved["saved"])
    tools.ok("dismiss", {"memory_id": saved["saved"], "key_id": keys["staging"]})
    after = link_weight(graph, keys["staging"], saved["saved"])
    assert after is not None and before is not None and 0 < after < before
    assert link_weight(graph, keys["certificate"], saved["saved"]) == before
    assert tools.ok("read_memory", {"memory_id": saved["saved"]})["memory"]["content"] == CERT["content"]


def test_cleanup_deletes_what_expired_and_keeps_the_rest(tools: Tools, graph: MemoryGraph, clock: FakeClock) -> None:
    ids = seed(tools)
    brief = tools.ok("remember", {"content": "The build cache is warm today", "keys": ["build cache"],
                                  "ttl_seconds": 3600})["saved"]
    assert tools.ok("cleanup_expired")["deleted"] == 0
    clock.advance(2 * 3600)
    assert brief not in recalled(tools, "build cache warm"), "an expired memory is never recalled"
    assert tools.ok("cleanup_expired")["deleted"] == 1
    assert memory_row(graph, brief) is None
    assert {m["id"] for m in tools.ok("list_memories")["memories"]} == set(ids.values())


def test_a_rejected_write_leaves_the_store_unchanged(tools: Tools, graph: MemoryGraph) -> None:
    seed(tools)
    before = state(graph)
    refused = tools("remember", {"content": "", "keys": ["x"]})
    assert refused.is_error or "error" in refused.result
    assert state(graph) == before


def test_the_push_path_surfaces_the_memory_a_prompt_is_about_and_nothing_otherwise(
        tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    before = state(graph)
    hit = push.inject(graph, "the e2e run can't reach staging: the certificate is self-signed", scope=None)
    assert [m.id for m in hit.memories] == [ids["cert"]]
    assert hit.context is not None and "(why: " in hit.context
    miss = push.inject(graph, "Explain the difference between a process and a thread", scope=None)
    assert miss.memories == [] and miss.context is None
    assert state(graph) == before, "injecting never reinforces"


def test_the_push_path_holds_back_what_the_session_was_already_shown(tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    prompt = "the e2e run can't reach staging: the certificate is self-signed"
    again = push.inject(graph, prompt, scope=None, session=push.SessionView({ids["cert"]: 1}, 1))
    assert again.memories == [] and again.held_back == [ids["cert"]]
