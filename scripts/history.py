"""What racecheck reports on each sglang release as shipped, and on the release before each
upstream fix: writes docs/HISTORY.md.

    python scripts/history.py --release 0.5.23=.venv --release 0.5.20=DIR ... [--out FILE]
                              [--configs cuda-eager,cuda-graphs,hip,npu] [--seeds] [--jobs N]

docs/HISTORY.md is `--configs cuda-eager,cuda-graphs,hip,npu,overlap,npu-mrope,cuda-graphs-mrope`.

The supported range, one release per minor: 0.5.8.post1, 0.5.9, 0.5.10.post1, 0.5.11, 0.5.12.post1, 0.5.13.post1,
0.5.14, 0.5.15.post1, 0.5.16 ... 0.5.23. Each `--release VERSION=VENV` names an environment set up by
`SGLANG=VERSION VENV=DIR bash scripts/setup.sh`; every run is `racecheck run` in that
environment, so a release's own imports, constructors and event loop are what is checked.
`--seeds` also runs each seed variant (a dropped upstream synchronization) where the release
has its site. Results are cached per (release, run) in .history/ (not committed), so a rerun
after adding a release only runs what is new (`--fresh` ignores the cache). The hierarchical
cache's table: `--configs hicache,hicache-hip --out docs/HISTORY_HICACHE.md`.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (scenario, --set values): as shipped, per platform flavour and graph mode
CONFIGS = {
    "cuda-eager": ("sglang-eagle-v2", ["graphs=off"]),
    "cuda-graphs": ("sglang-eagle-v2", ["graphs=on"]),
    "hip": ("sglang-eagle-v2", ["flavour=hip", "graphs=off"]),
    "npu": ("sglang-eagle-v2", ["flavour=npu", "graphs=off"]),
    # an mrope target (Qwen2.5-VL): the NPU recompute after the plan-stream join (#23423), and
    # on CUDA the spec mrope positions the plan stream computes and the decode graph's slot
    "npu-mrope": ("sglang-eagle-v2", ["flavour=npu", "graphs=off", "mrope=on"]),
    "cuda-graphs-mrope": ("sglang-eagle-v2", ["graphs=on", "mrope=on"]),
    "overlap": ("sglang-overlap", ["graphs=off"]),
    "hicache": ("sglang-hicache", []),
    "hicache-hip": ("sglang-hicache", ["flavour=hip"]),
}
SEEDS = ("no-verify_plan_wait", "no-draft_extend_plan_wait", "no-verify_join",
         "no-futuremap_publish_wait", "no-war_barrier")

# The upstream fixes (docs/EAGLE_PIPELINE.md, the WAR barrier) and the first release that has each,
# from the releases' sources (docs/SGLANG_RELEASES.md).
FIXES = [
    ("#21940 draft -> verify prep ordered (event; later a plan-stream wait)", "0.5.11"),
    ("#23613 piecewise-graph mm_input copy", "0.5.11"),
    ("#23423 NPU mrope positions recomputed after the plan-stream join", "0.5.12",
     ("npu-mrope", "cuda-graphs-mrope")),
    ("#26292 req_pool_indices zeroed in graph padding (PaddingPolicy.ZERO)", "0.5.13"),
    ("#25879/#26380 seq_lens through FutureMap.publish / publish_ready", "0.5.13"),
    ("WAR barrier: the schedule stream waits for the forward before the next schedule "
     "(`Scheduler._apply_war_barrier`)", "0.5.14"),
    ("verify prep on the plan stream waits for the forward stream (`run_eagle_verify`: "
     "#21940's ordering back after its revert)", "0.5.20"),
    ("draft-extend prep on the plan stream waits for the forward stream "
     "(`_draft_extend_for_decode`, the #40025 report)", "0.5.22"),
    ("#31687 WAR barrier moved from the loop's top to right after each `run_batch`: the "
     "previous batch's result processing (`req_to_token` rewrites) waits for the forward "
     "just launched", "0.5.16", ("cuda-eager", "overlap")),
]
FIX_CONFIGS = ("cuda-eager", "cuda-graphs")      # a fix's cells unless it names its own

# HiCache's device<->host transfer orderings (sglang-hicache), the first release with each (from
# the releases' sources and runs) and the runs whose release-before cell the table shows.
HICACHE_FIXES = [
    ("a finished request's backup ordered after the forward still writing its last KV rows (on "
     "cuda: the WAR barrier right after each `run_batch`, #31687, makes the schedule stream, "
     "where the backup's start event is recorded, wait for the forward just launched; the race "
     "upstream #20611 describes; dropping that barrier on 0.5.16 brings the race back)", "0.5.16",
     ("hicache",)),
    ("the same backups on the hip flavour, which has no WAR barrier (from 0.5.22 the overlap "
     "loop no longer decodes a request its result in flight finishes by length, "
     "`_reqs_finishing_inflight`: no round writes the rows being backed up; a scheduling "
     "change, not a wait, FINDINGS.md)", "0.5.22", ("hicache-hip",)),
    ("load-back copies wait for the forward stream (`HiCacheController.start_loading`: the "
     "host-to-device stream waits for `load_fence_stream`, which the scheduler sets to its "
     "forward stream; the fence upstream #36738 describes)", "0.5.19", ("hicache",)),
    ("backups wait for the forward stream (`HiCacheController.start_writing`: the "
     "device-to-host stream waits for `write_fence_stream`, the forward stream: #20611's fix)",
     "0.5.23", ("hicache", "hicache-hip")),
]


SHOWN = 4              # findings named per cell; the rest are counted


def version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in v.replace(".post", ".").split("."))


def run_one(venv: str, scenario: str, sets: list, variant: str | None, report: str) -> dict:
    """`racecheck run` in the release's environment; its exit status, time and error line."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        return {"exit": 2, "seconds": 0.0, "error": f"no environment at {venv} (set it up with "
                                                     "SGLANG=VERSION VENV=DIR bash scripts/setup.sh)"}
    cmd = [py, "-m", "racecheck", "run", scenario, "--all", "--report", f"json={report}"]
    for s in sets:
        cmd += ["--set", s]
    if variant:
        cmd += ["--variant", variant]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
    ok = p.returncode in (0, 1) and os.path.exists(report)
    return {"exit": p.returncode, "seconds": round(time.perf_counter() - t0, 1),
            "error": "" if ok else (lines[-1] if lines else f"exit {p.returncode}")}


def summarize(run: dict, scenario: str, report: str) -> dict:
    """The run's findings by (rule, tensor), less those of the scenario's triaged races."""
    out = dict(run, findings=[], known=0, races=0)
    if run["error"]:
        return out
    from racecheck import scenarios
    from racecheck.core.findings import group_findings
    from racecheck.reports.json_report import load_document
    from racecheck.scenarios.registry import split_known
    found, _meta = load_document(report)
    new, known = split_known(scenarios.get(scenario), found)
    out.update(findings=sorted({(f.rule, f.tensor) for f in new}), known=len(known),
               races=len(group_findings(new)))
    return out


def jobs(releases: dict, configs: list, seeds: bool) -> list:
    out = []
    for version, venv in releases.items():
        for name in configs:
            scenario, sets = CONFIGS[name]
            out.append((version, venv, name, scenario, sets, None))
        if seeds:
            for variant in SEEDS:
                scenario = "sglang-overlap" if variant == "no-war_barrier" else "sglang-eagle-v2"
                out.append((version, venv, f"seed {variant}", scenario, [], variant))
    return out


def describe(result: dict) -> str:
    if result["error"]:
        return f"did not run: {result['error'][:160]}"
    known = f" (+{result['known']} triaged)" if result.get("known") else ""
    if not result["findings"]:
        return "clean" + known
    shown = [f"{rule} `{tensor}`" for rule, tensor in result["findings"]]
    more = f", {len(shown) - SHOWN} more" if len(shown) > SHOWN else ""
    races = result.get("races")
    head = f"{races} race{'s' if races != 1 else ''}: " if races else ""
    return head + ", ".join(shown[:SHOWN]) + more + known


def render(results: dict, releases: list, configs: list, seeds: bool) -> str:
    eagle = any(not c.startswith("hicache") for c in configs)
    title = "# What racecheck reports on each sglang release" + \
        ("" if eagle else ": the hierarchical cache")
    lines = [title, "",
             "Generated by `python scripts/history.py` (see its header for the command); every "
             "row is sglang *as shipped* run through its front door on `sim` (docs/SGLANG.md). "
             "A cell counts the races (root-cause groups: one missing synchronization each, "
             "docs/RULES.md) and lists the findings by rule and tensor; `(+N triaged)` counts the findings "
             "of the races docs/FINDINGS.md triages (the start-up writes on the default stream, "
             "the draft-extend graph's padded rows), matched by the scenario's known-races file."
             + (" On sglang 0.5.13 to 0.5.21 the draft-extend plan stream runs without a wait, and on "
             "0.5.13 to 0.5.19 the verify plan stream too (seen with graphs on); on 0.5.8 to "
             "0.5.10, the releases before #21940, verify's graph prep reads the draft's outputs "
             "without a wait; before 0.5.14 CUDA has no WAR barrier, and on 0.5.14 and 0.5.15 "
             "the barrier at the loop's top leaves the previous batch's result processing "
             "unordered with the forward just launched (the plain overlap scheduler's RC002; "
             "#31687 moved it in 0.5.16); on 0.5.8 to 0.5.12 a batch's `seq_lens` is freed "
             "while the plan streams may still read it (RC005; 0.5.13 pins every batch field "
             "for two iterations), and before 0.5.13 the graph runners' padded rows (RC006) "
             "read the last replay's token ids, positions and draft scores, which is benign; on "
             "the npu flavour of 0.5.15.post1 to 0.5.22 the results' host copies run without "
             "`record_stream` (RC005 on `eagle_sample: predict`, 0.5.23 fixed `async_d2h`). "
             "The `-mrope` columns run an mrope target (a Qwen2.5-VL): where verify's plan "
             "stream has no wait (0.5.8 to 0.5.10, 0.5.13 to 0.5.19) it also computes the "
             "verify's multimodal positions from the draft's positions early (RC001 "
             "`ForwardBatch.positions` on npu; on CUDA inside the same missing wait's group), "
             "which npu's recompute after the join (#23423, 0.5.12) discards and CUDA did not "
             "before 0.5.20; the padded-row RC006 of 0.5.8 to 0.5.12 is on `mrope_positions`, "
             "which the model reads instead of `positions`. FINDINGS.md has the evidence."
             if eagle else
                " FINDINGS.md (\"HiCache\") has the evidence.")
             + ("" if "hicache" in configs else
                " The hierarchical cache (`sglang-hicache`) has its own table, "
                "[HISTORY_HICACHE.md](HISTORY_HICACHE.md) (`--configs hicache,hicache-hip`)."),
             "",
             "## As shipped", "",
             *(["`hicache` is `sglang-hicache` (the hierarchical KV cache, docs/SGLANG.md): "
                "the release's own HiCache controller, host pool and transfer streams on a "
                "schedule that backs prefixes up to host and loads them back; `hicache-hip` "
                "the same on the hip flavour. Before 0.5.16 the host pool is "
                "mem_cache/memory_pool_host.py's. The RC001 on the KV buffers "
                "(`MHATokenToKVPool.k_buffer[i]`, `.v_buffer[i]`, one per layer) is a finished "
                "request's backup reading the KV rows the forward already in flight still "
                "writes.", ""]
               if "hicache" in configs else []),
             "| release | " + " | ".join(configs) + " |",
             "| --- | " + " | ".join("---" for _ in configs) + " |"]
    for version in releases:
        cells = [describe(results[(version, c)]) for c in configs]
        lines.append(f"| {version} | " + " | ".join(cells) + " |")
    if seeds:
        lines += ["", "## Seeds (one upstream synchronization dropped)", "",
                  "| release | " + " | ".join(SEEDS) + " |",
                  "| --- | " + " | ".join("---" for _ in SEEDS) + " |"]
        for version in releases:
            cells = [describe(results[(version, f"seed {s}")]) for s in SEEDS]
            lines.append(f"| {version} | " + " | ".join(cells) + " |")
    if not {"cuda-eager", "cuda-graphs"} & set(configs):
        return "\n".join(lines + _hicache_fixes(results, releases, configs) + [""])
    lines += ["", "## Upstream fixes: the release before", "",
              "| fix | first release with it | release before | what racecheck reports there "
              "(cuda, eager / graphs, unless the cell names its run) |", "| --- | --- | --- | --- |"]
    from racecheck.scenarios.sglang.surface import OLDEST
    for fix, first, *own in FIXES:
        shown = own[0] if own else FIX_CONFIGS
        before = [v for v in releases if version_key(v) < version_key(first)
                  and version_key(v) >= version_key(OLDEST)]
        prev = before[-1] if before else None
        if prev is None:
            lines.append(f"| {fix} | {first} | before {OLDEST}, the oldest release the front "
                         "door runs | every release run has the fix |")
            continue
        seen = " / ".join((f"{c}: " if own else "") + describe(results[(prev, c)])
                          for c in shown if (prev, c) in results)
        lines.append(f"| {fix} | {first} | {prev} | {seen} |")
    lines += _hicache_fixes(results, releases, configs)
    lines.append("")
    return "\n".join(lines)


def _hicache_fixes(results: dict, releases: list, configs: list) -> list:
    """The HiCache orderings' table: what `sglang-hicache` reports on the release before each."""
    if "hicache" not in configs:
        return []
    lines = ["", "## HiCache orderings: the release before", "",
             "| ordering | first release with it | release before | what racecheck reports "
             "there (`sglang-hicache` as shipped) |", "| --- | --- | --- | --- |"]
    for fix, first, shown in HICACHE_FIXES:
        before = [v for v in releases if version_key(v) < version_key(first)]
        prev = before[-1] if before else None
        runs = [c for c in shown if (prev, c) in results]
        cell = " / ".join((f"{c}: " if len(runs) > 1 else "") + describe(results[(prev, c)])
                          for c in runs) if prev and runs else "no release before it was run"
        lines.append(f"| {fix} | {first} | {prev or '-'} | {cell} |")
    lines += ["", "A clean release before a fence: from 0.5.16 on the cuda flavour, and from 0.5.22 "
              "on hip, something else already orders those copies on these schedules (on cuda the "
              "WAR barrier after every forward, `Scheduler._apply_war_barrier`, orders the "
              "schedule stream, where every transfer's start event is recorded, after the "
              "forwards in flight); dropping either fence on 0.5.23 is silent too "
              "(docs/MUTATE_SGLANG.md says which case stays open). The backups before those "
              "orderings are real races: FINDINGS.md has the evidence and the consequence."]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", action="append", default=[], metavar="VERSION=VENV",
                    required=True)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--seeds", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "HISTORY.md"))
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args(argv)
    releases = {}
    for item in args.release:
        version, sep, venv = item.partition("=")
        if not sep or not version or not venv:
            print(f"--release {item!r}: expected VERSION=VENV", file=sys.stderr)
            return 2
        releases[version] = os.path.abspath(venv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        print(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})",
              file=sys.stderr)
        return 2
    cache_dir = os.path.join(ROOT, ".history")
    os.makedirs(cache_dir, exist_ok=True)
    results = {}

    def task(job):
        version, venv, name, scenario, sets, variant = job
        key = os.path.join(cache_dir, f"{version}__{name.replace(' ', '_')}")
        report, run_file = key + ".report.json", key + ".run.json"
        if os.path.exists(run_file) and not args.fresh:
            with open(run_file) as fh:
                run = json.load(fh)
        else:
            run = run_one(venv, scenario, sets, variant, report)
            if not run["error"].startswith("no environment"):
                with open(run_file, "w") as fh:
                    json.dump(run, fh)
        res = summarize(run, scenario, report)
        print(f"{version:>12} {name:<32} {describe(res)[:100]} ({res['seconds']}s)", flush=True)
        return (version, name), res

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for key, res in pool.map(task, jobs(releases, configs, args.seeds)):
            results[key] = res
    ordered = sorted(releases, key=version_key)
    with open(args.out, "w") as fh:
        fh.write(render(results, ordered, configs, args.seeds))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
