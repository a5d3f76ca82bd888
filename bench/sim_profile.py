"""Where racecheck's time goes on `sim` (CPU): timings and cProfile by component.

    python bench/sim_profile.py [--quick] [--json OUT.json] [--top N]

Workloads, each under racecheck.session(device="sim", route_cuda=True) (the GPU benchmarks' own
code, run unchanged through torch.cuda routing) and, for the first two, plain sim as well:
  add_         bench_interception.py's in-place add on a 64-element tensor
  decode-step  bench_interception.py's matmul, add, index_select, add, copy
  graph-loop   gpu_overhead.py's step captured in a graph and replayed (loop (b) of section 3),
               with its eager positions update, at a smaller size
First the µs per iteration (median of timed blocks; plain where it means anything), then each
workload once more under cProfile: own time per component (the categories of gpu_profile.py)
and the top functions. cProfile inflates Python-call-heavy code: read the shares, not the µs.
Last, the checker alone on synthetic graph replays (n captured ops alternating over k buffers),
every replay merged (racecheck/core/replay.py) vs per op, side by side: µs per replay, min of rounds.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _workloads(torch, device):
    from bench_interception import make_workloads
    w = make_workloads(device)
    return {"add_": w["add_"][0], "decode-step": w["decode-step"][0]}


def _graph_loop(torch):
    from gpu_overhead import _decode_step_factory
    _step, factory = _decode_step_factory(torch, torch.cuda, hidden=64, batch=4)
    return factory()


def _time(fn, iters, blocks=5):
    for _ in range(20):
        fn()
    out = []
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(out)


def _profile(fn, iters, rc, top):
    from gpu_profile import breakdown
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(iters):
        fn()
    rc.checker              # the queued events reach the checker inside the profile
    pr.disable()
    st = pstats.Stats(pr)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
    funcs = [(f"{os.path.basename(k[0])}:{k[1]}({k[2]})", v[2] / iters * 1e6) for k, v in rows]
    return breakdown(st), funcs


def replay_merge(rounds=7, replays=300):
    """{(ops, buffers): (per-op µs, merged µs)} per replay, checker only."""
    from racecheck.core.checker import Checker
    from racecheck.core.trace import CapturedOp, Footprint, GraphCapture, GraphReplay, HostSync, Kernel
    out = {}
    for nops, nbuf in ((6, 10), (6, 6), (12, 3), (24, 4), (48, 4)):
        ops = [CapturedOp((Footprint(1 + k % nbuf, ((0, 4096),)),),
                          (Footprint(1 + (k + 1) % nbuf, ((0, 4096),)),), f"op{k}", ())
               for k in range(nops)]
        evs = [GraphCapture(0, 1, ops)]
        for _ in range(replays):
            evs += [Kernel(0, 1, (), (Footprint(100, ((0, 64),)),), "fill_", ()),
                    GraphReplay(0, 1, 1, ()), HostSync(0, "device", None)]
        best = {}
        for _ in range(rounds):
            for merged in (False, True):
                c = Checker()
                c.merge_replays = merged
                c.merge_min_accesses = 0
                t = time.perf_counter()
                c.process_all(evs)
                best[merged] = min(best.get(merged, 1e9), (time.perf_counter() - t) / replays * 1e6)
        out[(nops, nbuf)] = (best[False], best[True])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    import torch

    import racecheck
    iters = 200 if args.quick else 2000
    out = {}
    plain = _workloads(torch, None)
    for name, fn in plain.items():
        t_plain = _time(fn, iters)
        with racecheck.session(device="sim") as rc:
            t_rc = _time(fn, iters)
            cats, funcs = _profile(fn, iters, rc, args.top)
        out[f"{name} (sim)"] = {"plain_us": t_plain, "racecheck_us": t_rc, "categories": cats,
                                "top": funcs}
    with racecheck.session(device="sim", route_cuda=True) as rc:
        routed = _workloads(torch, "cuda")
        routed["graph-loop"] = _graph_loop(torch)
        for name, fn in routed.items():
            t_rc = _time(fn, iters)
            cats, funcs = _profile(fn, iters, rc, args.top)
            out[f"{name} (routed)"] = {"racecheck_us": t_rc, "categories": cats, "top": funcs}
        findings = len(rc.findings)
    for name, r in out.items():
        head = f"{name}: racecheck {r['racecheck_us']:.1f} µs/iter"
        if "plain_us" in r:
            head += f", plain {r['plain_us']:.1f}"
        print(head)
        for cat, sec, share in r["categories"]:
            print(f"    {share * 100:5.1f}%  {cat}")
        print("  top functions (own µs per iteration under cProfile):")
        for f, us in r["top"]:
            print(f"    {us:7.2f}  {f}")
    print(f"findings in the routed session: {findings}")
    merge = replay_merge(rounds=2 if args.quick else 7, replays=50 if args.quick else 300)
    print("checker µs per replay, synthetic graphs (per op -> merged):")
    for (nops, nbuf), (per_op, merged) in merge.items():
        print(f"    {nops} ops over {nbuf} buffers ({2 * nops} accesses): {per_op:.1f} -> {merged:.1f}")
    out["replay merge"] = {f"{n} ops over {b} buffers": {"per_op_us": p, "merged_us": m}
                           for (n, b), (p, m) in merge.items()}
    if args.json:
        with open(args.json, "w") as fp:
            json.dump(out, fp, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
