"""``keymemd ui``, ``search``, ``show``, ``forget``, ``keys`` and ``activity``: the store, for a
person in a terminal.

They read through the daemon's ``/v1/inspect`` routes (the inspector's page data, with the
bearer token) and delete through the ``forget`` tool, so they see and do exactly what the
web inspector and the agents do. Human tables by default; ``--json`` prints the daemon's
answer as one JSON object (``activity -f --json``: one object per line).

``cli.py`` adds ``COMMANDS`` to its group.
"""

from __future__ import annotations

import json
import time
import webbrowser
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Final
from urllib.parse import quote

import click

from keymem_daemon.cli_shared import CliState, daemon_client, daemon_error, emit, json_option, pass_state, ready_daemon

ACTIVITY_POLL_INTERVAL: Final = 1.0
"""Seconds between ``keymemd activity -f`` polls (a person watching, not a benchmark)."""
CONTENT_COLUMN: Final = 60


def _get(state: CliState, path: str, params: Mapping[str, Any] | None = None) -> Any:
    info = ready_daemon(state.settings())
    with daemon_client(info) as client:
        response = client.get(path, params={k: v for k, v in (params or {}).items() if v is not None})
    if response.status_code != 200:
        raise daemon_error(response)
    return response.json()


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M")


def _cut(text: str, width: int = CONTENT_COLUMN) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, as wide as their widest cell."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip(), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out


def _memory_path(memory_id: str) -> str:
    return "/v1/inspect/memory/" + quote(memory_id, safe="")


@click.command()
@click.option("--print", "print_only", is_flag=True, help="Print the login link instead of opening a browser.")
@json_option
@pass_state
def ui(state: CliState, print_only: bool, as_json: bool) -> None:
    """Open the web inspector: a one-time login link (valid for 60 s) in the default browser.

    Example:

    \b
        keymemd ui --print
    """
    info = ready_daemon(state.settings())
    with daemon_client(info) as client:
        response = client.post("/v1/inspect/login-link")
    if response.status_code != 200:
        raise daemon_error(response)
    url = str(response.json()["url"])
    opened = False if print_only or as_json else webbrowser.open(url)
    emit(as_json, {"url": url, "opened": opened},
         f"opened the inspector in your browser ({url})" if opened else url)


@click.command()
@click.argument("query", default="")
@click.option("--namespace", help="Only this namespace.")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True, help="Most results.")
@json_option
@pass_state
def search(state: CliState, query: str, namespace: str | None, limit: int, as_json: bool) -> None:
    """Search memories (hybrid recall, nothing reinforced); no QUERY lists the newest.

    Example:

    \b
        keymemd search "deploy schedule" --namespace work
    """
    data = _get(state, "/v1/inspect/search", {"q": query, "namespace": namespace, "limit": limit})
    rows = [[r["id"], r["validity"]["status"], r["namespace"], _cut(r["content"]),
             ", ".join(k["concept"] for k in r["keys"])] for r in data["results"]]
    human = table(["id", "validity", "namespace", "content", "keys"], rows) if rows else ["no memories found"]
    emit(as_json, data, human)


@click.command()
@click.argument("memory_id")
@json_option
@pass_state
def show(state: CliState, memory_id: str, as_json: bool) -> None:
    """Show one memory in full: keys, validity, provenance and history (counts no access).

    Example:

    \b
        keymemd show 3f9a1c2b4d5e
    """
    data = _get(state, _memory_path(memory_id))
    emit(as_json, data, _describe(data))


def _describe(data: Mapping[str, Any]) -> list[str]:
    m = data["memory"]
    v = m["validity"]
    prov = data.get("provenance") or {}
    lines = [f"memory {m['id']} ({m['namespace']})", "", m["content"], ""]
    lines.append(f"validity: {v['status']} ({v['freshness']:.2f}), {data['decay_profile']}, "
                 f"confirmed {data['confirmation_count']}x")
    lines.append(f"saved: {_when(m['created_at'])}" + (f", observed {_when(m['observed_at'])}" if m["observed_at"]
                                                     else "") + (f", expires {_when(m['expires_at'])}"
                                                                 if m["expires_at"] else ""))
    if prov:
        lines.append("provenance: " + ", ".join(f"{k}={v}" for k, v in prov.items()))
    if m["superseded_by"]:
        lines.append(f"superseded by {m['superseded_by']}")
    lines.append("keys: " + (", ".join(f"{k['concept']} ({k['link_weight']})" for k in data["keys"]) or "-"))
    for old in data["history"]:
        lines.append(f"supersedes {old['id']}: {_cut(old['content'])}")
    return lines


@click.command()
@click.argument("memory_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@pass_state
def forget(state: CliState, memory_id: str, yes: bool, as_json: bool) -> None:
    """Permanently delete a memory (the forget tool); asks first unless --yes.

    Example:

    \b
        keymemd forget 3f9a1c2b4d5e --yes
    """
    data = _get(state, _memory_path(memory_id))
    if not yes:
        click.echo(f"{memory_id}: {_cut(data['memory']['content'], 200)}", err=True)
        if not click.confirm("Forget this memory for good?", err=True):
            raise click.ClickException("not forgotten")
    info = ready_daemon(state.settings())
    with daemon_client(info) as client:
        response = client.post("/v1/tools/forget", json={"arguments": {"memory_id": memory_id}})
    if response.status_code != 200:
        raise daemon_error(response)
    result = response.json()["result"]
    if result.get("error") or not result.get("deleted"):
        raise click.ClickException(str(result.get("error") or f"Memory {memory_id} not found"))
    restored = f"; restored the version it corrected, {result['restored']}" if result.get("restored") else ""
    emit(as_json, result, f"forgot {memory_id}{restored}")


@click.command()
@click.option("--namespace", help="Only this namespace.")
@click.option("--hubs", is_flag=True, help="Only hub keys.")
@click.option("--limit", type=click.IntRange(1, 500), default=100, show_default=True, help="Most keys.")
@json_option
@pass_state
def keys(state: CliState, namespace: str | None, hubs: bool, limit: int, as_json: bool) -> None:
    """List keys, hubs first, then by how many memories they hold.

    Example:

    \b
        keymemd keys --hubs
    """
    data = _get(state, "/v1/inspect/keys", {"namespace": namespace, "hubs": str(hubs).lower(), "limit": limit})
    rows = [[k["key_id"], k["concept"], str(k["memory_count"]), "hub" if k["is_hub"] else "",
             ", ".join(k["aliases"] + k["learned_aliases"])] for k in data["keys"]]
    human = table(["key_id", "concept", "memories", "", "aliases"], rows) if rows else ["no keys"]
    emit(as_json, data, human)


def _entry_line(entry: Mapping[str, Any]) -> str:
    return f"{_when(entry['at'])}  {entry['kind']:<14}  {entry['summary']}"


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new entries until Ctrl+C.")
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True, help="Entries shown first.")
@click.option("--kind", help="Only this kind (inject, remember, correct, forget, confirm_memory, dismiss, import).")
@json_option
@pass_state
def activity(state: CliState, follow: bool, limit: int, kind: str | None, as_json: bool) -> None:
    """Show the activity log: writes, corrections, deletions and what was pushed into prompts.

    Example:

    \b
        keymemd activity -f
    """
    data = _get(state, "/v1/inspect/activity", {"limit": limit, "kind": kind})
    entries = list(reversed(data["entries"]))
    if not follow:
        human = [_entry_line(e) for e in entries] or [
            "no activity yet" if data["enabled"] else "the activity log is off (KEYMEM_INJECT_LOG=off)"]
        emit(as_json, data, human)
        return
    latest = int(data["latest_id"])
    try:
        while True:
            for entry in entries:
                click.echo(json.dumps(entry, ensure_ascii=False, sort_keys=True) if as_json else _entry_line(entry))
            time.sleep(ACTIVITY_POLL_INTERVAL)
            data = _get(state, "/v1/inspect/activity", {"after": latest, "limit": 500, "kind": kind})
            entries = list(reversed(data["entries"]))
            latest = max(latest, int(data["latest_id"]))
    except KeyboardInterrupt:
        return


COMMANDS: Final = (ui, search, show, forget, keys, activity)
