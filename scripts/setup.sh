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
#
# Another sglang release, or a source checkout (the PR gate's case), in an environment of its own:
#
#   SGLANG=0.5.20 VENV=.venv-sglang-0.5.20 bash scripts/setup.sh
#   SGLANG=/path/to/sglang-checkout VENV=.venv-sglang-pr bash scripts/setup.sh
#   BASE_VENV=DIR        the environment whose torch, triton and racecheck are reused (default .venv,
#                        set up first the default way)
#
# VENV is a plain venv whose site-packages holds a `zz-racecheck-base.pth` that appends BASE_VENV's
# site-packages to sys.path AFTER its own (site.addsitedir, so the base's own .pth files, the
# editable racecheck among them, are processed too). Why this and not one shared environment or
# --system-site-packages: the release's sglang and the exact versions it pins (transformers,
# xgrammar, tokenizers, ...) sit first on the path and win, while torch (a CPU wheel, about 200 MB
# that must never be replaced by PyPI's CUDA build), triton and racecheck exist once, in the base;
# --system-site-packages would only reach the interpreter's own packages, not another venv's. pip
# in VENV sees the base's packages as installed (so a plain `torch` requirement is satisfied by the
# base's CPU torch) and never uninstalls them (they lie outside VENV's prefix).
#
# The release's dependencies are its own Requires-Dist (the wheel's METADATA, or the checkout's
# pyproject.toml), less GPU-only packages (torch and its companions, CUDA/NVIDIA wheels, native
# kernel packages, triton pins: see GPU_ONLY below); pip resolves them in a dry run under
# constraints that pin the base's torch and triton, and the resolved set, less the same GPU-only
# names (timm, say, asks for torchvision), is installed without further dependencies. Whatever
# shim a release's imports still need (stand-ins for the native packages, torchvision for sglang's
# own imports only) is scenarios/sglang/imports.py's work, at import time.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
SGLANG_VERSION=0.5.23
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ -n "${SGLANG:-}" ]; then
  BASE=${BASE_VENV:-.venv}
  [ "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/$(basename "$VENV")" != "$(pwd)/$(basename "$BASE")" ] \
    || { echo "setup: VENV must not be the base environment $BASE" >&2; exit 2; }
  env -u SGLANG VENV="$BASE" bash "$0"                  # the base the default way (quick if done)
  BPY="$BASE/bin/python"
  base_site=$("$BPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ -x "$VENV/bin/python" ] || "$BPY" -m venv "$VENV"
  VPY="$VENV/bin/python"
  site=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import site; site.addsitedir('$base_site')" > "$site/zz-racecheck-base.pth"
  for script in racecheck racecheck-gate; do             # the base's entry points, run by VENV
    [ -f "$BASE/bin/$script" ] && sed "1s|.*|#!$VPY|" "$BASE/bin/$script" > "$VENV/bin/$script" \
      && chmod +x "$VENV/bin/$script"
  done
  if [ -d "$SGLANG" ]; then                               # a source checkout
    src=$(cd "$SGLANG" && pwd)
    [ -f "$src/python/pyproject.toml" ] && src="$src/python"
    [ -f "$src/pyproject.toml" ] || { echo "setup: no pyproject.toml in $SGLANG or $SGLANG/python" >&2; exit 2; }
    want="checkout $src $(cksum < "$src/pyproject.toml")"
  else
    want="release $SGLANG"
  fi
  stamp="$VENV/.sglang-setup"
  if [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ] \
     && "$VPY" -c "import importlib.metadata as m; m.version('sglang')" 2>/dev/null; then
    echo "setup: sglang ($want) already set up in $VENV"
    echo "setup: ready: $VENV/bin/racecheck, $VENV/bin/python -m pytest"
    exit 0
  fi
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  if [ -d "$SGLANG" ]; then
    "$VPY" - "$src/pyproject.toml" > "$work/requires.txt" <<'PYEOF'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"].get("dependencies", [])))
PYEOF
  else
    "$VPY" -m pip download -q --no-deps -d "$work" "sglang==$SGLANG"
    "$VPY" - "$work"/sglang-*.whl > "$work/requires.txt" <<'PYEOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
print("\n".join(line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")))
PYEOF
  fi
  # GPU-only (or torch-build-bound) names never installed here; `*` ends a prefix
  GPU_ONLY="torch torchvision torchaudio torchcodec torchao triton xformers vllm sgl-kernel
    sglang-kernel sgl-deep-gemm sgl-deep-ep sgl-flash-mla flashinfer* nvidia-* cuda-* nvshmem*
    cupy* flash-attn* flash-mla flash_mla deep-gemm deep-ep quack-kernels tilelang tokenspeed-mla
    humming-kernels helion torch-memory-saver decord*"
  filter() {  # requirement lines on stdin -> those for this platform, no extras, no GPU-only names
    "$VPY" -c '
import re, sys
from packaging.requirements import Requirement
gpu = sys.argv[1].split()
def norm(n): return re.sub(r"[-_.]+", "-", n).lower()
def gpu_only(n): return any(n == g or (g.endswith("*") and n.startswith(g[:-1])) for g in map(norm, gpu))
for line in sys.stdin:
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if gpu_only(norm(req.name)):
        continue
    req.marker = None
    print(req)
' "$GPU_ONLY"
  }
  filter < "$work/requires.txt" > "$work/light.txt"
  torch_v=$("$VPY" -c "import importlib.metadata as m; print(m.version('torch').split('+')[0])")
  triton_v=$("$VPY" -c "import importlib.metadata as m; print(m.version('triton'))")
  printf 'torch==%s\ntriton==%s\n' "$torch_v" "$triton_v" > "$work/pins.txt"
  # 0.5.11-0.5.12 ask for `kernels` unpinned; its newer releases break the transformers they pin at
  # import (hub_kernels: "Either a revision or a version must be specified"): the pin 0.5.13 chose
  if grep -qx 'kernels' "$work/requires.txt"; then echo 'kernels>=0.14.1,<0.15' >> "$work/pins.txt"; fi
  echo "setup: sglang $SGLANG: $(wc -l < "$work/light.txt") light dependencies (of $(wc -l < "$work/requires.txt")), resolving"
  "$VPY" -m pip install -q --dry-run --report "$work/report.json" -c "$work/pins.txt" -r "$work/light.txt"
  "$VPY" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    print(meta["name"] + "==" + meta["version"])
' "$work/report.json" | filter > "$work/resolved.txt"
  if [ -s "$work/resolved.txt" ]; then
    "$VPY" -m pip install -q --no-deps --no-compile -r "$work/resolved.txt"
  fi
  if [ -d "$SGLANG" ]; then
    # an editable install builds sglang's own extension where the checkout has one; without the
    # tools for that, the checkout goes on the path as it is (the extension's users have Python
    # fallbacks for a CPU run)
    if ! "$VPY" -m pip install -q --no-deps -e "$src"; then
      echo "setup: editable install of $src failed: putting it on the path as it is"
      echo "$src" > "$site/sglang-checkout.pth"
    fi
  else
    "$VPY" -m pip install -q --no-deps --no-compile "$work"/sglang-*.whl
  fi
  echo "$want" > "$stamp"
  echo "setup: ready: sglang $("$VPY" -c "import importlib.metadata as m; print(m.version('sglang'))" 2>/dev/null || echo "($src)") in $VENV; $VENV/bin/racecheck, $VENV/bin/python -m pytest"
  exit 0
fi

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

# racecheck and the extras: pip only when the stamp (pyproject, setup.py, the C sources,
# extras) is new or racecheck is not imported from this checkout
extras=test
[ "${SETUP_ENGINES:-1}" = 0 ] || extras=test,triton,sglang
stamp="$VENV/.racecheck-setup"
sums="$(cat pyproject.toml setup.py racecheck/core/*.[ch] instrumentation/*.c | cksum) $(pwd)"
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
