#!/bin/sh
# keymem's MCP server launcher: what the Claude Code and Codex plugins run.
#
#   sh plugin/launcher.sh               the MCP server on stdio (hosts run this)
#   sh plugin/launcher.sh --bootstrap   build or repair the private venv now, then exit
#   sh plugin/launcher.sh --prepare     start that in the background and exit at once
#   sh plugin/launcher.sh --status      the venv's state as JSON
#
# Hosts install no Python dependencies for a plugin. The launcher runs the first keymem it
# finds:
#   1. $KEYMEM_PYTHON -m keymem_shim, when that interpreter has keymem installed;
#   2. keymem-shim on PATH (pipx install, uv tool install, pip install);
#   3. the private venv <data>/venv, when it holds this plugin's version
#      (<data> is $KEYMEM_DATA_DIR, default ~/.keymem).
# Otherwise it hands over to plugin/unavailable.py, which builds that venv from the plugin's
# own source in the background (plugin/bootstrap.py: one attempt at a time, resumable,
# logged to <data>/logs/bootstrap.log) and answers MCP meanwhile with a clear message, since
# a first install takes longer than a host waits for a server to start.
#
# Variables: KEYMEM_DATA_DIR, KEYMEM_PYTHON (an interpreter with keymem installed),
# KEYMEM_BOOTSTRAP_PYTHON (the interpreter that builds the venv; default: the first
# python3, python3.13 ... python3.10, python that is 3.10 or newer), KEYMEM_BOOTSTRAP_WAIT
# (seconds to wait for a running install before answering, default 0), and pip's own
# PIP_* variables for the install. It exports KEYMEM_HOST_CWD for the shim: the host's
# working directory, or empty when unknown (Codex starts plugin servers in the plugin dir).
set -u

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd -P) || exit 1
root=$(dirname -- "$here")

home=${HOME:-}
data=${KEYMEM_DATA_DIR:-}
case $data in
    '') data=$home/.keymem ;;
    \~) data=$home ;;
    \~/*) data=$home/${data#\~/} ;;
    /*) ;;
    *) data=$(pwd -P)/$data ;;  # relative: fixed now, before the cd below
esac
if [ -n "${KEYMEM_DATA_DIR:-}" ]; then
    KEYMEM_DATA_DIR=$data
    export KEYMEM_DATA_DIR
fi
venv=$data/venv
log=$data/logs/bootstrap.log

say() {
    # One line to stderr (the host's MCP log) and to bootstrap.log.
    printf 'keymem: %s\n' "$1" >&2
    if mkdir -p "$data/logs" 2>/dev/null; then
        printf '%s [%s] launcher: %s\n' "$(date '+%Y-%m-%dT%H:%M:%S%z')" "$$" "$1" >>"$log" 2>/dev/null
    fi
}

plugin_version() {
    sed -n 's/^version[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$root/pyproject.toml" 2>/dev/null | head -n 1
}

venv_ready() {
    [ -x "$venv/bin/keymem-shim" ] || return 1
    built=$(cat "$venv/keymem-plugin-version" 2>/dev/null) || return 1
    [ -n "$built" ] && [ "$built" = "$(plugin_version)" ]
}

python_ok() {
    # $1 runs and is Python 3.10 or newer.
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1
}

find_python() {
    # The interpreter that builds the venv (and runs the stand-in server), on stdout.
    if [ -n "${KEYMEM_BOOTSTRAP_PYTHON:-}" ]; then
        if python_ok "$KEYMEM_BOOTSTRAP_PYTHON"; then
            printf '%s\n' "$KEYMEM_BOOTSTRAP_PYTHON"
            return 0
        fi
        return 1
    fi
    for candidate in python3 python3.13 python3.12 python3.11 python3.10 python; do
        found=$(command -v "$candidate" 2>/dev/null) || continue
        if python_ok "$found"; then
            printf '%s\n' "$found"
            return 0
        fi
    done
    return 1
}

json_escape() {
    printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr -d '\n\r'
}

refuse() {
    # No usable Python at all: answer the host's first request with a JSON-RPC error that
    # says why (hosts show it as the server's start-up error), then exit.
    say "$1"
    IFS= read -r line || exit 1
    id=$(printf '%s\n' "$line" | sed -n 's/.*"id"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p')
    if [ -z "$id" ]; then
        id=$(printf '%s\n' "$line" | sed -n 's/.*"id"[[:space:]]*:[[:space:]]*\("[^"]*"\).*/\1/p')
    fi
    printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"%s"}}\n' \
        "${id:-null}" "$(json_escape "$1")"
    exit 1
}

host_cwd() {
    # The host's working directory. Claude Code starts plugin servers in the project; Codex
    # starts them in the plugin dir (a relative cwd is joined to the plugin root), so there
    # the parent's directory is the best witness (Linux /proc; elsewhere unknown).
    start=$(pwd -P 2>/dev/null) || start=''
    if [ -n "$start" ] && [ "$start" != "$root" ]; then
        printf '%s\n' "$start"
    elif [ -n "${CLAUDE_PROJECT_DIR:-}" ] && [ -d "$CLAUDE_PROJECT_DIR" ]; then
        printf '%s\n' "$CLAUDE_PROJECT_DIR"
    elif [ -d "/proc/$PPID/cwd" ]; then
        ppid_cwd=$(cd "/proc/$PPID/cwd" 2>/dev/null && pwd -P) || ppid_cwd=''
        if [ "$ppid_cwd" != "$root" ]; then
            printf '%s\n' "$ppid_cwd"
        fi
    fi
}

case ${1:-} in
    --bootstrap|--prepare|--status)
        py=$(find_python) || {
            say "no Python 3.10 or newer found (set KEYMEM_BOOTSTRAP_PYTHON)"
            exit 1
        }
        case $1 in
            --bootstrap) exec "$py" "$root/plugin/bootstrap.py" run "$root" ;;
            --prepare) exec "$py" "$root/plugin/bootstrap.py" start "$root" ;;
            --status) exec "$py" "$root/plugin/bootstrap.py" status "$root" ;;
        esac
        ;;
esac

if [ -z "${KEYMEM_HOST_CWD+set}" ]; then
    KEYMEM_HOST_CWD=$(host_cwd)
    export KEYMEM_HOST_CWD
fi
if [ -n "$KEYMEM_HOST_CWD" ]; then
    cd "$KEYMEM_HOST_CWD" 2>/dev/null || true
fi

if [ -n "${KEYMEM_PYTHON:-}" ]; then
    # Checked from / so that a keymem checkout in the current directory does not count.
    if (cd / && "$KEYMEM_PYTHON" -c 'import keymem_shim') >/dev/null 2>&1; then
        exec "$KEYMEM_PYTHON" -m keymem_shim "$@"
    fi
    say "KEYMEM_PYTHON=$KEYMEM_PYTHON cannot import keymem_shim; looking further"
fi
if command -v keymem-shim >/dev/null 2>&1; then
    exec keymem-shim "$@"
fi
if venv_ready; then
    exec "$venv/bin/keymem-shim" "$@"
fi

if [ -n "${KEYMEM_BOOTSTRAP_PYTHON:-}" ]; then
    wanted="KEYMEM_BOOTSTRAP_PYTHON=$KEYMEM_BOOTSTRAP_PYTHON is not Python 3.10 or newer"
else
    wanted="no Python 3.10 or newer found on PATH (python3, python3.1x, python)"
fi
py=$(find_python) || refuse "keymem cannot install itself: $wanted. Install Python 3.10+, or install keymem yourself so that keymem-shim is on PATH (pipx install $root). Log: $log"
exec "$py" "$root/plugin/unavailable.py" "$root"
