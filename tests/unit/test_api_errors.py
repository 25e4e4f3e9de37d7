"""One error shape on every route, and an OpenAPI document that lists every route exactly."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from test_api_routes import client_for, settings_for

from keymem_daemon.http.app import create_app
from keymem_daemon.service import Service

pytestmark = pytest.mark.timeout(60)

# DESIGN.md section 2, the daemon's contract.
DESIGN_ROUTES = {
    ("GET", "/health"),
    ("GET", "/v1/tools"),
    ("POST", "/v1/tools/{name}"),
    ("GET", "/v1/instructions"),
    ("GET", "/v1/prompts"),
    ("GET", "/v1/prompts/{name}"),
    ("POST", "/v1/inject"),
    ("GET", "/v1/stats"),
    ("POST", "/v1/export"),
    ("POST", "/v1/import"),
    ("POST", "/v1/shutdown"),
}
RESPONSE_MODELS = {
    ("GET", "/health"): "HealthOut",
    ("GET", "/v1/tools"): "ToolsOut",
    ("POST", "/v1/tools/{name}"): "ToolResult",
    ("GET", "/v1/instructions"): "InstructionsOut",
    ("GET", "/v1/prompts"): "PromptsOut",
    ("GET", "/v1/prompts/{name}"): "PromptOut",
    ("POST", "/v1/inject"): "InjectOut",
    ("GET", "/v1/stats"): "StatsOut",
    ("POST", "/v1/shutdown"): "ShutdownOut",
}
REQUEST_MODELS = {
    ("POST", "/v1/tools/{name}"): "ToolCall",
    ("POST", "/v1/inject"): "InjectIn",
    ("POST", "/v1/export"): "ExportIn",
}


@pytest.fixture
def service(tmp_path: Path) -> Service:
    return Service(settings_for(tmp_path))


@pytest.fixture
def client(service: Service, tmp_path: Path) -> Iterator[TestClient]:
    with client_for(service, settings_for(tmp_path)) as c:
        yield c


def _routes(service: Service, tmp_path: Path) -> set[tuple[str, str]]:
    app = create_app(service, settings_for(tmp_path), "t")
    return {
        (method, route.path) for route in app.routes if isinstance(route, APIRoute) for method in route.methods or ()
    }


def _concrete(path: str) -> str:
    return path.replace("{name}", "recall")


def _assert_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, (status, response.text)
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code and body["error"]["message"]


def test_the_app_serves_exactly_the_design_routes(service: Service, tmp_path: Path) -> None:
    assert _routes(service, tmp_path) == DESIGN_ROUTES


def test_every_route_refuses_without_the_token_in_the_one_shape(
    client: TestClient, service: Service, tmp_path: Path
) -> None:
    for method, path in _routes(service, tmp_path) - {("GET", "/health")}:
        _assert_error(
            client.request(method, _concrete(path), headers={"Authorization": ""}),
            401,
            "unauthorized",
        )


def test_every_route_answers_a_wrong_method_with_405(client: TestClient, service: Service, tmp_path: Path) -> None:
    for method, path in _routes(service, tmp_path):
        wrong = "DELETE" if method != "DELETE" else "PUT"
        _assert_error(client.request(wrong, _concrete(path)), 405, "method_not_allowed")


def test_unknown_routes_are_404_in_the_one_shape(client: TestClient) -> None:
    _assert_error(client.get("/v2/tools"), 404, "not_found")
    _assert_error(client.get("/docs"), 404, "not_found")  # no docs page: it would load a CDN


def test_every_body_route_answers_malformed_json_with_422(client: TestClient) -> None:
    for path in ("/v1/tools/recall", "/v1/inject", "/v1/export", "/v1/import"):
        response = client.post(path, content=b"{not json", headers={"Content-Type": "application/json"})
        _assert_error(response, 422, "invalid_input")
        assert "JSON" in response.json()["error"]["message"]


def test_an_unexpected_exception_is_a_logged_500(
    client: TestClient, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("the disk caught fire")

    service.stats = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="keymem_daemon.http.app"):
        response = client.get("/v1/stats")
    _assert_error(response, 500, "internal")
    assert "the disk caught fire" not in response.text, "internals leaked into the response"
    records = [r for r in caplog.records if r.exc_info]
    assert records and "the disk caught fire" in str(records[0].exc_info[1])  # type: ignore[index]


def test_the_openapi_document_lists_every_route_with_its_models(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == DESIGN_ROUTES
    for (method, path), model in RESPONSE_MODELS.items():
        schema = doc["paths"][path][method.lower()]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}, (path, schema)
    for (method, path), model in REQUEST_MODELS.items():
        body = doc["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]["schema"]
        refs = [body.get("$ref")] + [alt.get("$ref") for alt in body.get("anyOf", [])]
        assert f"#/components/schemas/{model}" in refs, (path, body)
    imported = doc["paths"]["/v1/import"]["post"]["responses"]["200"]["content"]
    assert imported["application/x-ndjson"]["schema"] == {"$ref": "#/components/schemas/ImportEvent"}
    assert "ImportEvent" in doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for status in ("401", "403", "413", "415", "422", "503"):
                if path == "/health" and status == "401":
                    continue
                assert op["responses"][status]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorOut"
                }, (path, status)
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    assert doc["security"] == [{"bearer": []}]
    assert doc["paths"]["/health"]["get"]["security"] == []
    headers = {p["name"] for p in doc["paths"]["/v1/tools/{name}"]["post"]["parameters"] if p["in"] == "header"}
    assert headers == {
        "x-keymem-host-agent",
        "x-keymem-host-session",
        "x-keymem-host-cwd",
        "Idempotency-Key",
    }
