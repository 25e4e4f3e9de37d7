"""The engine's logic on the fast tier: remember, recall, read_key, read_memory, correct,
forget, confirm, dismiss, cleanup and the push decision, through the tool layer as the
daemon runs it, with the deterministic ``HashingEmbedder`` (so what is asserted follows
from the engine's rules and shared words, not from a model's sense). Each test runs on a
SQLite file and on the in-memory repository; the rows are read back through the ports."""

from __future__ import annotations

import itertools
import secrets
import uuid
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import DAY, FakeClock, Tools, open_graph
from fakes import InMemoryRepository

from keymem_daemon.activity_log import ActivityLog
from keymem_daemon.config import Settings
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.ports import MemoryFilter, Reader, Writer
from keymem_daemon.engine.reads import inject as push
from keymem_daemon.engine.records import Memory, render
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.inference.embedders import Embedder

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


def memory(graph: MemoryGraph, mid: str) -> Memory | None:
    def read(r: Reader) -> Memory | None:
        return r.memory(mid)

    return graph.store.read(read)


def weight(graph: MemoryGraph, kid: str, mid: str) -> float | None:
    def read(r: Reader) -> float | None:
        return r.link_weight(kid, mid)

    return graph.store.read(read)


def active(tools: Tools) -> set[str]:
    return {m["id"] for m in tools.ok("list_memories")["memories"]}


def observable(tools: Tools) -> Any:
    """What the tools show of the whole store: its active memories (with their keys and
    validity) and its counts."""
    return {"memories": tools.ok("list_memories"), "stats": tools.ok("memory_stats")}


def recalled(tools: Tools, query: str) -> list[str]:
    return [m["id"] for m in tools.ok("recall_memories", {"query": query})]


# -- writes: on both repositories ----------------------------------------------------------------


def test_the_same_fact_remembered_twice_is_stored_once_and_confirmed(tools: Tools, graph: MemoryGraph) -> None:
    first = tools.ok("remember", DEPLOY)["saved"]
    again = tools.ok("remember", DEPLOY)
    assert again["saved"] == first and again["deduplicated"]
    assert graph.stats().memories == 1
    stored = memory(graph, first)
    assert stored is not None and stored.confirmation_count == 2


def test_reading_through_a_key_counts_the_access_and_reinforces_that_link_only(
        tools: Tools, graph: MemoryGraph) -> None:
    saved = tools.ok("remember", CERT)
    mid, keys = saved["saved"], keys_of(saved)
    before = {c: weight(graph, k, mid) for c, k in keys.items()}
    shown = tools.ok("read_memory", {"memory_id": mid, "via_key_id": keys["staging"]})
    assert shown["memory"]["content"] == CERT["content"]
    assert {k["concept"] for k in shown["keys"]} == {"staging", "certificate"}
    after = {c: weight(graph, k, mid) for c, k in keys.items()}
    assert after["staging"] > before["staging"]  # type: ignore[operator]
    assert after["certificate"] == before["certificate"]
    stored = memory(graph, mid)
    assert stored is not None and stored.access_count == 1


def test_a_correction_supersedes_the_old_version_which_reading_refuses(tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    new_id = tools.ok("correct", {"memory_id": ids["deploy"], "content": "Deploys go out on Tuesdays from main"})[
        "new_id"]
    assert active(tools) == {new_id, ids["cert"], ids["dark"]}
    old, new = memory(graph, ids["deploy"]), memory(graph, new_id)
    assert old is not None and old.superseded_by == new_id and old.content == DEPLOY["content"]
    assert new is not None and new.supersedes == ids["deploy"]
    assert f"superseded by {new_id}" in str(tools("read_memory", {"memory_id": ids["deploy"]}).result)
    kept = {k["concept"] for k in tools.ok("read_memory", {"memory_id": new_id})["keys"]}
    assert kept == set(DEPLOY["keys"]), "a correction without keys keeps the old ones"


def test_forgetting_a_correction_brings_back_the_version_it_replaced(tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    new_id = tools.ok("correct", {"memory_id": ids["deploy"], "content": "Deploys go out on Tuesdays"})["new_id"]
    assert tools.ok("forget", {"memory_id": new_id}) == {"deleted": True, "restored": ids["deploy"]}
    assert active(tools) == set(ids.values())
    restored = memory(graph, ids["deploy"])
    assert restored is not None and restored.superseded_by is None


def test_a_forgotten_memory_is_gone_with_its_links_and_the_rest_unchanged(tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    tools.ok("forget", {"memory_id": ids["dark"]})
    assert memory(graph, ids["dark"]) is None
    assert graph.store.read(lambda r: r.links_of(ids["dark"])) == []
    assert active(tools) == {ids["deploy"], ids["cert"]}
    assert tools.ok("forget", {"memory_id": ids["dark"]}) == {"deleted": False}


def test_confirming_with_evidence_refreshes_and_deepens_a_memory(
        tools: Tools, graph: MemoryGraph, clock: FakeClock) -> None:
    mid = seed(tools)["cert"]
    clock.advance(30 * DAY)
    tools.ok("confirm_memory", {"memory_id": mid, "evidence": "user"})
    stored = memory(graph, mid)
    assert stored is not None
    assert stored.confirmation_count == 2 and stored.last_confirmed_at == clock.now and stored.depth > 0.0


def test_dismissing_weakens_one_link_and_leaves_the_memory(tools: Tools, graph: MemoryGraph) -> None:
    saved = tools.ok("remember", CERT)
    mid, keys = saved["saved"], keys_of(saved)
    before = weight(graph, keys["staging"], mid)
    tools.ok("dismiss", {"memory_id": mid, "key_id": keys["staging"]})
    after = weight(graph, keys["staging"], mid)
    assert after is not None and before is not None and 0 < after < before
    assert weight(graph, keys["certificate"], mid) == before
    assert tools.ok("read_memory", {"memory_id": mid})["memory"]["content"] == CERT["content"]


def test_cleanup_deletes_what_expired_and_keeps_the_rest(tools: Tools, graph: MemoryGraph, clock: FakeClock) -> None:
    ids = seed(tools)
    brief = tools.ok("remember", {"content": "The build cache is warm today", "keys": ["build cache"],
                                  "ttl_seconds": 3600})["saved"]
    assert tools.ok("cleanup_expired")["deleted"] == 0
    clock.advance(2 * 3600)
    assert brief not in active(tools), "an expired memory is not listed"
    cleaned = tools.ok("cleanup_expired")
    assert cleaned["deleted"] == 1 and cleaned["pruned_keys"] == 1, "its key had no other memory"
    assert memory(graph, brief) is None
    assert active(tools) == set(ids.values())


def test_a_batch_is_saved_whole_and_a_rejected_write_changes_nothing(tools: Tools) -> None:
    batch = tools.ok("remember_batch", {"items": [DEPLOY, CERT]})
    assert batch["saved"] == 2 and batch["failed"] == 0
    before = observable(tools)
    for name, args in (("remember", {"content": "", "keys": ["x"]}), ("remember", {"content": "x", "keys": []}),
                       ("correct", {"memory_id": "000000000000", "content": "x"}),
                       ("confirm_memory", {"memory_id": batch["items"][0]["saved"], "evidence": "hunch"})):
        refused = tools(name, args)
        assert refused.is_error or "error" in refused.result, name
    assert observable(tools) == before


# -- reads: retrieval and the push path ---------------------------------------------------------


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


def test_recall_finds_the_current_version_only(tools: Tools) -> None:
    ids = seed(tools)
    new_id = tools.ok("correct", {"memory_id": ids["deploy"], "content": "Deploys go out on Tuesdays from main"})[
        "new_id"]
    assert recalled(tools, "deploys go out")[:1] == [new_id]
    assert ids["deploy"] not in recalled(tools, "deploys go out")


def test_read_key_ranks_the_handles_under_a_key_by_the_query(tools: Tools) -> None:
    ids = seed(tools)
    other = tools.ok("remember", {"content": "Staging is rebuilt every night", "keys": ["staging", "nightly"]})
    handles = tools.ok("read_key", {"key_id": keys_of(other)["staging"], "query": "certificate"})
    assert {h["memory_id"] for h in handles["memories"]} == {ids["cert"], other["saved"]}
    assert handles["memories"][0]["memory_id"] == ids["cert"], "the handle sharing the query's words ranks first"


def test_the_push_path_surfaces_the_memory_a_prompt_is_about_and_nothing_otherwise(
        tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    before = observable(tools)
    hit = push.inject(graph, "the e2e run can't reach staging: the certificate is self-signed", scope=None)
    assert [m.id for m in hit.memories] == [ids["cert"]]
    assert hit.context is not None and "(why: " in hit.context
    miss = push.inject(graph, "Explain the difference between a process and a thread", scope=None)
    assert miss.memories == [] and miss.context is None
    assert observable(tools) == before, "injecting never reinforces"


def test_the_push_path_holds_back_what_the_session_was_already_shown(tools: Tools, graph: MemoryGraph) -> None:
    ids = seed(tools)
    prompt = "the e2e run can't reach staging: the certificate is self-signed"
    again = push.inject(graph, prompt, scope=None, session=push.SessionView({ids["cert"]: 1}, 1))
    assert again.memories == [] and again.held_back == [ids["cert"]]


# -- the same engine on both repositories gives the same answers --------------------------------


def session(graph: MemoryGraph, clock: FakeClock) -> list[Any]:
    """A working session through the tools: every answer, then what the store shows."""
    tools = Tools(graph, Settings(data_dir=Path("/nonexistent"), tools="full"), Host())
    out: list[Any] = []

    def call(name: str, args: Any = None) -> Any:
        result = tools(name, args).result
        out.append((name, result))
        return result

    cert = call("remember", CERT)
    deploy = call("remember", {**DEPLOY, "related_to": [cert["saved"]], "source": {"file": "ci.yml"}})
    call("remember", {**DARK, "namespace": "home", "observed_at": "2023-10-01"})
    call("remember", CERT)
    clock.advance(DAY)
    batch = call("remember_batch", {"items": [
        {"content": "Deploys need two approvals", "keys": ["deployment", "approval"], "related_to": [cert["saved"]]},
        {"content": "The build cache is warm today", "keys": ["build cache"], "ttl_seconds": 3600},
        {"content": "", "keys": ["x"]}]})
    staging = keys_of(cert)["staging"]
    call("read_memory", {"memory_id": cert["saved"], "via_key_id": staging})
    call("confirm_memory", {"memory_id": deploy["saved"], "evidence": "observation"})
    call("dismiss", {"memory_id": cert["saved"], "key_id": staging})
    new = call("correct", {"memory_id": deploy["saved"], "content": "Deploys go out on Tuesdays",
                           "keys": ["deployment", "Tuesday"]})
    call("related", {"memory_id": new["new_id"]})
    call("related", {"memory_id": cert["saved"]})
    call("forget", {"memory_id": batch["items"][0]["saved"]})
    call("related", {"memory_id": cert["saved"]})
    call("correct", {"memory_id": deploy["saved"], "content": "again"})
    newest = call("remember", {"content": "A note written and taken back", "keys": ["note"]})
    call("forget", {"memory_id": newest["saved"]})
    call("remember", {"content": "The note that stayed", "keys": ["note", "editor"]})
    clock.advance(2 * 3600)
    call("cleanup_expired")
    call("browse_keys")
    call("recall", {"query": "staging certificate"})
    call("recall", {"query": "deploys", "context": "when do deploys go out?", "explain": True})
    call("recall", {"query": "quarterly tax"})
    call("recall_memories", {"query": "deploys go out on tuesdays"})
    call("recall_memories", {"query": "editor dark mode", "namespace": "home"})
    call("read_key", {"key_id": staging, "query": "certificate"})
    call("read_key", {"key_id": staging})
    for prompt in ("the e2e run can't reach staging: the certificate is self-signed",
                   "Explain the difference between a process and a thread", "how do deploys get approved?"):
        shown = render(push.inject(graph, prompt, scope=None))
        out.append({k: v for k, v in shown.items() if k != "took_ms"})  # the wall clock's
    call("list_memories", {"namespace": "home"})
    out.append(observable(tools))
    out.append(graph.store.integrity_check())
    out.append(inspected(graph, clock, staging))
    out.append(searched(graph, clock))
    out.append(reinforced(graph, clock))
    return out


def inspected(graph: MemoryGraph, clock: FakeClock, key_id: str) -> Any:
    """What the inspector and the activity log read of the store (through the ports)."""
    log = ActivityLog(graph.store, (3, 1.0), clock=clock)
    try:
        for i in range(5):
            log.record("remember", f"entry {i}", {"i": i}, memory_id="m" if i % 2 else None)
        log.flush()
        clock.advance(DAY / 2)
        log.record("forget", "late", {})
        log.flush()
        clock.advance(DAY * 0.75)
        pages = [log.page(), log.page(kind="remember", limit=1), log.page(memory_id="m"), log.prune(), log.page()]
    finally:
        log.close()

    def read(r: Reader) -> Any:
        newest = r.newest_memories(MemoryFilter(), now=clock.now, limit=10)
        ids = [m.id for m in newest]
        return (newest, r.newest_memories(MemoryFilter(namespace="home"), now=clock.now, limit=10),
                r.newest_memories(MemoryFilter(key_id=key_id), now=clock.now, limit=10),
                r.strongest_links(ids), r.strongest_links(ids, per_memory=1), r.aliases_of(key_id),
                r.co_occurring_keys(key_id, sample=10, limit=5), r.strongest_members(key_id, now=clock.now, limit=5))

    return pages, graph.store.read(read)


def searched(graph: MemoryGraph, clock: FakeClock) -> Any:
    """What retrieval's and export's reads answer (through the ports), ties in id order."""
    now = clock.now

    def ranked(pairs: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return sorted(((mid, round(score, 9)) for mid, score in pairs), key=lambda p: (-p[1], p[0]))

    def read(r: Reader) -> Any:
        rows = r.export_rows(include_vectors=True)
        ids = [m["id"] for m in rows["memories"]]
        key_ids = [k["id"] for k in rows["keys"]]
        tokens = r.indexed_tokens(ids)
        words = sorted({t for content, keys in tokens.values() for t in content + keys})
        out: list[Any] = [r.schema_version(), rows, tokens, r.links_by_memory(ids)]
        for scope in (None, frozenset({"default"}), frozenset({"home"})):
            out.append([ranked(r.lexical_hits(words[i:i + 3], scope, now, 5)) for i in range(0, len(words), 3)])
            out.append({k: ranked(v) for k, v in r.key_members(key_ids, scope, now, 10).items()})
            out.append(sorted(r.observed_between(0.0, now + DAY, scope, now, 10)))
        for kid in key_ids:
            out.append((sorted(r.key_links(kid)), sorted(r.key_links(kid, among=ids[:3])),
                        [w for _, w in r.key_links(kid, strongest=2)]))
        out.append({mid: sorted(r.related_either_way(mid)) for mid in ids})
        return out

    return graph.store.read(read)


def reinforced(graph: MemoryGraph, clock: FakeClock) -> Any:
    """The reinforcement writes a recall makes, on the key with the most links, and the store
    after them."""
    def members(r: Reader) -> tuple[str, list[str]]:
        counts = r.link_counts()
        key_id = max(sorted(counts), key=lambda k: counts[k])
        return key_id, sorted(mid for mid, _ in r.key_links(key_id))

    key_id, linked = graph.store.read(members)
    assert len(linked) >= 2

    def write(tx: Writer) -> None:
        tx.mark_accessed(linked, clock.now)
        tx.bump_links([(0.25, key_id, mid) for mid in linked] + [(5.0, key_id, linked[-1])], ceiling=2.0)
        tx.decay_links([key_id], linked[:1], 1.9, floor=0.3)

    graph.store.write(write)
    return graph.store.read(lambda r: r.export_rows(include_vectors=False))


def test_the_engine_gives_the_same_answers_on_sqlite_and_in_memory(
        tmp_path: Path, embedder: Embedder, analyzer: Analyzer, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = []
    for name in ("sqlite", "memory"):
        # Ids (secrets.token_hex) and batch ids (uuid4) are random: number them in order,
        # afresh for each run.
        ids, uuids = itertools.count(), itertools.count()
        monkeypatch.setattr(secrets, "token_hex", lambda n, ids=ids: f"{next(ids):0{2 * n}x}")
        monkeypatch.setattr(uuid, "uuid4", lambda uuids=uuids: uuid.UUID(int=next(uuids)))
        clock, settings = FakeClock(), Settings(data_dir=tmp_path / name)
        graph = (open_graph(tmp_path / name / "keymem.db", embedder, settings, clock, analyzer) if name == "sqlite"
                 else MemoryGraph.over(InMemoryRepository(), embedder, settings,  # type: ignore[arg-type]
                                       clock=clock, analyzer=analyzer))
        try:
            answers.append(session(graph, clock))
        finally:
            graph.close()
    sqlite, memory = answers
    assert len(memory) == len(sqlite)
    for on_sqlite, in_memory in zip(sqlite, memory, strict=True):
        assert in_memory == on_sqlite
