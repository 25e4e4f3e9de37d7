"""The activity log: bounded by entries and days, off when told, pruned by the cleanup, and
what it records for tool writes and for the push path."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import FakeClock

from keymem_daemon.activity_log import ActivityLog, describe_injection, describe_tool_call
from keymem_daemon.config import INJECT_LOG_DEFAULT, Settings, parse_activity_log
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import ConfigError
from keymem_daemon.service import InjectRequest, Service

pytestmark = pytest.mark.timeout(60)


def test_the_setting_takes_on_off_entries_and_days() -> None:
    assert parse_activity_log("KEYMEM_INJECT_LOG", "on") == INJECT_LOG_DEFAULT
    assert parse_activity_log("KEYMEM_INJECT_LOG", "off") is None
    assert parse_activity_log("KEYMEM_INJECT_LOG", "200") == (200, INJECT_LOG_DEFAULT[1])
    assert parse_activity_log("KEYMEM_INJECT_LOG", "200,7") == (200, 7.0)
    for bad in ("lots", "0,5", "10,0", "10,x", "-3"):
        with pytest.raises(ConfigError, match="KEYMEM_INJECT_LOG"):
            parse_activity_log("KEYMEM_INJECT_LOG", bad)
    assert Settings.from_env({"HOME": "/tmp", "KEYMEM_INJECT_LOG": "off"}).activity_log is None
    assert Settings.from_env({"HOME": "/tmp"}).activity_log == INJECT_LOG_DEFAULT


def test_the_log_keeps_the_newest_n_entries(graph: MemoryGraph, clock: FakeClock) -> None:
    log = ActivityLog(graph.store, (3, 30.0), clock=clock)
    try:
        for i in range(5):
            log.record("remember", f"entry {i}", {"i": i})
            log.flush()
        page = log.page()
        assert [e.summary for e in page.entries] == ["entry 4", "entry 3", "entry 2"]
        assert [e.summary for e in log.page(after=page.entries[1].id).entries] == ["entry 4"]
        assert [e.summary for e in log.page(before=page.entries[0].id, limit=1).entries] == ["entry 3"]
    finally:
        log.close()


def test_the_cleanup_drops_entries_older_than_the_days(graph: MemoryGraph, clock: FakeClock) -> None:
    log = ActivityLog(graph.store, (100, 2.0), clock=clock)
    try:
        log.record("inject", "old", {})
        clock.advance(3 * 86400)
        log.record("inject", "new", {})
        log.flush()
        assert log.prune() == 1
        assert [e.summary for e in log.page().entries] == ["new"]
    finally:
        log.close()


def test_off_records_nothing_and_the_cleanup_empties_what_was_there(graph: MemoryGraph, clock: FakeClock) -> None:
    before = ActivityLog(graph.store, (100, 30.0), clock=clock)
    before.record("remember", "kept from before", {})
    before.close()
    off = ActivityLog(graph.store, None, clock=clock)
    off.record("remember", "never written", {})
    off.flush()
    assert [e.summary for e in off.page().entries] == ["kept from before"] and not off.page().enabled
    assert off.prune() == 1 and off.page().entries == []


def test_tool_writes_and_injections_are_recorded_by_the_service(graph: MemoryGraph, clock: FakeClock,
                                                                tmp_path: Path) -> None:
    service = Service(Settings(data_dir=tmp_path), clock=clock)
    service.graph = graph
    service.activity = ActivityLog(graph.store, INJECT_LOG_DEFAULT, clock=clock)
    try:
        saved = service.call_tool("remember", {"content": "The billing staging database listens on port 5433.",
                                               "keys": ["billing", "staging database", "port"]}, Host()).result
        service.call_tool("forget", {"memory_id": "000000000000"}, Host())  # nothing deleted: not logged
        service.call_tool("remember", {"content": "x"}, Host())  # refused: not logged
        service.inject(InjectRequest(prompt="Which port does the billing staging database listen on?"))
        service.inject(InjectRequest(prompt="/compact the conversation"))
        service.call_tool("forget", {"memory_id": saved["saved"]}, Host(), actor="inspector")
        service.activity.flush()
        entries = list(reversed(service.activity.page().entries))
        assert [e.kind for e in entries] == ["remember", "inject", "inject", "forget"]
        assert entries[0].memory_id == saved["saved"] and entries[0].detail["actor"] == "agent"
        surfaced = entries[1].detail
        assert surfaced["prompt"].startswith("Which port") and surfaced["memories"][0]["id"] == saved["saved"]
        assert surfaced["memories"][0]["relevance_score"] > 0 and "context" not in surfaced
        assert entries[2].detail["silent"] == "slash command" and "stayed silent" in entries[2].summary
        assert entries[3].detail["actor"] == "inspector" and "5433" in entries[3].detail["content"], \
            "a forget keeps a preview of what was deleted"
        assert service.cleanup()["pruned_activity"] == 0
    finally:
        service.activity.close()


def test_watchers_wake_after_each_stored_batch_and_once_more_when_watching_ends(
        graph: MemoryGraph, clock: FakeClock) -> None:
    log = ActivityLog(graph.store, (100, 30.0), clock=clock)
    seen: list[int] = []
    unwatch = log.watch(lambda: seen.append(log.page().latest_id))
    try:
        log.record("remember", "one", {})
        log.flush()
        assert seen and seen[-1] == log.page().latest_id > 0, "woken after the entry was stored"
        unwatch()
        log.record("remember", "two", {})
        log.flush()
        assert len(seen) == 1, "no wake after unwatching"
        log.watch(lambda: seen.append(-1))
        assert not log.watches_ended
        log.end_watches()
        assert log.watches_ended and seen[-1] == -1
    finally:
        log.close()


def test_descriptions_skip_refusals_and_no_ops() -> None:
    assert describe_tool_call("forget", {"memory_id": "a"}, {"error": "nope"}, actor="x") is None
    assert describe_tool_call("forget", {"memory_id": "a"}, {"deleted": False}, actor="x") is None
    assert describe_tool_call("confirm_memory", {"memory_id": "a"}, {"confirmed": False}, actor="x") is None
    summary, detail = describe_injection({"prompt": "p " * 500}, {"memories": [], "keys": [], "took_ms": 1.0})
    assert len(detail["prompt"]) <= 160 and detail["silent"] == "nothing cleared the relevance floor"
    assert "stayed silent" in summary
