"""The sglang scenarios: the installed sglang, started through its own front door.

`sglang-eagle-v2` and `sglang-overlap` build sglang the way its server does (`ServerArgs`,
`PortArgs`, `run_scheduler_process`: the scheduler, TP worker, model runner, pools, radix cache,
Triton attention backend, EAGLE workers, graph runners and captures) and run sglang's own
`event_loop_overlap` on a request schedule. What racecheck adds is a tiny model config, the
request feeder, the platform flavour and, on a CPU, stand-ins for native kernel packages; every
place it touches sglang is listed in `surface.py` with the releases it holds for. A pull request
that drops a wait or reorders the loop is seen here, because the loop run is sglang's.

Seeds are variants defined as dropped synchronization sites (`racecheck mutate` finds the rest).
Needs sglang installed (`scripts/setup.sh`; `SGLANG=<version or checkout>` for another release).
"""
from __future__ import annotations

import importlib
import os

from ..registry import Knob, Scenario, Variant
from .requests import format_arrivals, parse_arrivals

SITE_VERIFY_PLAN_WAIT = \
    "sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#0"
SITE_VERIFY_JOIN = \
    "sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#1"
SITE_DRAFT_EXTEND_PLAN_WAIT = \
    "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker._draft_extend_for_decode:wait_stream#0"
SITE_PUBLISH_WAIT = "sglang.srt.managers.overlap_utils:FutureMap.resolve_seq_lens_cpu:wait#0"
SITE_WAR_BARRIER = "sglang.srt.managers.scheduler:Scheduler._apply_war_barrier:wait_stream#0"

# Requests join and finish so that batches cross and shrink inside the graph buckets (3 padded to
# 4, then 4, 5 past the largest bucket, then down to 1), in few loop iterations: every iteration
# runs sglang's Triton kernels in the CPU interpreter.
DEFAULT_ARRIVALS = "0:3x5;0:1x2;2:2x3;3:1x2"
# Requests with a 12-token shared prefix join while a short one finishes, so rows are handed on
# and the radix cache repoints running requests' rows at its slots while forwards still read them.
PREFIX_REUSE = {"topk": 1, "prefix_len": 12, "graphs": False,
                "arrivals": "0:1x6+14;3:1x8+3;8:1x4+14;12:1x4+14"}


def _arrivals(value):
    return format_arrivals(parse_arrivals(value))


_SCHEDULE_KNOBS = [
    Knob("graphs", True, "bool", "CUDA graphs: sglang's decode graph runner (and, with EAGLE, "
         "its draft and draft-extend runners), captured at start-up; padded batches"),
    Knob("flavour", "cuda", "choice", "platform branches sglang takes: cuda, hip (ROCm: "
         "publish_ready.synchronize(), no WAR barrier), npu (Ascend: mrope recompute, no WAR "
         "barrier)", choices=("cuda", "hip", "npu")),
    Knob("war_barrier", "auto", "choice", "Scheduler._apply_war_barrier (the schedule stream "
         "waits for the forward after every run_batch): auto is upstream's default (on for "
         "cuda, off for hip and npu); on sets sglang's switch SGLANG_ENABLE_WAR_BARRIER. "
         "Removing the barrier is the drop-sync variant no-war_barrier, not a setting",
         choices=("auto", "on")),
    Knob("forward_delay_us", 0, "int", "hold the forward stream this long before each "
         "run_batch (a sleep kernel on a GPU; a hold under sim's adversarial executor): the "
         "schedule stream's next step runs ahead", minimum=0, maximum=1_000_000),
    Knob("arrivals", DEFAULT_ARRIVALS, "str", "request schedule: step:COUNTxMAX_NEW_TOKENS[+PROMPT_LEN]"
         " items separated by ';' (requests join at that loop iteration; batches cross graph "
         "buckets); phases of traffic separated by '|' (the next starts when the last one's "
         "requests have all finished, on the same running engine)", validator=_arrivals),
    Knob("shared_prefix", True, "bool", "every prompt starts with the same tokens (radix-cache "
         "prefix hits for requests that join later)"),
    Knob("prefix_len", 3, "int", "length of the shared prompt prefix (a shorter prompt is all "
         "prefix)", minimum=1, maximum=16),
    Knob("stop_token", -1, "int", "a token that ends a request when it is generated (-1: none; "
         "requests then end by length)", minimum=-1),
    Knob("graph_bs", [1, 2, 4], "int-list", "decode graph batch-size buckets"),
    Knob("max_steps", 80, "int", "scheduler loop iterations at most, per traffic phase",
         minimum=1, maximum=1000),
    Knob("seed", 0, "int", "prompt tokens and the dummy weights", minimum=0),
    Knob("mrope", False, "bool", "a target model with multimodal rotary positions (a tiny "
         "Qwen2.5-VL, text-only requests): each ForwardBatch carries mrope_positions, and "
         "EAGLE's verify computes them from the draft's positions on the plan stream (#23423)"),
]
KNOBS = _SCHEDULE_KNOBS[:4] + [
    Knob("publish_delay_us", 0, "int", "hold the forward stream this long right after "
         "FutureMap.publish records publish_ready (sglang 0.5.13 on): the next schedule, which "
         "waits only for the publish, runs ahead of the draft extend", minimum=0,
         maximum=1_000_000),
    Knob("plan_stream", True, "bool", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM: verify and draft-extend "
         "metadata prepared on the workers' plan streams (an option sglang ships, off by "
         "default upstream; the seeds live on it)"),
    Knob("topk", 1, "int", "EAGLE topk (1: chain drafts; > 1: tree drafts)", minimum=1, maximum=4),
    Knob("steps", 3, "int", "speculative_num_steps", minimum=1, maximum=6),
    Knob("draft_tokens", "auto", "int", "speculative_num_draft_tokens (auto: steps + 1 for topk 1, "
         "else 2 * steps; at least 2: the bonus token and one draft token)", minimum=2),
] + _SCHEDULE_KNOBS[4:]


def _resolve(cfg: dict) -> dict:
    if cfg["draft_tokens"] == "auto":
        cfg["draft_tokens"] = cfg["steps"] + 1 if cfg["topk"] == 1 else 2 * cfg["steps"]
    if cfg["topk"] == 1 and cfg["draft_tokens"] != cfg["steps"] + 1:
        raise ValueError("topk 1 (chain drafts) needs draft_tokens = steps + 1")
    if cfg["topk"] > 1 and cfg["draft_tokens"] > cfg["topk"] * cfg["steps"] + 1:
        raise ValueError("draft_tokens must be <= topk * steps + 1")
    if cfg["topk"] > 1 and cfg["draft_tokens"] < cfg["steps"] + 1:
        raise ValueError("tree drafts (topk > 1) need draft_tokens >= steps + 1")
    if cfg["flavour"] == "npu" and cfg["topk"] > 1:
        raise ValueError("the npu flavour is modelled with topk 1 (chain drafts)")
    return cfg


def _resolve_overlap(cfg: dict) -> dict:
    return cfg


def _reference(cfg: dict) -> dict:
    return dict(cfg)


def _run(cfg: dict, ctx) -> dict:
    from .engine_run import run_pipeline
    return run_pipeline(cfg, ctx)


def _run_overlap(cfg: dict, ctx) -> dict:
    from .engine_run import run_pipeline
    return run_pipeline(dict(cfg, speculative=False), ctx)


VARIANTS = [
    # expected tensors are fnmatch patterns: a tensor held by several engine objects is named
    # after one of them (ForwardBatch.seq_lens and KVLocPlan.seq_lens are the same tensor)
    Variant("no-verify_plan_wait", {"graphs": True},
            [("RC001", "ForwardBatch.positions"), ("RC001", "ForwardBatch.input_ids")],
            "run_eagle_verify without `plan_stream.wait_stream(fwd_stream)`: verify prep on the "
            "plan stream reads the draft's outputs before the draft finished (the #21940 seed; "
            "needs the graph runner's pre-planned load_batch)",
            drop_sync=(SITE_VERIFY_PLAN_WAIT,)),
    Variant("no-verify_join", {"graphs": True}, [("RC003", "graph.input_ids")],
            "run_eagle_verify without the forward stream's join on the plan stream after verify "
            "prep: the graph buffers are written by both", drop_sync=(SITE_VERIFY_JOIN,)),
    Variant("no-draft_extend_plan_wait", {}, [("RC001", "*.seq_lens")],
            "_draft_extend_for_decode without the plan stream's wait on the forward stream: "
            "draft-extend prep reads verify's results early (#40025)",
            drop_sync=(SITE_DRAFT_EXTEND_PLAN_WAIT,)),
    Variant("no-futuremap_publish_wait", {"flavour": "npu"},
            [("RC001", "FutureMap.new_seq_lens_buf")],
            "FutureMap.resolve_seq_lens_cpu without `publish_ready.wait()`: the schedule stream "
            "reads seq_lens before the forward stream published them (#25879). On the cuda "
            "flavour the WAR barrier after every forward orders it anyway, so the flavour is npu",
            also=[("RC002", "ReqToTokenPool.req_to_token")],
            drop_sync=(SITE_PUBLISH_WAIT,)),
    Variant("rocm-prefix-reuse", dict(PREFIX_REUSE, flavour="hip"),
            [("RC002", "ReqToTokenPool.req_to_token")],
            "sglang as shipped for ROCm (no WAR barrier) on a workload whose requests share a "
            "cached prefix while others finish: the radix cache repoints a request's "
            "req_to_token row on the schedule stream while the forward still reads the row. "
            "Through sglang's own loop no wrong value has followed, on sim or on a GPU "
            "(docs/FINDINGS.md)",
            also=[("RC001", "*.seq_lens")]),
    Variant("no-war_barrier", dict(PREFIX_REUSE), [("RC002", "ReqToTokenPool.req_to_token")],
            "the same workload on the cuda flavour without Scheduler._apply_war_barrier's "
            "`schedule_stream.wait_stream(forward_stream)`: the one edge that orders the "
            "forward's req_to_token reads before the next step rewrites the rows",
            drop_sync=(SITE_WAR_BARRIER,)),
]


def _strategy(sc, fixed, explore):
    """The fuzzer's own draws (`strategy.py`): the request schedule always; when exploring also
    the spec shape, mrope, shared prefixes and graph buckets. The flavour stays the user's."""
    from .strategy import overrides
    return overrides(sc, fixed, explore)


_DIFF_FIELDS = {"output_ids": {"producer": "the forward (Scheduler.run_batch)",
                              "consumer": "Scheduler.process_batch_result",
                              "stream": "forward_stream"},
                # oracles.py: the target's KV pool by slot, read after the loop
                "kv_cache": {"producer": "the forward's KV write (MHATokenToKVPool.set_kv_buffer)",
                             "consumer": "a later forward's attention over the cached prefix",
                             "stream": "forward_stream", "key": "slot"},
                # oracles.py: with a host tier (sglang-hicache), each token the radix tree holds
                # on both tiers; an invariant of the run itself (its two copies agree), not
                # compared with the reference
                "kv_tiers": {"producer": "HiCache's transfers (HiCacheController backup and "
                                         "load-back on their own streams)",
                             "consumer": "a later forward's attention over the loaded-back prefix",
                             "stream": "forward_stream", "key": "token path", "expect": "agree",
                             "describe": "its device and host copies of the KV differ"}}


def _engine_version():
    from .surface import installed_version
    return installed_version()


SCENARIO = Scenario(
    name="sglang-eagle-v2",
    description="the installed sglang started through its front door (ServerArgs, "
                "run_scheduler_process) with EAGLE v2 speculative decoding: its own overlap "
                "event loop, workers, graph runners and Triton kernels, on a tiny model",
    knobs=KNOBS, switches=[], variants=VARIANTS, runner=_run, resolve=_resolve,
    reference=_reference, diff_fields=_DIFF_FIELDS,
    session_options=lambda cfg, device: {"route_cuda": device == "sim"},
    strategy=_strategy,
    # flavour, max_steps, publish_delay_us and mrope are "drawn" by never changing them
    # (strategy.HELD)
    drawn_knobs=("arrivals", "steps", "topk", "draft_tokens", "shared_prefix", "graph_bs",
                 "flavour", "max_steps", "publish_delay_us", "mrope"))
KNOWN_RACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "known-races.supp")
SCENARIO.engine_version = _engine_version
SCENARIO.known_findings = KNOWN_RACES
SCENARIO.fresh_process = True              # one sglang server per process (scenarios/fresh.py)
SCENARIO.engine_modules = ("sglang.",)     # mutate sglang's sites, not the harness's own
# the reviewed sync mutation table of the tested sglang release: `racecheck mutate`'s baseline
SCENARIO.mutate_baseline = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "mutate-0.5.23.json")

OVERLAP_SCENARIO = Scenario(
    name="sglang-overlap",
    description="the installed sglang started through its front door without speculative "
                "decoding: the overlap scheduler most sglang servers run (schedule stream "
                "prepares batch N+1 while the forward stream runs batch N; the WAR barrier)",
    knobs=_SCHEDULE_KNOBS, switches=[],
    variants=[Variant("no-war_barrier", {}, [("RC002", "ReqToTokenPool.req_to_token")],
                      "Scheduler._apply_war_barrier without its wait: the next step's "
                      "schedule-stream writes of req_to_token are unordered with the forward "
                      "still reading them", drop_sync=(SITE_WAR_BARRIER,))],
    runner=_run_overlap, resolve=_resolve_overlap, reference=_reference,
    diff_fields=_DIFF_FIELDS,
    session_options=lambda cfg, device: {"route_cuda": device == "sim"},
    strategy=_strategy,
    drawn_knobs=("arrivals", "shared_prefix", "graph_bs", "flavour", "max_steps", "mrope"))
OVERLAP_SCENARIO.engine_version = _engine_version
OVERLAP_SCENARIO.known_findings = KNOWN_RACES
OVERLAP_SCENARIO.fresh_process = True
OVERLAP_SCENARIO.engine_modules = ("sglang.",)


def _import_engine() -> None:
    from .engine_run import import_sglang
    import_sglang(False)


def engine_setup(sc) -> None:
    """What every scenario of the real engine shares beyond its knobs."""
    # each fresh process imports sglang itself, under its run's routing; the packages sglang
    # pulls in are imported once in the parent (scenarios/fresh.py `warm`). Triton is sglang's:
    # its interpreter mode is the run's environment.
    sc.import_engine = _import_engine
    sc.engine_packages = ("sglang", "sgl_kernel", "flashinfer", "triton")
    # drawn execution-order plans start at the first request: start-up's default-stream writes
    # are a triaged race (docs/FINDINGS.md) that a drawn order would only show again as a crash
    sc.plan_from = "serving"


for _sc in (SCENARIO, OVERLAP_SCENARIO):
    engine_setup(_sc)
    # the fuzzer runs examples as stretches of one open engine per shape (reuse.py)
    _sc.reuse = importlib.import_module(__name__ + ".reuse")
    # ... so an exploring example varies the engine's shape one time in two, else the traffic
    _sc.shape_knobs = _sc.reuse.SHAPE_KNOBS
    _sc.shape_odds = 2
