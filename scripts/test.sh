#!/usr/bin/env bash
# Sets up the venv (idempotent), runs the benchmarks in quick mode, then the whole test suite (its 25
# slowest tests listed, then its verdict line: the last thing printed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
VENV="$VENV" bash scripts/setup.sh
"$VENV/bin/python" bench/run_all.py --quick
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=25 tests
