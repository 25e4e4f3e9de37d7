"""Issue 19 (hardening), bad input at the HTTP edge of a real daemon: idempotency keys reused
for another request, malformed bodies, surrogates, non-finite and huge numbers, ttl bounds,
oversized unknown-argument lists, a tool route without a name, invisible keys and namespaces.

One daemon serves the whole module: every case here is a request that must change nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from daemon_helpers import DaemonFactory, DaemonProcess

pytestmark = pytest.mark.timeout(180)

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    factory = DaemonFactory(tmp_path_factory.mktemp("issue19"))
    try:
        yield factory.start(KEYMEM_TOOLS="full")
    finally:
        factory.teardown()


def _active(daemon: DaemonProcess) -> list[str]:
    return sorted(m["content"] for m in daemon.export()["memories"] if not m.get("superseded_by"))


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    message: str = body["error"]["message"]
    return message


# -- 3. an Idempotency-Key reused for a different request -------------------------------------


def test_issue_19_an_idempotency_key_reused_for_another_request_is_refused_not_replayed(
    daemon: DaemonProcess,
) -> None:
    client = daemon.client()

    def post(tool: str, arguments: dict[str, Any], key: str) -> httpx.Response:
        return client.post(f"/v1/tools/{tool}", json={"arguments": arguments}, headers={"Idempotency-Key": key})

    first = post("remember", {"content": "The CI runner is Buildkite.", "keys": ["CI", "Buildkite"]}, "reuse-1")
    assert first.status_code == 200 and not first.json()["is_error"], first.text
    saved = first.json()["result"]["saved"]
    before = _active(daemon)

    other_content = post("remember", {"content": "The CI runner is Jenkins.", "keys": ["CI", "Jenkins"]}, "reuse-1")
    message = _error(other_content, 409, "idempotency_key_reused")
    assert "reuse-1" in message and "different request" in message
    other_tool = post("forget", {"memory_id": saved}, "reuse-1")
    _error(other_tool, 409, "idempotency_key_reused")
    assert _active(daemon) == before, "a refused request changed the store"

    # The same request under the same key is still a replay of the first answer.
    again = post("remember", {"keys": ["CI", "Buildkite"], "content": "The CI runner is Buildkite."}, "reuse-1")
    assert again.status_code == 200 and again.json()["result"]["saved"] == saved, again.text
    assert _active(daemon) == before
