"""Host identity comes from each request's headers; the daemon has none of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_helpers import DaemonFactory

pytestmark = pytest.mark.timeout(120)

SESSION_A = "11111111-2222-4333-8444-555555555555"
SESSION_B = "66666666-7777-4888-8999-aaaaaaaaaaaa"


def _claude_transcript(home: Path, session: str, turns: list[tuple[str, str]]) -> None:
    project = home / ".claude" / "projects" / "-work-project"
    project.mkdir(parents=True, exist_ok=True)
    lines = [
        {
            "type": role,
            "cwd": "/work/project",
            "sessionId": session,
            "timestamp": f"2026-01-01T00:00:{i:02d}Z",
            "message": {"role": role, "content": text},
        }
        for i, (role, text) in enumerate(turns)
    ]
    (project / f"{session}.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def _headers(session: str) -> dict[str, str]:
    return {
        "X-Keymem-Host-Agent": "claude",
        "X-Keymem-Host-Session": session,
        "X-Keymem-Host-Cwd": "/work/project",
    }


def test_each_request_is_stamped_with_its_own_host(daemons: DaemonFactory, tmp_path: Path) -> None:
    home = tmp_path / "home"
    _claude_transcript(home, SESSION_A, [("user", "hello"), ("assistant", "hi"), ("user", "remember vim")])
    _claude_transcript(home, SESSION_B, [("user", "first question")])
    daemon = daemons.start(KEYMEM_TOOLS="full")

    a = daemon.call(
        "remember",
        {"content": "Session A prefers vim", "keys": ["editor", "vim", "a"]},
        **_headers(SESSION_A),
    )["result"]["saved"]
    b = daemon.call(
        "remember",
        {"content": "Session B prefers emacs", "keys": ["editor", "emacs", "b"]},
        **_headers(SESSION_B),
    )["result"]["saved"]
    anonymous = daemon.remember("Nobody in particular saved this", ["anonymous", "note"])

    def source(memory_id: str) -> dict[str, object]:
        result = daemon.call("read_memory", {"memory_id": memory_id})["result"]
        stamped: dict[str, object] = result["memory"]["source"]
        return stamped

    assert source(a)["host_agent"] == "claude" and source(a)["host_session"] == SESSION_A
    assert source(a)["host_turn"] == 2  # three turns in A's transcript: the last one is index 2
    assert source(b)["host_session"] == SESSION_B and source(b)["host_turn"] == 0
    assert "host_session" not in source(anonymous) and "host_agent" not in source(anonymous)


def test_transcript_tools_are_offered_only_to_an_identified_host(daemons: DaemonFactory, tmp_path: Path) -> None:
    _claude_transcript(
        tmp_path / "home",
        SESSION_A,
        [("user", "what is our deploy script?"), ("assistant", "ops/deploy.sh")],
    )
    daemon = daemons.start(KEYMEM_TOOLS="full")
    client = daemon.client()
    anonymous = {t["name"] for t in client.get("/v1/tools").json()["tools"]}
    identified = {t["name"] for t in client.get("/v1/tools", headers=_headers(SESSION_A)).json()["tools"]}
    assert "list_sessions" not in anonymous and "get_conversation" not in anonymous
    assert {"list_sessions", "get_conversation"} <= identified
    assert client.post("/v1/tools/get_conversation", json={"arguments": {"session_id": SESSION_A}}).status_code == 404

    page = daemon.call("get_conversation", {"session_id": SESSION_A}, **_headers(SESSION_A))["result"]
    assert [t["content"] for t in page["turns"]] == ["what is our deploy script?", "ops/deploy.sh"]
    assert page["next_from_turn"] is None
    sessions = daemon.call("list_sessions", {}, **_headers(SESSION_A))["result"]
    assert SESSION_A in {s["session_id"] for s in sessions}


def test_transcript_access_false_wins_over_headers(daemons: DaemonFactory) -> None:
    daemon = daemons.start(KEYMEM_TOOLS="full", KEYMEM_TRANSCRIPT_ACCESS="false")
    names = {t["name"] for t in daemon.client().get("/v1/tools", headers=_headers(SESSION_A)).json()["tools"]}
    assert "list_sessions" not in names and "get_conversation" not in names
