#!/usr/bin/env bash
# The main job: set up the venv (without the engine packages only the tests need), then show what
# racecheck does on the built-in EAGLE v2 scenario (CPU sim backend): the shipped pipeline fuzzed and
# clean, then each fix-off variant's bug found, shrunk, saved, with its one-line repro, as a table.
# BUDGET=10m for a longer run (default 90s); extra arguments go to `racecheck fuzz`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
SETUP_ENGINES=0 VENV="$VENV" bash scripts/setup.sh
status=0
"$VENV/bin/racecheck" fuzz eagle-v2 --every-variant --budget "${BUDGET:-90s}" "$@" || status=$?
echo
echo "racecheck is installed in $VENV: $VENV/bin/racecheck --help (or \`source $VENV/bin/activate\`, then"
echo "racecheck list, racecheck run eagle-v2 --variant no-mrope_recompute, racecheck exec -- python prog.py)"
exit "$status"
