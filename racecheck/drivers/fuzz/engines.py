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
# engines kept open at once (least recently used closed first): the examples that keep the
# configured shape share one, while exploring examples' shapes come and go
MAX_OPEN = 2


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
        self.number = 0


class EnginePool:
    """The open engines of one fuzz target: up to `MAX_OPEN` instrumented engines and as many
    reference engines, one per engine shape."""

    def __init__(self, sc, device: str):
        self.sc = sc
        self.device = device
        self.hooks = sc.reuse
        self.max_open = MAX_OPEN
        self.engines: dict = {}          # key -> _Open, least recently used first
        self.references: dict = {}
        self.engine: _Open | None = None     # the one the last example ran on
        self._refs: dict = {}
        self.engines_built = 0
        self.references_built = 0
        self.stretches = 0
        self.retired = 0
        self.seconds = {"construction": 0.0, "stretch": 0.0, "end": 0.0, "reference_wait": 0.0,
                        "parent": 0.0}

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        for table in (self.engines, self.references):
            for got in table.values():
                got.server.close(timeout=5.0)
            table.clear()
        self.engine = None

    def retire(self) -> None:
        """Close the engine the last example ran on (the next example of its shape builds a
        new one)."""
        if self.engine is not None:
            self.engine.server.kill()
            self.engines.pop(self.engine.key, None)
            self.engine = None
            self.retired += 1

    def _drop_reference(self, got: _Open, kill: bool = False) -> None:
        (got.server.kill if kill else got.server.close)()
        self.references.pop(got.key, None)

    def _open(self, table: dict, key: str, device: str, fn, *args) -> tuple:
        from racecheck.scenarios import fresh
        got = table.pop(key, None)
        if got is not None and not got.server.alive:
            got = None
        built = got is None
        if built:
            while len(table) >= self.max_open:
                table.pop(next(iter(table))).server.close(timeout=5.0)
            got = _Open(key, fresh.serve(self.sc, fn, *args, device=device))
        table[key] = got                                   # the most recently used last
        return got, built

    def _instrumented(self, cfg: dict) -> tuple:
        got, built = self._open(self.engines, self.hooks.engine_key(cfg), self.device,
                                self.hooks.instrumented_engine, self.sc, cfg, self.device)
        self.engines_built += built
        if built:
            got.number = self.engines_built
        self.engine = got
        return got, built

    def _reference_server(self, cfg: dict) -> _Open:
        got, built = self._open(self.references,
                                self.hooks.engine_key(self.sc.reference_config(cfg)),
                                self.device, self.hooks.reference_engine, self.sc, cfg)
        self.references_built += built
        return got

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
                self._drop_reference(ref_server, kill=True)
            raise
        engine.stretches += 1
        self.stretches += 1
        t_wait = time.perf_counter()
        if ref_server is not None:
            try:
                ref_reply = ref_server.server.reply()
            except BaseException:
                self._drop_reference(ref_server, kill=True)
                raise
            ref_out = ref_reply["outputs"]
            if ref_reply.get("timed_out") or not ref_reply.get("flushed", True):
                self._drop_reference(ref_server)
            if len(self._refs) >= _REFERENCE_CACHE_SIZE:
                self._refs.pop(next(iter(self._refs)))
            self._refs[self._ref_key(cfg)] = ref_out
        t_ref = time.perf_counter()
        outputs = reply["outputs"]
        findings, known = split_known(self.sc, list(reply["findings"]))
        if ref_out is not None:
            diffs = compare_outputs(outputs, ref_out, self.sc.diff_fields)
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
        return Stretch(result, engine.number, reply["stretch"], constructed, secs, clean_end)

    def summary(self) -> dict:
        return {"engines_built": self.engines_built, "references_built": self.references_built,
                "stretches": self.stretches, "retired": self.retired,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}
