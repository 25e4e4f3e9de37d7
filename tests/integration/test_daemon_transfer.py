"""Export -> wipe -> import through the daemon's HTTP API gives the same store back."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import DaemonFactory, DaemonProcess

pytestmark = pytest.mark.timeout(180)

SESSION = "5f0c9a3e-1b2d-4c6e-8f70-123456789abc"


def _populate(daemon: DaemonProcess) -> None:
    """A store with every kind of record: keys in two languages, aliases, history, relations."""
    host = {"X-Keymem-Host-Agent": "claude", "X-Keymem-Host-Session": SESSION}
    first = daemon.remember("The user lives in Seoul", ["residence", "서울", "Seoul"])
    daemon.remember("민수는 매일 아침 커피를 마신다", ["민수", "커피", "coffee"], key_types={"민수": "name"})
    editor = daemon.remember(
        "The user prefers vim over emacs",
        ["editor", "vim", "preference"],
        namespace="Work",
        decay_profile="stable",
    )
    daemon.remember(
        "Sprint review is on Friday",
        ["sprint", "review", "schedule"],
        ttl_seconds=86400,
        related_to=[editor],
    )
    corrected = daemon.call(
        "correct",
        {
            "memory_id": first,
            "content": "The user moved to Busan",
            "keys": ["residence", "Busan", "부산"],
        },
        **host,
    )
    assert not corrected["is_error"], corrected
    batch = daemon.call(
        "remember_batch",
        {
            "items": [
                {"content": "Deploys run from ops/deploy.sh", "keys": ["deploy", "script", "배포"]},
                {
                    "content": "The staging database is Postgres 16",
                    "keys": ["database", "staging", "postgres"],
                },
            ]
        },
    )
    assert batch["result"]["saved"] == 2, batch
    found = daemon.call("recall", {"query": "editor", "namespace": "work"})["result"]
    key_id = found["keys"][0]["key_id"]
    daemon.call("read_memory", {"memory_id": editor, "via_key_id": key_id, "namespace": "work"})
    daemon.call("confirm_memory", {"memory_id": editor, "evidence": "user", "namespace": "work"}, **host)
    daemon.call("dismiss", {"memory_id": editor, "key_id": key_id, "namespace": "work"})


def _export(daemon: DaemonProcess, *, vectors: bool = False) -> dict[str, Any]:
    response = daemon.client().post("/v1/export", json={"include_vectors": vectors})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def _import(daemon: DaemonProcess, data: dict[str, Any]) -> dict[str, Any]:
    response = daemon.client(timeout=120).post("/v1/import", json=data)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    events = [json.loads(line) for line in response.text.splitlines()]
    assert events[-1]["event"] == "done", events[-1]
    assert all(e["event"] == "progress" for e in events[:-1])
    result: dict[str, Any] = events[-1]["result"]
    return result


@pytest.mark.parametrize("vectors", [False, True], ids=["text-only", "with-vectors"])
def test_export_wipe_import_is_identity(tmp_path: Path, vectors: bool) -> None:
    source = DaemonFactory(tmp_path / "source")
    target = DaemonFactory(tmp_path / "target")
    (tmp_path / "source").mkdir()
    (tmp_path / "target").mkdir()
    try:
        # Both start at once (a start is most of this test's time): the target's store is a
        # new, empty data directory -- the wiped store -- whenever it starts.
        with ThreadPoolExecutor(2) as starting:
            original, fresh = starting.map(DaemonFactory.start, (source, target))
        _populate(original)
        exported = _export(original, vectors=vectors)
        assert len(exported["memories"]) == 7 and exported["keys"] and exported["links"]
        assert exported["relations"], "the explicit relation was not exported"

        assert _export(fresh)["memories"] == []
        result = _import(fresh, exported)
        assert result["imported"]["memories"] == 7
        again = _export(fresh, vectors=vectors)
        assert again == exported

        # The imported store works: recall finds by key and by the other language.
        found = fresh.call("recall", {"query": "부산"})["result"]
        assert found["status"] == "found"
        # Importing the same export again is a merge that changes nothing.
        assert _import(fresh, exported)["skipped"]["memories"] == 7
        assert _export(fresh, vectors=vectors) == exported
    finally:
        source.teardown()
        target.teardown()


def test_an_upstream_graph_json_imports_over_http(daemon: DaemonProcess) -> None:
    now = time.time()
    graph = {
        "keys": {
            "a1b2c3d4e5f6": {
                "id": "a1b2c3d4e5f6",
                "concept": "python",
                "aliases": ["파이썬"],
                "learnedAliases": [{"alias": "파이썬", "addedAt": now - 10, "hits": 2}],
            },
            "0a0b0c0d0e0f": {"id": "0a0b0c0d0e0f", "concept": "climbing", "aliases": []},
        },
        "memories": {
            "aaaaaaaaaaaa": {
                "id": "aaaaaaaaaaaa",
                "content": "The user writes Python every day",
                "created_at": now - 1000,
                "namespace": "default",
                "links": ["bbbbbbbbbbbb"],
            },
            "bbbbbbbbbbbb": {
                "id": "bbbbbbbbbbbb",
                "content": "동건은 클라이밍을 좋아한다",
                "created_at": now - 500,
                "namespace": "default",
            },
        },
        "links": [
            {"key_id": "a1b2c3d4e5f6", "memory_id": "aaaaaaaaaaaa", "weight": 1.5},
            {"key_id": "0a0b0c0d0e0f", "memory_id": "bbbbbbbbbbbb", "weight": 1.0},
        ],
        "meta": {"embeddingFingerprint": "local:bge-m3+nopad"},
    }
    result = _import(daemon, graph)
    assert result["imported"]["memories"] == 2
    exported = _export(daemon)
    assert {m["id"] for m in exported["memories"]} == {"aaaaaaaaaaaa", "bbbbbbbbbbbb"}
    read = daemon.call("read_memory", {"memory_id": "aaaaaaaaaaaa"})["result"]
    assert read["memory"]["content"] == "The user writes Python every day"


def test_an_invalid_import_names_the_record_and_changes_nothing(daemon: DaemonProcess) -> None:
    daemon.remember("Existing memory stays as it is", ["existing", "memory"])
    before = _export(daemon)
    bad = {
        "format": "keymem-export",
        "version": 1,
        "keys": [{"id": "k1", "concept": "ok"}],
        "memories": [{"id": "m1", "content": "fine"}, {"id": "m2", "content": 42}],
        "links": [{"key_id": "k1", "memory_id": "m1"}],
    }
    response = daemon.client().post("/v1/import", json=bad)
    assert response.status_code == 200
    last = json.loads(response.text.splitlines()[-1])
    assert last["event"] == "error" and "memories[1]" in last["error"]["message"]
    assert _export(daemon) == before
