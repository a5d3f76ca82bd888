"""Engines kept open across fuzz examples: one engine, many request schedules.

A scenario whose runs each build a whole inference engine in a fresh process
(`Scenario.fresh_process`) may say how one engine serves many examples (`Scenario.reuse`: a
module with `engine_key(cfg)`, `STRETCH_KNOBS`, `instrumented_engine` and `reference_engine`;
scenarios/sglang/reuse.py). Then `EnginePool` keeps one engine process per engine shape open
(forked from the warmed fuzz process: scenarios/fresh.py `Server`) and runs each example as a
*stretch* of it: the example's request schedule fed into the running engine under the example's
executor plan, its findings those the checker made during the stretch, its outputs compared with
a second long-lived process of the same shape running the serialized reference (reference
outputs are also cached per schedule).

An engine whose stretch failed in any way (a finding, wrong values, a fault, a crash, an
internal error, a stretch that did not end, a flush sglang refused) is closed: the checker
reports a race once per session, and a failing engine's state is not the state a fresh engine
starts from. The fuzz target (target.py) confirms every failure of a reused engine on a fresh one.
"""
from __future__ import annotations

import json
import time

_REFERENCE_CACHE_SIZE = 256


class Stretch:
    """What one stretch showed: a `RunResult` and how it ran."""

    def __init__(self, result, engine: int, stretch: int, constructed: bool, seconds: dict,
                 clean_end: bool):
        self.result = result
        self.engine = engine             # which engine of this pool (1, 2, ...)
        self.stretch = stretch           # its stretch number on that engine (0: the first)
        self.constructed = constructed   # the engine was built for this example
        self.seconds = seconds
        self.clean_end = clean_end

    def describe(self) -> str:
        return f"stretch {self.stretch} of reused engine {self.engine}"


class _Open:
    def __init__(self, key: str, server):
        self.key, self.server = key, server
        self.stretches = 0


class EnginePool:
    """The open engines of one fuzz target (one instrumented, one reference)."""

    def __init__(self, sc, device: str):
        self.sc = sc
        self.device = device
        self.hooks = sc.reuse
        self.engine: _Open | None = None
        self.reference: _Open | None = None
        self._refs: dict = {}
        self.engines_built = 0
        self.references_built = 0
        self.stretches = 0
        self.retired = 0
        self.seconds = {"construction": 0.0, "stretch": 0.0, "end": 0.0, "reference_wait": 0.0,
                        "parent": 0.0}

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        for which in ("engine", "reference"):
            got = getattr(self, which)
            if got is not None:
                got.server.close(timeout=5.0)
                setattr(self, which, None)

    def retire(self) -> None:
        """Close the instrumented engine (the next example builds a new one)."""
        if self.engine is not None:
            self.engine.server.kill()
            self.engine = None
            self.retired += 1

    def _instrumented(self, cfg: dict) -> tuple:
        from racecheck.scenarios import fresh
        key = self.hooks.engine_key(cfg)
        if self.engine is not None and (self.engine.key != key or not self.engine.server.alive):
            self.engine.server.close(timeout=5.0)
            self.engine = None
        if self.engine is None:
            self.engine = _Open(key, fresh.serve(self.sc, self.hooks.instrumented_engine, self.sc,
                                                 cfg, self.device))
            self.engines_built += 1
            return self.engine, True
        return self.engine, False

    def _reference_server(self, cfg: dict) -> _Open:
        from racecheck.scenarios import fresh
        ref = self.sc.reference_config(cfg)
        key = self.hooks.engine_key(ref)
        if self.reference is not None and (self.reference.key != key
                                           or not self.reference.server.alive):
            self.reference.server.close(timeout=5.0)
            self.reference = None
        if self.reference is None:
            self.reference = _Open(key, fresh.serve(self.sc, self.hooks.reference_engine,
                                                    self.sc, cfg))
            self.references_built += 1
        return self.reference

    def _ref_key(self, cfg: dict) -> str:
        return json.dumps(self.sc.reference_config(cfg), sort_keys=True, default=str)

    # -- one example -------------------------------------------------------------------------------
    def run(self, cfg: dict, plan, seed: int = 0, *, reference: bool = True) -> Stretch:
        """Run `cfg`'s schedule under `plan` on the open engine of its shape (built first if
        none is open). Raises what the engine raised (its process is then closed)."""
        from racecheck.scenarios.registry import (RunResult, compare_outputs, diff_finding,
                                                  split_known)
        t0 = time.perf_counter()
        command = {"cfg": cfg, "plan": plan}
        ref_out = None
        ref_server = None
        if reference:
            ref_out = self._refs.get(self._ref_key(cfg))
            if ref_out is None:
                ref_server = self._reference_server(cfg)
                ref_server.server.send(command)           # runs beside the instrumented stretch
        engine, constructed = self._instrumented(cfg)
        try:
            reply = engine.server.request(command)
        except BaseException:
            self.retire()
            if ref_server is not None:                     # its reply is not wanted any more
                ref_server.server.kill()
                self.reference = None
            raise
        engine.stretches += 1
        self.stretches += 1
        t_wait = time.perf_counter()
        if ref_server is not None:
            try:
                ref_reply = ref_server.server.reply()
            except BaseException:
                ref_server.server.kill()
                self.reference = None
                raise
            ref_out = ref_reply["outputs"]
            if ref_reply.get("timed_out") or not ref_reply.get("flushed", True):
                ref_server.server.close(timeout=5.0)
                self.reference = None
            if len(self._refs) >= _REFERENCE_CACHE_SIZE:
                self._refs.pop(next(iter(self._refs)))
            self._refs[self._ref_key(cfg)] = ref_out
        t_ref = time.perf_counter()
        outputs = reply["outputs"]
        findings, known = split_known(self.sc, list(reply["findings"]))
        if ref_out is not None:
            diffs = compare_outputs(outputs, ref_out)
        else:
            diffs, ref_out = [], outputs
        diff_ok = not diffs
        detail = "outputs equal the serialized run" if diff_ok else \
            "; ".join(d[1] for d in diffs[:6])
        seen = set()
        for fieldname, text in diffs:
            if fieldname not in seen:
                seen.add(fieldname)
                findings.append(diff_finding(self.sc, fieldname, text))
        secs = dict(reply["seconds"])
        secs["reference_wait"] = t_ref - t_wait
        result = RunResult(self.sc.name, cfg, self.device, seed, findings, outputs, ref_out,
                           diff_ok, detail, list(reply["internal_errors"]),
                           time.perf_counter() - t0, reply["stats"], reply["sync_sites"],
                           reply["unmatched_drops"], known)
        result.executor_state = reply["executor"]
        secs["parent"] = time.perf_counter() - t_ref
        for k in self.seconds:
            self.seconds[k] += secs.get(k, 0.0)
        clean_end = not reply["timed_out"] and reply["flushed"]
        return Stretch(result, self.engines_built, reply["stretch"], constructed, secs, clean_end)

    def summary(self) -> dict:
        return {"engines_built": self.engines_built, "references_built": self.references_built,
                "stretches": self.stretches, "retired": self.retired,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}
