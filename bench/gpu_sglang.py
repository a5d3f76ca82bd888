"""The real sglang EAGLE v2 loop (`sglang-eagle-v2`) on a GPU: what runs, findings, overhead.

    python3 bench/gpu_sglang.py --bundle BUNDLE --out OUT [--runs N]

BUNDLE holds what a machine without a package index needs: `sglang.tgz` (sglang's Python
sources and its dist-info) and `wheels/` (its light dependencies). They are installed into
BUNDLE/site, which is put on the path of a child process that runs, per configuration:

* the scenario under racecheck `cuda` (findings, seconds), and uninstrumented (seconds, outputs);
* the outputs of N uninstrumented runs compared with the first (a race showing as wrong values).

Writes OUT/gpu_sglang.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time

CONFIGS = [
    {"name": "cuda, graphs", "set": {"graphs": True, "flavour": "cuda"}},
    {"name": "cuda, eager", "set": {"graphs": False, "flavour": "cuda"}},
    {"name": "hip branches, graphs (no WAR barrier)", "set": {"graphs": True, "flavour": "hip"}},
]


def install(bundle: str) -> str:
    site = os.path.join(bundle, "site")
    if os.path.isdir(os.path.join(site, "sglang")):
        return site
    os.makedirs(site, exist_ok=True)
    wheels = os.path.join(bundle, "wheels")
    names = sorted({f.split("-")[0] for f in os.listdir(wheels) if f.endswith(".whl")})
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--find-links", wheels, "--target", site, *names], check=False)
    with tarfile.open(os.path.join(bundle, "sglang.tgz")) as tf:
        tf.extractall(site)
    return site


def child_env(site: str) -> dict:
    """The child's environment: the bundle first; then whatever racecheck this process was
    given (an install with its C code built); the source tree last, as a fallback."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [site, *inherited, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]))


def child(configs: list, runs: int) -> list:
    """In the process that has sglang on its path."""
    import torch

    from racecheck import native, scenarios

    sc = scenarios.get("sglang-eagle-v2")
    rows = []
    for c in configs:
        row = {"name": c["name"], "set": c["set"], "c_hot_path": native.speedups is not None,
               "c_engine": native.engine is not None}
        try:
            cfg = sc.config(overrides=c["set"])
            t0 = time.perf_counter()
            plain = scenarios.run_plain(sc, cfg, device="cuda")
            torch.cuda.synchronize()
            row["plain_first_s"] = time.perf_counter() - t0      # includes Triton compilation
            t0 = time.perf_counter()
            plain = scenarios.run_plain(sc, cfg, device="cuda")
            torch.cuda.synchronize()
            row["plain_s"] = time.perf_counter() - t0
            res = scenarios.run(sc, cfg, device="cuda")
            row["racecheck_s"] = res.seconds
            row["findings"] = sorted({(f.rule, f.tensor) for f in res.findings})
            row["details"] = [{"message": f.message(), "fix": f.suggestion,
                               "current": list(f.current.stack), "previous": list(f.previous.stack)}
                              for f in res.findings[:6]]
            row["internal_errors"] = [e.splitlines()[0] for e in res.internal_errors]
            row["outputs_equal_plain"] = res.outputs == plain
            wrong = 0
            for _ in range(runs):
                if scenarios.run_plain(sc, cfg, device="cuda") != plain:
                    wrong += 1
            row["runs"] = runs
            row["runs_differing"] = wrong
        except Exception as exc:     # report what did not run, and why
            import traceback
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-3000:]
        rows.append(row)
        print(json.dumps(row)[:400], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default=None, help="run only the configurations whose name has this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        rows = child([c for c in CONFIGS if args.only is None or args.only in c["name"]], args.runs)
        with open(os.path.join(args.out, "gpu_sglang.json"), "w") as fh:
            json.dump({"configs": rows}, fh, indent=1)
        return 0
    site = install(args.bundle)
    os.makedirs(args.out, exist_ok=True)
    env = child_env(site)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--bundle",
                           args.bundle, "--out", args.out, "--runs", str(args.runs)]
                          + (["--only", args.only] if args.only else []), env=env)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
