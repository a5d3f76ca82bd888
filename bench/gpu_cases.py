"""The public hazard cases on a GPU: racecheck `cuda` and PyTorch's CSAN side by side.

    python bench/gpu_cases.py [--json OUT.json] [--md OUT.md] [--no-csan]

racecheck runs every case of tests/cases.py under `racecheck.session(device="cuda")` and compares
its findings with the ground truth (EXPECTED: exact (rule, tensor) pairs). CSAN
(`torch.cuda._sanitizer`) runs in a separate process (its trace callbacks and dispatch mode
cannot be removed once installed); its verdict is binary: it raises on the first race it sees.
CSAN is right on a case when it reports a race exactly where the ground truth has one.
Every case runs once outside any tool first, so kernels are loaded.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)


class _Plain:
    def __getattr__(self, name):
        import torch
        return getattr(torch.cuda, name)


def _warm(program):
    import torch
    keep = program(_Plain(), "cuda")
    del keep
    torch.cuda.synchronize()


def racecheck_cases() -> dict:
    import torch

    import racecheck
    from cases import EXPECTED
    out = {}
    for cid, (program, expected) in sorted(EXPECTED.items()):
        t0 = time.perf_counter()
        try:
            _warm(program)
            with racecheck.session(device="cuda") as rc:
                keep = program(rc.device_module, "cuda")  # noqa: F841
            torch.cuda.synchronize()
            got = sorted({(f.rule, f.tensor) for f in rc.findings})
            out[cid] = {"got": got, "expected": sorted(expected),
                        "ok": set(got) == set(expected) and not rc.internal_errors,
                        "internal_errors": [e.splitlines()[0] for e in rc.internal_errors],
                        "approx": sorted({f.approx for f in rc.findings if f.approx}),
                        "seconds": round(time.perf_counter() - t0, 3)}
        except Exception:
            out[cid] = {"got": None, "expected": sorted(expected), "ok": False,
                        "error": traceback.format_exc(limit=4)}
    return out


def csan_cases() -> dict:
    """Runs in its own process: enable CSAN, one fresh dispatch mode per case."""
    import contextlib

    import torch
    import torch.cuda._sanitizer as csan
    from cases import EXPECTED
    out = {}
    for cid, (program, expected) in sorted(EXPECTED.items()):
        try:
            _warm(program)
        except Exception:
            pass
        mode = csan.CUDASanitizerDispatchMode()
        err = io.StringIO()
        verdict, detail = "clean", ""
        try:
            with contextlib.redirect_stderr(err), mode:
                keep = program(_Plain(), "cuda")  # noqa: F841
                torch.cuda.synchronize()
        except csan.CUDASanitizerErrors as exc:
            verdict, detail = "race", str(exc).splitlines()[0] if str(exc) else "race"
        except Exception as exc:
            verdict, detail = "error", f"{type(exc).__name__}: {exc}"[:200]
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        truth = "race" if expected else "clean"
        out[cid] = {"csan": verdict, "truth": truth, "right": verdict == truth, "detail": detail}
    return out


def _csan_subprocess() -> dict | None:
    env = dict(os.environ)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--csan-worker"],
                       capture_output=True, text=True, timeout=600, env=env)
    for line in p.stdout.splitlines()[::-1]:
        if line.startswith("{"):
            return json.loads(line)
    sys.stderr.write(f"CSAN worker failed (exit {p.returncode}):\n{p.stderr[-3000:]}\n")
    return None


def _fmt_pairs(pairs) -> str:
    if pairs is None:
        return "error"
    return ", ".join(f"{r} {t}" for r, t in pairs) or "clean"


def to_markdown(rc: dict, cs: dict | None, device: str) -> str:
    lines = [f"Public cases on `{device}`", "",
             "| case | ground truth | racecheck cuda | ok | CSAN | CSAN right |",
             "| --- | --- | --- | --- | --- | --- |"]
    for cid in sorted(rc):
        r = rc[cid]
        c = (cs or {}).get(cid, {})
        lines.append(f"| {cid} | {_fmt_pairs(r['expected'])} | {_fmt_pairs(r.get('got'))} | "
                     f"{'yes' if r['ok'] else 'NO'} | {c.get('csan', 'n/a')} | "
                     f"{'yes' if c.get('right') else ('no' if c else 'n/a')} |")
    n_ok = sum(r["ok"] for r in rc.values())
    lines.append("")
    lines.append(f"racecheck: {n_ok}/{len(rc)} cases give the ground-truth verdict (exact rule and tensor).")
    if cs:
        n_c = sum(c["right"] for c in cs.values())
        lines.append(f"CSAN: {n_c}/{len(cs)} cases right (race reported exactly where there is one).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--no-csan", action="store_true")
    p.add_argument("--csan-worker", action="store_true")
    args = p.parse_args(argv)
    import torch
    if args.csan_worker:
        print(json.dumps(csan_cases()))
        return 0
    if not torch.cuda.is_available():
        print("no GPU: nothing to run")
        return 0
    device = torch.cuda.get_device_name()
    rc = racecheck_cases()
    cs = None if args.no_csan else _csan_subprocess()
    md = to_markdown(rc, cs, device)
    print(md)
    for cid, r in sorted(rc.items()):
        if not r["ok"]:
            print(f"--- {cid}: {r.get('error') or r}")
    if args.json:
        with open(args.json, "w") as fp:
            json.dump({"device": device, "torch": torch.__version__, "racecheck": rc, "csan": cs},
                      fp, indent=1)
    if args.md:
        with open(args.md, "w") as fp:
            fp.write(md)
    return 0 if all(r["ok"] for r in rc.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
