"""``keymemd``: start, stop and inspect the keymem daemon; export and import its store.

Human output by default; ``--json`` prints one JSON object on stdout instead (stable
keys). Diagnostics and progress go to stderr. An expected failure is one line on stderr
and exit code 1; misuse is exit code 2 (click's).

``start``, ``stop`` and ``status`` import only light modules (config, errors, runtime,
logs): no numpy, onnx, kiwi or fastapi, so they answer quickly. ``run`` imports the
daemon itself.
"""

from __future__ import annotations

import collections
import json
import os
import plistlib
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, Final, TextIO

import click

from keymem_daemon import __version__, cli_inspect, logs, runtime
from keymem_daemon.cli_shared import (
    CliState,
    daemon_client,
    daemon_error,
    emit,
    json_option,
    pass_state,
    ready_daemon,
)
from keymem_daemon.config import Settings, redacted_url
from keymem_daemon.errors import Conflict, DaemonNotRunning, KeymemError

if TYPE_CHECKING:
    # Imported where a command makes a request: ``keymemd run`` is the daemon, which makes
    # none and would carry httpx for nothing (see runtime.py).
    pass

LOG_TAIL_LINES: Final = 30
"""Log lines shown when ``start`` fails."""
FOLLOW_POLL_INTERVAL: Final = 0.25
TRANSFER_TIMEOUT: Final = 3600.0
"""Export and import of a large store may take minutes."""
SYSTEMD_UNIT: Final = "keymemd.service"
LAUNCHD_LABEL: Final = "dev.keymem.keymemd"

CONTEXT_SETTINGS: Final = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def note(message: str) -> None:
    """A diagnostic, on stderr."""
    click.echo(message, err=True)


def _change_log_line(log: Mapping[str, Any]) -> str:
    """``/v1/stats``'s ``change_log`` as one line of ``keymemd status``."""
    ago = log.get("read_to_end_s_ago")
    read = f"read to its end {ago} s ago" if ago is not None else "not read to its end yet"
    return f"at position {log.get('position')}, {read}" + ("" if log.get("connected") else " (not connected)")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{days}d" if days else "",
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
    ]
    return " ".join(p for p in parts if p) or f"{secs}s"


# -- the group -------------------------------------------------------------------------------


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="keymemd")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Data directory (default: KEYMEM_DATA_DIR, else ~/.keymem).",
)
@pass_state
def cli(state: CliState, data_dir: Path | None) -> None:
    """keymemd: the keymem long-term memory daemon (one per user and data directory).

    Example:

    \b
        keymemd start && keymemd status
    """
    if data_dir is not None:
        state.data_dir = data_dir.expanduser().resolve()


# ``start`` passes it on to the ``run`` it spawns.
port_option = click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help="Port on 127.0.0.1 (default: KEYMEM_PORT, else free).",
)


@cli.command()
@port_option
@click.option(
    "--timeout",
    type=click.FloatRange(0, min_open=True),
    help="Seconds to wait until ready (default: KEYMEM_START_TIMEOUT).",
)
@json_option
@pass_state
def start(state: CliState, port: int | None, timeout: float | None, as_json: bool) -> None:
    """Start the daemon in the background and wait until it is ready.

    Does nothing when a daemon already serves the data directory; concurrent starts end
    with exactly one daemon. On failure the end of the log is printed.

    Example:

    \b
        keymemd start --json
    """
    settings = state.settings(port=port)
    run_args = ["--port", str(port)] if port is not None else []
    try:
        result = runtime.start_daemon(settings, timeout=timeout, run_args=run_args, environ=state.environ)
    except KeymemError as exc:
        tail = logs.tail(settings.log_path, LOG_TAIL_LINES) if isinstance(exc, DaemonNotRunning) else []
        if tail:
            note(f"--- last {len(tail)} lines of {settings.log_path} ---")
            note("\n".join(tail))
        raise click.ClickException(exc.message) from None
    info = result.info
    verb = "started" if result.started else "already running"
    warnings = _warnings(info)
    emit(
        as_json,
        {
            "started": result.started,
            "pid": info.pid,
            "port": info.port,
            "url": info.url,
            "version": info.version,
            "data_dir": info.data_dir,
            "log": str(settings.log_path),
            "warnings": warnings,
        },
        f"keymemd {verb} on {info.url} (pid {info.pid}, data {info.data_dir})",
    )
    for warning in warnings:
        note(f"WARNING: {warning}")


def _warnings(info: runtime.DaemonInfo) -> list[str]:
    """What the daemon's /health says is wrong with its store."""
    health = runtime.get_health(info) or {}
    found = health.get("warnings")
    return [str(w) for w in found] if isinstance(found, list) else []


@cli.command()
@json_option
@pass_state
def stop(state: CliState, as_json: bool) -> None:
    """Stop the daemon: ask it to shut down, then SIGTERM, then SIGKILL.

    In-flight requests finish and the store is flushed first. Stopping a daemon that is
    not running is not an error.

    Example:

    \b
        keymemd stop
    """
    settings = state.settings()
    try:
        # A daemon still starting holds the lock before it publishes daemon.json: wait for it.
        owner = runtime.wait_for_owner(settings.data_dir, settings.start_timeout)
    except DaemonNotRunning as exc:
        raise click.ClickException(exc.message) from None
    if owner is None:
        reason = "keymemd is not running"
        try:
            runtime.read_daemon_info(settings.data_dir)
        except DaemonNotRunning as exc:
            reason = exc.message  # says why: no file, or a stale one
        stale = runtime.clear_stale_info(settings.data_dir)
        reason += "; removed the stale daemon.json" if stale else ""
        emit(as_json, {"stopped": False, "reason": reason}, f"keymemd is not running: {reason}")
        return
    info = owner
    try:
        how = runtime.stop_daemon(info, settings.data_dir)
    except DaemonNotRunning as exc:
        raise click.ClickException(exc.message) from None
    if how == "not_running":
        reason = (f"daemon.json named pid {info.pid}, which is not this data directory's daemon "
                  "(left alone; removed the stale daemon.json)")
        emit(as_json, {"stopped": False, "pid": info.pid, "how": how, "reason": reason},
             f"keymemd is not running: {reason}")
        return
    emit(
        as_json,
        {"stopped": True, "pid": info.pid, "how": how},
        f"keymemd stopped (pid {info.pid}, {how})",
    )


@cli.command()
@json_option
@pass_state
def status(state: CliState, as_json: bool) -> None:
    """Show whether the daemon runs, where, since when, and what it holds.

    Exit code 0 when it answers, 1 when it does not.

    Example:

    \b
        keymemd status --json
    """
    import httpx

    settings = state.settings()
    try:
        info = runtime.read_daemon_info(settings.data_dir)
    except DaemonNotRunning as exc:
        emit(
            as_json,
            {"running": False, "data_dir": str(settings.data_dir), "reason": exc.message},
            f"keymemd is not running: {exc.message}",
        )
        sys.exit(1)
    health = runtime.get_health(info)
    if health is None:
        reason = f"pid {info.pid} is alive but does not answer on {info.url}"
        emit(
            as_json,
            {"running": False, "pid": info.pid, "data_dir": info.data_dir, "reason": reason},
            f"keymemd is not answering: {reason}",
        )
        sys.exit(1)
    stats: dict[str, Any] = {}
    try:
        with daemon_client(info, runtime.HEALTH_TIMEOUT * 5) as client:
            response = client.get("/v1/stats")
        if response.status_code == 200:
            stats = response.json()
    except (httpx.HTTPError, ValueError):
        pass
    data: dict[str, Any] = {
        "running": True,
        "pid": info.pid,
        "port": info.port,
        "url": info.url,
        "version": info.version,
        "state": health.get("status"),
        "started_at": info.started_at,
        "uptime_s": round(time.time() - info.started_at, 1),
        "data_dir": info.data_dir,
        "store": stats.get("store"),
        "stores": stats.get("stores"),
        "change_log": stats.get("change_log"),
        "embedder": stats.get("embedder") or info.embedder,
        "memories": stats.get("memories"),
        "keys": stats.get("keys"),
        "links": stats.get("links"),
        "reranker": stats.get("reranker"),
        "learned_words": stats.get("learned_words"),
        "downloads": stats.get("downloads"),
        "warm_shim": str(settings.warm_shim_socket) if settings.warm_shim_socket.exists() else None,
    }
    if health.get("error"):
        data["error"] = health["error"]
    if health.get("detail"):
        data["detail"] = health["detail"]
    if health.get("warnings"):
        data["warnings"] = health["warnings"]
    lines = [
        f"keymemd {info.version} {data['state']} on {info.url} (pid {info.pid})",
        *([f"  loading:   {data['detail']}"] if data.get("detail") else []),
        f"  data dir:  {info.data_dir}",
        f"  uptime:    {_duration(data['uptime_s'])}",
    ]
    if data["store"]:
        lines.append(f"  store at:  {data['store']}")
    if data["memories"] is not None:
        lines.append(f"  store:     {data['memories']} memories, {data['keys']} keys, {data['links']} links")
    for part in data["stores"] or []:  # personal namespaces in SQLite, team ones in PostgreSQL
        counts = part.get("counts")
        held = (f"{counts['memories']} memories, {counts['keys']} keys, {counts['links']} links" if counts
                else "does not answer")
        lines.append(f"    {part['store']}: {held}")
    if isinstance(data["change_log"], dict):
        lines.append(f"  change log: {_change_log_line(data['change_log'])}")
    if data["embedder"]:
        lines.append(f"  embedder:  {data['embedder']}")
    if isinstance(data["reranker"], dict):
        rerank = data["reranker"]
        detail = rerank.get("detail")
        lines.append(f"  reranker:  {rerank.get('state')}" + (f" ({detail})" if detail else ""))
        if rerank.get("tokens_per_second"):
            lines.append(f"             {rerank['tokens_per_second']} tokens/s; within {rerank['budget_ms']} ms "
                         f"for a tool call and {rerank['inject_budget_ms']} ms for the prompt hook")
    if data["learned_words"]:
        lines.append(f"  loanwords: {', '.join(data['learned_words'])} (taught to the Korean analyser)")
    warm = data["warm_shim"] or "none (hosts' shims import the MCP SDK themselves)"
    lines.append(f"  warm shim: {warm}")
    if data.get("error"):
        lines.append(f"  error:     {data['error']}")
    lines.extend(f"  WARNING:   {warning}" for warning in data.get("warnings", []))
    emit(as_json, data, lines)


@cli.command()
@port_option
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log level (default: KEYMEM_LOG_LEVEL).",
)
@click.option("--background", is_flag=True, hidden=True, help="Log to the file only (used by start).")
@pass_state
def run(state: CliState, port: int | None, log_level: str | None, background: bool) -> None:
    """Run the daemon in the foreground until SIGTERM or Ctrl+C (for systemd and launchd).

    Logs go to <data>/logs/daemon.log and to stderr.

    Example:

    \b
        KEYMEM_DATA_DIR=/tmp/km keymemd run --port 8765
    """
    settings = state.settings(port=port, log_level=log_level)
    from keymem_daemon import daemon  # the heavy part: FastAPI, the engine, the models

    try:
        code = daemon.run(settings, log_to_stderr=not background)
    except KeymemError as exc:
        raise click.ClickException(exc.message) from None
    sys.exit(code)


@cli.command(name="logs")
@click.option(
    "-n",
    "--lines",
    default=50,
    show_default=True,
    type=click.IntRange(0),
    help="How many of the last lines to show.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until Ctrl+C.")
@json_option
@pass_state
def logs_cmd(state: CliState, lines: int, follow: bool, as_json: bool) -> None:
    """Show the daemon's log (<data>/logs/daemon.log).

    Example:

    \b
        keymemd logs -n 100 -f
    """
    if follow and as_json:
        raise click.UsageError("--json cannot be combined with --follow")
    path = state.settings().log_path
    if not follow:
        last = logs.tail(path, lines)
        emit(as_json, {"path": str(path), "lines": last}, last)
        return
    handle = _open_log(path)
    if handle is not None:  # the tail, then whatever is appended after it, from one handle
        for line in collections.deque(handle, maxlen=lines) if lines else ():
            click.echo(line, nl=False)
    _follow(path, handle)


def _open_log(path: Path) -> TextIO | None:
    try:
        return open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by _follow
    except FileNotFoundError:
        return None


def _follow(path: Path, handle: TextIO | None) -> None:
    """Print what is appended to ``path`` until interrupted, following it across rotations."""
    try:
        while True:
            chunk = handle.read() if handle is not None else ""
            if chunk:
                click.echo(chunk, nl=False)
                continue
            if handle is None or not logs.same_file(path, handle.fileno()):
                if handle is not None:
                    handle.close()
                handle = _open_log(path)  # rotated in (or created): read it from its start
                if handle is not None:
                    continue
            time.sleep(FOLLOW_POLL_INTERVAL)
    except KeyboardInterrupt:
        pass
    finally:
        if handle is not None:
            handle.close()


@cli.command(name="install-service")
@click.option("--systemd", "kind", flag_value="systemd", help="A systemd user unit (default on Linux).")
@click.option("--launchd", "kind", flag_value="launchd", help="A launchd agent plist (default on macOS).")
@click.option(
    "--write",
    is_flag=True,
    help="Write the file (instead of printing it) and print how to enable it.",
)
@click.option("--force", is_flag=True, help="With --write: replace a different existing file.")
@json_option
@pass_state
def install_service(state: CliState, kind: str | None, write: bool, force: bool, as_json: bool) -> None:
    """Print (or --write) a service definition that runs the daemon at login.

    The service runs `<python> -m keymem_daemon run` with KEYMEM_DATA_DIR set. Stop a
    daemon started with `keymemd start` before enabling it.

    Example:

    \b
        keymemd install-service --systemd --write
    """
    settings = state.settings()
    kind = kind or ("launchd" if sys.platform == "darwin" else "systemd")
    home = Path(state.environ.get("HOME") or Path.home())
    if kind == "systemd":
        path = home / ".config" / "systemd" / "user" / SYSTEMD_UNIT
        content = systemd_unit(settings)
        commands = [
            "systemctl --user daemon-reload",
            f"systemctl --user enable --now {SYSTEMD_UNIT}",
            'loginctl enable-linger "$USER"   # optional: keep it running after logout',
        ]
    else:
        path = home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
        content = launchd_plist(settings)
        commands = [
            f'launchctl bootstrap gui/"$(id -u)" "{path}"',
            f'launchctl kickstart -k gui/"$(id -u)"/{LAUNCHD_LABEL}',
        ]
    data: dict[str, Any] = {
        "kind": kind,
        "path": str(path),
        "content": content,
        "written": False,
        "commands": commands,
    }
    if not write:
        emit(as_json, data, content.rstrip("\n"))
        return
    if path.exists() and path.read_text(encoding="utf-8") != content and not force:
        raise click.ClickException(f"{path} exists with different content; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(content, encoding="utf-8")
    tmp.chmod(0o644)
    tmp.replace(path)
    data["written"] = True
    emit(as_json, data, [f"wrote {path}", "enable it with:", *(f"  {c}" for c in commands)])


def _systemd_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def systemd_unit(settings: Settings) -> str:
    """A systemd user unit running the daemon in the foreground."""
    return "\n".join(
        [
            "[Unit]",
            "Description=keymem long-term memory daemon (keymemd)",
            "",
            "[Service]",
            "Type=simple",
            f"ExecStart={_systemd_quote(sys.executable)} -m keymem_daemon run",
            f"Environment={_systemd_quote(f'KEYMEM_DATA_DIR={settings.data_dir}')}",
            "Restart=on-failure",
            "RestartSec=2",
            "TimeoutStopSec=45",
            "# The MCP shims of running host sessions are forks of keymemd's warm shim, so they",
            "# live in this unit's cgroup: stopping or restarting keymemd must not end them (each",
            "# exits with its host session; the warm shim exits with keymemd).",
            "KillMode=process",
            "",
            "[Install]",
            "WantedBy=default.target",
            "",
        ]
    )


def launchd_plist(settings: Settings) -> str:
    """A launchd agent running the daemon in the foreground (launchd jobs must not fork)."""
    log = str(settings.log_dir / "launchd.log")
    plist = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": [sys.executable, "-m", "keymem_daemon", "run"],
        "EnvironmentVariables": {"KEYMEM_DATA_DIR": str(settings.data_dir)},
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Background",
        "StandardOutPath": log,
        "StandardErrorPath": log,
    }
    return plistlib.dumps(plist).decode("utf-8")


@cli.command()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file (default: stdout).",
)
@click.option("--include-vectors", is_flag=True, help="Also export the vectors (larger; skips re-embedding).")
@json_option
@pass_state
def export(state: CliState, output: Path | None, include_vectors: bool, as_json: bool) -> None:
    """Export the whole store as lossless JSON (the input of `keymemd import`).

    Example:

    \b
        keymemd export -o keymem-backup.json
    """
    info = ready_daemon(state.settings())
    with daemon_client(info, TRANSFER_TIMEOUT) as client:
        response = client.post("/v1/export", json={"include_vectors": include_vectors})
    if response.status_code != 200:
        raise daemon_error(response)
    if output is None:
        click.echo(response.text)
        return
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        # Every memory is in it: private (0600) whatever the umask, like the store itself.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, runtime.PRIVATE_FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), runtime.PRIVATE_FILE_MODE)
            handle.write(response.content)
        tmp.replace(output)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    counts = {k: len(v) for k, v in response.json().items() if isinstance(v, list)}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    emit(
        as_json,
        {"path": str(output), "bytes": len(response.content), "counts": counts},
        f"exported {summary or 'the store'} to {output}",
    )


@cli.command(name="import")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@json_option
@pass_state
def import_cmd(state: CliState, file: Path, as_json: bool) -> None:
    """Import a keymem export (or an upstream keymem graph.json) into the store.

    Progress goes to stderr; a file that does not validate changes nothing and exits 1.

    Example:

    \b
        keymemd import keymem-backup.json
    """
    try:
        raw = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise click.ClickException(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise click.ClickException(f"{file} holds a JSON {type(parsed).__name__}; expected an export object")
    del parsed
    info = ready_daemon(state.settings())
    import httpx

    result: dict[str, Any] | None = None
    tty = sys.stderr.isatty()
    last_phase = None
    # SIGTERM cancels like Ctrl+C: the connection closes and the daemon abandons the import.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with (
            daemon_client(info, TRANSFER_TIMEOUT) as client,
            client.stream("POST", "/v1/import", content=raw, headers={"Content-Type": "application/json"}) as response,
        ):
            if response.status_code != 200:
                response.read()
                raise daemon_error(response)
            for line in response.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("event")
                if kind == "progress":
                    phase, done, total = event.get("phase"), event.get("done"), event.get("total")
                    if tty:
                        click.echo(f"\r{phase}: {done}/{total}   ", nl=False, err=True)
                    elif phase != last_phase or done == total:
                        note(f"{phase}: {done}/{total}")
                    last_phase = phase
                elif kind == "error":
                    if tty:
                        note("")
                    error = event.get("error") or {}
                    raise click.ClickException(f"import failed: {error.get('message', event)}")
                elif kind == "done":
                    result = event.get("result") or {}
    except KeyboardInterrupt:
        raise click.ClickException("import cancelled: the daemon abandons it and imports nothing") from None
    except (httpx.HTTPError, ValueError) as exc:
        raise click.ClickException(
            f"the import did not finish: the daemon went away ({type(exc).__name__}); an import cut short "
            "commits nothing (see keymemd logs)"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if tty and last_phase is not None:
        note("")
    if result is None:
        raise click.ClickException("the daemon ended the import without a result; see keymemd logs")
    summary = _summarize(result)
    emit(as_json, {"imported": True, "result": result}, summary or "imported")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@cli.command()
@click.argument("backup", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--no-start", is_flag=True, help="Leave the daemon stopped afterwards.")
@json_option
@pass_state
def restore(state: CliState, backup: Path | None, no_start: bool, as_json: bool) -> None:
    """Put a backup in place of the store (keymem.db) and start the daemon on it.

    BACKUP is a file of <data>/backups (its name is enough) or any path; without it, the
    newest backup there. It must pass SQLite's integrity check and be a keymem store. A
    running daemon is stopped first. The files it replaces (keymem.db and its -wal and
    -shm) are moved to <data>/replaced/<time>/, never deleted.

    Example:

    
        keymemd restore                               # the newest good backup
        keymemd restore keymem-20261130T101500Z.db    # this one
    """
    import sqlite3

    from keymem_daemon import backups

    settings = state.settings()
    if settings.store_url is not None and not settings.federated:  # federated: the local half is SQLite's
        raise click.ClickException(f"KEYMEM_STORE_URL is set: the store is {settings.store_description}, whose "
                                   "server keeps and backs up the data (pg_dump / pg_restore); keymemd restore puts "
                                   "back SQLite backups only")
    try:
        chosen = backups.choose(settings.backup_dir, backup)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    # Queued starts (a host's shim reconnecting) wait until the backup is in place.
    try:
        with runtime.start_lock(settings.data_dir, settings.start_timeout + runtime.START_LOCK_MARGIN):
            stopped = _stop_for_restore(settings)
            try:
                lock = runtime.acquire_daemon_lock(settings.data_dir)
            except Conflict as exc:
                raise click.ClickException(f"{exc.message}: stop it (keymemd stop), then restore again") from None
            try:
                restored = backups.restore(chosen, settings.db_path, now=time.time())
            except (OSError, sqlite3.Error) as exc:
                raise click.ClickException(f"cannot restore {chosen.path}: {exc}; the store is as it was") from None
            finally:
                lock.release()
    except DaemonNotRunning as exc:
        raise click.ClickException(exc.message) from None
    data: dict[str, Any] = {"restored": str(chosen.path), "memories": chosen.memories, "stopped": stopped,
                            "set_aside": [str(p) for p in restored.set_aside], "started": False}
    lines = [f"restored {chosen.path} ({chosen.memories} memories) to {settings.db_path}"]
    if restored.set_aside:
        lines.append(f"the files it replaced are in {restored.set_aside[0].parent}")
    if not no_start:
        try:
            info = runtime.start_daemon(settings, environ=state.environ).info
        except DaemonNotRunning as exc:
            raise click.ClickException(f"restored, but keymemd did not start: {exc.message}") from None
        data.update(started=True, pid=info.pid, url=info.url)
        lines.append(f"keymemd started on the restored store (pid {info.pid}, {info.url})")
    else:
        lines.append("start it with: keymemd start")
    emit(as_json, data, lines)


def _stop_for_restore(settings: Settings) -> int | None:
    """Stop the daemon that owns the data directory, if one does; its pid."""
    owner = runtime.wait_for_owner(settings.data_dir, settings.start_timeout)
    if owner is None:
        return None
    runtime.stop_daemon(owner, settings.data_dir)
    note(f"stopped keymemd (pid {owner.pid}) to restore the store")
    return owner.pid


def _summarize(result: Mapping[str, Any]) -> str:
    """``{"imported": {"memories": 3}, "skipped": {...}}`` -> ``imported: 3 memories; ...``."""
    parts = []
    for name, value in result.items():
        if isinstance(value, Mapping):
            counts = ", ".join(f"{n} {k}" for k, n in value.items() if isinstance(n, int))
            parts.append(f"{name}: {counts or 'nothing'}")
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{value} {name}")
    return "; ".join(parts)


@cli.command(name="migrate-store")
@click.option("--to", "url", required=True, metavar="URL",
              help="The PostgreSQL store: postgresql://ROLE@HOST:PORT/DATABASE (password: the URL, ~/.pgpass or "
                   "PGPASSWORD).")
@json_option
@pass_state
def migrate_store(state: CliState, url: str, as_json: bool) -> None:
    """Copy the local SQLite store (<data>/keymem.db) into a PostgreSQL store, and verify the copy.

    Run it with the daemon stopped. Progress goes to stderr. Interrupted (Ctrl+C, a lost
    connection), the same command continues where it stopped without copying anything twice.
    A database that already holds other keymem data is refused and left as it is. At the
    end both stores are compared, table by table and by a checksum of their exports; then
    point keymem at the copy with KEYMEM_STORE_URL. The SQLite store is left as it was.

    Example:

    \b
        keymemd stop
        keymemd migrate-store --to postgresql://alice@db.example:5432/keymem
        export KEYMEM_STORE_URL=postgresql://alice@db.example:5432/keymem && keymemd start
    """
    from keymem_daemon.config import parse_store_url

    settings = state.settings()
    try:
        url = parse_store_url("--to", url)
    except KeymemError as exc:
        raise click.ClickException(exc.message) from None
    try:
        from keymem_daemon import store_migration
    except ImportError as exc:  # psycopg is the optional 'team' extra
        raise click.ClickException(f"migrate-store needs psycopg ({exc}): pip install 'keymem[team]'") from None
    started = time.monotonic()

    def progress(phase: str, done: int, total: int) -> None:
        rate = f" ({done / (time.monotonic() - started):.0f}/s)" if phase == "memories" else ""
        note(f"{phase}: {done}/{total}{rate}")

    try:
        done = store_migration.migrate_store(settings, url, progress=progress)
    except KeymemError as exc:
        raise click.ClickException(exc.message) from None
    counts = done.verified.counts
    memories = counts["memories"]
    emit(as_json, {"target": done.target, "resumed": done.resumed, "result": done.result, "counts": counts,
                   "sha256": done.verified.sha256, "seconds": round(done.seconds, 2)}, [
        f"{'resumed and ' if done.resumed else ''}copied {settings.db_path} to {done.target} in {done.seconds:.1f} s "
        f"({memories / max(done.seconds, 1e-9):.0f} memories/s): {_summarize(done.result)}",
        "verified: " + ", ".join(f"{n} {name}" for name, n in counts.items())
        + f" on both sides, export checksum sha256 {done.verified.sha256[:16]}... equal",
        f"serve from it with: KEYMEM_STORE_URL={redacted_url(url)} keymemd start"])


# -- team memory: grants on the PostgreSQL store (store/postgres/grants.py, psycopg directly) --


def _team_store_url(state: CliState) -> str:
    url = state.settings().store_url
    if url is None:
        raise click.ClickException("KEYMEM_STORE_URL is not set: team commands manage the grants of a PostgreSQL "
                                   "store (KEYMEM_STORE_URL=postgresql://OWNER@HOST:PORT/DATABASE)")
    return url


def _grants_module() -> ModuleType:
    """store/postgres/grants.py, imported when a team command runs: psycopg is optional."""
    try:
        from keymem_daemon.store.postgres import grants
    except ImportError as exc:  # psycopg is the optional 'team' extra
        raise click.ClickException(f"team memory needs psycopg ({exc}): pip install 'keymem[team]'") from None
    return grants


@cli.group()
def team() -> None:
    """Team memory: grant roles read or write access to namespaces of the PostgreSQL store.

    KEYMEM_STORE_URL names the database; grant and revoke need its owner (or a member of
    the owner's role), list shows the grants that apply to the connecting role (all of them
    for the owner). PostgreSQL's row-level security enforces them for every connection.

    Example:

    \b
        keymemd team grant deploy-rules alice --write
        keymemd team list
    """


@team.command()
@click.argument("namespace")
@click.argument("role")
@click.option("--read", "mode", flag_value="read", default=True, help="Read only (the default).")
@click.option("--write", "mode", flag_value="write", help="Read and write.")
@json_option
@pass_state
def grant(state: CliState, namespace: str, role: str, mode: str, as_json: bool) -> None:
    """Let ROLE read (or, with --write, read and write) NAMESPACE; granting again changes the mode.

    The first grant on an empty database also creates keymem's schema there.

    Example:

    \b
        keymemd team grant deploy-rules alice --write
    """
    grants = _grants_module()
    try:
        done = grants.grant(_team_store_url(state), namespace, role, "write" if mode == "write" else "read")
    except KeymemError as exc:
        raise click.ClickException(exc.message) from None
    emit(as_json, asdict(done), f"{done.role} may now {'read and write' if done.mode == 'write' else 'read'} "
                                f"namespace {done.namespace}")


@team.command()
@click.argument("namespace")
@click.argument("role")
@json_option
@pass_state
def revoke(state: CliState, namespace: str, role: str, as_json: bool) -> None:
    """Take ROLE's access to NAMESPACE away (with its last grant, ROLE may no longer connect).

    Example:

    \b
        keymemd team revoke deploy-rules alice
    """
    grants = _grants_module()
    try:
        removed = grants.revoke(_team_store_url(state), namespace, role)
    except KeymemError as exc:
        raise click.ClickException(exc.message) from None
    emit(as_json, {"namespace": namespace, "role": role, "revoked": removed},
         f"{role} no longer has access to namespace {namespace}" if removed
         else f"{role} had no grant on namespace {namespace}")


@team.command(name="list")
@click.argument("namespace", required=False)
@click.option("--role", help="Only this role's grants.")
@json_option
@pass_state
def list_command(state: CliState, namespace: str | None, role: str | None, as_json: bool) -> None:
    """List grants (of NAMESPACE, if given): namespace, role, mode, when.

    Example:

    \b
        keymemd team list deploy-rules --json
    """
    grants = _grants_module()
    try:
        found = grants.list_grants(_team_store_url(state), namespace=namespace, role=role)
    except KeymemError as exc:
        raise click.ClickException(exc.message) from None
    rows = [[g.namespace, g.role, g.mode, g.granted_at] for g in found]
    emit(as_json, {"grants": [asdict(g) for g in found]},
         cli_inspect.table(["namespace", "role", "mode", "granted"], rows) if rows else "no grants")


# The inspection commands: ui, search, show, forget, keys, activity.
for _command in cli_inspect.COMMANDS:
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """The ``keymemd`` console script."""
    cli.main(args=argv, prog_name="keymemd", obj=CliState(environ=os.environ))
