#!/usr/bin/env bash
# The main job: set up, then fuzz the built-in EAGLE v2 scenario on the sim backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/racecheck fuzz eagle-v2 --device sim --budget "${BUDGET:-60s}" "$@"
