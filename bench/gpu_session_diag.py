"""Back-to-back runs of a scenario in one process on a GPU, with and without racecheck.

    python bench/gpu_session_diag.py [--quick] [--json OUT.json] [--variant V]

A process that has run one session must run the next one normally (fuzzing and the
manifestation measurement run many). Each configuration runs in its own process:
  plain-plain        the pipeline twice, no racecheck
  rc-rc              two racecheck `cuda` sessions (the default: the device module's wrappers)
  rc-rc-blocking     the same with CUDA_LAUNCH_BLOCKING=1 (an error then names its real call)
  rc-rc-noindex      two sessions, device-side index snapshots off (whole-tensor index footprints)
  rc-rc-callbacks    two sessions with torch's GPU trace callbacks too (callbacks=True)
  rc-plain           a session, then the pipeline plainly
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback

CONFIGS = {
    "plain-plain": ("plain", "plain"),
    "rc-rc": ("rc", "rc"),
    "rc-rc-blocking": ("rc", "rc"),
    "rc-rc-noindex": ("rc-noindex", "rc-noindex"),
    "rc-rc-callbacks": ("rc-callbacks", "rc-callbacks"),
    "rc-plain": ("rc", "plain"),
}


def worker(config: str, variant) -> dict:
    import torch

    from racecheck import scenarios
    from racecheck.scenarios import RunContext
    sc = scenarios.get("eagle-v2")
    cfg = sc.config(variant=variant)
    out = {"config": config, "runs": []}
    for i, kind in enumerate(CONFIGS[config]):
        r = {"run": i, "kind": kind}
        try:
            if kind == "plain":
                sc.run_once(cfg, RunContext(torch.cuda, "cuda", None, pin=True, seed=0))
            else:
                opts = {}
                if kind == "rc-callbacks":
                    opts["callbacks"] = True
                if kind == "rc-noindex":
                    from racecheck.instrumentation.base import Backend
                    from racecheck.instrumentation.device import DeviceBackend
                    DeviceBackend.index_footprint = Backend.index_footprint
                res = scenarios.run(sc, cfg, device="cuda", session_options=opts)
                r["findings"] = sorted({(f.rule, f.tensor) for f in res.findings})
                r["internal_errors"] = [e.splitlines()[0] for e in res.internal_errors]
            torch.cuda.synchronize()
            r["ok"] = True
        except Exception as exc:
            r["ok"] = False
            r["error"] = f"{type(exc).__name__}: {exc}"[:400]
            r["trace"] = traceback.format_exc(limit=8)[-2500:]
            out["runs"].append(r)
            break
        out["runs"].append(r)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--variant")
    p.add_argument("--worker")
    args = p.parse_args(argv)
    if args.worker:
        print("@@diag " + json.dumps(worker(args.worker, args.variant)))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("no GPU: nothing to run")
        return 0
    results = []
    for config in CONFIGS:
        env = dict(os.environ)
        if config.endswith("blocking"):
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", config]
        if args.variant:
            cmd += ["--variant", args.variant]
        try:
            pr = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            lines = [ln for ln in pr.stdout.splitlines() if ln.startswith("@@diag ")]
            res = json.loads(lines[-1][7:]) if lines else {"config": config, "crashed": pr.returncode,
                                                           "stderr": pr.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            res = {"config": config, "crashed": "timeout"}
        results.append(res)
        runs = res.get("runs", [])
        status = "ok" if runs and all(r.get("ok") for r in runs) and len(runs) == 2 else "FAILED"
        print(f"{config:16s} {status}")
        for r in runs:
            if not r.get("ok"):
                print(f"   run {r['run']} ({r['kind']}): {r.get('error')}\n{r.get('trace', '')}")
        if "crashed" in res:
            print(f"   crashed: {res['crashed']} {res.get('stderr', '')[-800:]}")
    if args.json:
        with open(args.json, "w") as fp:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, fp, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
