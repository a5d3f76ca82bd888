#!/usr/bin/env bash
# Sets up a virtual environment with torch, racecheck (editable) and its test extras, and the engine
# packages the tests drive (triton; sglang without its own dependency list). Idempotent and quick on
# a second run: what is already importable is kept, pip runs only when something is missing or
# pyproject.toml changed.
#
#   VENV=DIR             environment to use or create (default .venv); an existing one keeps its torch
#   PYTHON=python3.X     interpreter for a new environment (default python3); when it can import torch
#                        already, the new environment sees its packages and reuses that torch
#   TORCH_INDEX_URL=URL  where torch comes from when it must be installed, e.g.
#                        https://download.pytorch.org/whl/cpu for the CPU build (default: pip's own
#                        configured index; on Linux PyPI's torch is the CUDA build, several GB)
#   TORCH_VERSION=V      torch version to install when none is importable (default 2.13.0)
#   SETUP_ENGINES=0      skip triton and sglang (the fuzzing demo does not need them; the tests do)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
SGLANG_VERSION=0.5.23
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import sys, torch; sys.exit(sys.prefix != sys.base_prefix)" 2>/dev/null; then
    echo "setup: $PY has torch: $VENV will reuse it (--system-site-packages)"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
pipi() { "$VPY" -m pip install --progress-bar on "$@"; }

if version=$("$VPY" -c "import torch; print(torch.__version__)" 2>/dev/null); then
  echo "setup: torch $version already importable, kept"
else
  index=()
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    index=(--index-url "$TORCH_INDEX_URL")
    echo "setup: installing torch ${TORCH_VERSION:-2.13.0} from $TORCH_INDEX_URL"
  else
    echo "setup: installing torch ${TORCH_VERSION:-2.13.0} from pip's configured index" \
         "(set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU build)"
  fi
  pipi "${index[@]}" "torch==${TORCH_VERSION:-2.13.0}"
fi

# racecheck and the extras: pip only when the stamp (pyproject, setup.py, the C hot path's source,
# extras) is new or racecheck is not imported from this checkout
extras=test
[ "${SETUP_ENGINES:-1}" = 0 ] || extras=test,triton,sglang
stamp="$VENV/.racecheck-setup"
sums="$(cat pyproject.toml setup.py racecheck/*.c | cksum) $(pwd)"
have="$(cat "$stamp" 2>/dev/null || true)"
if { [ "$have" != "$sums test,triton,sglang" ] && [ "$have" != "$sums $extras" ]; } \
   || ! "$VPY" -c "import os, racecheck, pytest; assert os.path.samefile(os.path.dirname(racecheck.__file__), 'racecheck')" 2>/dev/null; then
  pipi -e ".[$extras]"
  echo "$sums $extras" > "$stamp"
fi

if [ "${SETUP_ENGINES:-1}" != 0 ] \
   && ! "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '$SGLANG_VERSION')" 2>/dev/null; then
  # sglang's own dependency list pulls CUDA packages and another torch: its light dependencies come
  # from the `sglang` extra above, sglang itself without dependencies
  pipi --no-deps "sglang==$SGLANG_VERSION"
fi
echo "setup: ready: $VENV/bin/racecheck, $VENV/bin/python -m pytest"
