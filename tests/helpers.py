"""What many tests do alike: run a small program in a session, read its findings as
(rule, tensor) pairs, check its saved trace again, call the command line in a fresh process."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile

import racecheck


def in_session(program, device="sim", **options):
    """The session `program(rc)` ran in, once it is over (its findings are final). What the program
    returns lives until the session has ended, as a real program's tensors would."""
    with racecheck.session(device=device, **options) as rc:
        kept = program(rc)  # noqa: F841
    return rc


def case_on_sim(program, **options):
    """A public case of tests/cases.py on sim (its tensors on the host), in a session."""
    return in_session(lambda rc: program(rc.device_module, "cpu"), **options)


def pairs(findings) -> list:
    """(rule, tensor) of each finding, in report order: the verdict most tests compare."""
    return [(f.rule, f.tensor) for f in findings]


def frames(finding) -> list:
    """Every frame of both accesses of a finding, as `file.py:123 in fn`."""
    return [frame for a in (finding.current, finding.previous) for frame in a.stack]


def messages(findings) -> str:
    """Every finding's message, for an assertion to show what was found instead."""
    return "\n".join(f.message() for f in findings)


def recheck(rc, path) -> list:
    """Save the session's trace to `path` and check it again from the file, as `racecheck check`
    does: the findings of the offline checker."""
    from racecheck.core.checker import Checker
    from racecheck.core.trace import Trace
    rc.save_trace(path)
    return Checker().process_all(Trace.iter_file(path)).findings


def racecheck_cli(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """`python -m racecheck ARGS` in a fresh process; `env` adds to this process's environment."""
    return subprocess.run([sys.executable, "-m", "racecheck", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout)


def what_ran(res) -> str:
    """What a failure message needs to tell how a run on another machine (CI) differed from a
    passing one: the dropped sites' calls, the outputs, the known races, the environment and
    every site's calls."""
    dropped = {s.id: (s.calls, s.dropped) for s in res.sync_sites if s.dropped}
    calls = {s.id.split(":", 1)[-1]: s.calls for s in res.sync_sites}
    known = sorted({(f.rule, f.tensor, f.place.spans if f.place else "") for f in res.known})
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("SGLANG_", "RACECHECK_", "TRITON_", "TORCH", "CUDA", "OMP_", "PYTHON"))}
    return (f"\n  dropped (calls, dropped): {dropped}; unmatched: {res.unmatched_drops}"
            f"\n  outputs: {res.outputs}\n  known: {known}\n  environment: {env}"
            f"\n  site calls: {calls}")


_RUN_ALONE = """
import json, pickle, sys
from racecheck import scenarios
name, variant, overrides, out = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
sc = scenarios.get(name)
res = scenarios.run(sc, sc.config(variant=variant, overrides=overrides), device="sim")
with open(out, "wb") as fh:
    pickle.dump(res, fh)
"""


def run_alone(scenario, variant=None, **overrides):
    """`scenarios.run` on sim in a new interpreter, as `racecheck run` runs it: the engine
    scenarios' verdicts then do not depend on what earlier tests left in this process (one
    process running the whole suite once saw sglang seeds unflagged that every subset of the
    suite flags; not understood yet). Returns the RunResult."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pickle")
        p = subprocess.run([sys.executable, "-c", _RUN_ALONE, scenario, json.dumps(variant),
                            json.dumps(overrides), out], capture_output=True, text=True,
                           timeout=1200)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        with open(out, "rb") as fh:
            return pickle.load(fh)
