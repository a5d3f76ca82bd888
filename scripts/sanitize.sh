#!/usr/bin/env bash
# The C extensions (the per-op hot path and the checker's engine) under AddressSanitizer and
# UndefinedBehaviorSanitizer: both are built with -fsanitize=address,undefined into a copy of the
# checkout (the checkout's own build is left alone), and the tests that drive them against their
# Python reference run on that copy. Any sanitizer report fails the script.
#
#   VENV=DIR    the environment whose python runs the tests (default .venv, scripts/setup.sh's)
#   TESTS=...   test files to run (default: tests/test_native.py tests/test_checker_engine.py
#               tests/test_engine_faults.py: the C against its Python reference, and the engine's
#               error paths under failing allocations)
#   CI=true     a missing libasan/libubsan is an error (elsewhere the script says so and skips)
#
# Python's own allocator is switched to malloc (PYTHONMALLOC=malloc) so that ASan sees every
# allocation the C makes through PyMem_* and PyObject_*; leaks are not checked here (CPython keeps
# much of what it allocates until exit, by design).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-.venv}
case "$VENV" in /*) VPY="$VENV/bin/python" ;; *) VPY="$ROOT/$VENV/bin/python" ;; esac
TESTS=${TESTS:-"tests/test_native.py tests/test_checker_engine.py tests/test_engine_faults.py"}

skip_or_fail() {
  if [ "${CI:-}" = true ]; then
    echo "sanitize: $1 (CI needs it: install gcc with its sanitizer runtimes, e.g. apt-get install gcc)" >&2
    exit 1
  fi
  echo "sanitize: $1; skipped"
  exit 0
}

command -v gcc >/dev/null 2>&1 || skip_or_fail "no gcc"
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
[ -f "$libasan" ] || skip_or_fail "gcc has no libasan"
[ -f "$libubsan" ] || skip_or_fail "gcc has no libubsan"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src="$work/src"
mkdir "$src"
# the checkout's files as git sees them (tracked and untracked, not ignored: no venvs, builds or
# caches, nothing another process is writing there)
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
    | tar -C "$ROOT" --null -T - --ignore-failed-read -cf - | tar -C "$src" -xf -
else
  tar -C "$ROOT" --exclude=./.git --exclude='./.venv*' --exclude=./build --exclude='*.egg-info' \
      --exclude=__pycache__ --exclude='*.so' --exclude=./.hypothesis -cf - . | tar -C "$src" -xf -
fi
# One import tree, as the editable install maps it: racecheck/<sub> -> its folder (racecheck/_layout.py)
"$VPY" - "$src" <<'PY'
import os, runpy, sys
src = sys.argv[1]
for package, folder in runpy.run_path(os.path.join(src, "racecheck", "_layout.py"))["FOLDERS"].items():
    link = os.path.join(src, *package.split("."))
    if package != "racecheck" and not os.path.lexists(link):
        os.symlink(os.path.relpath(os.path.join(src, folder), os.path.dirname(link)), link)
PY

flags="-fsanitize=address,undefined -fno-omit-frame-pointer -O1 -g"
echo "sanitize: building the C extensions with $flags"
start=$SECONDS
(cd "$src" && RACECHECK_CFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" \
   "$VPY" setup.py -q build_ext --inplace >"$work/build.log" 2>&1) || { cat "$work/build.log"; exit 1; }
# the extensions are optional to setuptools: a failed compile is silent, so check each is there
for module in racecheck.core._engine racecheck.instrumentation._speedups; do
  so=$(ls "$src/$(echo "$module" | sed 's/^racecheck\.instrumentation/instrumentation/; s/\./\//g')".*.so 2>/dev/null || true)
  if [ -z "$so" ] || ! grep -q __asan_ <<<"$(nm -D "$so")"; then
    cat "$work/build.log"; echo "sanitize: $module was not built with ASan"; exit 1
  fi
done
echo "sanitize: built in $((SECONDS - start)) s"

export PYTHONPATH="$src" PYTHONMALLOC=malloc LD_PRELOAD="$libasan" PYTHONDONTWRITEBYTECODE=1
# ASan writes its reports to files; UBSan (its handlers are libasan's here) writes to stderr
# whatever log_path says, so pytest leaves file descriptor 2 alone (--capture=sys) and the
# report lands in the log. Either halts the run at the first report.
export ASAN_OPTIONS="detect_leaks=0:log_path=$work/asan:halt_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
unset RACECHECK_PURE_PYTHON
(cd "$src" && "$VPY" -c "
import racecheck.core._engine as e, racecheck.instrumentation._speedups as s
assert e.__file__.startswith('$src') and s.__file__.startswith('$src'), (e.__file__, s.__file__)")
status=0
# shellcheck disable=SC2086
(cd "$src" && "$VPY" -m pytest -q -x -p no:cacheprovider --capture=sys $TESTS) 2>&1 | tee "$work/tests.log" || status=$?
reports=$(ls "$work"/asan.* 2>/dev/null || true)
if [ -n "$reports" ] || grep -q "runtime error:\|ERROR: AddressSanitizer" "$work/tests.log"; then
  [ -z "$reports" ] || cat $reports
  echo "sanitize: the sanitizers reported errors (above)"
  exit 1
fi
[ "$status" = 0 ] || { echo "sanitize: the tests failed under the sanitizers (exit $status)"; exit "$status"; }
echo "sanitize: no AddressSanitizer or UndefinedBehaviorSanitizer report ($((SECONDS - start)) s)"
