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
from daemon_helpers import DaemonProcess, shared_daemon

pytestmark = pytest.mark.timeout(180)

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with shared_daemon(tmp_path_factory.mktemp("issue19"), KEYMEM_TOOLS="full") as running:
        yield running


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


# -- 12, 21. bodies and values keymem cannot store or compute with -----------------------------

GOOD: dict[str, Any] = {"content": "The staging host is stg-3.", "keys": ["staging", "host"]}
SURROGATE_FIELDS: list[tuple[str, bytes, str]] = [
    ("remember", b'{"arguments": {"content": "a \\ud800 b", "keys": ["alpha", "beta"]}}', "arguments.content"),
    # The same lone surrogate as raw CESU-8 bytes instead of an escape.
    ("remember", b'{"arguments": {"content": "a \xed\xa0\x80 b", "keys": ["alpha", "beta"]}}', "arguments.content"),
    ("remember", b'{"arguments": {"content": "fact", "keys": ["alpha", "\\udfff"]}}', "arguments.keys[1]"),
    ("remember", b'{"arguments": {"content": "fact", "keys": ["alpha"], "namespace": "\\ud800"}}',
     "arguments.namespace"),
    ("remember", b'{"arguments": {"content": "fact", "keys": ["alpha"], "source": {"url": "\\udc00"}}}',
     "arguments.source.url"),
    ("recall", b'{"arguments": {"query": "\\ud83d"}}', "arguments.query"),
    ("remember_batch", b'{"arguments": {"items": [{"content": "x\xed\xb0\x80", "keys": ["alpha"]}]}}',
     "arguments.items[0].content"),
]


@pytest.mark.parametrize(("tool", "body", "field"), SURROGATE_FIELDS)
def test_issue_19_a_lone_surrogate_anywhere_in_a_tool_call_is_refused_naming_its_field(
    daemon: DaemonProcess, tool: str, body: bytes, field: str
) -> None:
    before = daemon.export()["memories"]
    message = _error(daemon.client().post(f"/v1/tools/{tool}", content=body, headers=JSON), 422, "invalid_input")
    assert message.startswith(field + " ") and "surrogate" in message, message
    assert daemon.export()["memories"] == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"prompt": "how do we deploy \\ud800 the service?"}', "prompt"),
        (b'{"prompt": "how do we deploy the service?", "namespace": "\xed\xa0\x80"}', "namespace"),
        (b'{"prompt": "how do we deploy the service?", "cwd": "/home/\\udc00"}', "cwd"),
        (b'{"prompt": "how do we deploy the service?", "top_k": Infinity}', "top_k"),
        (b'{"prompt": "how do we deploy the service?", "max_chars": 1e999}', "max_chars"),
    ],
)
def test_issue_19_inject_refuses_surrogates_and_non_finite_numbers_naming_the_field(
    daemon: DaemonProcess, body: bytes, field: str
) -> None:
    message = _error(daemon.client().post("/v1/inject", content=body, headers=JSON), 422, "invalid_input")
    assert message.startswith(field + " "), message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"format": "keymem-export", "version": "\\ud800", "memories": []}', "version"),
        (b'{"format": "keymem-export", "version": 1e999, "memories": []}', "version"),
        (b'{"format": "keymem-export", "version": NaN, "memories": []}', "version"),
        (b'{"format": "keymem-export", "version": 1, "memories": [{"content": "\\udbff"}]}', "memories[0].content"),
    ],
)
def test_issue_19_import_refuses_surrogates_and_non_finite_numbers_before_it_starts(
    daemon: DaemonProcess, body: bytes, field: str
) -> None:
    before = daemon.export()["memories"]
    message = _error(daemon.client().post("/v1/import", content=body, headers=JSON), 422, "invalid_input")
    assert message.startswith(field + " "), message
    assert daemon.export()["memories"] == before


def test_issue_19_a_large_import_is_checked_through_to_its_last_record(daemon: DaemonProcess) -> None:
    """Over a megabyte, the body is parsed off the event loop; the checks are the same."""
    import json

    records = [{"content": f"Fact {i}: " + "x" * 2000, "keys": ["fact"]} for i in range(1000)]
    records[900]["content"] = "broken \ud800"
    body = json.dumps({"format": "keymem-export", "version": 1, "memories": records}).encode()
    assert len(body) > 2_000_000
    before = daemon.export()["memories"]
    message = _error(daemon.client().post("/v1/import", content=body, headers=JSON), 422, "invalid_input")
    assert message.startswith("memories[900].content holds a lone surrogate"), message
    assert daemon.export()["memories"] == before


@pytest.mark.parametrize("literal", [b"Infinity", b"-Infinity", b"NaN", b"1e999", b"-1e999", b'"inf"', b'"-1e999"',
                                     b'"nan"'])
@pytest.mark.parametrize(("tool", "field", "extra"), [
    ("recall", "top_k", {"query": "staging"}), ("recall", "max_chars", {"query": "staging"}),
    ("browse_keys", "limit", {}), ("browse_keys", "offset", {}), ("list_memories", "offset", {}),
    ("recall_memories", "hops", {"query": "staging"}), ("get_conversation", "turn", {}),
])
def test_issue_19_a_non_finite_integer_argument_is_refused_naming_it(
    daemon: DaemonProcess, literal: bytes, tool: str, field: str, extra: dict[str, Any]
) -> None:
    import json

    headers = {**JSON}
    if tool == "get_conversation":  # a trusted host's tool
        extra = {"session_id": "4f1c2d3e-5a6b-4c7d-8e9f-0a1b2c3d4e5f"}
        headers.update({"X-Keymem-Host-Agent": "claude", "X-Keymem-Host-Session": extra["session_id"]})
    body = b'{"arguments": {' + b"".join(
        json.dumps(k).encode() + b": " + json.dumps(v).encode() + b", " for k, v in extra.items()
    ) + json.dumps(field).encode() + b": " + literal + b"}}"
    response = daemon.client().post(f"/v1/tools/{tool}", content=body, headers=headers)
    if literal.startswith(b'"'):  # a string holding a number is the tool's own argument check
        assert response.status_code == 200, response.text
        assert response.json() == {"is_error": True, "result": {
            "error": f"{field} must be a finite number, not {literal.decode().strip(chr(34))}", "field": field}}
    else:
        message = _error(response, 422, "invalid_input")
        assert message.startswith(f"arguments.{field} holds "), message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"arguments": {"query": "caf\xe9"}}', "not valid UTF-8: byte 0xe9 at offset 28"),
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
        (b'{"arguments": {"query": "x", "top_k": ' + b"7" * 5000 + b"}}", "arguments.top_k holds a number of 5000"),
        (b'{"arguments": {"query": "x",}}', "not valid JSON: Expecting property name enclosed in double quotes "
                                            "at line 1 column 29"),
        (b'{"arguments": ' + b'{"a": ' * 70 + b"1" + b"}" * 70 + b"}", "nests deeper than 64 levels"),
    ],
)
def test_issue_19_a_body_that_cannot_be_parsed_says_why(daemon: DaemonProcess, body: bytes, expected: str) -> None:
    message = _error(daemon.client().post("/v1/tools/recall", content=body, headers=JSON), 422, "invalid_input")
    assert expected in message, message


# -- 12, 13. ttl_seconds out of range ---------------------------------------------------------


@pytest.mark.parametrize("ttl", [b"-1", b"0", b"-0.5", b"100000000000000000000", b'"-3"', b'"1e999"'])
def test_issue_19_a_ttl_that_is_not_positive_or_too_large_is_refused_naming_it(
    daemon: DaemonProcess, ttl: bytes
) -> None:
    before = daemon.export()["memories"]
    body = b'{"arguments": {"content": "The demo link works today.", "keys": ["demo", "link"], "ttl_seconds": ' \
        + ttl + b"}}"
    for tool in ("remember", "remember_batch"):
        if tool == "remember_batch":
            body = body.replace(b'{"arguments": {', b'{"arguments": {"items": [{').replace(b"}}", b"}]}}")
        answer = daemon.client().post(f"/v1/tools/{tool}", content=body, headers=JSON)
        assert answer.status_code == 200, answer.text
        result = answer.json()["result"]
        error = result if tool == "remember" else result["items"][0]
        assert error["field"] == "ttl_seconds", result
        assert ("finite" if b"e999" in ttl else "more than 0") in error["error"], result
    assert daemon.export()["memories"] == before


# -- 22. many unknown argument names ----------------------------------------------------------


def test_issue_19_ten_thousand_unknown_arguments_get_a_short_error_listing_a_few(daemon: DaemonProcess) -> None:
    arguments: dict[str, Any] = {"query": "staging", **{f"color_{i:05d}": i for i in range(10_000)}}
    answer = daemon.client().post("/v1/tools/recall", json={"arguments": arguments})
    assert answer.status_code == 200 and len(answer.content) < 2000, len(answer.content)
    result = answer.json()["result"]
    assert answer.json()["is_error"] and result["field"] == "color_00000"
    assert "'color_00000', 'color_00001'" in result["error"] and "and 9995 more" in result["error"], result


# -- 23. a tool route without a tool name -----------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/tools/"), ("GET", "/v1/tools/"), ("POST", "/v1/inject/")])
def test_issue_19_a_trailing_slash_gets_a_json_404_saying_what_to_call(
    daemon: DaemonProcess, method: str, path: str
) -> None:
    answer = daemon.client().request(method, path, json={"arguments": {}} if method == "POST" else None)
    message = _error(answer, 404, "not_found")
    if path.startswith("/v1/tools"):
        assert "POST /v1/tools/{name}" in message, message
    else:
        assert "no trailing slash: /v1/inject" in message, message


# -- 24. invisible keys and namespaces --------------------------------------------------------


def test_issue_19_keys_of_invisible_characters_alone_are_refused(daemon: DaemonProcess) -> None:
    before = daemon.export()["memories"]
    invisible = ["\u200b\u200b", "\u202e\u202d\u2066", "\ufeff\u200d", "\u3164\u3164", "a\u200b"]
    refused = daemon.call("remember", {"content": "Nothing to see here.", "keys": invisible})
    assert not refused["is_error"] and "keys required" in refused["result"]["error"], refused
    assert daemon.export()["memories"] == before
    kept = daemon.call("remember", {"content": "The release train leaves on Thursdays.",
                                    "keys": ["release", "\u200b\u200b", "Thursday"]})["result"]
    assert [k["concept"] for k in kept["keys"]] == ["release", "Thursday"], kept
    assert kept["dropped_keys"] == ["\u200b\u200b"]


def test_issue_19_bidi_controls_and_zero_width_characters_are_stripped_from_namespaces(
    daemon: DaemonProcess,
) -> None:
    spoof = "\u202eprod\u202c\u200b"
    saved = daemon.remember("The prod database is pg-7.", ["database", "prod"], namespace=spoof)
    memory = daemon.call("read_memory", {"memory_id": saved})["result"]["memory"]
    assert memory["namespace"] == "prod"
    found = daemon.call("recall", {"query": "database", "namespace": "prod"})["result"]
    assert saved in str(found), found
