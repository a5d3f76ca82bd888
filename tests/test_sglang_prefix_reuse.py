"""sglang without the WAR barrier (its default on ROCm and Ascend): a finished request's last
forward still reads its `req_to_token` row for KV write locations while the schedule stream
hands the row to a new request with a longer cached prefix.

Run through the real sglang code (docs/FINDINGS.md): the request lifecycle, the detection, and
the consequence under a schedule-first order, seen by the KV oracles and by later requests'
tokens. Needs sglang 0.5.23 and triton.
"""
import importlib.util
import subprocess
import sys

import pytest

from racecheck import scenarios
from racecheck.instrumentation.adversarial import AdversarialExecutor

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang 0.5.23 (pip install --no-deps sglang==0.5.23) and racecheck[sglang,triton]")

SC = "sglang-eagle-v2"
SCHEDULE_FIRST = {"priorities": {"schedule_stream": 2, "forward_stream": -1}, "host": 0}
RC002_ROW = ("RC002", "ReqToTokenPool.req_to_token")


def _run(variant, plan=None, **overrides):
    sc = scenarios.get(SC)
    cfg = sc.config(variant=variant, overrides=dict({"graphs": False}, **overrides))
    options = {"executor": AdversarialExecutor(plan)} if plan is not None else {}
    res = scenarios.run(sc, cfg, device="sim", session_options=options)
    assert not res.internal_errors, res.internal_errors
    if plan is not None:
        assert options["executor"].faults == []
    return res


def test_the_finished_requests_row_goes_to_a_request_with_a_longer_cached_prefix():
    from racecheck.scenarios.sglang import PREFIX_REUSE
    res = _run(None, **PREFIX_REUSE)                     # the workload, barrier in place
    adm, out = res.outputs["admissions"], res.outputs["output_ids"]
    short_len = 3 + len(out["r1"])                       # r1 ends on the stop token
    assert out["r1"][-1] == 37 and len(out["r1"]) < 8
    assert adm["r2"][1] == adm["r1"][1]                  # LIFO: r2 takes r1's freed row ...
    assert adm["r2"][2] > short_len                      # ... with a longer radix-cache prefix
    assert adm["r3"][2] == adm["r2"][2]                  # a later request shares it
    barrier = "sglang.srt.managers.scheduler:Scheduler._apply_war_barrier:wait_stream#0"
    assert barrier in {s.id for s in res.sync_sites}
    assert res.findings == [] and res.diff_ok


@pytest.mark.parametrize("variant", ["rocm-prefix-reuse", "no-war_barrier"])
def test_the_detector_names_the_row_both_streams_touch(variant):
    res = _run(variant)
    rows = [f for f in res.findings if (f.rule, f.tensor) == RC002_ROW]
    assert rows, [f.message() for f in res.findings]
    # the schedule stream's write_cache_indices (admitting r2 into r1's row) against a read
    # of the row by the forward that is still running r1 (its own stream or its plan stream)
    admit = [f for f in rows if f.current.stream == "schedule_stream"
             and any("write_cache_indices" in frame for frame in f.current.stack)]
    assert admit, [f.message() for f in rows]
    assert all(f.previous.kind == "read" and f.previous.stream in (
        "forward_stream", "plan_stream(target)", "plan_stream(draft)") for f in admit)
    # among them, verify prep reading the row for the KV write locations of r1's last step
    kv_locs = [f for f in admit if f.previous.function == "assign_extend_cache_locs_uniform_func"]
    assert kv_locs and any("eagle_prepare_for_verify" in frame
                           for frame in kv_locs[0].previous.stack)
    assert res.diff_ok                                   # issue order: no wrong values


def test_schedule_first_order_overwrites_the_shared_prefix_kv_on_rocm():
    res = _run("rocm-prefix-reuse", SCHEDULE_FIRST)
    adm = res.outputs["admissions"]
    hit = res.outputs["prefix_overwrites"]["r2"]
    assert hit and all(slot >= 0 for slot in hit)
    assert res.outputs["radix_kv"]["mismatched_slots"] == hit   # the tree's KV is corrupted
    # r3 joins twelve steps later, shares the prefix, and reads the corrupted KV
    assert adm["r3"][0] > adm["r2"][0] + 10
    assert res.outputs["output_ids"]["r3"] != res.reference_outputs["output_ids"]["r3"]
    assert RC002_ROW in res.signature()


@pytest.mark.parametrize("overrides", [{"flavour": "cuda"}, {"war_barrier": "on"}],
                         ids=["cuda", "rocm-with-SGLANG_ENABLE_WAR_BARRIER"])
def test_the_war_barrier_keeps_the_prefix_intact_in_the_same_order(overrides):
    res = _run("rocm-prefix-reuse", SCHEDULE_FIRST, **overrides)
    assert res.findings == [], [f.message() for f in res.findings]
    assert res.outputs["prefix_overwrites"] == {}
    assert res.outputs["radix_kv"]["mismatched_slots"] == []


def test_one_command_reproduction():
    cmd = [sys.executable, "-m", "racecheck", "run", SC, "--variant", "rocm-prefix-reuse",
           "--set", "graphs=off", "--plan", '{"priorities": {"schedule_stream": 2, '
           '"forward_stream": -1}}']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "prefix_overwrites of request r2" in p.stdout
    assert "RC002" in p.stdout and "ReqToTokenPool.req_to_token" in p.stdout


@pytest.mark.parametrize("sets, text", [
    (["flavour=npu", "topk=2"], "npu flavour is modelled with topk 1"),
    (["topk=2", "draft_tokens=3"], "need draft_tokens >= steps + 1"),   # an engine crash
])
def test_unsupported_combinations_are_one_line_usage_errors(sets, text):
    cmd = [sys.executable, "-m", "racecheck", "run", SC]
    for item in sets:
        cmd += ["--set", item]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and text in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
