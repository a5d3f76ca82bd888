"""How racecheck's cost grows with batch size, iterations, streams and graph size (sim, CPU).

Each row is measured side by side with the same program uninstrumented where one exists:
  batch       eagle-v2 with N requests from the first iteration (graphs on, buckets up to 16)
  iterations  eagle-v2 with the default schedule over more decode iterations
  streams     K streams, each updating its own tensor and handing it on with events
  graph       a captured graph of N ops, replayed (one footprint pass per replay)

    python bench/bench_scaling.py [--quick] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import racecheck


def _best(fn, repeat):
    return min(_once(fn) for _ in range(repeat))


def _once(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def scenario_rows(quick):
    from racecheck import scenarios
    sc = scenarios.get("eagle-v2")
    rows = []
    batches = (1, 4) if quick else (1, 2, 4, 8, 16)
    for n in batches:
        cfg = sc.config(overrides={"schedule": f"0:+{n}x8", "iterations": "8",
                                   "buckets": "1,2,4,8,16"})
        res = scenarios.run(sc, cfg)  # warm (and the reference run is cached)
        t = _best(lambda: scenarios.run(sc, cfg), 1 if quick else 3)
        rows.append({"axis": "batch", "value": n, "seconds": t, "events": res.stats["events"],
                     "findings": len(res.findings)})
    for iters in ((4, 8) if quick else (8, 16, 32, 64)):
        cfg = sc.config(overrides={"iterations": str(iters)})
        res = scenarios.run(sc, cfg)
        t = _best(lambda: scenarios.run(sc, cfg), 1 if quick else 3)
        rows.append({"axis": "iterations", "value": iters, "seconds": t,
                     "events": res.stats["events"], "findings": len(res.findings)})
    return rows


def streams_rows(quick):
    rows = []
    n_ops = 200 if quick else 2000
    for k in ((2, 4) if quick else (2, 4, 8, 16)):
        def program(dm):
            streams = [dm.Stream() for _ in range(k)]
            events = [dm.Event() for _ in range(k)]
            xs = [torch.zeros(64) for _ in range(k)]
            dm.synchronize()
            for i in range(n_ops // k):
                for j, (s, e, x) in enumerate(zip(streams, events, xs)):
                    with dm.stream(s):
                        s.wait_event(events[j - 1])
                        x.add_(1)
                        e.record(s)
            dm.synchronize()  # before the tensors are freed back to the default stream's pool

        def plain():
            class _S:
                def wait_event(self, e):
                    pass

            class _E:
                def record(self, s=None):
                    pass

            class _DM:
                Stream, Event = _S, _E

                @staticmethod
                def stream(s):
                    import contextlib
                    return contextlib.nullcontext()

                @staticmethod
                def synchronize():
                    pass
            program(_DM)

        def checked():
            with racecheck.session() as rc:
                program(rc.device_module)
            assert not rc.findings

        tp = _best(plain, 3)
        tc = _best(checked, 3)
        rows.append({"axis": "streams", "value": k, "seconds": tc, "plain_seconds": tp,
                     "us_per_op_added": (tc - tp) / n_ops * 1e6})
    return rows


def graph_rows(quick):
    rows = []
    for n in ((8, 64) if quick else (8, 64, 256, 1024)):
        replays = 20 if quick else 100

        def checked():
            with racecheck.session() as rc:
                dm = rc.device_module
                bufs = [torch.zeros(64) for _ in range(n)]
                g = dm.CUDAGraph()
                with dm.graph(g):
                    for b in bufs:
                        b.add_(1)
                t = time.perf_counter()
                for _ in range(replays):
                    g.replay()
                dm.synchronize()
                return time.perf_counter() - t

        def plain():
            bufs = [torch.zeros(64) for _ in range(n)]
            t = time.perf_counter()
            for _ in range(replays):
                for b in bufs:
                    b.add_(1)
            return time.perf_counter() - t

        tc = min(checked() for _ in range(3))
        tp = min(plain() for _ in range(3))
        rows.append({"axis": "graph ops", "value": n, "seconds": tc / replays,
                     "plain_seconds": tp / replays, "us_per_replayed_op": tc / replays / n * 1e6})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = scenario_rows(args.quick) + streams_rows(args.quick) + graph_rows(args.quick)
    from rich.console import Console
    from rich.table import Table
    table = Table(title="racecheck on sim: cost against program size")
    for col in ("axis", "value", "seconds", "plain seconds", "events", "note"):
        table.add_column(col, justify="right")
    for r in rows:
        note = ""
        if "us_per_op_added" in r:
            note = f"+{r['us_per_op_added']:.1f} µs/op"
        elif "us_per_replayed_op" in r:
            note = f"{r['us_per_replayed_op']:.2f} µs per replayed op"
        elif r["axis"] in ("batch", "iterations"):
            note = f"{r['events'] / r['seconds'] / 1e3:.0f}k events/s"
        table.add_row(r["axis"], str(r["value"]), f"{r['seconds']:.4f}",
                      f"{r['plain_seconds']:.4f}" if "plain_seconds" in r else "",
                      str(r.get("events", "")), note)
    Console().print(table)
    if args.json:
        with open(args.json, "w") as fp:
            json.dump(rows, fp, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
