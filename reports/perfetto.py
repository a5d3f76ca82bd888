"""Perfetto / Chrome trace-event JSON: open a race in ui.perfetto.dev.

One process per finding, one thread track per stream (thread_name metadata), ops as "X" slices on a
logical clock (one op per 10 µs), record->wait edges and the racing pair as v1 flow arrows
(s/f with bp:"e", so both ends bind to their enclosing slices).
"""
from __future__ import annotations

import json

from racecheck.core.findings import Finding

from ._common import rule_name
from .json_report import tool_info
from .timeline import build

TICK, DUR = 10.0, 8.0   # µs per op column, slice length


def finding_events(f: Finding, pid: int, flow_ids) -> list[dict]:
    tl = build(f, max_ops=0)   # a trace has room for the whole context
    col = tl.column()
    tids = {lane: i + 1 for i, lane in enumerate(tl.lanes)}
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
           "args": {"name": f"#{pid} {f.rule} {rule_name(f.rule)} on {f.tensor}"}},
          {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for lane, tid in tids.items():
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
        ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    def ts(seq):
        return col[seq] * TICK

    for o in tl.ops:
        args = {"seq": o.seq, "kind": o.kind}
        cat = "sync" if o.kind in ("record", "wait", "sync") else "op"
        if o.role:
            args["race"] = o.role
            cat = "race"
            a = f.current if o.role == "current" else f.previous
            args.update({"location": a.location, "function": a.function, "stack": list(a.stack)})
        ev.append({"ph": "X", "name": o.label or o.kind, "cat": cat, "pid": pid, "tid": tids[o.lane],
                   "ts": ts(o.seq), "dur": DUR, "args": args})

    def flow(a, b, name, cat):
        fid = next(flow_ids)
        # start inside the source slice, end bound to the enclosing destination slice
        ev.append({"ph": "s", "id": fid, "name": name, "cat": cat, "pid": pid,
                   "tid": tids[tl.op(a).lane], "ts": ts(a) + DUR / 2})
        ev.append({"ph": "f", "bp": "e", "id": fid, "name": name, "cat": cat, "pid": pid,
                   "tid": tids[tl.op(b).lane], "ts": ts(b) + DUR / 2})

    for a, b in tl.edges:
        flow(a, b, "sync", "sync")
    prev_seq, cur_seq = tl.race
    flow(prev_seq, cur_seq, f"RACE {f.tensor}", "race")
    cur = tl.op(cur_seq)
    ev.append({"ph": "i", "s": "t", "name": f"{f.rule} {f.tensor}: {f.suggestion}", "cat": "race", "pid": pid,
               "tid": tids[cur.lane], "ts": ts(cur_seq), "args": {"fingerprint": f.fingerprint(),
                                                                "missing_edge": list(f.missing_edge)}})
    return ev


def to_trace(findings, meta: dict | None = None) -> dict:
    meta = dict(meta or {})
    counter = iter(range(1, 1 << 30))
    events = []
    for i, f in enumerate(findings, 1):
        events += finding_events(f, i, counter)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tool": "racecheck", "version": tool_info()["version"], "clock": "logical (one op = 10 us)",
                          **{k: str(meta[k]) for k in ("scenario", "variant", "device", "seed") if meta.get(k) not in (None, "")}}}


def render(findings, meta: dict | None = None) -> str:
    return json.dumps(to_trace(list(findings), meta), indent=1) + "\n"
