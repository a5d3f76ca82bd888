#!/usr/bin/env bash
# Builds the wheel, installs it (not editable) into a fresh venv outside the checkout and uses it as
# someone who installed the package would: `racecheck list`, a fix-off variant (exit 1 expected),
# and the pytest plugin on a racy test. torch in that venv is the version .venv has.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-.venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
isolation=()
"$VENV/bin/python" -c "import setuptools, wheel" 2>/dev/null && isolation=(--no-build-isolation)
mkdir "$work/src"     # a clean copy: a build/ folder left in the checkout would leak into the wheel
tar -C "$ROOT" --exclude=./.git --exclude='./.venv*' --exclude=./build --exclude='*.egg-info' \
    --exclude=__pycache__ --exclude='*.so' -cf - . | tar -C "$work/src" -xf -
"$VENV/bin/python" -m pip wheel -q --no-deps "${isolation[@]}" -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/racecheck-*.whl)
echo "wheel-check: built $(basename "$wheel")"

torch=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
python3 -m venv "$work/venv"
index=()
[ -z "${TORCH_INDEX_URL:-}" ] || index=(--index-url "$TORCH_INDEX_URL")
"$work/venv/bin/python" -m pip install -q "${index[@]}" "torch==$torch"
"$work/venv/bin/python" -m pip install -q "$wheel" pytest numpy
cd "$work"
"$work/venv/bin/python" -c "import racecheck, sys; assert '/site-packages/' in racecheck.__file__, racecheck.__file__"
if command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; then
  "$work/venv/bin/python" -c "from racecheck.core import native; assert native.built is not None, 'the wheel has no C hot path'; assert native.engine_built is not None, 'the wheel has no C engine'"
  echo "wheel-check: the C hot path and engine are in the wheel: ok"
fi

bin="$work/venv/bin"
"$bin/racecheck" list > list.txt
grep -q "eagle-v2" list.txt || { echo "wheel-check: racecheck list shows no eagle-v2"; exit 1; }
echo "wheel-check: racecheck list: ok"

status=0
"$bin/racecheck" run eagle-v2 --variant no-req_pool_padding_zero > run.txt || status=$?
if [ "$status" != 1 ] || ! grep -q "RC006" run.txt; then
  cat run.txt; echo "wheel-check: racecheck run eagle-v2 --variant no-req_pool_padding_zero: exit $status, expected 1 with RC006"; exit 1
fi
echo "wheel-check: racecheck run eagle-v2 --variant no-req_pool_padding_zero: exit 1, RC006 found: ok"

cat > test_racy.py <<'PY'
import torch

def test_racy():
    s = torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x.add_(1)
    y = x * 2
PY
status=0
"$bin/python" -m pytest -q -p no:cacheprovider --racecheck test_racy.py > pytest.txt 2>&1 || status=$?
if [ "$status" != 1 ] || ! grep -q "RC001" pytest.txt; then
  cat pytest.txt; echo "wheel-check: pytest --racecheck: exit $status, expected 1 with RC001"; exit 1
fi
echo "wheel-check: pytest --racecheck on a racy test: fails with RC001: ok"
