"""`racecheck fuzz`: Hypothesis over a scenario, failures shrunk and saved as repro records.

    from racecheck.scenarios.fuzz import FuzzTarget, Fuzzer, open_database
    target = FuzzTarget("eagle-v2", "no-futuremap_publish")
    report = Fuzzer(target, database=open_database(".racecheck/examples"),
                    findings_dir="racecheck-findings", budget_s=60).run()
    report.failures          # key -> FoundFailure(path, example, outcome, examples_to_find, ...)

One example = one scenario run on `sim` under the adversarial executor with a drawn plan. A run
fails when the detector reports a finding, the differential oracle sees an output differ from the
serialized run, an op faults when the plan runs it, or the program crashes. Each distinct failure
(its key: "RC001 seq_lens", "DIFF mm_input_embeds", ...; see `racecheck.repro`) is shrunk by
Hypothesis on its own and written as a JSON repro record.

Hypothesis settings: racecheck registers and loads its own profile ("racecheck") for the run and
passes every setting explicitly, so the `ci` profile Hypothesis picks when `CI` is set (no
database, derandomized) never applies. The database key is `racecheck/v1/<scenario>/<variant>`
(`all-fixes` without a variant; `+switches` when fix switches are drawn; `@<device>` off sim), never
a hash of test source, so every runner and every racecheck release with the same strategies
shares one corpus. Bump the `v1` when the strategies change incompatibly.

The loop: first every failure the database already knows is replayed (from any runner); then
bounded Hypothesis runs of a fixed schedule of sizes (50, 100, 200, ... examples, each with its
own seed derived from --seed), each stopping at its first failure (report_multiple_bugs off) and
shrinking it; failures already saved are ignored by later runs, and a failure seen only beside
another one is shrunk on its own (its example seeded under its own key). While Hypothesis shrinks
a detector finding, each attempt runs in issue order without the reference run: findings do not
depend on the order, and the final replay runs the example's own plan.

Budget: Hypothesis has no wall-clock limit. Once the budget is spent, a run with nothing to
shrink ends at once (a skip exception, which Hypothesis passes through untouched); shrinking gets
a grace period (half the budget, 5 to 30 s) so that a late find still leaves a minimal repro.
"""
from __future__ import annotations

import os
import sys
import time
import unittest
from dataclasses import dataclass, field

from racecheck.errors import UsageError

__all__ = ["FuzzTarget", "Outcome", "Fuzzer", "FuzzReport", "FoundFailure", "open_database",
           "database_key", "racecheck_profile", "DEFAULT_DB", "DEFAULT_FINDINGS_DIR", "parse_budget",
           "run_workers"]

DEFAULT_DB = os.path.join(".racecheck", "examples")
DEFAULT_FINDINGS_DIR = "racecheck-findings"
KEY_VERSION = "v1"
MAX_REPLAYS_PER_KEY = 20
PROFILE = "racecheck"


# -- configuration helpers ------------------------------------------------------------------------

def parse_budget(text) -> float:
    """"60s", "5m", "1h", "90" (seconds) -> seconds."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        v = float(text)
    else:
        s = str(text).strip().lower()
        mult = 1.0
        for suffix, m in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
            if s.endswith(suffix):
                s, mult = s[: -len(suffix)], m
                break
        try:
            v = float(s) * mult
        except ValueError:
            raise UsageError(f"--budget {text!r}: expected a duration like 60s, 5m or 1h") from None
    if not v > 0:
        raise UsageError(f"--budget {text!r}: must be positive")
    return v


def database_key(scenario: str, variant=None, *, draw_switches: bool = False, device: str = "sim") -> bytes:
    key = f"racecheck/{KEY_VERSION}/{scenario}/{variant or 'all-fixes'}"
    if draw_switches:
        key += "+switches"
    if device != "sim":
        key += f"@{device}"
    return key.encode()


def open_database(spec):
    """`PATH` (directory database), `redis://HOST:PORT/N`, `:memory:` or `none`."""
    from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase
    if spec is None:
        spec = DEFAULT_DB
    if not isinstance(spec, str):
        return spec                      # already a database object
    s = spec.strip()
    if s.lower() in ("none", "off", ""):
        return None
    if s == ":memory:":
        return InMemoryExampleDatabase()
    if s.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise UsageError("--db redis://... needs the redis client: pip install 'racecheck[redis]'") from None
        try:
            client = redis.Redis.from_url(s)
            client.ping()
        except Exception as exc:
            raise UsageError(f"--db {s}: cannot reach Redis: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        return RedisExampleDatabase(client)
    if "://" in s:
        raise UsageError(f"--db {s!r}: unsupported URL (use a directory path or redis://HOST:PORT/N)")
    if os.path.exists(s) and not os.path.isdir(s):
        raise UsageError(f"--db {s}: not a directory")
    return DirectoryBasedExampleDatabase(s)


def racecheck_profile(database):
    """Register and return racecheck's Hypothesis settings profile (explicit database, not `ci`)."""
    from hypothesis import HealthCheck, settings
    prof = settings(parent=settings.get_profile("default"), database=database, derandomize=False,
                    deadline=None, print_blob=False, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck))
    settings.register_profile(PROFILE, prof)
    return prof


class _profile_loaded:
    """Load the racecheck profile for the duration of a fuzz run; restore the previous one."""

    def __init__(self, database):
        self.database = database

    def __enter__(self):
        from hypothesis import settings
        self.prev = settings.get_current_profile_name()
        racecheck_profile(self.database)
        settings.load_profile(PROFILE)
        return self

    def __exit__(self, *exc):
        from hypothesis import settings
        try:
            settings.load_profile(self.prev)
        except Exception:
            pass
        return False


# -- one example ------------------------------------------------------------------------------------

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

    @property
    def failed(self) -> bool:
        return bool(self.keys)

    def wrong_values(self) -> str:
        r = self.result
        if r is None or getattr(r, "diff_ok", True):
            return ""
        return r.diff_detail


class FuzzTarget:
    """A scenario (and variant) to fuzz on a device: its strategy and how to run one example."""

    def __init__(self, scenario: str, variant=None, *, device: str = "sim", draw_switches: bool = False,
                 draw_plan: bool = True, fixed: dict | None = None):
        from racecheck import scenarios
        if device not in ("sim", "cuda", "npu"):
            raise UsageError(f"unknown device {device!r} (choose from sim, cuda, npu)")
        self.sc = scenarios.get(scenario)            # UsageError when unknown
        self.scenario = self.sc.name
        self.variant = variant or None
        if self.variant:
            self.sc.variant(self.variant)            # UsageError when unknown
        self.device = device
        self.draw_switches = draw_switches
        self.draw_plan = draw_plan
        self.fixed = dict(fixed or {})
        if self.fixed:
            self.sc.config(self.variant, self.fixed)  # validate up front

    @property
    def key(self) -> bytes:
        return database_key(self.scenario, self.variant, draw_switches=self.draw_switches, device=self.device)

    @property
    def label(self) -> str:
        return f"{self.scenario}" + (f" --variant {self.variant}" if self.variant else "")

    def strategy(self):
        from racecheck.scenarios import strategies
        return strategies.examples(self.sc, self.variant, device=self.device,
                                   draw_switches=self.draw_switches, fixed=self.fixed,
                                   draw_plan=self.draw_plan)

    def concrete_config(self, example) -> dict:
        return self.sc.config(self.variant, example.get("config") or {})

    def run_detector_only(self, example: dict) -> Outcome:
        """The detector's verdict alone: issue order, no reference run (fast).

        Findings do not depend on the order device work runs in, so this gives the same detector
        keys as `run`; differential and value failures need `run`."""
        import racecheck
        from racecheck.repro import finding_key
        from racecheck.scenarios import RunContext
        cfg = self.concrete_config(example)
        t0 = time.perf_counter()
        crash = ""
        rc = racecheck.session(device=self.device)
        try:
            with rc:
                ctx = RunContext(rc.device_module, "cpu" if self.device == "sim" else self.device, rc,
                                 pin=True, seed=int(example.get("seed", 0)))
                self.sc.run_once(cfg, ctx)
        except UsageError:
            raise
        except Exception as exc:
            crash = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        keys = []
        findings = list(rc.findings)
        for f in findings:
            k = finding_key(f)
            if k not in keys:
                keys.append(k)
        if crash:
            keys.append(f"CRASH {crash.split(':', 1)[0]}")
        return Outcome(keys, findings, None, [], crash, list(rc.internal_errors), time.perf_counter() - t0, cfg)

    def run(self, example: dict) -> Outcome:
        """Run one example. An invalid configuration raises UsageError."""
        from racecheck import scenarios
        from racecheck.repro import finding_key
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
        except UsageError:
            raise
        except Exception as exc:   # the program itself failed under this order
            crash = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        for f in findings:
            k = finding_key(f)
            if k not in keys:
                keys.append(k)
        faults = list(executor.faults) if executor is not None else []
        if faults and not crash:
            # An op that fails under any order is a program bug, not a race: check issue order.
            eager = self.run(dict(example, plan=None)) if plan is not None else None
            if eager is not None and eager.crash:
                crash = eager.crash
                faults = []
        for fl in faults:
            k = f"FAULT {fl['op']}"
            if k not in keys:
                keys.append(k)
        if crash:
            keys.append(f"CRASH {crash.split(':', 1)[0]}")
        for text in internal:
            head = text.split("\n", 1)[0]
            kind = head.split(": ", 2)[1] if head.count(": ") >= 2 else "Error"
            k = f"INTERNAL {kind}"
            if k not in keys:
                keys.append(k)
        return Outcome(keys, findings, result, faults, crash, internal, time.perf_counter() - t0, cfg,
                       executor.describe() if executor is not None else {})


# -- the fuzz loop ------------------------------------------------------------------------------------

class FuzzFailure(Exception):
    """Raised inside the Hypothesis test for a failing example; one subclass per failure key, so
    Hypothesis shrinks each distinct failure separately."""

    def __init__(self, key, example, outcome):
        super().__init__(key)
        self.key = key
        self.example = example
        self.outcome = outcome
        self.choices = None            # Hypothesis' choice sequence of the example


_failure_classes: dict = {}


def _failure_class(key: str):
    cls = _failure_classes.get(key)
    if cls is None:
        slug = "".join(c if c.isalnum() else "_" for c in key)[:60]
        cls = _failure_classes[key] = type(f"Failure_{slug}", (FuzzFailure,), {"__module__": __name__})
        _class_keys[cls] = key
    return cls


@dataclass
class FoundFailure:
    key: str
    example: dict
    outcome: Outcome
    path: str = ""
    examples_to_find: int = 0          # scenario runs until it was first seen (this worker)
    seconds_to_find: float = 0.0
    seconds_to_repro: float = 0.0      # until the shrunk record was written
    shrunk: bool = True
    worker: int = 0

    def command(self) -> str:
        from racecheck.repro import reproduce_command
        return reproduce_command(self.path) if self.path else ""


@dataclass
class FuzzReport:
    target: str
    examples: int = 0
    elapsed: float = 0.0
    failures: dict = field(default_factory=dict)     # key -> FoundFailure
    replayed_first: bool = False                      # the first example came from the database
    first_example_failed: bool = False
    stopped: str = ""
    hypothesis_runs: int = 0
    # examples (scenario runs) that showed each kind of failure
    kinds: dict = field(default_factory=lambda: {"finding": 0, "differential": 0, "fault": 0,
                                                 "crash": 0, "internal": 0})

    @property
    def rate(self) -> float:
        return self.examples / self.elapsed if self.elapsed > 0 else 0.0


def _runner():
    """The running Hypothesis engine (to read its phase), found on the call stack; or None."""
    from hypothesis.internal.conjecture.engine import ConjectureRunner
    f = sys._getframe(2)
    while f is not None:
        s = f.f_locals.get("self")
        if isinstance(s, ConjectureRunner):
            return s
        f = f.f_back
    return None


_class_keys: dict = {}        # failure class -> key


def _keys_being_shrunk(runner) -> list:
    out = []
    for origin in list(getattr(runner, "interesting_test_cases", {}) or ()):
        key = _class_keys.get(getattr(origin, "exc_type", None))
        if key is not None and key not in out:
            out.append(key)
    return out


def _is_detector_key(key: str) -> bool:
    head = key.split(" ", 1)[0]
    return head.startswith("RC") and head[2:].isdigit()


class _BudgetSpent(unittest.SkipTest):
    """Ends a Hypothesis run with nothing to shrink once the budget is spent (Hypothesis lets
    skip exceptions through untouched; nothing is saved to or deleted from the database)."""


class Fuzzer:
    """Runs the fuzz loop for one target in this process."""

    def __init__(self, target: FuzzTarget, *, database=None, findings_dir: str = DEFAULT_FINDINGS_DIR,
                 budget_s: float | None = None, max_examples: int | None = None, seed: int | None = None,
                 first_only: bool = False, stop_when=None, stop_when_all: bool = False,
                 shrink_grace_s: float | None = None,
                 on_progress=None, on_found=None, worker: int = 0, write: bool = True):
        if budget_s is None and max_examples is None:
            budget_s = 60.0
        self.target = target
        self.db = database
        self.findings_dir = findings_dir
        self.budget_s = budget_s
        self.max_examples = max_examples
        self.seed = seed
        self.first_only = first_only
        self.stop_when = set(stop_when or ())   # stop once any (or all) of these keys is saved
        self.stop_when_all = stop_when_all
        self.shrink_grace_s = (shrink_grace_s if shrink_grace_s is not None
                               else (min(30.0, max(5.0, 0.5 * budget_s)) if budget_s else 30.0))
        self.on_progress = on_progress
        self.on_found = on_found
        self.worker = worker
        self.write = write
        self.report = FuzzReport(target.label)
        self._seen: dict = {}          # key -> (choices, example, outcome, examples, seconds)
        self._t0 = 0.0
        self._deadline = None
        self._last_progress = 0.0

    # -- limits ------------------------------------------------------------------------------------
    def _out_of_budget(self, phase: str) -> bool:
        if phase in ("reuse", "unknown"):
            return False               # replays from the database always run (else they'd be deleted)
        now = time.monotonic()
        if phase == "shrink":
            return self._deadline is not None and now > self._deadline + self.shrink_grace_s
        if self._deadline is not None and now > self._deadline:
            return True
        if self.max_examples is not None and self.report.examples >= self.max_examples:
            return True
        if self.first_only and self.report.failures:
            return True
        if self._wanted_saved():
            return True
        return False

    def _wanted_saved(self) -> bool:
        if not self.stop_when:
            return False
        got = self.stop_when & set(self.report.failures)
        return got == self.stop_when if self.stop_when_all else bool(got)

    def _progress(self, force=False):
        if self.on_progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress > 0.1:
            self._last_progress = now
            self.on_progress(self.report.examples, len(self._seen), now - self._t0)

    # -- one Hypothesis run ------------------------------------------------------------------------
    def _hypothesis_run(self, *, phases, max_examples, ignore=(), key=None, want=None, seed=None):
        from hypothesis import Verbosity, given, settings
        from hypothesis import reject
        from hypothesis.control import current_build_context
        target = self.target
        rep = self.report
        ignore = frozenset(ignore)

        @settings(database=self.db, max_examples=max_examples, phases=phases,
                  report_multiple_bugs=False, verbosity=Verbosity.quiet)
        @given(example=target.strategy())
        def fuzz_example(example):
            ctx = current_build_context()
            final = ctx.is_final
            runner = _runner()
            phase = "final" if final else (runner._current_phase if runner is not None else "unknown")
            if not final and self._out_of_budget(phase):
                if phase in ("generate", "target") and runner is not None and not runner.interesting_test_cases:
                    raise _BudgetSpent()
                return
            shrinking = None
            if phase in ("shrink", "final") and runner is not None:
                shrinking = _keys_being_shrunk(runner)
            try:
                if phase == "shrink" and shrinking and all(_is_detector_key(k) for k in shrinking):
                    # Findings are the same in every order: shrink a detector failure on fast
                    # issue-order runs (the final replay runs the example's own plan again).
                    outcome = target.run_detector_only(example)
                else:
                    outcome = target.run(example)
            except UsageError:
                reject()                 # a knob combination the scenario does not accept
            self._count(outcome, phase, ctx.data.choices, example)
            if want is not None:
                key = want if want in outcome.keys else None
            else:
                # the failure being shrunk while it is still there, else the first new one
                key = next((k for k in shrinking or () if k in outcome.keys), None) or \
                    next((k for k in outcome.keys if k not in ignore), None)
            if key is not None:
                exc = _failure_class(key)(key, example, outcome)
                exc.choices = tuple(ctx.data.choices)
                # one raise site: Hypothesis tells failures apart by exception type and location
                raise exc

        fuzz_example._hypothesis_internal_database_key = key if key is not None else target.key
        if seed is not None:
            # What `hypothesis.seed(n)` sets, without its side effect of turning the database off.
            fuzz_example._hypothesis_internal_use_seed = seed
        rep.hypothesis_runs += 1
        try:
            fuzz_example()
        except _BudgetSpent:
            return []
        except FuzzFailure as exc:
            return [exc]
        except BaseExceptionGroup as group:    # several distinct failures (or a flaky one)
            found = []
            rest = []
            for e in _flatten(group):
                (found if isinstance(e, FuzzFailure) else rest).append(e)
            if rest and not found:
                raise rest[0]
            return found
        except Exception as exc:
            from hypothesis.errors import Unsatisfiable
            if isinstance(exc, Unsatisfiable):
                raise UsageError(f"fuzz: {target.label}: no valid example could be generated") from None
            raise
        return []

    # -- recording -----------------------------------------------------------------------------------
    def _record(self, exc: FuzzFailure, shrunk: bool = True) -> FoundFailure:
        from racecheck.repro import make_record, save_record
        import hypothesis
        key = exc.key
        seen = self._seen.get(key)
        outcome = exc.outcome
        r = outcome.result
        found = FoundFailure(key, exc.example, outcome, examples_to_find=seen[3] if seen else self.report.examples,
                             seconds_to_find=seen[4] if seen else time.monotonic() - self._t0,
                             shrunk=shrunk, worker=self.worker)
        if self.write and self.findings_dir:
            rec = make_record(
                scenario=self.target.scenario, variant=self.target.variant, device=self.target.device,
                seed=int(exc.example.get("seed", 0)), config=outcome.config, plan=exc.example.get("plan"),
                key=key, findings=outcome.findings, diff_ok=getattr(r, "diff_ok", True),
                diff_detail=getattr(r, "diff_detail", ""), faults=outcome.faults, crash=outcome.crash,
                search={"examples": found.examples_to_find, "seconds": round(found.seconds_to_find, 3),
                        "shrunk": shrunk, "hypothesis": hypothesis.__version__,
                        "database_key": self.target.key.decode(), "worker": self.worker})
            found.path = save_record(rec, self.findings_dir)
        found.seconds_to_repro = time.monotonic() - self._t0
        self.report.failures[key] = found
        if self.db is not None:
            self.db.save(self._index_key, key.encode())
        if self.on_found is not None:
            self.on_found(found)
        return found

    def _focused_shrink(self, key: str) -> None:
        """Shrink a failure that was seen but never the first failure of its example."""
        from hypothesis import Phase
        from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes
        choices, example, outcome, n, secs = self._seen[key]
        db = self.db if self.db is not None else InMemoryExampleDatabase()
        fkey = self.target.key + b"/" + key.encode()
        # Seed it as a *secondary* entry: Hypothesis replays those and shrinks them (an exact
        # primary entry counts as already shrunk and would not be shrunk again).
        db.save(fkey + b".secondary", choices_to_bytes(choices))
        saved_db, self.db = self.db, db
        try:
            got = self._hypothesis_run(phases=[Phase.reuse, Phase.shrink], max_examples=1, key=fkey, want=key)
        finally:
            self.db = saved_db
        if got:
            self._record(got[0])
            choices = getattr(got[0], "choices", None)
            if choices is not None and self.db is not None:
                # so that the next run (any worker on this database) replays it early too
                self.db.save(self.target.key + b".secondary", choices_to_bytes(choices))
        else:   # could not replay it (should not happen: runs are deterministic): keep it unshrunk
            self._record(_failure_class(key)(key, example, outcome), shrunk=False)

    @property
    def _index_key(self) -> bytes:
        return self.target.key + b".racecheck-failures"

    def _replay_known(self) -> None:
        """Replay every failure this database knows (any runner's), before searching.

        Hypothesis' own reuse phase stops at the first failing entry; this runs them all: the
        entries of the main key (minimal failing examples) and of each failure's own key (failures
        shrunk on their own). An entry that no longer fails is deleted, as Hypothesis does.
        """
        from hypothesis.control import BuildContext
        from hypothesis.database import choices_from_bytes
        from hypothesis.internal.conjecture.data import ConjectureData
        db = self.db
        if db is None:
            return
        keys = [self.target.key]
        for k in sorted(db.fetch(self._index_key)):
            keys.append(self.target.key + b"/" + k)
        strategy = self.target.strategy()
        rep = self.report
        for dbkey in keys:
            for entry in sorted(db.fetch(dbkey), key=lambda b: (len(b), b))[:MAX_REPLAYS_PER_KEY]:
                if self._stop_for_time() or (self.max_examples is not None and rep.examples >= self.max_examples):
                    return
                choices = choices_from_bytes(entry)
                if choices is None:
                    continue
                try:
                    data = ConjectureData.for_choices(choices)
                    with BuildContext(data, wrapped_test=None):
                        example = data.draw(strategy)
                except BaseException:  # noqa: BLE001 - an entry for other strategies: not ours to judge
                    continue
                try:
                    outcome = self.target.run(example)
                except UsageError:
                    continue
                self._count(outcome, "reuse", choices, example)
                if not outcome.keys:
                    db.delete(dbkey, entry)          # fixed
                    continue
                for key in outcome.keys:
                    if key not in rep.failures:
                        exc = _failure_class(key)(key, example, outcome)
                        exc.choices = tuple(choices)
                        self._record(exc)

    def _count(self, outcome, phase, choices, example) -> None:
        rep = self.report
        rep.examples += 1
        if outcome.keys:
            from racecheck.repro import failure_kind
            for kind in {failure_kind(k) for k in outcome.keys}:
                rep.kinds[kind] = rep.kinds.get(kind, 0) + 1
        if rep.examples == 1:
            rep.replayed_first = phase == "reuse"
            rep.first_example_failed = outcome.failed
        now = time.monotonic() - self._t0
        for k in outcome.keys:
            if k not in self._seen:
                self._seen[k] = (tuple(choices), example, outcome, rep.examples, now)
        self._progress()

    # -- the loop --------------------------------------------------------------------------------------
    def run(self) -> FuzzReport:
        from hypothesis import Phase
        self._t0 = time.monotonic()
        self._deadline = self._t0 + self.budget_s if self.budget_s else None
        rep = self.report
        batch = 0
        size = 50
        with _profile_loaded(self.db):
            self._replay_known()
            while True:
                if self._stop_for_time() or self.first_only and rep.failures or self._wanted_saved():
                    rep.stopped = rep.stopped or "known failures replayed"
                    break
                phases = [Phase.explicit, Phase.generate, Phase.shrink] if batch == 0 \
                    else [Phase.generate, Phase.shrink]
                n = size
                if self.max_examples is not None:
                    n = max(1, self.max_examples - rep.examples)
                    if self.budget_s:
                        n = min(n, size)
                seed = None if self.seed is None else self.seed * 1009 + batch + 7919 * self.worker
                before = rep.examples
                failures = self._hypothesis_run(phases=phases, max_examples=n, ignore=set(rep.failures),
                                                seed=seed)
                for exc in failures:
                    if exc.key not in rep.failures:
                        self._record(exc)
                if not (self.first_only and rep.failures):
                    for key in list(self._seen):
                        if key in rep.failures or self._stop_for_time(grace=True):
                            continue
                        if self.stop_when and key not in self.stop_when and self._wanted_saved():
                            continue
                        self._focused_shrink(key)
                batch += 1
                self._progress(force=True)
                if self.first_only and rep.failures:
                    rep.stopped = "first failure saved"
                    break
                if self._wanted_saved():
                    rep.stopped = "wanted failure saved"
                    break
                if self._stop_for_time():
                    rep.stopped = "budget spent"
                    break
                if self.max_examples is not None and rep.examples >= self.max_examples:
                    rep.stopped = "max examples run"
                    break
                ran = rep.examples - before
                if ran == 0 and batch > 3:
                    rep.stopped = "nothing left to generate"
                    break
                # A fixed schedule of batch sizes (never timing-dependent: with --seed the examples
                # drawn are the same on every machine; only where the budget stops them differs).
                size = min(2000, size * 2)
            # failures seen but not shrunk in time: saved as they were found (search.shrunk = false)
            if not (self.first_only and rep.failures) and not self._wanted_saved():
                for key, (choices, example, outcome, n, secs) in list(self._seen.items()):
                    if key not in rep.failures:
                        self._record(_failure_class(key)(key, example, outcome), shrunk=False)
        rep.elapsed = time.monotonic() - self._t0
        return rep

    def _stop_for_time(self, grace: bool = False) -> bool:
        if self._deadline is None:
            return False
        return time.monotonic() > self._deadline + (self.shrink_grace_s if grace else 0.0)


def _flatten(group):
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _flatten(e)
        else:
            yield e


# -- several processes sharing one database ------------------------------------------------------------

def _worker_main(k, spec, queue):
    """Worker process k: fuzz with its own seed; report progress and finds through `queue`."""
    try:
        import importlib
        for name in spec.get("imports", ()):    # "module" or "module:function" registering scenarios
            mod, _, func = name.partition(":")
            m = importlib.import_module(mod)
            if func:
                getattr(m, func)()
        target = FuzzTarget(spec["scenario"], spec["variant"], device=spec["device"],
                            draw_switches=spec["draw_switches"])
        db = open_database(spec["db"])
        seed = None if spec["seed"] is None else spec["seed"] + k

        def progress(examples, distinct, elapsed):
            queue.put(("progress", k, examples, distinct, elapsed))

        def found(ff):
            queue.put(("found", k, ff.key, ff.path, ff.examples_to_find, ff.seconds_to_find,
                       ff.seconds_to_repro, ff.outcome.wrong_values()))

        rep = Fuzzer(target, database=db, findings_dir=spec["findings_dir"], budget_s=spec["budget_s"],
                     max_examples=spec["max_examples"], seed=seed, first_only=spec["first_only"],
                     on_progress=progress, on_found=found, worker=k).run()
        queue.put(("done", k, rep.examples, rep.elapsed, rep.replayed_first, rep.first_example_failed,
                   rep.stopped, dict(rep.kinds)))
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        import traceback
        queue.put(("error", k, f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                   isinstance(exc, UsageError)))


def run_workers(spec: dict, workers: int, *, on_progress=None, on_found=None):
    """Run `workers` processes on one database; returns (per-worker done tuples, errors)."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(k, spec, queue), daemon=True) for k in range(workers)]
    for p in procs:
        p.start()
    done, errors = {}, []
    progress = {}
    while len(done) + len(errors) < workers:
        try:
            msg = queue.get(timeout=1.0)
        except Exception:
            if not any(p.is_alive() for p in procs):
                if queue.empty():
                    break
            continue
        kind = msg[0]
        if kind == "progress":
            progress[msg[1]] = msg[2:]
            if on_progress is not None:
                on_progress(sum(v[0] for v in progress.values()), progress)
        elif kind == "found":
            if on_found is not None:
                on_found(msg)
        elif kind == "done":
            done[msg[1]] = msg[2:]
        elif kind == "error":
            errors.append(msg[1:])
    for p in procs:
        p.join(timeout=10)
    return done, errors
