"""Secrets in memory content are redacted before anything is stored: the stored text, the
lexical index, the export and the database files never hold them, and the response says
what was removed."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import FakeClock, Tools, db_read, memory_row, open_graph, remember

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.redact import redact
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.inference.embedders import Embedder
from keymem_daemon.mcp.tools import Context, call_tool

pytestmark = pytest.mark.timeout(60)

AWS = "AKIAIOSFODNN7EXAMPLE"
GITHUB = "ghp_abcdefghijklmnopqrstuvwxyz0123456789AB"
OPENAI = "sk-proj-abcdefghijklmnopqrstuvwxyz0123"
PASSWORD = "hunter2hunter2"
PRIVATE = "MIIEowIBAAKCAQEAsecretkeymaterial"
PRIVATE_BLOCK = (
    f"-----BEGIN RSA PRIVATE KEY-----\n{PRIVATE}\nmore+material/==\n-----END RSA PRIVATE KEY-----"
)

CASES = [
    ("aws_access_key", f"The deploy bot uses access key {AWS} in CI", AWS),
    ("github_token", f"The release job authenticates with {GITHUB}", GITHUB),
    ("openai_key", f"Embeddings are billed to {OPENAI} for now", OPENAI),
    ("secret", f"The staging db password={PASSWORD} rotates monthly", PASSWORD),
    ("private_key", f"The deploy key is\n{PRIVATE_BLOCK}\nstored in the vault", PRIVATE),
]


@pytest.mark.parametrize(("kind", "text", "secret"), CASES, ids=[c[0] for c in CASES])
def test_each_kind_of_secret_is_replaced_by_a_marker(kind: str, text: str, secret: str) -> None:
    clean, found = redact(text)
    assert secret not in clean
    assert f"[REDACTED:{kind}]" in clean
    assert [(r.kind, r.count) for r in found] == [(kind, 1)]


def test_ordinary_text_about_passwords_is_left_alone() -> None:
    text = "The password policy requires 12 characters and a token bucket limits retries"
    assert redact(text) == (text, [])


def test_a_korean_password_statement_is_redacted() -> None:
    clean, found = redact("와이파이 비밀번호는 qwer1234zz 이다")
    assert "qwer1234zz" not in clean and found[0].kind == "secret"


@pytest.mark.parametrize(("kind", "text", "secret"), CASES, ids=[c[0] for c in CASES])
def test_remember_stores_and_exports_no_secret_and_reports_it(
    graph: MemoryGraph,
    tools: Tools,  # noqa: F811
    kind: str,
    text: str,
    secret: str,
) -> None:
    result = tools.ok("remember", {"content": text, "keys": ["credentials", "deployment", "배포"]})
    assert result["redacted"] == [{"kind": kind, "count": 1}]
    row = memory_row(graph, result["saved"])
    assert (
        row is not None and secret not in row["content"] and f"[REDACTED:{kind}]" in row["content"]
    )
    assert secret not in graph.read_memory(result["saved"]).memory.content
    assert secret not in str(transfer.export(graph, include_vectors=True))
    fts = db_read(graph.store, lambda c: [tuple(r) for r in c.execute("SELECT * FROM memory_fts")])
    assert secret.lower() not in str(fts).lower()


def test_secrets_never_reach_the_database_files(
    tmp_path: Path,
    embedder: Embedder,
    analyzer: Analyzer,  # noqa: F811
    clock: FakeClock,
) -> None:
    settings = Settings(data_dir=tmp_path, tools="full")
    g = open_graph(tmp_path / "keymem.db", embedder, settings, clock, analyzer)
    ctx = Context(g, settings, Host())
    try:
        text = " ".join(t for _, t, _ in CASES)
        saved = call_tool(
            ctx, "remember", {"content": text, "keys": ["credentials", "infra"]}
        ).result["saved"]
        call_tool(
            ctx,
            "correct",
            {
                "memory_id": saved,
                "content": f"Rotated: new key {AWS.replace('EXAMPLE', 'EXAMPL2')}",
            },
        )
        call_tool(
            ctx,
            "remember_batch",
            {
                "items": [
                    {"content": f"Batch secret {GITHUB}", "keys": ["batch", "token"]},
                    {"content": f"Another password={PASSWORD}", "keys": ["batch", "password"]},
                ]
            },
        )
    finally:
        g.close()
    secrets = [s for _, _, s in CASES] + [AWS.replace("EXAMPLE", "EXAMPL2")]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, f"{secret} found in {path.name}"


def test_a_correction_and_a_batch_are_redacted_too(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    mid = remember(graph, "The CI token lives in the vault", ["CI", "token"])
    fixed = tools.ok("correct", {"memory_id": mid, "content": f"The CI token is {GITHUB}"})
    assert fixed["redacted"] == [{"kind": "github_token", "count": 1}]
    assert GITHUB not in graph.read_memory(fixed["new_id"]).memory.content
    batch = tools.ok(
        "remember_batch",
        {
            "items": [
                {"content": f"Ops password={PASSWORD}", "keys": ["ops", "password"]},
                {"content": "Nothing secret here", "keys": ["ops", "note"]},
            ]
        },
    )
    assert batch["items"][0]["redacted"] == [{"kind": "secret", "count": 1}]
    assert "redacted" not in batch["items"][1]
    assert PASSWORD not in graph.read_memory(batch["items"][0]["saved"]).memory.content


def test_a_secret_in_a_key_is_redacted(graph: MemoryGraph, tools: Tools) -> None:  # noqa: F811
    result = tools.ok("remember", {"content": "The bot key is set", "keys": [AWS, "bot"]})
    concepts = [k["concept"] for k in result["keys"]]
    assert AWS not in str(concepts)
    assert AWS not in str(transfer.export(graph))


def test_no_redaction_means_no_redacted_field(tools: Tools) -> None:  # noqa: F811
    assert "redacted" not in tools.ok(
        "remember", {"content": "Deploys go out on Fridays", "keys": ["deployment", "Friday"]}
    )
