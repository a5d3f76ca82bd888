"""Fuzzing: Hypothesis over a scenario, every distinct failure shrunk and saved as a repro record.

    from racecheck.drivers.fuzz import FuzzTarget, Fuzzer, open_database
    target = FuzzTarget("eagle-v2", "no-futuremap_publish")
    report = Fuzzer(target, database=open_database(".racecheck/examples"),
                    findings_dir="racecheck-findings", budget_s=60).run()
    report.failures          # key -> FoundFailure(path, example, outcome, examples_to_find, ...)
    replay(load_record(report.failures[key].path)).reproduced

A driver: it runs scenarios (racecheck.scenarios) under instrumentation options (executor plans,
delays) and writes records; the CLI sits on top. Modules: `target` (what one example runs),
`strategies` (what an example is), `search` (the Hypothesis loop), `workers` (processes sharing a
database), `keys` (what makes two failures one), `repro` (the record format and replay). Hypothesis internals live in `_hypothesis`.
"""
from __future__ import annotations

from racecheck.drivers.fuzz.search import (DEFAULT_DB, DEFAULT_FINDINGS_DIR, FoundFailure, Fuzzer, FuzzReport, open_database,
                     parse_budget, racecheck_profile)
from racecheck.drivers.fuzz.keys import failure_kind, finding_key
from racecheck.drivers.fuzz.repro import (FORMAT, FORMAT_VERSION, ReplayResult, load_record, make_record, record_filename, replay,
                    reproduce_command, save_record)
from racecheck.drivers.fuzz.target import FuzzTarget, Outcome, database_key
from racecheck.drivers.fuzz.workers import Done, Failed, Found, Progress, WorkerSpec, run_workers

__all__ = ["FuzzTarget", "Outcome", "Fuzzer", "FuzzReport", "FoundFailure", "open_database", "database_key",
           "racecheck_profile", "DEFAULT_DB", "DEFAULT_FINDINGS_DIR", "parse_budget", "run_workers",
           "WorkerSpec", "Progress", "Found", "Done", "Failed", "FORMAT", "FORMAT_VERSION", "finding_key",
           "failure_kind", "make_record", "save_record", "load_record", "record_filename", "replay",
           "ReplayResult", "reproduce_command"]
