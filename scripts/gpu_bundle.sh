#!/usr/bin/env bash
# Packs sglang for a GPU machine that has torch and Triton but no package index (ci/gpu-sglang,
# bench/gpu_sglang.py --bundle): sglang's Python sources and dist-info, without compiled modules
# (sglang.txz), and wheels for CPython 3.12 of the light dependencies a front-door run imports
# that such an image lacks, plus nvidia-ml-py (NVML names the GPU without initializing CUDA).
#
#   BUNDLE=DIR [VENV=.venv] [PY_VERSION=3.12] bash scripts/gpu_bundle.sh
#
# VENV is an environment set up by scripts/setup.sh (its sglang is the one packed). The wheels are
# the distributions that importing sglang's scheduler, EAGLE worker, Triton backend and Llama
# models loads in VENV, at the versions VENV resolved for sglang, less the ones a GPU image
# brings (torch, Triton, numpy and their companions, tokenizers, pillow).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BUNDLE:?BUNDLE=DIR names where the bundle goes}"
VENV=${VENV:-.venv}
PYV=${PY_VERSION:-3.12}
VPY="$VENV/bin/python"
mkdir -p "$BUNDLE/wheels"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

site=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
version=$("$VPY" -c "import importlib.metadata as m; print(m.version('sglang'))")
tar -C "$site" --exclude='__pycache__' --exclude='*.so' --exclude='*.pyc' \
    -cJf "$BUNDLE/sglang.txz" sglang "sglang-$version.dist-info"

# what a front-door import loads, as name==version of the distributions
PYV="$PYV" "$VPY" - > "$work/wanted.txt" <<'EOF'
import importlib.metadata as md, os, re, sys, warnings
os.environ.setdefault("TRITON_INTERPRET", "1")
warnings.simplefilter("ignore")
from racecheck.scenarios.sglang import imports, surface
imports.install()
surface.ENTRY.get()
for mod in ("sglang.srt.speculative.eagle_worker_v2", "sglang.srt.layers.attention.triton_backend",
            "sglang.srt.models.llama", "sglang.srt.models.llama_eagle"):
    __import__(mod)
# what the GPU image brings, what is packed apart (sglang) or installed apart (racecheck), and
# redis, which only racecheck's fuzz database imports
not_packed = {"torch", "triton", "numpy", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
              "filelock", "fsspec", "setuptools", "typing-extensions", "tokenizers", "pillow",
              "racecheck", "sglang", "redis"}
from packaging.requirements import Requirement
def norm(n): return re.sub(r"[-_.]+", "-", n).lower()
dists = md.packages_distributions()
names = {norm(d) for m in list(sys.modules) for d in dists.get(m.split(".")[0], [])} - not_packed
# and what they need (a module imported lazily still needs its distribution: openai's distro)
env = {"extra": "", "python_version": os.environ["PYV"], "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64"}
todo = list(names)
while todo:
    for line in md.requires(todo.pop()) or ():
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = norm(req.name)
        if name not in names and name not in not_packed:
            try:
                md.version(name)
            except md.PackageNotFoundError:
                continue
            names.add(name)
            todo.append(name)
for name in sorted(names):
    print(f"{name}=={md.version(name)}")
try:
    print(f"nvidia-ml-py=={md.version('nvidia-ml-py')}")
except md.PackageNotFoundError:
    print("nvidia-ml-py")
EOF
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
"$VPY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${platforms[@]}" -d "$BUNDLE/wheels" -r "$work/wanted.txt"
echo "gpu_bundle: sglang $version and $(ls "$BUNDLE/wheels" | wc -l) wheels in $BUNDLE ($(du -sh "$BUNDLE" | cut -f1))"
