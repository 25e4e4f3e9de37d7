"""Issue 20: every route returns the response model it declares, so FastAPI checks each
answer against the schema the OpenAPI document publishes."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import TypeAdapter
from test_api_routes import client_for, loaded, settings_for  # noqa: F401 (the module fixture)

from keymem_daemon.config import Settings
from keymem_daemon.http.app import create_app
from keymem_daemon.mcp import instructions
from keymem_daemon.service import Service

pytestmark = pytest.mark.timeout(120)

RAW_JSON: frozenset[tuple[str, str]] = frozenset({("POST", "/v1/export")})
"""Free-form and possibly large (a whole store): serialised in a worker thread, no model."""
REQUESTS: dict[tuple[str, str], tuple[str, dict[str, Any] | None]] = {
    ("GET", "/health"): ("/health?nonce=abc", None),
    ("GET", "/v1/tools"): ("/v1/tools", None),
    ("POST", "/v1/tools/{name}"): ("/v1/tools/recall", {"arguments": {"query": "editor preference"}}),
    ("GET", "/v1/instructions"): ("/v1/instructions", None),
    ("GET", "/v1/prompts"): ("/v1/prompts", None),
    ("GET", "/v1/prompts/{name}"): (f"/v1/prompts/{instructions.PROMPT_NAME}", None),
    ("POST", "/v1/inject"): ("/v1/inject", {"prompt": "Which editor do I use for this project?", "top_k": 3}),
    ("GET", "/v1/stats"): ("/v1/stats", None),
    ("POST", "/v1/shutdown"): ("/v1/shutdown", None),
}


def _json_routes(app: Any) -> list[tuple[str, APIRoute]]:
    out = []
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.response_class is StreamingResponse:
            continue
        out += [(method, route) for method in sorted(route.methods or ()) if (method, route.path) not in RAW_JSON]
    return out


def test_every_json_route_declares_a_response_model_and_returns_it(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    routes = _json_routes(create_app(Service(settings), settings, "t"))
    assert {(m, r.path) for m, r in routes} == set(REQUESTS)
    for method, route in routes:
        assert route.response_model is not None, (method, route.path)
        returned = typing.get_type_hints(route.endpoint)["return"]
        assert returned is route.response_model, f"{method} {route.path} returns {returned}"


@pytest.fixture
def answering(loaded: tuple[Service, Settings]) -> Iterator[tuple[TestClient, Any]]:  # noqa: F811
    service, settings = loaded
    with client_for(service, settings, on_shutdown=lambda: None) as client:
        remembered = client.post("/v1/tools/remember", json={"arguments": {
            "content": "The user edits this project in Helix.", "keys": ["editor", "Helix", "에디터"]}})
        assert remembered.status_code == 200 and not remembered.json()["is_error"], remembered.text
        yield client, client.app


def test_every_route_answers_with_a_body_its_model_accepts(answering: tuple[TestClient, Any]) -> None:
    client, app = answering
    for method, route in _json_routes(app):
        path, body = REQUESTS[(method, route.path)]
        response = client.request(method, path, json=body)
        assert response.status_code == 200, (path, response.text)
        TypeAdapter(route.response_model).validate_python(response.json())


def test_an_answer_that_does_not_match_its_model_is_a_500_not_a_wrong_body(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    service = Service(settings)

    def prompts() -> list[dict[str, Any]]:
        return [{"name": "keymem"}]  # no description, no arguments

    service.prompts = prompts  # type: ignore[method-assign]
    with client_for(service, settings) as client:
        response = client.get("/v1/prompts")
    assert response.status_code == 500, response.text
    assert response.json()["error"]["code"] == "internal"
