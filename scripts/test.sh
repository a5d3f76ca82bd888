#!/usr/bin/env bash
# Sets up (idempotent) and runs the whole test suite, then the benchmarks in quick mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q -p no:cacheprovider tests
.venv/bin/python bench/run_all.py --quick
