"""Scenario variants on a GPU: detection as on `sim`, and how often each race gives wrong values.

    python bench/gpu_manifest.py [--runs N] [--us MICROSECONDS] [--budget SECONDS]
                                 [--variants V ...] [--plan-json FILE] [--json OUT] [--md OUT]

For every variant of every scenario (and the all-fixes configuration):
1. detection: one run on `sim` and one on `cuda`; the (rule, tensor) signatures should agree and
   include the variant's expected findings; all fixes on should be clean;
2. manifestation: N runs without delays and N runs with a delay plan, counting runs whose outputs
   differ from the serialized run (the differential oracle). The plan is the one the fuzzer aims
   for: for each race the detector reports, a delay on the earlier access's stream before its op
   (the producer of a read-after-write, the reader of a write-after-read), `--us` long. A plan
   file (`{"variant": [holds...]}`) overrides it. The all-fixes configuration runs under the union
   of the variants' plans as a control: delays must not change correct code's outputs.
Runs happen in worker processes: a race can make a kernel fault (an index read from a racing
buffer), which leaves the process's CUDA context unusable; the worker then exits, the run counts
as an error, and a fresh worker goes on with the remaining runs. The undelayed runs go first, so
kernels are loaded before any delayed run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback

_REPLAY = re.compile(r"\(?replay of graph \d+\)?")
_MARK = "@@manifest "


def producer_plan(findings, us: float) -> list:
    """Delays before the earlier access of every race finding (deduplicated)."""
    holds, seen = [], set()
    for f in findings:
        if f.rule not in ("RC001", "RC002", "RC003", "RC004", "RC005", "RC007"):
            continue
        prev = f.previous
        if prev is None or not prev.stream or prev.stream.startswith("host"):
            continue
        op = prev.op or ""
        op = "graph_replay" if "replay of graph" in op else _REPLAY.sub("", op).strip()
        if not op:
            continue
        key = (prev.stream, op)
        if key in seen:
            continue
        seen.add(key)
        holds.append({"stream": prev.stream, "op": op, "us": float(us)})
    return holds


def _sig(res) -> list:
    return sorted({(f.rule, f.tensor) for f in res.findings if f.rule != "DIFF"})


_FAULTS = ("illegal memory", "illegal address", "device-side assert", "misaligned address",
           "unspecified launch failure", "an illegal instruction")


def _fault(exc) -> bool:
    """A kernel fault (a racing index read out of range, say): the run crashed, a wrong result."""
    text = str(exc).lower()
    return any(f in text for f in _FAULTS)


def _last_error(stderr: str) -> str:
    """The line of a dead worker's stderr that says what went wrong, else its last line."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() and not line.startswith("frame #"):
            return line[:300]
    return lines[-1][:300] if lines else ""


def _cuda_error(exc) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "AcceleratorError" in text or "CUDA error" in text or _fault(exc)


def _probe(device) -> bool:
    """Is this process's device state healthy before the next run?"""
    if device != "cuda":
        return True
    import torch
    try:
        torch.cuda.synchronize()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()
        return True
    except Exception:
        return False


# -- the worker: runs tasks, one JSON line per task ------------------------------------------------

def worker(spec: dict) -> int:
    import torch

    from racecheck import scenarios
    sc = scenarios.get(spec["scenario"])
    device, us = spec["device"], spec["us"]
    plans: dict = {}

    def emit(d):
        print(_MARK + json.dumps(d, default=str), flush=True)

    for i, task in enumerate(spec["tasks"]):
        v = task.get("variant")
        out = dict(task)
        if i > 0 and not _probe(device):
            emit({"restart": True})       # not this task's fault: run it in a fresh process
            return 4
        try:
            cfg = sc.config(variant=v)
            if task["kind"] == "detect":
                r_sim = scenarios.run(sc, cfg, device="sim")
                r_gpu = scenarios.run(sc, cfg, device=device)
                exp = []
                if v is not None:
                    exp = sorted(tuple(p) for p in getattr(sc.variant(v), "expected", []))
                plan = task.get("plan") or producer_plan(r_gpu.race_findings, us)
                plans[v] = plan
                out.update(sim=_sig(r_sim), cuda=_sig(r_gpu), expected=exp, plan=plan,
                           sim_diff_ok=r_sim.diff_ok, cuda_diff_ok=r_gpu.diff_ok,
                           internal_errors=[e.splitlines()[0] for e in r_gpu.internal_errors],
                           seconds=round(r_gpu.seconds, 3))
            else:
                plan = task.get("plan")
                if plan == "auto":
                    plan = plans.get(v)
                opts = {"delay_plan": plan} if plan else {}
                res = scenarios.run(sc, cfg, device=device, seed=task["seed"], session_options=opts)
                if device == "cuda":
                    torch.cuda.synchronize()
                out.update(wrong=not res.diff_ok, plan=plan,
                           internal_errors=len(res.internal_errors), seconds=round(res.seconds, 3))
            emit(out)
        except Exception as exc:
            out.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                       trace=traceback.format_exc(limit=4))
            out["fault"] = _fault(exc)
            out["fatal"] = _cuda_error(exc)
            emit(out)
            if out["fatal"]:
                return 3            # this process's CUDA state is suspect: a fresh worker goes on
    return 0


def _drive(spec: dict, budget_end: float, timeout: float) -> list:
    """Run spec["tasks"] in workers, restarting after a fatal error, until done or out of time."""
    remaining = list(spec["tasks"])
    results = []
    while remaining:
        if time.perf_counter() > budget_end:
            results += [dict(t, skipped="time budget spent") for t in remaining]
            break
        s = dict(spec, tasks=remaining)
        left = max(10.0, min(timeout, budget_end - time.perf_counter() + 30))
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(s)],
                               capture_output=True, text=True, timeout=left)
            stdout, rc, err = p.stdout, p.returncode, p.stderr
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            rc, err = -9, "worker timed out"
        lines = [json.loads(line[len(_MARK):]) for line in stdout.splitlines() if line.startswith(_MARK)]
        restart = any(d.get("restart") for d in lines)
        done = [d for d in lines if not d.get("restart")]
        retry = []
        for d in done:                   # a CUDA error that is no kernel fault: once more, afresh
            if d.get("fatal") and not d.get("fault") and not d.get("retried"):
                retry = [dict(remaining[len(done) - 1], retried=True)]
        if retry:
            done = done[:-1]
        results += done
        remaining = retry + remaining[len(done) + len(retry):]
        for r in done:                       # later tasks reuse the plan a restarted worker lacks
            if r.get("kind") == "detect" and "plan" in r:
                for t in remaining:
                    if t.get("variant") == r.get("variant") and t.get("plan") == "auto":
                        t["plan"] = r["plan"]
        if remaining and not done and not retry and not (restart and lines):
            # The worker died inside this task (an abort from a CUDA error, say): a fault when
            # its last words name one.
            results += [dict(t, error=f"worker failed (exit {rc}): {_last_error(err)}",
                             fault=_fault(err), fatal=True) for t in remaining[:1]]
            remaining = remaining[1:]
    return results


def measure(args) -> dict:
    import torch

    from racecheck import scenarios
    plans_in = {}
    if args.plan_json:
        with open(args.plan_json) as fp:
            plans_in = json.load(fp)
    t0 = time.perf_counter()
    budget_end = t0 + args.budget
    out = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
           "torch": torch.__version__, "runs": args.runs, "us": args.us, "scenarios": {}}
    for name in scenarios.names():
        sc = scenarios.get(name)
        variants = [v if isinstance(v, str) else v.name for v in sc.variants]
        if args.variants:
            variants = [v for v in variants if v in args.variants]
        rows = {}
        union = []
        for v in [None] + variants:
            label = v or "all-fixes"
            tasks = [{"kind": "detect", "variant": v, "plan": plans_in.get(label)}]
            tasks += [{"kind": "run", "variant": v, "seed": k, "tag": "no delay", "plan": None}
                      for k in range(args.runs)]
            if v is not None:
                tasks += [{"kind": "run", "variant": v, "seed": k, "tag": "delayed", "plan": "auto"}
                          for k in range(args.runs)]
            res = _drive({"scenario": name, "device": args.device, "us": args.us, "tasks": tasks},
                         budget_end, args.worker_timeout)
            rows[label] = row = _summarize(res)
            if v is not None:
                var = sc.variant(v)
                row["value_visible"] = getattr(var, "value_visible", True)
                row["why_benign"] = getattr(var, "why_benign", "")
                for h in row.get("plan") or []:
                    if h not in union:
                        union.append(h)
        ctl = rows.get("all-fixes")
        if ctl is not None and union:
            tasks = [{"kind": "run", "variant": None, "seed": k, "tag": "delayed", "plan": union}
                     for k in range(args.runs)]
            res = _drive({"scenario": name, "device": args.device, "us": args.us, "tasks": tasks},
                         budget_end, args.worker_timeout)
            c = _summarize(res)
            ctl["wrong_with_delay"] = c.get("wrong_with_delay")
            ctl["errors"] = ctl.get("errors", []) + c.get("errors", [])
            ctl["plan"] = union
        out["scenarios"][name] = rows
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _summarize(results: list) -> dict:
    row: dict = {"errors": []}
    counts = {"no delay": [0, 0], "delayed": [0, 0]}
    for r in results:
        if r.get("skipped"):
            row["skipped"] = r["skipped"]
            continue
        if r.get("error"):
            row["errors"].append(f"{r.get('kind')}{'/' + r['tag'] if r.get('tag') else ''}: {r['error']}")
            # A kernel fault is a wrong result too; so is the program failing on its own (a
            # Python error from racy values) when a race is present. A CUDA error that is no
            # fault counts nowhere: it says nothing about the program.
            crashed = r.get("fault") or (r.get("variant") is not None and not r.get("fatal"))
            if r.get("kind") == "run" and crashed:
                c = counts[r["tag"]]
                c[0] += 1
                c[1] += 1
                row["crashes"] = row.get("crashes", 0) + 1
            continue
        if r["kind"] == "detect":
            for k in ("sim", "cuda", "expected", "plan", "sim_diff_ok", "cuda_diff_ok",
                      "internal_errors", "seconds"):
                row[k] = r.get(k)
            row["match"] = r.get("sim") == r.get("cuda")
            row["expected_found"] = set(map(tuple, r.get("expected") or [])) <= set(map(tuple, r.get("cuda") or []))
        else:
            c = counts[r["tag"]]
            c[0] += int(bool(r.get("wrong")))
            c[1] += 1
    row["wrong_no_delay"] = counts["no delay"] if counts["no delay"][1] else None
    row["wrong_with_delay"] = counts["delayed"] if counts["delayed"][1] else None
    return row


def _pairs(p) -> str:
    return ", ".join(f"{r} {t}" for r, t in p) if p else "clean"


def _frac(x) -> str:
    return "-" if not x else f"{x[0]}/{x[1]}"


def to_markdown(res: dict) -> str:
    lines = [f"Scenario variants on `{res['device']}` (torch {res['torch']}): detection vs `sim`; "
             f"runs with wrong outputs out of {res['runs']}, without / with producer delays of "
             f"{res['us']:.0f} us (a fault counts as wrong)",
             "",
             "| scenario | variant | expected | cuda findings | same as sim | value-visible | "
             "wrong, no delay | wrong, delayed | delay plan | errors |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    met, visible = [], []
    for name, rows in res["scenarios"].items():
        for label, r in rows.items():
            plan = "; ".join(f"{h['stream']} before {h['op']}" for h in (r.get("plan") or [])) or "-"
            errs = "; ".join(e[:90] for e in r.get("errors", [])[:2])
            if r.get("skipped"):
                errs = (errs + "; " if errs else "") + r["skipped"]
            vis = "-" if label == "all-fixes" else ("yes" if r.get("value_visible", True) else "no")
            if vis == "yes":
                visible.append(label)
                w = r.get("wrong_with_delay")
                if w and w[1] and w[0] >= 0.95 * w[1]:
                    met.append(label)
            lines.append(f"| {name} | {label} | {_pairs(r.get('expected'))} | "
                         f"{_pairs(r.get('cuda')) if 'cuda' in r else 'n/a'} | "
                         f"{'yes' if r.get('match') else 'NO'} | {vis} | {_frac(r.get('wrong_no_delay'))} | "
                         f"{_frac(r.get('wrong_with_delay'))} | {plan} | {errs} |")
    lines.append("")
    lines.append(f"value-visible variants wrong in >= 95% of delayed runs: {len(met)}/{len(visible)}"
                 + (f" (not: {', '.join(sorted(set(visible) - set(met)))})" if len(met) < len(visible) else ""))
    for rows in res["scenarios"].values():
        for label, r in rows.items():
            if r.get("why_benign"):
                lines.append(f"- {label} is not value-visible here: {r['why_benign']}")
    lines.append(f"({res['seconds']} s)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--us", type=float, default=2000.0)
    p.add_argument("--budget", type=float, default=1e9, help="seconds; stop measuring after this")
    p.add_argument("--worker-timeout", type=float, default=600.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--variants", nargs="*")
    p.add_argument("--plan-json")
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--worker")
    args = p.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    try:
        from racecheck import scenarios  # noqa: F401
    except ImportError as exc:
        print(f"scenario package not available ({exc}): nothing to measure")
        return 0
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    res = measure(args)
    md = to_markdown(res)
    print(md)
    if args.json:
        with open(args.json, "w") as fp:
            json.dump(res, fp, indent=1, default=str)
    if args.md:
        with open(args.md, "w") as fp:
            fp.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
