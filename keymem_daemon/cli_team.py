"""``keymemd team grant|revoke|list``: which roles may read or write which namespaces of the
PostgreSQL store that ``KEYMEM_STORE_URL`` names.

They talk to PostgreSQL directly (``store/postgres/grants.py``), not to a daemon: managing
grants is the database owner's business, and row-level security on the server is what
enforces them. psycopg is imported only when one of them runs, so the other commands stay
light. ``cli.py`` imports this module at its end, which registers the group on it.
"""

from __future__ import annotations

from dataclasses import asdict
from types import ModuleType

import click

from keymem_daemon.cli import CliState, cli, emit, json_option, pass_state
from keymem_daemon.cli_inspect import table
from keymem_daemon.errors import KeymemError


def _store_url(state: CliState) -> str:
    url = state.settings().store_url
    if url is None:
        raise click.ClickException("KEYMEM_STORE_URL is not set: team commands manage the grants of a PostgreSQL "
                                   "store (KEYMEM_STORE_URL=postgresql://OWNER@HOST:PORT/DATABASE)")
    return url


def _grants_module() -> ModuleType:
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
        done = grants.grant(_store_url(state), namespace, role, "write" if mode == "write" else "read")
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
        removed = grants.revoke(_store_url(state), namespace, role)
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
        found = grants.list_grants(_store_url(state), namespace=namespace, role=role)
    except KeymemError as exc:
        raise click.ClickException(exc.message) from None
    rows = [[g.namespace, g.role, g.mode, g.granted_at] for g in found]
    emit(as_json, {"grants": [asdict(g) for g in found]},
         table(["namespace", "role", "mode", "granted"], rows) if rows else "no grants")
