"""Throughput and memory benchmark of the happens-before checker.

    python bench/bench_checker.py               # 1e4, 1e5, 1e6 accesses
    python bench/bench_checker.py --quick       # 1e4, 1e5 only
    python bench/bench_checker.py --sizes 20000 --streams 8
    python bench/bench_checker.py --trace run.jsonl   # time checking a saved trace
    python bench/bench_checker.py --scenario sglang-eagle-v2 --set graphs=off   # one sim run's trace

Synthetic traces: single-range accesses (whole tensors and halves) by kernels on 2-8 streams,
private and shared tensors, an event record after every few kernels and cross-stream waits
before shared tensors are consumed, a few deliberately unsynchronized shared accesses (so the
race path and its dedup are exercised), occasional host syncs and host reads of pinned buffers.

Throughput is measured without tracemalloc, on a pre-built event list (trace construction is not
timed), for the Python Checker and, side by side, for the checker `racecheck check` and sessions
use (`new_checker()`: the C engine where built, which hands over to the Python checker at the
first event that could make a finding; the "engine until" column says where). Peak memory is
measured in a second run with tracemalloc on, feeding events from a
generator so that only the checker's own state counts; the top allocation sites show whether
anything grows with run length.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))

from racecheck.core.checker import Checker  # noqa: E402
from racecheck.core.fastchecker import new_checker  # noqa: E402
from racecheck.core.trace import (Copy, EventRecord, Footprint, HostAccess, HostSync, Kernel,  # noqa: E402
                             NameTensor, NameTimeline, StreamWaitEvent, StreamWaitStream,
                             Trace)

HOST = 0
TENSOR_BYTES = 4096


def _sites(n):
    return [(("/engine/model_runner.py", 100 + i, f"fn{i % 17}"),
             ("/engine/scheduler.py", 40 + i % 7, "run_batch")) for i in range(n)]


def synthetic(n_accesses: int, n_streams: int = 4, seed: int = 0, private: int = 48,
              shared: int = 16, record_every: int = 8):
    """Yield events until about n_accesses accesses (footprint ranges) have been issued."""
    rng = random.Random(seed)
    streams = list(range(1, n_streams + 1))
    sites = _sites(64)
    racy_sites = [(("/engine/buggy.py", 7, "overwrite"),), (("/engine/buggy.py", 9, "overwrite"),),
                  (("/engine/buggy.py", 11, "peek"),)]
    sid = 100
    priv = {}
    fps = {}
    yield NameTimeline(HOST, HOST, "main", True)
    for s in streams:
        yield NameTimeline(HOST, s, "default" if s == 1 else f"side_{s}")
        priv[s] = []
        for _ in range(private):
            priv[s].append(sid)
            sid += 1
    shared_ids = list(range(sid, sid + shared))
    sid += shared
    pinned, racy = sid, sid + 1
    sid += 2
    for st in [x for s in streams for x in priv[s]] + shared_ids + [pinned, racy]:
        yield NameTensor(HOST, st, 0, TENSOR_BYTES, f"t{st}", 256, 4)
        half = TENSOR_BYTES // 2
        fps[st] = (Footprint(st, ((0, TENSOR_BYTES),), host=st == pinned),
                   Footprint(st, ((0, half),), host=st == pinned),
                   Footprint(st, ((half, TENSOR_BYTES),), host=st == pinned))
    yield HostSync(HOST, "device", None)

    def fp(st):
        r = rng.random()
        return fps[st][0] if r < 0.8 else fps[st][1 if r < 0.9 else 2]

    # events are reused objects, as engines keep them (a few per stream, cycling)
    pool = {s: [s * 1000 + i for i in range(4)] for s in streams}
    turn = {s: 0 for s in streams}
    last_event = {}          # stream -> latest event recorded on it
    written = {}             # shared tensor -> event recorded right after its last update
    owner = {st: streams[i % n_streams] for i, st in enumerate(shared_ids)}
    since_record = {s: 0 for s in streams}

    def record(s):
        e = pool[s][turn[s] % 4]
        turn[s] += 1
        last_event[s] = e
        since_record[s] = 0
        return EventRecord(HOST, e, s, site)

    done = 0
    k = 0
    while done < n_accesses:
        k += 1
        s = streams[k % n_streams] if rng.random() < 0.5 else rng.choice(streams)
        site = sites[rng.randrange(len(sites))]
        r = rng.random()
        if r < 0.15:
            # consume a shared tensor, after waiting on the event recorded after its update
            st = rng.choice(shared_ids)
            if st in written and owner[st] != s and rng.random() < 0.995:
                yield StreamWaitEvent(HOST, s, written[st], site)
            reads = (fp(st), fp(rng.choice(priv[s])))
            writes = (fp(rng.choice(priv[s])),)
        elif r < 0.20:
            # the owner updates its shared tensor once every consumer is done with it
            mine = [st for st in shared_ids if owner[st] == s]
            st = rng.choice(mine) if mine else rng.choice(shared_ids)
            for o in streams:
                if o != s and rng.random() < 0.999:
                    yield StreamWaitStream(HOST, s, o, site)
            reads = (fp(rng.choice(priv[s])),)
            writes = (fp(st),)
            yield Kernel(HOST, s, reads, writes, "publish", site)
            done += 2
            ev = record(s)
            written[st] = ev.event
            yield ev
            continue
        elif r < 0.21:
            # a D2H copy to pinned memory; the host syncs on it and reads the result
            yield Copy(HOST, s, fps[rng.choice(priv[s])][0], fps[pinned][0], True, "copy_", site)
            ev = record(s)
            yield ev
            yield HostSync(HOST, "event", ev.event, site)
            yield HostAccess(HOST, (fps[pinned][0],), (), "item", site)
            done += 3
            continue
        elif r < 0.212:
            # deliberate bugs: unsynchronized reads and writes of one buffer from every stream
            site = racy_sites[k % 3]
            if k % 3 == 2:
                reads, writes = (fp(racy),), (fp(rng.choice(priv[s])),)
            else:
                reads, writes = (fp(rng.choice(priv[s])),), (fp(racy),)
        else:
            reads = (fp(rng.choice(priv[s])), fp(rng.choice(priv[s])))
            writes = (fp(rng.choice(priv[s])),)
        yield Kernel(HOST, s, reads, writes, "op", site)
        done += len(reads) + len(writes)
        since_record[s] += 1
        if since_record[s] >= record_every:
            yield record(s)
        if rng.random() < 0.001:
            yield HostSync(HOST, "device", None, site)


def count_accesses(events) -> int:
    n = 0
    for ev in events:
        if isinstance(ev, (Kernel, HostAccess)):
            n += sum(len(fp.ranges) for fp in ev.reads) + sum(len(fp.ranges) for fp in ev.writes)
        elif isinstance(ev, Copy):
            n += len(ev.src.ranges) + len(ev.dst.ranges)
    return n


def _mb(n) -> str:
    return f"{n / 2**20:.1f} MiB"


def time_check(events, repeat=1, make=Checker, read_findings=False):
    """Best (wall seconds, cpu seconds, checker) over `repeat` runs; with `read_findings` the
    timing includes reading the findings, as a session's end does."""
    best = best_cpu = None
    checker = None
    for _ in range(repeat):
        gc.collect()
        checker = make()
        t0, c0 = time.perf_counter(), time.process_time()
        checker.process_all(events)
        if read_findings:
            checker.findings
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        best = dt if best is None else min(best, dt)
        best_cpu = dc if best_cpu is None else min(best_cpu, dc)
    return best, best_cpu, checker


def memory_check(gen, top=3):
    gc.collect()
    tracemalloc.start(1)
    checker = Checker()
    checker.process_all(gen)
    current, peak = tracemalloc.get_traced_memory()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    stats = [s for s in snap.statistics("lineno")
             if s.traceback[0].filename.startswith(os.path.join(root, "racecheck"))]
    sites = [(f"{os.path.relpath(s.traceback[0].filename, root)}:{s.traceback[0].lineno}",
              s.size, s.count) for s in stats[:top]]
    return current, peak, sites, checker


def bench_sizes(sizes, streams, seed, repeat):
    print(f"racecheck checker benchmark: python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus, streams={streams}")
    print("accesses/s: wall clock; cpu/s: the same over process CPU time (steadier on a busy "
          "machine)")
    print(f"{'accesses':>10} {'events':>9} {'seconds':>8} {'accesses/s':>11} {'cpu/s':>9} "
          f"{'new_checker/s':>13} {'engine until':>12} "
          f"{'findings':>8} {'segments':>8} {'peak mem':>10}  top allocation sites (size, count)")
    for n in sizes:
        events = list(synthetic(n, streams, seed))
        acc = count_accesses(events)
        runs = repeat or (3 if n <= 200_000 else 1)
        dt, dc, checker = time_check(events, runs)
        st = checker.stats()
        ndt, _ndc, fast = time_check(events, runs, new_checker)
        until = getattr(fast, "handed_over_at", None)
        until = "end" if until is None and not isinstance(fast, Checker) else \
            ("-" if until is None else f"event {until}")
        del events
        gc.collect()
        _cur, peak, sites, _c = memory_check(synthetic(n, streams, seed))
        site_text = "; ".join(f"{s} {_mb(sz)}/{cnt}" for s, sz, cnt in sites)
        print(f"{acc:>10} {st['events']:>9} {dt:>8.2f} {acc / dt:>11,.0f} "
              f"{acc / dc if dc else float('inf'):>9,.0f} {acc / ndt:>13,.0f} {until:>12} "
              f"{st['findings']:>8} "
              f"{st['segments']:>8} {_mb(peak):>10}  {site_text}", flush=True)


def bench_trace(path, repeat):
    from racecheck.core.trace import TraceFormatError
    t0 = time.perf_counter()
    try:
        events = list(Trace.iter_file(path))
    except (OSError, TraceFormatError) as exc:
        print(f"bench_checker: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: loaded in {time.perf_counter() - t0:.2f} s")
    bench_events(path, events, repeat)
    return 0


def scenario_events(name, sets) -> list:
    """The trace of one run of a scenario on sim (recorded in this process)."""
    import racecheck
    from racecheck import scenarios
    from racecheck.scenarios.registry import RunContext, parse_sets
    sc = scenarios.get(name)
    cfg = sc.config(overrides=parse_sets(sets))
    options = sc.session_options(cfg, "sim")
    with racecheck.session(device="sim", record_trace=True, **options) as rc:
        sc.run_once(cfg, RunContext(rc.device_module, "cpu", rc, pin=True, seed=0))
    return list(rc.trace.events)


def bench_events(label, events, repeat) -> None:
    """The Python Checker and new_checker() side by side on one trace, findings read at the end
    (as a session does: open RC005 hazards are judged then)."""
    acc = count_accesses(events)
    print(f"{label}: {len(events)} events, {acc} accesses; best of {repeat}")
    base = None
    for name, make in (("Checker (Python)", Checker), ("new_checker()", new_checker)):
        best, _cpu, checker = time_check(events, repeat, make, read_findings=True)
        findings = checker.findings
        base = base or best
        until = getattr(checker, "handed_over_at", None)
        where = "" if isinstance(checker, Checker) else \
            ("; the engine ran to the end" if until is None else
             f"; the engine handed over at event {until} "
             f"({checker.handed_over_on})")
        if getattr(checker, "resumed", 0):
            where += f"; {checker.resumed} races judged by the Python checker alone"
        print(f"  {name:18s} {best * 1e3:9.2f} ms  {len(events) / best:>12,.0f} events/s  "
              f"x{base / best:.2f}  {len(findings)} findings{where}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only 1e4 and 1e5 accesses")
    ap.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")],
                    help="comma-separated access counts (default 1e4,1e5,1e6)")
    ap.add_argument("--streams", type=int, default=4, help="streams (2-8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=0,
                    help="timing runs per size, best shown (default 3 up to 2e5 accesses, else 1)")
    ap.add_argument("--trace", help="time checking a saved .jsonl trace instead")
    ap.add_argument("--scenario", help="time checking one sim run of this scenario instead")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                    help="with --scenario: a knob (repeatable), e.g. graphs=off")
    args = ap.parse_args(argv)
    if args.trace:
        return bench_trace(args.trace, args.repeat or 1)
    if args.scenario:
        bench_events(f"{args.scenario} {' '.join(args.set)}".strip(),
                     scenario_events(args.scenario, args.set), args.repeat or 5)
        return 0
    sizes = args.sizes or ([10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000])
    bench_sizes(sizes, args.streams, args.seed, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
