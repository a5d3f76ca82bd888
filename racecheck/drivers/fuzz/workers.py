"""Several fuzzing processes sharing one example database, and the messages they send back.

Each worker runs its own `Fuzzer` with its own seed; what it reports travels as one of the small
dataclasses below (pickled through a multiprocessing queue), never as a positional tuple.
"""
from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
from dataclasses import dataclass, field

from racecheck.core.errors import UsageError


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker fuzzes. `imports`: modules ("module" or "module:function") to import
    first in the fresh process, to register scenarios the registry does not find by itself."""

    scenario: str
    variant: str | None = None
    device: str = "sim"
    draw_switches: bool = False
    db: str | None = None
    seed: int | None = None
    findings_dir: str = "racecheck-findings"
    budget_s: float | None = None
    max_examples: int | None = None
    first_only: bool = False
    imports: tuple = ()
    fixed: tuple = ()              # (knob, value) pairs every example keeps (--set, --drop-sync)


@dataclass(frozen=True)
class Progress:
    worker: int
    examples: int
    distinct: int
    elapsed: float


@dataclass(frozen=True)
class Found:
    """A failure a worker shrunk and saved as a repro record at `path`."""

    worker: int
    key: str
    path: str
    examples_to_find: int
    seconds_to_find: float
    seconds_to_repro: float
    wrong_values: str


@dataclass(frozen=True)
class Done:
    worker: int
    examples: int
    elapsed: float
    replayed_first: bool
    first_example_failed: bool
    stopped: str
    kinds: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    """A worker that raised: `usage` when the spec itself was wrong (a UsageError)."""

    worker: int
    error: str
    traceback: str
    usage: bool


def _worker_main(k: int, spec: WorkerSpec, queue) -> None:
    """Worker process k: fuzz with its own seed; report progress and finds through `queue`."""
    try:
        import importlib

        from racecheck.drivers.fuzz.search import Fuzzer, open_database
        from racecheck.drivers.fuzz.target import FuzzTarget
        for name in spec.imports:
            mod, _, func = name.partition(":")
            m = importlib.import_module(mod)
            if func:
                getattr(m, func)()
        target = FuzzTarget(spec.scenario, spec.variant, device=spec.device, draw_switches=spec.draw_switches,
                            fixed=dict(spec.fixed))
        db = open_database(spec.db)
        seed = None if spec.seed is None else spec.seed + k

        def progress(examples, distinct, elapsed):
            queue.put(Progress(k, examples, distinct, elapsed))

        def found(ff):
            queue.put(Found(k, ff.key, ff.path, ff.examples_to_find, ff.seconds_to_find,
                            ff.seconds_to_repro, ff.outcome.wrong_values()))

        rep = Fuzzer(target, database=db, findings_dir=spec.findings_dir, budget_s=spec.budget_s,
                     max_examples=spec.max_examples, seed=seed, first_only=spec.first_only,
                     on_progress=progress, on_found=found, worker=k).run()
        queue.put(Done(k, rep.examples, rep.elapsed, rep.replayed_first, rep.first_example_failed,
                       rep.stopped, dict(rep.kinds)))
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        import traceback
        queue.put(Failed(k, f"{type(exc).__name__}: {exc}", traceback.format_exc(), isinstance(exc, UsageError)))


def run_workers(spec: WorkerSpec, workers: int, *, on_progress=None, on_found=None):
    """Run `workers` processes on one database; returns ({worker: Done}, [Failed]).

    `on_progress(total_examples, {worker: Progress})` and `on_found(Found)` run in this process."""
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
        except queue_mod.Empty:
            if not any(p.is_alive() for p in procs) and queue.empty():
                break
            continue
        if isinstance(msg, Progress):
            progress[msg.worker] = msg
            if on_progress is not None:
                on_progress(sum(p.examples for p in progress.values()), progress)
        elif isinstance(msg, Found):
            if on_found is not None:
                on_found(msg)
        elif isinstance(msg, Done):
            done[msg.worker] = msg
        elif isinstance(msg, Failed):
            errors.append(msg)
    for p in procs:
        p.join(timeout=10)
    return done, errors
