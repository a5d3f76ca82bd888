"""The fuzz loop: Hypothesis over a target, each distinct failure shrunk and saved as a repro record.

    from racecheck.drivers.fuzz import FuzzTarget, Fuzzer, open_database
    target = FuzzTarget("eagle-v2", "no-futuremap_publish")
    report = Fuzzer(target, database=open_database(".racecheck/examples"),
                    findings_dir="racecheck-findings", budget_s=60).run()
    report.failures          # key -> FoundFailure(path, example, outcome, examples_to_find, ...)

One example = one scenario run on `sim` under the adversarial executor with a drawn plan. A run
fails when the detector reports a finding, the differential oracle sees an output differ from the
serialized run, an op faults when the plan runs it, or the program crashes. Each distinct failure
(its key: "RC001 seq_lens", "DIFF mm_input_embeds", ...; see `racecheck.drivers.fuzz.repro`) is shrunk by
Hypothesis on its own and written as a JSON repro record.

Hypothesis settings: racecheck registers and loads its own profile ("racecheck") for the run and
passes every setting explicitly, so the `ci` profile Hypothesis picks when `CI` is set (no
database, derandomized) never applies. The database key is `racecheck/v2/<scenario>/<variant>`
(`all-fixes` without a variant; `+switches` when fix switches are drawn; `@<device>` off sim), never
a hash of test source, so every runner and every racecheck release with the same strategies
shares one corpus. Bump the version (racecheck.drivers.fuzz.target.KEY_VERSION) when the strategies change incompatibly.

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
Hypothesis's final replay of a failure's minimal example reuses that example's outcome when it
already ran in full (`_RecentOutcomes`), so a failure found late costs no second engine run.
"""
from __future__ import annotations

import os
import time
import unittest
from dataclasses import dataclass, field

from racecheck.core.errors import UsageError

from racecheck.drivers.fuzz import _hypothesis as hyp
from racecheck.drivers.fuzz.keys import failure_kind
from racecheck.drivers.fuzz.repro import make_record, record_filename, reproduce_command, save_record
from racecheck.drivers.fuzz.target import FuzzTarget, Outcome

DEFAULT_DB = os.path.join(".racecheck", "examples")
DEFAULT_FINDINGS_DIR = "racecheck-findings"
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
    engines: dict = field(default_factory=dict)       # engines.py's counts, where engines are reused
    # examples (scenario runs) that showed each kind of failure
    kinds: dict = field(default_factory=lambda: {"finding": 0, "differential": 0, "fault": 0,
                                                 "crash": 0, "internal": 0})

    @property
    def rate(self) -> float:
        return self.examples / self.elapsed if self.elapsed > 0 else 0.0


_class_keys: dict = {}        # failure class -> key


class _BudgetSpent(unittest.SkipTest):
    """Ends a Hypothesis run with nothing to shrink once the budget is spent (Hypothesis lets
    skip exceptions through untouched; nothing is saved to or deleted from the database)."""


class _RecentOutcomes:
    """The outcomes of the last few full runs, by the example's choice sequence. Hypothesis
    ends a failure with a final replay of its minimal example; when that example already ran in
    full (found and not shrunk further, or a shrink step that ran the plan), its outcome is
    reused instead of running the engine again: an engine example can cost a minute, and on
    the real engine a failure's replay would also be confirmed on a fresh engine a second time."""

    def __init__(self, size: int = 8):
        self.size = size
        self._items: dict = {}

    def get(self, choices):
        return self._items.get(tuple(choices))

    def put(self, choices, outcome) -> None:
        key = tuple(choices)
        self._items.pop(key, None)
        self._items[key] = outcome
        while len(self._items) > self.size:
            del self._items[next(iter(self._items))]


class Fuzzer:
    """Runs the fuzz loop for one target in this process."""

    def __init__(self, target: FuzzTarget, *, database=None, findings_dir: str = DEFAULT_FINDINGS_DIR,
                 budget_s: float | None = None, max_examples: int | None = None, seed: int | None = None,
                 first_only: bool = False, stop_when=None, stop_when_all: bool = False,
                 shrink_grace_s: float | None = None,
                 on_progress=None, on_found=None, worker: int = 0, write: bool = True,
                 reuse_engines: bool = True):
        if budget_s is None and max_examples is None:
            budget_s = 60.0
        self.target = target
        # one engine, many schedules (engines.py), where the scenario says how
        target.reuse_engines = reuse_engines
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
        self._full_runs = _RecentOutcomes()

    # -- limits ------------------------------------------------------------------------------------
    def _out_of_budget(self, phase: str) -> bool:
        if phase == "reuse":
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
        from hypothesis import Phase, Verbosity, given, reject, settings
        target = self.target
        ignore = frozenset(ignore)
        # Failure keys raised in this run, in order: what Hypothesis is shrinking. With
        # report_multiple_bugs off it stops generating at the first one, so a run that raised is
        # shrinking (or replaying the result); one without a generate phase starts by replaying
        # the database (never cut short by the budget: an entry that passes would be deleted).
        raised: list = []
        first_phase = "generate" if Phase.generate in phases else "reuse"

        @settings(database=self.db, max_examples=max_examples, phases=phases,
                  report_multiple_bugs=False, verbosity=Verbosity.quiet)
        @given(example=target.strategy())
        def fuzz_example(example):
            final = hyp.is_final()
            phase = "final" if final else ("shrink" if raised else first_phase)
            if not final and self._out_of_budget(phase):
                if phase == "generate":
                    raise _BudgetSpent()
                return
            choices = hyp.choices()
            outcome = self._full_runs.get(choices) if final else None
            if outcome is None:
                try:
                    if phase == "shrink" and all(failure_kind(k) == "finding" for k in raised):
                        # Findings are the same in every order: shrink a detector failure on
                        # fast issue-order runs (the final replay runs the example's own plan).
                        outcome = target.run_detector_only(example)
                    else:
                        outcome = target.run(example)
                        self._full_runs.put(choices, outcome)
                except UsageError:
                    reject()             # a knob combination the scenario does not accept
                self._count(outcome, phase, choices, example)
            if want is not None:
                key = want if want in outcome.keys else None
            else:
                # the failure being shrunk while it is still there, else the first new one
                key = next((k for k in raised if k in outcome.keys), None) or \
                    next((k for k in outcome.keys if k not in ignore), None)
            if key is not None:
                if key not in raised:
                    raised.append(key)
                exc = _failure_class(key)(key, example, outcome)
                exc.choices = choices
                # one raise site: Hypothesis tells failures apart by exception type and location
                raise exc

        hyp.set_database_key(fuzz_example, key if key is not None else target.key)
        if seed is not None:
            hyp.set_seed(fuzz_example, seed)
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
                        "database_key": self.target.key.decode(), "worker": self.worker,
                        "engine": outcome.engine})
            found.path = save_record(rec, self.findings_dir, record_filename(
                self.target.scenario, self.target.variant, key, self.target.fixed))
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
        from hypothesis.database import InMemoryExampleDatabase
        choices, example, outcome, n, secs = self._seen[key]
        db = self.db if self.db is not None else InMemoryExampleDatabase()
        fkey = self.target.key + b"/" + key.encode()
        # Seed it as a *secondary* entry: Hypothesis replays those and shrinks them (an exact
        # primary entry counts as already shrunk and would not be shrunk again).
        db.save(fkey + b".secondary", hyp.choices_to_bytes(choices))
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
                self.db.save(self.target.key + b".secondary", hyp.choices_to_bytes(choices))
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
                choices = hyp.choices_from_bytes(entry)
                if choices is None:
                    continue
                try:
                    example = hyp.draw_from_choices(strategy, choices)
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
        try:
            return self._run(rep)
        finally:
            self.target.close()
            rep.engines = self.target.engine_stats() if self.target.reusing() else {}

    def _run(self, rep) -> FuzzReport:
        from hypothesis import Phase
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
