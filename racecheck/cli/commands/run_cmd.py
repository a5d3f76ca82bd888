"""`racecheck run SCENARIO [--variant V] [--set KNOB=VALUE ...] [--device D] [--seed N] [--plan P]`.

Runs the scenario once under the detector and compares its outputs with a serialized run of the
same inputs. With `--plan` (sim) the device work runs under the adversarial executor in the
order the plan chooses, so a race shows what it does to the values, not only that it exists.
Exit 0 clean, 1 findings or a differential mismatch, 2 usage error, 3 internal error.
"""
from __future__ import annotations

import shlex

from racecheck.core.devices import DEVICES
from racecheck.cli.gate import add_gate_arguments, finish


def add_arguments(p) -> None:
    p.add_argument("scenario", help="scenario name (see `racecheck list`)")
    p.add_argument("--variant", default=None, metavar="V", help="a fix-off variant, e.g. no-mrope_recompute")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", dest="sets",
                   help="override a knob (repeatable), e.g. --set plan_stream=on")
    p.add_argument("--device", default="sim", choices=DEVICES, help="backend (default: sim)")
    p.add_argument("--all", action="store_true", dest="keep_known",
                   help="also report the scenario's triaged upstream races (docs/FINDINGS.md), "
                        "which are otherwise counted apart")
    p.add_argument("--seed", default=0, type=_seed, help="request contents seed (default: 0)")
    p.add_argument("--save-trace", metavar="FILE", default=None,
                   help="save the instrumented run's trace as JSON lines (racecheck check, "
                        "racecheck explain)")
    p.add_argument("--drop-sync", action="append", default=[], metavar="SITE", dest="drop_sync",
                   help="drop a synchronization site (repeatable; ids from `racecheck mutate "
                        "SCENARIO --list`, fnmatch patterns allowed)")
    p.add_argument("--plan", default=None, metavar="PLAN",
                   help="sim: run device work under the adversarial executor with this plan "
                        "(JSON text or a JSON file), e.g. '{\"priorities\": {\"forward_stream\": -1}}'"
                        " (a slow forward stream); see docs/FUZZING.md")
    add_gate_arguments(p)


def load_plan(text: str, device: str) -> dict:
    """The normalized executor plan of `--plan` (JSON text, or a file holding it)."""
    import json
    import os

    from racecheck.core.errors import UsageError
    from racecheck.instrumentation.adversarial import PlanError, normalize_plan
    if device != "sim":
        raise UsageError("--plan orders device work on sim only (on a GPU, use delays: "
                         "racecheck fuzz --device cuda draws them)")
    source = text
    if not text.lstrip().startswith("{") and os.path.exists(text):
        try:
            with open(text, encoding="utf-8") as f:
                source = f.read()
        except OSError as exc:
            raise UsageError(f"--plan {text}: {exc.strerror}") from None
    try:
        return normalize_plan(json.loads(source))
    except json.JSONDecodeError as exc:
        raise UsageError(f"--plan: not a JSON object or a file holding one ({exc.msg})") from None
    except PlanError as exc:
        raise UsageError(f"--plan: {exc}") from None


def _seed(text: str) -> int:
    from racecheck.core.errors import UsageError
    try:
        return int(text, 0)
    except ValueError:
        raise UsageError(f"--seed {text!r}: expected an integer") from None


def _trace_path(path):
    """Where --save-trace writes, checked before the run (the run's process may be another)."""
    if not path:
        return None
    import os
    from racecheck.core.errors import UsageError
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.isdir(full) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UsageError(f"--save-trace {path}: not a file in a writable folder")
    return full


def repro_line(name: str, variant, sets: dict, device: str, seed: int, plan=None) -> str:
    parts = ["racecheck", "run", name]
    if variant:
        parts += ["--variant", variant]
    for key, value in sets.items():
        parts += ["--set", f"{key}={value}"]
    if device != "sim":
        parts += ["--device", device]
    if seed:
        parts += ["--seed", str(seed)]
    if plan is not None:
        from racecheck.instrumentation.adversarial import plan_text
        parts += ["--plan", plan_text(plan)]
    return " ".join(shlex.quote(p) for p in parts)


def main(args) -> int:
    from rich.console import Console

    from racecheck import scenarios
    from racecheck.core.errors import InternalError

    sc = scenarios.get(args.scenario)
    if args.variant:
        sc.variant(args.variant)
    sets = scenarios.parse_sets(args.sets)
    if getattr(args, "drop_sync", None):
        sets["drop_sync"] = ",".join(args.drop_sync)
    cfg = sc.config(variant=args.variant, overrides=sets)
    if args.report:
        from racecheck.reports import parse_report_specs
        parse_report_specs(args.report)
    plan = load_plan(args.plan, args.device) if getattr(args, "plan", None) else None
    trace_path = _trace_path(getattr(args, "save_trace", None))

    console = Console(highlight=False)
    changed = {k: v for k, v in cfg.items() if v != sc.config()[k]}
    label = f"{sc.name}" + (f" [{args.variant}]" if args.variant else "")
    console.print(f"racecheck run {label} on {args.device}, seed {args.seed}"
                  + (": " + ", ".join(f"{k}={sc.knobs[k].format(v)}" for k, v in changed.items())
                     if changed else ""), markup=False)

    options = {}
    executor = None
    if plan is not None:
        from racecheck.instrumentation.adversarial import AdversarialExecutor, plan_text
        executor = options["executor"] = AdversarialExecutor(plan)
        console.print("executor: adversarial, plan " + plan_text(plan), markup=False,
                      soft_wrap=True)
    repro = repro_line(sc.name, args.variant, sets, args.device, args.seed, plan)
    from racecheck.scenarios.fresh import EngineProcessDied
    try:
        res = scenarios.run(sc, cfg, device=args.device, seed=args.seed, session_options=options,
                            keep_known=getattr(args, "keep_known", False),
                            save_trace=trace_path)
    except EngineProcessDied as exc:
        # a memory fault is what a race can cause; racecheck's C code can too
        console.print(f"fault: {exc}: the program crashed under this order (to rule out "
                      "racecheck's native code, rerun with RACECHECK_PURE_PYTHON=1)",
                      style="bold red", markup=False, soft_wrap=True)
        console.print(f"repro: {repro}", markup=False)
        return 1
    if res.internal_errors:
        raise InternalError(res.internal_errors[0].splitlines()[0])
    if res.unmatched_drops:
        from racecheck.scenarios.registry import unexecuted_drops
        raise unexecuted_drops(res.unmatched_drops, [s.id for s in res.sync_sites])
    faults = list(executor.faults) if executor is not None else []

    meta = {"scenario": sc.name, "variant": args.variant or "", "device": args.device, "seed": args.seed,
            "config": cfg, "repro": repro, "time": res.seconds}
    code = finish(res.findings, args, meta, console=console)
    if res.known:
        console.print(f"known upstream races: {len(res.known)} finding(s) of races triaged in "
                      "docs/FINDINGS.md, not counted (--all reports and names them)", markup=False,
                      soft_wrap=True)
    if res.diff_ok:
        console.print(f"differential: outputs equal the serialized run ({res.seconds:.2f}s)", markup=False)
    else:
        console.print(f"differential: MISMATCH: {res.diff_detail}", style="bold red", markup=False)
        code = max(code, 1)
    if executor is not None:           # a delay knob that never held anything delays nothing
        stats = executor.stats
        console.print(f"executor: {stats.get('ops', 0)} device ops ordered by the plan, "
                      f"{stats.get('holds', 0)} holds", markup=False)
    for fault in faults[:3]:           # an op that failed under this order: a device fault
        console.print(f"fault: {fault['op']} on {fault['stream']} failed when the plan ran it: "
                      f"{fault['error']}", style="bold red", markup=False, soft_wrap=True)
    if faults:
        code = max(code, 1)
    if code:
        console.print(f"repro: {repro}", markup=False)
    return code
