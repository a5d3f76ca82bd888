"""What is fuzzed: a scenario (and variant) on a device, its strategy, and one example's run."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from racecheck.core.devices import check_device
from racecheck.core.errors import UsageError

from racecheck.drivers.fuzz.keys import finding_key

KEY_VERSION = "v2"


def database_key(scenario: str, variant=None, *, draw_switches: bool = False, device: str = "sim",
                 fixed: dict | None = None) -> bytes:
    """`racecheck/v2/<scenario>/<variant>[+switches][@device][{knob=value,...}]`: one corpus per
    target, whatever the test's source (bumped when the strategies change incompatibly: v2 draws
    `explore` first). Knobs the user fixed (`--set`, `--drop-sync`) are part of the target: a
    failure of the code with a site dropped must not be replayed (and deleted) as the shipped
    code's."""
    key = f"racecheck/{KEY_VERSION}/{scenario}/{variant or 'all-fixes'}"
    if draw_switches:
        key += "+switches"
    if device != "sim":
        key += f"@{device}"
    if fixed:
        key += "{" + ",".join(f"{k}={_text(v)}" for k, v in sorted(fixed.items())) + "}"
    return key.encode()


def _text(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


@dataclass
class Outcome:
    """What one run showed. `keys`: distinct failure keys, detection order (races before DIFF)."""

    keys: list
    findings: list = field(default_factory=list)
    result: object = None
    faults: list = field(default_factory=list)
    crash: str = ""
    internal: list = field(default_factory=list)
    seconds: float = 0.0
    config: dict = field(default_factory=dict)
    executor: dict = field(default_factory=dict)
    # where it ran: "fresh" (an engine built for it), "reused" (a stretch of an open engine,
    # engines.py), or the confirmation of a reused engine's failure on a fresh one
    engine: str = "fresh"

    @property
    def failed(self) -> bool:
        return bool(self.keys)

    def wrong_values(self) -> str:
        r = self.result
        if r is None or getattr(r, "diff_ok", True):
            return ""
        return r.diff_detail


def _crash_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _add(keys: list, key: str) -> None:
    if key not in keys:
        keys.append(key)


class FuzzTarget:
    """A scenario (and variant) to fuzz on a device: its strategy and how to run one example."""

    def __init__(self, scenario: str, variant=None, *, device: str = "sim", draw_switches: bool = False,
                 draw_plan: bool = True, fixed: dict | None = None):
        from racecheck import scenarios
        check_device(device)
        self.sc = scenarios.get(scenario)            # UsageError when unknown
        self.scenario = self.sc.name
        self.variant = variant or None
        if self.variant:
            self.sc.variant(self.variant)            # UsageError when unknown
        self.device = device
        self.draw_switches = draw_switches
        self.draw_plan = draw_plan
        self.fixed = dict(fixed or {})
        if self.fixed.get("drop_sync") and device != "sim":
            raise UsageError(f"--drop-sync: dropping synchronization sites is supported on sim, "
                             f"not on {device} (a GPU run keeps the engine's own synchronization)")
        if self.fixed:
            self.sc.config(self.variant, self.fixed)  # validate up front
            # concrete values ("off" -> False, "1,2" -> [1, 2]): what strategies compare against
            self.fixed = {k: v if v == "auto" else self.sc.knobs[k].parse(v) for k, v in self.fixed.items()}
        self.drops_matched: set = set()       # --drop-sync entries some example's run executed
        self.sites_seen: set = set()
        self.examples_run = 0
        # one engine, many schedules (engines.py): the fuzzer turns it on; a replay
        # (`racecheck repro`) and `racecheck run` always build a fresh engine
        self.reuse_engines = False
        self.pool = None
        self.confirmations = {"confirmed": 0, "not_reproduced": 0}

    def reusing(self) -> bool:
        """Whether examples run as stretches of open engines (engines.py)."""
        from racecheck.scenarios import fresh
        return bool(self.reuse_engines) and getattr(self.sc, "reuse", None) is not None \
            and fresh.serves(self.sc, self.device)

    def close(self) -> None:
        """Close the open engines, if any."""
        if self.pool is not None:
            self.pool.close()

    def engine_stats(self) -> dict:
        out = self.pool.summary() if self.pool is not None else {}
        out["confirmations"] = dict(self.confirmations)
        return out

    def unmatched_drops(self) -> list:
        """--drop-sync entries that no example run so far executed (in this process)."""
        from racecheck.scenarios.registry import drop_sync_sites
        dropped = drop_sync_sites(self.sc.config(self.variant, self.fixed))
        return [d for d in dropped if d not in self.drops_matched] if self.examples_run else []

    @property
    def key(self) -> bytes:
        return database_key(self.scenario, self.variant, draw_switches=self.draw_switches, device=self.device,
                            fixed=self.fixed)

    @property
    def label(self) -> str:
        return f"{self.scenario}" + (f" --variant {self.variant}" if self.variant else "")

    def strategy(self):
        from racecheck.drivers.fuzz import strategies
        return strategies.examples(self.sc, self.variant, device=self.device,
                                   draw_switches=self.draw_switches, fixed=self.fixed,
                                   draw_plan=self.draw_plan)

    def concrete_config(self, example) -> dict:
        return self.sc.config(self.variant, example.get("config") or {})

    def run_detector_only(self, example: dict) -> Outcome:
        """The detector's verdict alone: issue order, no reference run (fast).

        Findings do not depend on the order device work runs in, so this gives the same detector
        keys as `run`; differential and value failures need `run`."""
        from racecheck.scenarios import fresh
        if self.reusing():
            return self._run_reused(example, detector_only=True)
        cfg = self.concrete_config(example)
        t0 = time.perf_counter()
        seed = int(example.get("seed", 0))
        if fresh.mode(self.sc, self.device):
            findings, internal, crash = fresh.start_for(self.sc, self.device, _detector_only, self.sc,
                                                        cfg, self.device, seed).result()
        else:
            findings, internal, crash = _detector_only(self.sc, cfg, self.device, seed)
        keys = []
        from racecheck.scenarios.registry import split_known
        findings = split_known(self.sc, findings)[0]
        for f in findings:
            _add(keys, finding_key(f))
        if crash:
            keys.append(f"CRASH {crash.split(':', 1)[0]}")
        return Outcome(keys, findings, None, [], crash, internal, time.perf_counter() - t0, cfg)

    def run(self, example: dict) -> Outcome:
        """Run one example. An invalid configuration raises UsageError."""
        if self.reusing():
            return self._run_reused(example)
        return self._run_fresh(example)

    def _run_reused(self, example: dict, *, detector_only: bool = False) -> Outcome:
        """The example as a stretch of the open engine of its shape (engines.py). A failure
        closes that engine and, unless only the detector is asked (Hypothesis shrinking a
        finding; its final replay comes here again), is confirmed on a fresh engine: the
        outcome is then the fresh engine's, as a repro record replays it."""
        from racecheck.drivers.fuzz.engines import EnginePool
        from racecheck.scenarios.registry import drop_sync_sites
        cfg = self.concrete_config(example)
        plan = example.get("plan")
        seed = int(example.get("seed", 0))
        if self.pool is None:
            self.pool = EnginePool(self.sc, self.device)
        t0 = time.perf_counter()
        keys, findings, crash, internal, result, faults, stretch = [], [], "", [], None, [], None
        executor = {}
        try:
            stretch = self.pool.run(cfg, plan, seed, reference=not detector_only)
            result = stretch.result
            findings = list(result.findings)
            internal = list(result.internal_errors or ())
            executor = dict(result.executor_state or {})
            faults = list(executor.get("faults") or ())
            self.examples_run += 1
            self.sites_seen.update(site.id for site in result.sync_sites)
            self.drops_matched.update(set(drop_sync_sites(cfg)) - set(result.unmatched_drops))
        except UsageError:
            raise
        except Exception as exc:   # the engine failed in this stretch (its process is closed)
            crash = _crash_text(exc)
        for f in findings:
            _add(keys, finding_key(f))
        for fl in faults:
            _add(keys, f"FAULT {fl['op']}")
        if crash:
            keys.append(f"CRASH {crash.split(':', 1)[0]}")
        for text in internal:
            head = text.split("\n", 1)[0]
            kind = head.split(": ", 2)[1] if head.count(": ") >= 2 else "Error"
            _add(keys, f"INTERNAL {kind}")
        where = stretch.describe() if stretch is not None else "a reused engine"
        if keys or (stretch is not None and not stretch.clean_end):
            self.pool.retire()
        if keys and not detector_only:
            confirmed = self._run_fresh(example)
            same = [k for k in keys if k in confirmed.keys]
            self.confirmations["confirmed" if same else "not_reproduced"] += 1
            confirmed.engine = (
                f"fresh: confirmed on a fresh engine ({where} showed {', '.join(keys)})" if same
                else f"fresh: {where} showed {', '.join(keys)}, a fresh engine did not")
            return confirmed
        return Outcome(keys, findings, result, faults, crash, internal, time.perf_counter() - t0,
                       cfg, executor, engine=f"reused: {where}")

    def _run_fresh(self, example: dict) -> Outcome:
        from racecheck import scenarios
        cfg = self.concrete_config(example)
        plan = example.get("plan")
        opts = {}
        executor = None
        if self.device == "sim" and plan is not None:
            from racecheck.instrumentation.adversarial import AdversarialExecutor
            executor = AdversarialExecutor(plan)
            opts["executor"] = executor
        elif plan is not None and plan.get("holds"):
            opts["delay_plan"] = plan["holds"]        # GPUs: the holds become real sleeps
        t0 = time.perf_counter()
        keys, findings, crash, internal, result = [], [], "", [], None
        try:
            result = scenarios.run(self.sc, cfg, device=self.device, seed=int(example.get("seed", 0)),
                                   session_options=opts)
            findings = list(result.findings)
            internal = list(getattr(result, "internal_errors", ()) or ())
            from racecheck.scenarios.registry import drop_sync_sites
            self.examples_run += 1
            self.sites_seen.update(site.id for site in result.sync_sites)
            self.drops_matched.update(set(drop_sync_sites(cfg)) - set(result.unmatched_drops))
        except UsageError:
            raise
        except Exception as exc:   # the program itself failed under this order
            crash = _crash_text(exc)
        for f in findings:
            _add(keys, finding_key(f))
        faults = list(executor.faults) if executor is not None else []
        if faults and not crash:
            # An op that fails under any order is a program bug, not a race: check issue order.
            eager = self._run_fresh(dict(example, plan=None)) if plan is not None else None
            if eager is not None and eager.crash:
                crash = eager.crash
                faults = []
        for fl in faults:
            _add(keys, f"FAULT {fl['op']}")
        if crash:
            keys.append(f"CRASH {crash.split(':', 1)[0]}")
        for text in internal:
            head = text.split("\n", 1)[0]
            kind = head.split(": ", 2)[1] if head.count(": ") >= 2 else "Error"
            _add(keys, f"INTERNAL {kind}")
        return Outcome(keys, findings, result, faults, crash, internal, time.perf_counter() - t0, cfg,
                       executor.describe() if executor is not None else {})


def _detector_only(sc, cfg: dict, device: str, seed: int) -> tuple:
    """(findings, internal errors, crash text) of one run in issue order."""
    import racecheck
    from racecheck.scenarios import RunContext
    crash = ""
    rc = racecheck.session(device=device, **sc.session_options(cfg, device))
    try:
        with rc:
            ctx = RunContext(rc.device_module, "cpu" if device == "sim" else device, rc,
                             pin=True, seed=seed)
            sc.run_once(cfg, ctx)
    except UsageError:
        raise
    except Exception as exc:
        crash = _crash_text(exc)
    return list(rc.findings), list(rc.internal_errors), crash
