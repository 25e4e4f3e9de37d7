"""Requests the daemon must refuse, over a real socket: each is refused and changes nothing."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, scaled

pytestmark = pytest.mark.timeout(120)

MAX_BODY = 65536
REMEMBER = {"arguments": {"content": "Refused requests must not store this", "keys": ["security", "test"]}}


@pytest.fixture
def guarded(daemons: DaemonFactory) -> DaemonProcess:
    daemon = daemons.start(KEYMEM_MAX_BODY_BYTES=str(MAX_BODY))
    daemon.remember("The store holds this one memory before the attack", ["baseline", "memory"])
    return daemon


def _state(daemon: DaemonProcess) -> dict[str, Any]:
    return daemon.export()


def _raw(daemon: DaemonProcess, request: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (httpx would fix the Host header) and read the status line."""
    with socket.create_connection(("127.0.0.1", daemon.info.port), timeout=scaled(10)) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):  # the request says Connection: close
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body


def _json_post(path: str, body: bytes, host: str, token: str, *extra: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        f"Authorization: Bearer {token}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_every_refused_request_leaves_the_store_unchanged(guarded: DaemonProcess) -> None:
    daemon = guarded
    before = _state(daemon)
    good = daemon.client()
    anonymous = daemon.client(token="")
    wrong = daemon.client(token="not-the-token")
    port = daemon.info.port
    body = b'{"arguments": {"content": "Refused requests must not store this", "keys": ["security"]}}'

    cases: list[tuple[str, int, str, httpx.Response | tuple[int, bytes]]] = [
        ("no token", 401, "unauthorized", anonymous.post("/v1/tools/remember", json=REMEMBER)),
        ("wrong token", 401, "unauthorized", wrong.post("/v1/tools/remember", json=REMEMBER)),
        ("wrong token, import", 401, "unauthorized", wrong.post("/v1/import", json=before)),
        (
            "origin",
            403,
            "forbidden",
            good.post("/v1/tools/remember", json=REMEMBER, headers={"Origin": "http://evil.example"}),
        ),
        (
            "null origin",
            403,
            "forbidden",
            good.post("/v1/tools/remember", json=REMEMBER, headers={"Origin": "null"}),
        ),
        (
            "foreign host",
            403,
            "forbidden",
            _raw(daemon, _json_post("/v1/tools/remember", body, f"evil.example:{port}", daemon.token)),
        ),
        (
            "rebinding host",
            403,
            "forbidden",
            _raw(daemon, _json_post("/v1/tools/remember", body, "attacker.test", daemon.token)),
        ),
        (
            "other port",
            403,
            "forbidden",
            _raw(
                daemon,
                _json_post("/v1/tools/remember", body, f"127.0.0.1:{port + 1}", daemon.token),
            ),
        ),
        (
            "form post",
            415,
            "unsupported_media_type",
            good.post("/v1/tools/remember", content=body, headers={"Content-Type": "text/plain"}),
        ),
        (
            "malformed json",
            422,
            "invalid_input",
            good.post(
                "/v1/tools/remember",
                content=b'{"arguments": {"content": ',
                headers={"Content-Type": "application/json"},
            ),
        ),
        (
            "arguments not an object",
            422,
            "invalid_input",
            good.post("/v1/tools/remember", json={"arguments": ["x"]}),
        ),
        (
            "unknown body field",
            422,
            "invalid_input",
            good.post("/v1/tools/remember", json={**REMEMBER, "extra": 1}),
        ),
        (
            "oversized, declared",
            413,
            "too_large",
            good.post(
                "/v1/tools/remember",
                json={"arguments": {"content": "x" * MAX_BODY, "keys": ["big"]}},
            ),
        ),
        (
            "oversized, chunked",
            413,
            "too_large",
            good.post(
                "/v1/tools/remember",
                content=_chunks(b'{"arguments": {"content": "' + b"y" * 2 * MAX_BODY),
                headers={"Content-Type": "application/json"},
            ),
        ),
        ("import not an object", 422, "invalid_input", good.post("/v1/import", json=[1, 2])),
        ("import of garbage", 200, "error", good.post("/v1/import", json={"hello": "world"})),
    ]
    for name, status, code, response in cases:
        if isinstance(response, tuple):
            got_status, raw = response
            assert got_status == status, f"{name}: {got_status} {raw!r}"
            assert code.encode() in raw, f"{name}: {raw!r}"
            continue
        assert response.status_code == status, f"{name}: {response.status_code} {response.text}"
        if status == 200:  # the import stream reports the failure in its last line
            assert '"event": "error"' in response.text.splitlines()[-1], f"{name}: {response.text}"
        else:
            assert response.json()["error"]["code"] == code, f"{name}: {response.text}"
            assert response.json()["error"]["message"], name
    assert _state(daemon) == before, "a refused request changed the store"
    # The daemon is still serving, and the good path still works.
    assert good.post("/v1/tools/remember", json=REMEMBER).json()["is_error"] is False


def _chunks(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), 4096):
        yield data[start : start + 4096]


def test_health_is_public_but_nothing_else_is(guarded: DaemonProcess) -> None:
    anonymous = guarded.client(token="")
    assert anonymous.get("/health").status_code == 200
    for method, path in (
        ("GET", "/v1/tools"),
        ("GET", "/v1/stats"),
        ("GET", "/v1/instructions"),
        ("GET", "/v1/prompts"),
        ("GET", "/openapi.json"),
        ("POST", "/v1/export"),
        ("POST", "/v1/inject"),
        ("GET", "/no/such/route"),
        ("GET", "/docs"),
    ):
        response = anonymous.request(method, path)
        assert response.status_code == 401, f"{method} {path}: {response.status_code}"
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "unauthorized"
    # Even /health refuses a page from another origin.
    assert anonymous.get("/health", headers={"Origin": "http://evil.example"}).status_code == 403


def test_the_token_never_reaches_the_log(guarded: DaemonProcess) -> None:
    client = guarded.client()
    client.get("/v1/stats")
    guarded.client(token="wrong-token-value").get("/v1/stats")
    log = (guarded.data_dir / "logs" / "daemon.log").read_text()
    assert guarded.token not in log
    assert "wrong-token-value" not in log
