"""Run the fuzzer's tests on both ends of the Hypothesis range racecheck declares.

The fuzzer uses a few Hypothesis details that are not public API (racecheck/drivers/fuzz/_hypothesis.py);
the declared range is the one where they work, and this checks both of its ends. Each end gets a
temporary virtual environment that sees this environment's packages (torch, racecheck) but has
its own Hypothesis, installed with pip:

    python scripts/hypothesis_ends.py                 # lowest allowed and newest allowed
    python scripts/hypothesis_ends.py --only low      # one end
    python scripts/hypothesis_ends.py -- -k shrink    # extra pytest arguments

Exit 0 when both ends pass, 1 when one fails, 2 on bad input (no range found, pip failed).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ["tests/test_fuzz.py", "tests/test_fuzz_toy.py", "tests/test_repro.py", "tests/test_fuzz_eagle.py",
         "tests/test_adversarial.py"]


def declared_range() -> str:
    """The Hypothesis requirement in pyproject.toml, e.g. "hypothesis>=6.124.9,<7"."""
    from packaging.requirements import Requirement
    try:
        import tomllib
    except ImportError:                      # Python 3.10: read the installed metadata instead
        from importlib.metadata import requires
        deps = requires("racecheck") or []
    else:
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
            deps = tomllib.load(fh)["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        if req.name == "hypothesis":
            return f"hypothesis{req.specifier}"
    raise SystemExit("hypothesis_ends: pyproject.toml declares no hypothesis dependency")


def lowest(spec: str) -> str:
    from packaging.requirements import Requirement
    lows = [s.version for s in Requirement(spec).specifier if s.operator in (">=", "==")]
    if not lows:
        raise SystemExit(f"hypothesis_ends: {spec} has no lower bound to test")
    return f"hypothesis=={lows[0]}"


def make_env(where: str, requirement: str) -> str:
    """A venv at `where` whose own site-packages (with `requirement`) come before this one's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
    py = os.path.join(where, "bin", "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    base = sysconfig.get_paths()["purelib"]
    with open(os.path.join(site, "_racecheck_base_env.pth"), "w") as fh:
        fh.write(f"import site; site.addsitedir({base!r})\n")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site,
                        requirement], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"hypothesis_ends: pip could not install {requirement}")
    return py


def run_end(name: str, requirement: str, pytest_args) -> tuple:
    with tempfile.TemporaryDirectory(prefix=f"racecheck-hypothesis-{name}-") as d:
        py = make_env(os.path.join(d, "env"), requirement)
        version = subprocess.run([py, "-c", "import hypothesis; print(hypothesis.__version__)"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        print(f"== {name}: {requirement} -> hypothesis {version}", flush=True)
        status = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *pytest_args],
                                cwd=ROOT).returncode
    return version, status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["low", "high"], help="test one end only")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = p.parse_args(argv)
    try:
        spec = declared_range()
        ends = {"low": lowest(spec), "high": spec}
        results = {}
        for name, req in ends.items():
            if args.only in (None, name):
                results[name] = run_end(name, req, args.pytest_args)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
            return 2
        raise
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(f"hypothesis_ends: {' '.join(map(str, exc.cmd))} failed with status {exc.returncode}\n")
        return 2
    for name, (version, status) in results.items():
        print(f"{name:5} hypothesis {version:10} {'passed' if status == 0 else f'FAILED (pytest exit {status})'}")
    return 0 if all(s == 0 for _, s in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
