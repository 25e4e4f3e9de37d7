"""Named scenarios: an agent's associative walk, cross-lingual keys, names that never
bleed, corrections, TTL expiry, namespace isolation and a reopened store -- each run the
way an agent runs it, through the MCP tools."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import FakeClock, StoreAt, Tools, memory_row, open_graph

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.inference.embedders import Embedder

pytestmark = pytest.mark.timeout(60)

NEWTON = "Newton discovered gravity when an apple fell"
APPLES = "Apples are a fruit"
STRAWBERRIES = "The user loves strawberries"


def save(tools: Tools, content: str, keys: list[str], **fields: object) -> str:  # noqa: F811
    return str(tools.ok("remember", {"content": content, "keys": keys, **fields})["saved"])


def newton_graph(tools: Tools) -> dict[str, str]:  # noqa: F811
    return {
        "newton": save(tools, NEWTON, ["Newton", "apple", "gravity"]),
        "apples": save(tools, APPLES, ["apple", "fruit", "red"]),
        "strawberries": save(tools, STRAWBERRIES, ["fruit", "strawberry", "preference"]),
    }


def connected(memory: dict, concept: str) -> str:  # type: ignore[type-arg]
    return str(next(k["key_id"] for k in memory["keys"] if k["concept"] == concept))


def test_the_newton_apple_fruit_strawberry_walk(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    m = newton_graph(tools)
    found = tools.ok("recall", {"query": "Newton"})
    assert found["keys"][0]["concept"] == "Newton"
    top = found["memories"][0]
    assert top["id"] == m["newton"]
    apple = next(k["key_id"] for k in top["connected_keys"] if k["concept"] == "apple")

    first = tools.ok(
        "read_memory", {"memory_id": top["id"], "via_key_id": top["matched_key"]["key_id"]}
    )
    assert first["memory"]["content"] == NEWTON
    assert connected(first, "apple") == apple

    under_apple = tools.ok("read_key", {"key_id": apple, "query": "fruit"})
    assert {h["memory_id"] for h in under_apple["memories"]} == {m["newton"], m["apples"]}
    second = tools.ok("read_memory", {"memory_id": m["apples"], "via_key_id": apple})
    assert second["memory"]["content"] == APPLES
    fruit = connected(second, "fruit")

    under_fruit = tools.ok("read_key", {"key_id": fruit, "query": "what fruit does the user love"})
    assert m["strawberries"] in [h["memory_id"] for h in under_fruit["memories"]]
    third = tools.ok("read_memory", {"memory_id": m["strawberries"], "via_key_id": fruit})
    assert third["memory"]["content"] == STRAWBERRIES
    assert third["keys"][0]["key_id"] == fruit and third["keys"][0]["traversed_from"] is True


def test_hybrid_recall_of_newton_with_three_hops_includes_the_strawberries(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    m = newton_graph(tools)
    hits = tools.ok(
        "recall_memories", {"query": "Newton", "hops": 3, "top_k": 5, "reinforce": False}
    )
    found = [h["id"] for h in hits]
    assert found[0] == m["newton"]
    assert m["strawberries"] in found


def test_hybrid_recall_walks_newton_to_strawberries_through_its_keys(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    m = newton_graph(tools)
    hits = {
        h["id"]: h
        for h in tools.ok(
            "recall_memories", {"query": "Newton", "hops": 3, "top_k": 5, "reinforce": False}
        )
    }
    assert hits[m["apples"]]["hop"] == 2 and "apple(via)" in hits[m["apples"]]["matched_via"]
    assert (
        hits[m["strawberries"]]["hop"] == 3
        and "fruit(via)" in hits[m["strawberries"]]["matched_via"]
    )
    two = [
        h["id"]
        for h in tools.ok(
            "recall_memories", {"query": "Newton", "hops": 2, "top_k": 5, "reinforce": False}
        )
    ]
    assert m["strawberries"] not in two, "two hops stop at the apples"


def test_파이썬_and_python_land_on_one_key_reached_from_either_language(
    graph: MemoryGraph, tools: Tools
) -> None:  # noqa: F811
    mid = save(
        tools, "The user writes Python every day", ["Python", "파이썬", "programming", "프로그래밍"]
    )
    browse = tools.ok("browse_keys", {"namespace": "default"})
    python = [k for k in browse["keys"] if "파이썬" in [k["concept"], *k["aliases"]]]
    assert (
        len(python) == 1 and python[0]["concept"] == "Python" and "파이썬" in python[0]["aliases"]
    )
    for query in ("파이썬", "Python", "파이썬으로 뭘 해?"):
        found = tools.ok("recall", {"query": query})
        assert found["keys"][0]["key_id"] == python[0]["key_id"], query
        assert found["memories"][0]["id"] == mid


def test_동건_never_matches_뉴턴(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    dong = save(
        tools,
        "동건은 주말마다 클라이밍을 한다",
        ["동건", "클라이밍", "climbing"],
        key_types={"동건": "name"},
    )
    save(
        tools,
        "뉴턴은 사과가 떨어지는 것을 보고 중력을 생각했다",
        ["뉴턴", "중력", "gravity"],
        key_types={"뉴턴": "name"},
    )
    found = tools.ok("recall", {"query": "동건"})
    assert [k["concept"] for k in found["keys"]][0] == "동건"
    assert "뉴턴" not in [k["concept"] for k in found["keys"]]
    assert found["memories"][0]["id"] == dong
    assert "동건" not in [k["concept"] for k in tools.ok("recall", {"query": "뉴턴"})["keys"]]


def test_a_correction_hides_its_predecessor_from_recall(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    seoul = save(tools, "The user lives in Seoul", ["residence", "거주지", "home"])
    busan = tools.ok("correct", {"memory_id": seoul, "content": "The user lives in Busan"})[
        "new_id"
    ]
    found = tools.ok("recall", {"query": "residence", "context": "where does the user live?"})
    assert found["memories"][0]["id"] == busan
    assert found["keys"][0]["memory_count"] == 1
    handles = tools.ok("read_key", {"key_id": found["keys"][0]["key_id"]})["memories"]
    assert [h["memory_id"] for h in handles] == [busan]
    hits = tools.ok(
        "recall_memories", {"query": "where does the user live, Seoul or Busan", "reinforce": False}
    )
    assert seoul not in [h["id"] for h in hits]
    assert "superseded by" in tools("read_memory", {"memory_id": seoul}).result["error"]


def test_a_ttl_expiry_hides_everywhere_then_cleanup_deletes(
    graph: MemoryGraph,
    tools: Tools,  # noqa: F811
    clock: FakeClock,
) -> None:  # noqa: F811
    keep = save(tools, "The office is on floor 3", ["office", "floor"])
    temp = save(
        tools, "The office wifi password changes on Monday", ["office", "wifi"], ttl_seconds=3600
    )
    wifi = graph.keys.by_norm("wifi")
    assert wifi is not None
    assert tools.ok("recall", {"query": "wifi"})["memories"][0]["id"] == temp
    clock.advance(3600)
    assert tools.ok("read_memory", {"memory_id": temp})["memory"]["id"] == temp, (
        "alive at expires_at itself"
    )
    clock.advance(1)
    assert "not found" in tools("read_memory", {"memory_id": temp}).result["error"]
    assert (
        tools.ok("recall", {"query": "wifi"})["status"] != "found"
        or tools.ok("recall", {"query": "wifi"})["memories"][0]["id"] != temp
    )
    assert "wifi" not in [k["concept"] for k in tools.ok("browse_keys", {})["keys"]]
    office = graph.keys.by_norm("office")
    assert [h["memory_id"] for h in tools.ok("read_key", {"key_id": office})["memories"]] == [keep]
    assert temp not in [
        h["id"] for h in tools.ok("recall_memories", {"query": "office wifi", "reinforce": False})
    ]
    assert [m["id"] for m in tools.ok("list_memories", {})["memories"]] == [keep]
    assert tools.ok("memory_stats")["memories"] == 1
    assert (
        "not found"
        in tools("confirm_memory", {"memory_id": temp, "evidence": "user"}).result["error"]
    )
    assert memory_row(graph, temp) is not None
    assert tools.ok("cleanup_expired")["deleted"] == 1
    assert memory_row(graph, temp) is None
    assert graph.keys.get(wifi) is None


def test_namespaces_are_isolated(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    work = save(tools, "Deploys need two approvals", ["deployment", "approval"], namespace="work")
    home = save(
        tools, "The home server deploys itself nightly", ["deployment", "server"], namespace="home"
    )
    work_recall = tools.ok("recall", {"query": "deployment", "namespace": "work"})
    assert [m["id"] for m in work_recall["memories"]] == [work]
    assert work_recall["keys"][0]["memory_count"] == 1
    deploy = work_recall["keys"][0]["key_id"]
    assert [
        h["memory_id"]
        for h in tools.ok("read_key", {"key_id": deploy, "namespace": "work"})["memories"]
    ] == [work]
    assert {k["concept"] for k in tools.ok("browse_keys", {"namespace": "work"})["keys"]} == {
        "deployment",
        "approval",
    }
    assert (
        "not found"
        in tools("read_memory", {"memory_id": home, "namespace": "work"}).result["error"]
    )
    hits = tools.ok(
        "recall_memories", {"query": "deployment", "namespace": "work", "reinforce": False}
    )
    assert [h["id"] for h in hits] == [work]
    assert tools.ok("recall", {"query": "server", "namespace": "work"})["status"] == "no_match"
    assert (
        tools.ok("recall", {"query": "deployment", "namespace": "home"})["memories"][0]["id"]
        == home
    )


def test_reopening_the_store_loses_nothing_and_recall_still_works(
    tmp_path: Path,
    store_at: StoreAt,
    embedder: Embedder,  # noqa: F811
    analyzer: Analyzer,
    clock: FakeClock,
) -> None:  # noqa: F811
    settings = Settings(data_dir=tmp_path, tools="full")
    first = open_graph(store_at, embedder, settings, clock, analyzer)
    t = Tools(
        first,
        settings,
        Host(agent="claude", session="4f1c2d3e-5a6b-4c7d-8e9f-0a1b2c3d4e5f", turn=1),
    )
    m = newton_graph(t)
    found = t.ok("recall", {"query": "Newton"})
    apple = next(
        k["key_id"] for k in found["memories"][0]["connected_keys"] if k["concept"] == "apple"
    )
    t.ok("read_memory", {"memory_id": m["apples"], "via_key_id": apple})
    t.ok("confirm_memory", {"memory_id": m["strawberries"], "evidence": "user"})
    before = transfer.export(first)
    first.close()

    second = open_graph(store_at, embedder, settings, clock, analyzer)
    try:
        assert transfer.export(second) == before
        t2 = Tools(second, settings, Host())
        again = t2.ok("recall", {"query": "Newton"})
        assert again["memories"][0]["id"] == m["newton"]
        read = t2.ok("read_memory", {"memory_id": m["apples"], "via_key_id": apple})
        assert read["memory"]["access_count"] == 2
        assert next(k for k in read["keys"] if k["key_id"] == apple)[
            "link_weight"
        ] == pytest.approx(1.2)
        assert t2.ok("recall", {"query": "strawberry"})["memories"][0]["depth"] == 0.05
    finally:
        second.close()
