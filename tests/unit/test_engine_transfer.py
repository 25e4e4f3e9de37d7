"""Export and import: a lossless round trip through a fresh store, upstream keymem's
graph.json, and malformed imports that name the bad record and change nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import DAY, START, FakeClock, StoreAt, key_id, link_weight, open_graph, remember, state

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput
from keymem_daemon.inference.embedders import Embedder

pytestmark = pytest.mark.timeout(60)


def populate(graph: MemoryGraph, clock: FakeClock) -> dict[str, str]:  # noqa: F811
    host = Host(agent="claude", session="4f1c2d3e-5a6b-4c7d-8e9f-0a1b2c3d4e5f", turn=4)
    m = {
        "python": remember(
            graph,
            "The user writes Python every day",
            ["Python", "파이썬", "programming"],
            host=host,
        ),
        "deploy": remember(
            graph,
            "Deploys go out on Fridays",
            ["deployment", "배포", "Friday"],
            source={"origin": "standup"},
            decay_profile="stable",
        ),
        "mina": remember(
            graph,
            "Mina runs the design team",
            ["Mina", "design"],
            key_types={"Mina": "name"},
            namespace="work",
            observed_at="2023-05-08",
        ),
        "temp": remember(
            graph, "The demo link is valid this week", ["demo", "link"], ttl_seconds=7 * DAY
        ),
        "home": remember(graph, "The user grew up in Busan near the sea", ["hometown", "Busan"]),
    }
    m["linked"] = remember(
        graph, "Release notes go to #releases", ["release", "Slack"], related_to=[m["deploy"]]
    )
    graph.read_memory(m["python"], via_key_id=key_id(graph, "Python"))
    graph.confirm_memory(m["deploy"], "user", host=host)
    graph.dismiss(m["mina"], key_id(graph, "design"))
    m["deploy2"] = graph.correct(
        m["deploy"],
        graph.prepare(content="Deploys go out on Thursdays", keys=None, require_keys=False),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    ).new_id  # type: ignore[union-attr]
    # A learned alias and a pending candidate.
    for _ in range(3):
        recall(graph, "birthplace")
        graph.read_memory(m["home"], via_key_id=key_id(graph, "hometown"))
    recall(graph, "espresso hometown")
    recall(graph, "place of birth")
    graph.read_memory(m["home"], via_key_id=key_id(graph, "hometown"))
    clock.advance(DAY)
    return m


def fresh_graph(
    tmp_path: Path,
    new_store: Callable[[str], StoreAt],
    name: str,
    embedder: Embedder,
    analyzer: Analyzer,  # noqa: F811
    clock: FakeClock,
) -> MemoryGraph:  # noqa: F811
    """The engine over a new, empty store of the test's backend."""
    return open_graph(new_store(name), embedder, Settings(data_dir=tmp_path / name), clock, analyzer)


def test_export_then_import_into_a_fresh_store_gives_the_same_export(
    graph: MemoryGraph,
    tmp_path: Path,
    new_store: Callable[[str], StoreAt],
    embedder: Embedder,
    analyzer: Analyzer,  # noqa: F811
    clock: FakeClock,
) -> None:  # noqa: F811
    m = populate(graph, clock)
    exported = transfer.export(graph)
    assert exported["format"] == "keymem-export" and exported["version"] == 1
    assert exported["embedder"] == embedder.fingerprint
    assert len(exported["memories"]) == 7, "superseded history is exported too"
    assert any(a["learned"] for k in exported["keys"] for a in k["aliases"])
    assert exported["relations"] and exported["links"]
    text = json.dumps(exported, ensure_ascii=False)
    other = fresh_graph(tmp_path, new_store, "copy", embedder, analyzer, clock)
    try:
        report = transfer.import_data(other, json.loads(text))
        assert report["imported"]["memories"] == 7
        assert transfer.export(other) == exported
        # The imported store works: indexes and key vectors were rebuilt.
        python = key_id(other, "파이썬")
        assert recall(other, "파이썬").keys[0].key_id == python
        assert recall(other, "birthplace").keys[0].match_type == "alias"
        assert link_weight(other, python, m["python"]) == pytest.approx(1.1)
        assert other.read_memory(m["deploy2"]).memory.supersedes == m["deploy"]
        hits = hybrid_recall(other, "Thursdays deployment", reinforce=False).hits
        assert hits[0].id == m["deploy2"]
    finally:
        other.close()


def test_an_export_with_vectors_round_trips_without_re_embedding(
    graph: MemoryGraph,
    tmp_path: Path,
    new_store: Callable[[str], StoreAt],
    embedder: Embedder,
    analyzer: Analyzer,  # noqa: F811
    clock: FakeClock,
) -> None:  # noqa: F811
    populate(graph, clock)
    exported = transfer.export(graph, include_vectors=True)
    other = fresh_graph(tmp_path, new_store, "copy", embedder, analyzer, clock)
    try:
        transfer.import_data(other, exported)
        assert transfer.export(other, include_vectors=True) == exported
    finally:
        other.close()


def test_importing_the_same_export_twice_duplicates_nothing(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    populate(graph, clock)
    exported = transfer.export(graph)
    report = transfer.import_data(graph, exported)
    assert report["imported"]["memories"] == 0
    assert report["skipped"]["memories"] == len(exported["memories"])
    assert transfer.export(graph) == exported


UPSTREAM_KEYS = {
    "a1b2c3d4e5f6": {
        "id": "a1b2c3d4e5f6",
        "concept": "Python",
        "aliases": ["파이썬", "py3"],
        "embedding": [],
        "key_type": "concept",
        "learnedAliases": [{"alias": "py3", "addedAt": START - 10 * DAY, "hits": 2}],
    },
    "0a0b0c0d0e0f": {
        "id": "0a0b0c0d0e0f",
        "concept": "동건",
        "aliases": [],
        "embedding": [],
        "key_type": "name",
    },
    "111111111111": {
        "id": "111111111111",
        "concept": "residence",
        "aliases": ["거주지"],
        "embedding": [],
        "key_type": "concept",
    },
}


def upstream_memory(mid: str, content: str, **extra: Any) -> dict[str, Any]:
    base = {
        "id": mid,
        "content": content,
        "embedding": [],
        "created_at": START - 100 * DAY,
        "source": None,
        "supersedes": None,
        "depth": 0.0,
        "access_count": 0,
        "last_accessed": 0,
        "namespace": "default",
        "ttl": None,
        "links": [],
        "contradicts": [],
    }
    base.update(extra)
    return base


def upstream_graph() -> dict[str, Any]:
    return {
        "keys": copy.deepcopy(UPSTREAM_KEYS),
        "memories": {
            "aaaaaaaaaaaa": upstream_memory(
                "aaaaaaaaaaaa",
                "The user writes Python every day",
                depth=0.35,
                access_count=4,
                last_accessed=START - DAY,
                namespace=" Work ",
                source={"tool": "remember", "session": "s1"},
                last_confirmed_at=START - 5 * DAY,
                confirmation_count=3,
                decay_profile="stable",
                last_confirmation_evidence="user",
            ),
            "bbbbbbbbbbbb": upstream_memory(
                "bbbbbbbbbbbb", "동건은 클라이밍을 좋아한다", links=["aaaaaaaaaaaa"]
            ),
            "cccccccccccc": upstream_memory("cccccccccccc", "The user lives in Seoul"),
            "dddddddddddd": upstream_memory(
                "dddddddddddd",
                "The user lives in Busan",
                supersedes="cccccccccccc",
                created_at=START - 50 * DAY,
            ),
            "eeeeeeeeeeee": upstream_memory(
                "eeeeeeeeeeee", "A note that expires", ttl=START + 3600
            ),
        },
        "links": [
            {"key_id": "a1b2c3d4e5f6", "memory_id": "aaaaaaaaaaaa", "weight": 1.7},
            {"key_id": "0a0b0c0d0e0f", "memory_id": "bbbbbbbbbbbb", "weight": 1.0},
            {"key_id": "111111111111", "memory_id": "cccccccccccc", "weight": 1.0},
            {"key_id": "111111111111", "memory_id": "dddddddddddd", "weight": 0.85, "auto": True},
            {"key_id": "111111111111", "memory_id": "eeeeeeeeeeee", "weight": 1.0},
        ],
        "meta": {"embeddingFingerprint": "local:bge-m3+nopad", "schemaVersion": 2},
    }


def test_an_upstream_graph_json_imports(graph: MemoryGraph, clock: FakeClock) -> None:  # noqa: F811
    report = transfer.import_data(
        graph, json.loads(json.dumps(upstream_graph(), ensure_ascii=False))
    )
    assert report["imported"] == {"keys": 3, "memories": 5, "links": 5, "relations": 1}
    python = graph.read_memory("aaaaaaaaaaaa")
    assert python.memory.namespace == "work"
    assert (python.memory.depth, python.memory.access_count) == (0.35, 5)
    assert (
        python.memory.validity.decay_profile == "stable"
        and python.memory.validity.confirmation_count == 3
    )
    assert python.memory.source == {"tool": "remember", "session": "s1"}
    key = next(k for k in python.keys if k.key_id == "a1b2c3d4e5f6")
    assert (
        key.link_weight == 1.7
        and set(key.aliases) == {"파이썬", "py3"}
        and key.learned_aliases == ["py3"]
    )
    assert graph.read_memory("bbbbbbbbbbbb").memory.related_to == ["aaaaaaaaaaaa"]
    assert graph.keys.get("0a0b0c0d0e0f").key_type == "name"  # type: ignore[union-attr]
    # Supersession is rebuilt from `supersedes`; the old version is history only.
    busan = graph.read_memory("dddddddddddd")
    assert busan.memory.supersedes == "cccccccccccc"
    assert next(k for k in busan.keys if k.key_id == "111111111111").auto is True
    with pytest.raises(Exception, match="superseded by dddddddddddd"):
        graph.read_memory("cccccccccccc")
    assert graph.read_memory("eeeeeeeeeeee").memory.expires_at == START + 3600
    # Retrieval works on the imported graph.
    assert recall(graph, "파이썬", namespace="work").memories[0].id == "aaaaaaaaaaaa"
    assert recall(graph, "거주지").memories[0].id in ("dddddddddddd", "eeeeeeeeeeee")
    assert recall(graph, "동건").memories[0].id == "bbbbbbbbbbbb"
    clock.advance(3601)
    assert graph.cleanup_expired().deleted == 1


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["memories"]["bbbbbbbbbbbb"].pop("content"), "memories[1].content"),
        (
            lambda d: d["memories"]["cccccccccccc"].update(decay_profile="forever"),
            "memories[2].decay_profile",
        ),
        (lambda d: d["memories"]["aaaaaaaaaaaa"].update(depth=7), "memories[0].depth"),
        (
            lambda d: d["memories"]["aaaaaaaaaaaa"].update(created_at="yesterday"),
            "memories[0].created_at",
        ),
        (lambda d: d["keys"]["0a0b0c0d0e0f"].update(key_type="person"), "keys[1].key_type"),
        (lambda d: d["keys"]["111111111111"].update(concept=""), "keys[2].concept"),
        (
            lambda d: d["links"].append({"key_id": "ffffffffffff", "memory_id": "aaaaaaaaaaaa"}),
            "links[5].key_id",
        ),
        (
            lambda d: d["links"].append({"key_id": "a1b2c3d4e5f6", "memory_id": "ffffffffffff"}),
            "links[5].memory_id",
        ),
        (lambda d: d["links"][0].update(weight="heavy"), "links[0].weight"),
    ],
)
def test_a_malformed_upstream_import_names_the_bad_record_and_changes_nothing(
    graph: MemoryGraph, mutate: Any, field: str
) -> None:
    remember(graph, "Deploys go out on Fridays", ["deployment", "Friday"])
    before = state(graph)
    data = upstream_graph()
    mutate(data)
    with pytest.raises(InvalidInput) as caught:
        transfer.import_data(graph, data)
    assert caught.value.field == field
    assert field in caught.value.message
    assert state(graph) == before


def test_a_malformed_export_names_the_bad_record_and_changes_nothing(
    graph: MemoryGraph, clock: FakeClock
) -> None:  # noqa: F811
    populate(graph, clock)
    exported = transfer.export(graph)
    before = state(graph)
    bad = copy.deepcopy(exported)
    bad["memories"][3]["namespace"] = 12
    with pytest.raises(InvalidInput, match=r"memories\[3\]\.namespace"):
        transfer.import_data(graph, bad)
    bad = copy.deepcopy(exported)
    bad["keys"].append(dict(bad["keys"][0]))
    with pytest.raises(InvalidInput, match="repeats key id"):
        transfer.import_data(graph, bad)
    bad = copy.deepcopy(exported)
    bad["version"] = 99
    with pytest.raises(InvalidInput, match="version"):
        transfer.import_data(graph, bad)
    with pytest.raises(InvalidInput) as caught:
        transfer.import_data(graph, {"hello": "world"})
    assert caught.value.field == "format"
    assert state(graph) == before


def test_an_imported_key_with_the_text_of_an_existing_key_lands_on_it(graph: MemoryGraph) -> None:
    existing = remember(graph, "The user writes Python every day", ["python", "programming"])
    python = key_id(graph, "python")
    report = transfer.import_data(graph, upstream_graph())
    assert report["skipped"]["keys"] == 1
    assert key_id(graph, "Python") == python
    members = {h.memory_id for h in graph.read_key(python).memories}
    assert members == {existing, "aaaaaaaaaaaa"}
    assert "파이썬" in graph.keys.get(python).aliases  # type: ignore[union-attr]
