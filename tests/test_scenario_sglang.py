"""The sglang scenarios: the installed sglang, started through its own front door, under racecheck.

As shipped they report nothing but the triaged upstream races (docs/FINDINGS.md), graphs on
and off; every seed, defined as a dropped synchronization site of the real code, is flagged with
its rule and the engine's name for the tensor. Needs sglang (scripts/setup.sh) and triton.
"""
import fnmatch
import importlib.util
import os
import subprocess
import sys

import pytest

from racecheck import scenarios

from helpers import frames, run_alone, what_ran

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang and racecheck[sglang,triton] (scripts/setup.sh); CI installs them")

SC = "sglang-eagle-v2"


def _run(variant=None, scenario=SC, **overrides):
    res = run_alone(scenario, variant, **overrides)
    assert not res.internal_errors, res.internal_errors
    return res


@pytest.fixture(scope="module")
def eager():
    return _run(graphs=False)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_as_shipped_reports_only_triaged_upstream_races(graphs, eager):
    res = eager if not graphs else _run(graphs=True)
    assert res.findings == [], "\n".join(f.message() for f in res.findings)
    assert res.diff_ok, res.diff_detail
    outputs = res.outputs["output_ids"]
    assert outputs and all(len(v) > 0 for v in outputs.values())
    # the KV oracle reads the target's pool: a slot for every token the forwards computed
    assert len(res.outputs["kv_cache"]) >= sum(len(v) - 1 for v in outputs.values())
    # the triaged races (FINDINGS.md) are reported apart, not hidden: the start-up writes on
    # the default stream and, with graphs, the draft-extend graph's padded rows
    assert res.known
    startup = [f for f in res.known if f.rule in ("RC001", "RC003")]
    assert startup and all(f.previous.stream == "default" for f in startup)
    assert all(f.rule == "RC006" and any("eagle_draft_extend_cuda_graph_runner.py:" in fr
                                         for fr in frames(f))
               for f in res.known if f not in startup)


def test_the_loop_run_is_sglangs_own(eager):
    ids = [s.id for s in eager.sync_sites]
    assert "sglang.srt.managers.scheduler:Scheduler._apply_war_barrier:wait_stream#0" in ids
    assert "sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#0" in ids
    assert not any(":padding(" in i for i in ids)          # eager: no graph padding


@pytest.mark.parametrize("variant", sorted(scenarios.get(SC).variants))
def test_every_seed_is_flagged_with_the_engines_name(variant):
    v = scenarios.get(SC).variant(variant)
    res = _run(variant)
    got = res.signature()
    missing = [(rule, pattern) for rule, pattern in v.expected
               if not any(r == rule and fnmatch.fnmatchcase(t, pattern) for r, t in got)]
    assert not missing, f"{variant}: missing {missing}; got {sorted(got)}{what_ran(res)}"
    assert not res.unmatched_drops
    # sim runs device work in issue order: the values, the KV pool's slot by slot too, are the
    # serialized run's (made in a process of its own), whatever the dropped wait
    kv = res.outputs.get("kv_cache")
    assert kv and kv == res.reference_outputs.get("kv_cache") and res.diff_ok, res.diff_detail


def test_the_plain_overlap_scheduler_is_clean_and_needs_its_war_barrier():
    shipped = _run(scenario="sglang-overlap", graphs=False)
    assert shipped.findings == [], "\n".join(f.message() for f in shipped.findings)
    dropped = _run("no-war_barrier", scenario="sglang-overlap", graphs=False)
    assert ("RC002", "ReqToTokenPool.req_to_token") in dropped.signature(), what_ran(dropped)


def test_an_upstream_rename_fails_with_one_line():
    """Touches resolve names lazily; a missing one is one line with the supported range. (A
    standard-library module stands in for sglang: importing sglang in this process, outside a
    racecheck session, would leave it unrouted for the runs forked from it.)"""
    from racecheck.scenarios.sglang import surface
    touch = surface.Touch("json:JSONDecoder.renamed_method", "a test")
    with pytest.raises(surface.EngineMismatch) as err:
        touch.get()
    text = str(err.value)
    assert "JSONDecoder.renamed_method" in text and surface.OLDEST in text and "\n" not in text
    assert not surface.Touch("json:nothing_here", "a test").exists()


def test_run_cli_drop_sync_flags_the_seed_and_rejects_a_site_that_never_ran():
    site = "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker._draft_extend_for_decode:wait_stream#0"
    proc = subprocess.run([sys.executable, "-m", "racecheck", "run", SC, "--set", "graphs=off",
                           "--drop-sync", site], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ".seq_lens" in proc.stdout
    typo = site.replace("wait_stream#0", "wait_stream#7")
    proc = subprocess.run([sys.executable, "-m", "racecheck", "run", SC, "--set", "graphs=off",
                           "--drop-sync", typo], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert site in proc.stderr and "\n" not in proc.stderr.strip()


def test_a_dropped_wait_groups_its_findings_and_names_every_temporary():
    """The draft-extend join dropped: one panel per missing edge (rule family, the two
    timelines), and temporaries carry the statement that made them, not "unnamed tensor"."""
    from racecheck.core.findings import group_findings, rule_family
    site = "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker._draft_extend_for_decode:wait_stream#1"
    res = _run(graphs=False, drop_sync=site)
    assert res.race_findings, "dropping the join exposes races"
    groups = group_findings(res.race_findings)
    edges = {(rule_family(f.rule), *f.missing_edge) for f in res.race_findings}
    assert len(groups) == len(edges) < len(res.race_findings)
    assert ("RC001", "plan_stream(draft)", "forward_stream") in edges
    assert not [f.tensor for f in res.race_findings if "unnamed" in f.tensor]


_PROBE_CASE = '''
class Worker:
    def prepare_for_draft_extend(self):
        from sglang.srt.utils.common import is_npu
        return is_npu()

    def plan(self):
        return "no probe here"
'''


def _call_time_probes_on_npu():
    import sys
    import types

    from racecheck.scenarios.sglang import imports, platform, surface
    imports.install()
    from sglang.srt.utils import common
    case = types.ModuleType("racecheck_probe_case")
    exec(_PROBE_CASE, case.__dict__)
    sys.modules[case.__name__] = case
    surface.NPU_CALL_TIME_PROBES = (
        surface.Touch("racecheck_probe_case:Worker.prepare_for_draft_extend", "a test"),
        surface.Touch("racecheck_probe_case:Worker.plan", "a test"),
        surface.Touch("racecheck_probe_case:Worker.gone", "a test", optional=True))
    original, plan = case.Worker.prepare_for_draft_extend, vars(case.Worker)["plan"]
    applied = []
    with platform._call_time_npu_probes(applied):
        during = (case.Worker().prepare_for_draft_extend(), common.is_npu(),
                  vars(case.Worker)["plan"] is plan)
    after = (case.Worker().prepare_for_draft_extend(),
             case.Worker.prepare_for_draft_extend is original)
    return during, after, applied


def test_the_npu_flavour_answers_a_probe_imported_at_call_time_only_inside_its_function():
    """0.5.14-0.5.15 ask `is_npu()` through an import inside `prepare_for_draft_extend` (the
    Ascend deferral of the draft extend's metadata, FINDINGS.md): True there while it runs,
    sglang's own answer everywhere else and afterwards. In a forked child: sglang imported here
    would be unrouted for the runs forked from this process."""
    from racecheck.scenarios import fresh
    during, after, applied = fresh.call(_call_time_probes_on_npu)
    assert during == (True, False, True)
    assert after == (False, True)
    assert applied == ["racecheck_probe_case:Worker.prepare_for_draft_extend: is_npu() while "
                       "it runs"]


def _mrope_engine_setup():
    from racecheck.scenarios.sglang import imports, platform, server
    from racecheck.scenarios.sglang.engine_run import _SIM_ENV, _environment, _import_quietly
    imports.install()
    with _environment(dict(_SIM_ENV)):
        _import_quietly()
        import sglang.srt.speculative.eagle_worker_v2 as v2
        flags = {}
        for graphs in (False, True):
            with platform.flavour("npu", graphs=graphs):
                flags[graphs] = v2._is_npu
        models = [os.path.basename(server.server_args(server.Shape(mrope=m)).model_path)
                  for m in (True, False)]
        return flags, v2._is_npu, *models


def test_mrope_picks_its_target_and_npu_sets_the_workers_own_flag_with_graphs_off_only():
    """The Ascend mrope recompute of 0.5.12-0.5.15 is gated on eagle_worker_v2's `_is_npu`, which
    also picks Ascend's graph runners: the npu flavour sets it for eager engines only."""
    from racecheck.scenarios import fresh
    flags, after, mrope_model, model = fresh.call(_mrope_engine_setup)
    assert flags == {False: True, True: False} and after is False
    assert (mrope_model, model) == ("target-mrope", "target")


def test_an_mrope_target_on_the_npu_flavour_reports_only_the_flavours_known_race():
    """The tiny Qwen2.5-VL target: sglang computes mrope positions for every batch, and the
    verify's spec mrope positions on the plan stream, then again after the join on npu. What
    the npu flavour reports is its documented missing WAR barrier, nothing on mrope."""
    from racecheck.core.suppressions import filter_findings
    res = _run(mrope=True, flavour="npu", graphs=False)
    kept = filter_findings(res.findings, os.path.join(ROOT, "ci", "known-failures", "npu.supp")).kept
    assert kept == [], "\n".join(f.message() for f in kept)
    assert res.diff_ok, res.diff_detail
