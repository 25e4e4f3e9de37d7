"""The guard in front of every route: Host, Origin, token, media type, body size."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_api_routes import AUTH, PORT, TOKEN, client_for, settings_for

from keymem_daemon.service import Service

pytestmark = pytest.mark.timeout(60)

MAX_BODY = 2048


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """A daemon still loading: a request that passes the guard reaches a route and gets 503
    (or 404 for an unknown tool), one that does not gets the guard's refusal."""
    settings = settings_for(tmp_path).replace(max_body_bytes=MAX_BODY)
    with client_for(Service(settings), settings) as c:
        yield c


def _passed_guard(status: int) -> bool:
    return status in (404, 503)


@pytest.mark.parametrize(
    "host, allowed",
    [
        (f"127.0.0.1:{PORT}", True),
        (f"localhost:{PORT}", True),
        (f"LocalHost:{PORT}", True),
        ("127.0.0.1", False),  # the port is part of the check
        (f"127.0.0.1:{PORT + 1}", False),
        (f"evil.example:{PORT}", False),
        (f"127.0.0.1.nip.io:{PORT}", False),
        (f"[::1]:{PORT}", False),
        ("", False),
    ],
)
def test_only_loopback_host_names_on_our_port_are_served(client: TestClient, host: str, allowed: bool) -> None:
    response = client.post("/v1/tools/nope", json={}, headers={"Host": host})
    if allowed:
        assert _passed_guard(response.status_code), response.text
    else:
        assert response.status_code == 403, host
        assert response.json()["error"]["code"] == "forbidden"


@pytest.mark.parametrize("path", ["/health", "/v1/tools", "/v1/stats"])
@pytest.mark.parametrize("origin", ["http://evil.example", "null", f"http://127.0.0.1:{PORT}"])
def test_any_origin_header_is_refused(client: TestClient, path: str, origin: str) -> None:
    response = client.get(path, headers={"Origin": origin})
    assert response.status_code == 403
    assert "Origin" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "authorization, ok",
    [
        (f"Bearer {TOKEN}", True),
        (f"bearer {TOKEN}", True),
        (f"Bearer  {TOKEN} ", True),
        ("", False),
        ("Bearer", False),
        ("Bearer ", False),
        (f"Basic {TOKEN}", False),
        (f"Bearer {TOKEN}x", False),
        (f"Bearer {TOKEN[:-1]}", False),
        (TOKEN, False),
        ("Bearer \u00e9t\u00e9".encode("latin-1"), False),
    ],
)
def test_the_bearer_token_must_match_exactly(client: TestClient, authorization: str, ok: bool) -> None:
    response = client.get("/v1/stats", headers={"Authorization": authorization})
    if ok:
        assert response.status_code == 200
    else:
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "content_type, ok",
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("Application/JSON", True),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("application/json-patch+json", False),
        (None, False),
    ],
)
def test_post_bodies_must_be_json(client: TestClient, content_type: str | None, ok: bool) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post("/v1/tools/nope", content=b'{"arguments": {}}', headers=headers)
    if ok:
        assert _passed_guard(response.status_code), response.text
    else:
        assert response.status_code == 415
        assert response.json()["error"]["code"] == "unsupported_media_type"


def test_a_post_without_a_body_needs_no_content_type(client: TestClient) -> None:
    assert client.post("/v1/tools/nope").status_code == 404
    assert client.post("/v1/export").status_code == 503


def test_a_declared_oversized_body_is_refused_before_it_is_read(client: TestClient) -> None:
    response = client.post("/v1/inject", json={"prompt": "x" * MAX_BODY})
    assert response.status_code == 413
    assert str(MAX_BODY) in response.json()["error"]["message"]
    just_fits = '{"prompt": "' + "y" * (MAX_BODY - 20) + '"}'
    assert len(just_fits) <= MAX_BODY
    assert client.post("/v1/inject", content=just_fits, headers={"Content-Type": "application/json"}).status_code == 503


def test_a_chunked_body_is_cut_off_at_the_limit(client: TestClient) -> None:
    def chunks(total: int) -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(total // 256):
            yield b"z" * 256
        yield b'"}'

    response = client.post("/v1/inject", content=chunks(4 * MAX_BODY), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    small = client.post("/v1/inject", content=chunks(512), headers={"Content-Type": "application/json"})
    assert small.status_code == 503  # passed the guard, replayed intact to the route


def test_import_may_carry_a_whole_export(client: TestClient) -> None:
    big = {"format": "keymem-export", "padding": "p" * (4 * MAX_BODY)}
    assert client.post("/v1/import", json=big).status_code == 503  # not 413


def test_unknown_paths_need_the_token_too(client: TestClient) -> None:
    assert client.get("/no/such/path", headers={"Authorization": ""}).status_code == 401
    assert client.get("/no/such/path", headers=AUTH).status_code == 404
