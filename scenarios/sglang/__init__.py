"""The `sglang-eagle-v2` scenario: the installed sglang's own EAGLE v2 overlap decode loop.

`eagle-v2` is our model of the pipeline; this scenario runs the engine itself, so a pull request
that drops a wait in sglang is seen here. What is sglang's and what is ours:

    sglang's (unchanged)   Scheduler.run_batch / _apply_war_barrier / update_running_batch,
                           ScheduleBatch, FutureMap, EAGLEWorkerV2 and EagleDraftWorker (draft,
                           verify, draft-extend), ForwardBatch, the decode / draft / draft-extend
                           graph runners and their buffer registry, the KV pools, the radix cache,
                           the batch result processor, and the Triton kernels (in Triton's CPU
                           interpreter on sim)
    ours (thin, explicit)  the tiny model and attention backend (on sglang's base classes), the
                           objects whose constructors load weights or join process groups
                           (assembled with the attributes they would set), the scheduler loop's
                           body driven by a scripted request schedule, and the platform flavour

Seeds are variants defined as dropped synchronization sites (`racecheck mutate` finds the rest).
Needs sglang installed with `pip install --no-deps sglang==0.5.23` and `racecheck[sglang]`.
"""
from __future__ import annotations

import os

from ..registry import Knob, Scenario, Variant
from .requests import format_arrivals, parse_arrivals

SITE_VERIFY_PLAN_WAIT = \
    "sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#0"
SITE_VERIFY_JOIN = \
    "sglang.srt.speculative.eagle_worker_common:run_eagle_verify:wait_stream#1"
SITE_DRAFT_EXTEND_PLAN_WAIT = \
    "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker._draft_extend_for_decode:wait_stream#0"
SITE_DRAFT_EXTEND_JOIN = \
    "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker._draft_extend_for_decode:wait_stream#1"
SITE_PUBLISH_WAIT = "sglang.srt.managers.overlap_utils:FutureMap.resolve_seq_lens_cpu:wait#0"
SITE_REQ_POOL_PADDING = ("sglang.srt.model_executor.cuda_graph_buffer_registry:"
                         "CudaGraphBufferRegistry.fill_from:padding(req_pool_indices)#0")

SITE_WAR_BARRIER = "sglang.srt.managers.scheduler:Scheduler._apply_war_barrier:wait_stream#0"

DEFAULT_ARRIVALS = "0:3x8;0:1x2;3:2x5;5:1x4"
# A short request ends on a stop token (so it rides one more forward), and a long one that
# shares a 12-token prefix with an earlier request takes its req_to_token row at once: the
# forward still reading that row for KV write locations lands in the shared prefix's slots.
PREFIX_REUSE = {"topk": 2, "prefix_len": 12, "stop_token": 37,
                "arrivals": "0:1x2+14;3:1x8+3;8:1x4+14;20:1x4+14"}


def _arrivals(value):
    return format_arrivals(parse_arrivals(value))


KNOBS = [
    Knob("graphs", True, "bool", "CUDA graphs: decode (target verify), draft and draft-extend "
         "runners with their buffer registry; padded batches"),
    Knob("flavour", "cuda", "choice", "platform branches sglang takes: cuda, hip (ROCm: "
         "publish_ready.synchronize(), no WAR barrier), npu (Ascend: mrope recompute, no WAR "
         "barrier)", choices=("cuda", "hip", "npu")),
    Knob("war_barrier", "auto", "choice", "Scheduler._apply_war_barrier (the schedule stream "
         "waits for the forward after every run_batch): auto is upstream's choice (on for cuda; "
         "off for hip and npu, SGLANG_ENABLE_WAR_BARRIER unset), on forces it (the env var), "
         "off makes it a no-op", choices=("auto", "on", "off")),
    Knob("forward_delay_us", 0, "int", "hold the forward stream this long before each "
         "run_batch (a sleep kernel on a GPU; a hold under sim's adversarial executor): the "
         "schedule stream's next step runs ahead", minimum=0, maximum=1_000_000),
    Knob("mrope", False, "bool", "an mrope (multimodal rotary) target model: spec mrope positions"),
    Knob("topk", 1, "int", "EAGLE topk (1: chain drafts; > 1: tree drafts)", minimum=1, maximum=4),
    Knob("steps", 3, "int", "speculative_num_steps", minimum=1, maximum=6),
    Knob("draft_tokens", "auto", "int", "speculative_num_draft_tokens (auto: steps + 1 for topk 1, "
         "else 2 * steps; at least 2: the bonus token and one draft token)", minimum=2),
    Knob("arrivals", DEFAULT_ARRIVALS, "str", "request schedule: step:COUNTxMAX_NEW_TOKENS[+PROMPT_LEN]"
         " items separated by ';' (requests join at that loop step; batches cross graph buckets)",
         validator=_arrivals),
    Knob("shared_prefix", True, "bool", "every prompt starts with the same tokens (radix-cache "
         "prefix hits for requests that join later)"),
    Knob("prefix_len", 3, "int", "length of the shared prompt prefix (a shorter prompt is all "
         "prefix)", minimum=1, maximum=16),
    Knob("stop_token", -1, "int", "a token that ends a request when it is generated (-1: none; "
         "requests then end by length, which the scheduler predicts; a stop token it cannot "
         "predict, so the finishing request rides one more forward)", minimum=-1),
    Knob("graph_bs", [1, 2, 4, 8], "int-list", "decode graph batch-size buckets"),
    Knob("max_steps", 80, "int", "scheduler loop iterations at most", minimum=1, maximum=1000),
    Knob("seed", 0, "int", "prompt tokens", minimum=0),
]


def _resolve(cfg: dict) -> dict:
    if cfg["draft_tokens"] == "auto":
        cfg["draft_tokens"] = cfg["steps"] + 1 if cfg["topk"] == 1 else 2 * cfg["steps"]
    if cfg["topk"] == 1 and cfg["draft_tokens"] != cfg["steps"] + 1:
        raise ValueError("topk 1 (chain drafts) needs draft_tokens = steps + 1")
    if cfg["topk"] > 1 and cfg["draft_tokens"] > cfg["topk"] * cfg["steps"] + 1:
        raise ValueError("draft_tokens must be <= topk * steps + 1")
    if cfg["topk"] > 1 and cfg["draft_tokens"] < cfg["steps"] + 1:
        # sglang 0.5.23's tree verify (_compact_accept_to_front) fails on a shape below that
        raise ValueError("tree drafts (topk > 1) need draft_tokens >= steps + 1 in sglang 0.5.23")
    if cfg["mrope"] and cfg["flavour"] == "hip":
        raise ValueError("mrope targets are modelled on cuda and npu")
    if cfg["flavour"] == "npu" and cfg["topk"] > 1:
        # on the Ascend branches a tree draft's forward reaches the model with out_cache_loc
        # unset (the KV write gets no locations) with the tiny attention backend; not modelled
        raise ValueError("the npu flavour is modelled with topk 1 (chain drafts)")
    return cfg


def _reference(cfg: dict) -> dict:
    return dict(cfg)


def _run(cfg: dict, ctx) -> dict:
    from .engine_run import run_pipeline
    return run_pipeline(cfg, ctx)


VARIANTS = [
    # expected tensors are fnmatch patterns: a tensor held by several engine objects is named
    # after one of them (ForwardBatch.seq_lens and KVLocPlan.seq_lens are the same tensor)
    Variant("no-verify_plan_wait", {"graphs": True},
            [("RC001", "ForwardBatch.positions"), ("RC001", "ForwardBatch.input_ids")],
            "run_eagle_verify without `plan_stream.wait_stream(fwd_stream)`: verify prep on the "
            "plan stream reads the draft's outputs before the draft finished (the #21940 seed; "
            "needs the graph runner's pre-planned load_batch)",
            drop_sync=(SITE_VERIFY_PLAN_WAIT,)),
    Variant("no-verify_plan_wait-mrope", {"graphs": True, "mrope": True},
            [("RC001", "ForwardBatch.positions"), ("RC003", "graph.mrope_positions")],
            "the same with an mrope target: the spec mrope positions computed on the plan stream "
            "also read the draft's positions early (the NPU mrope seed, #23423)",
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
            "sglang as shipped for ROCm (no WAR barrier) on a workload that reuses a finished "
            "request's req_to_token row for a request with a longer cached prefix: the forward "
            "still reading the row for its KV write locations is unordered with the schedule "
            "stream's write_cache_indices. Under a schedule-first order (`--plan`, "
            "docs/FINDINGS.md) its verify writes land in the shared prefix's KV slots",
            also=[("RC001", "*.seq_lens")]),
    Variant("no-war_barrier", dict(PREFIX_REUSE), [("RC002", "ReqToTokenPool.req_to_token")],
            "the same workload on the cuda flavour without Scheduler._apply_war_barrier's "
            "`schedule_stream.wait_stream(forward_stream)`: the one edge that orders the "
            "forward's req_to_token reads before the next step rewrites the rows",
            drop_sync=(SITE_WAR_BARRIER,)),
    Variant("no-req_pool_padding_zero", {"graphs": True, "flavour": "npu"},
            [("RC006", "graph.req_pool_indices")],
            "the decode graph registry's req_pool_indices slot not zero-padded: padded rows keep "
            "the previous replay's request rows, read in the graph as rows of req_to_token "
            "(#26292). Where graph runners share input buffers (cuda, hip) the draft-extend "
            "runner's own `req_pool_indices.zero_()` rewrites the same buffer before every "
            "verify replay, so the flavour is npu, where each runner keeps its own buffers",
            also=[("RC002", "ReqToTokenPool.req_to_token")],
            drop_sync=(SITE_REQ_POOL_PADDING,)),
]


def _strategy(sc, fixed, explore):
    """The fuzzer's own draws (`strategy.py`): the request schedule always; when exploring also
    the spec shape, mrope, shared prefixes and graph buckets. The flavour stays the user's."""
    from .strategy import overrides
    return overrides(sc, fixed, explore)


SCENARIO = Scenario(
    name="sglang-eagle-v2",
    description="the installed sglang's EAGLE v2 overlap decode loop (real scheduler, FutureMap, "
                "workers, graph runners, Triton kernels) with a tiny deterministic model",
    knobs=KNOBS, switches=[], variants=VARIANTS, runner=_run, resolve=_resolve,
    reference=_reference,
    diff_fields={"output_ids": {"producer": "EAGLEWorkerV2.forward_batch_generation",
                                "consumer": "SchedulerBatchResultProcessor.process_batch_result_decode",
                                "stream": "forward_stream"},
                 # the request lifecycle (host-side: equal in every order) and the KV oracles
                 # (oracles.py): where the target's KV writes landed
                 "admissions": {"producer": "ScheduleBatch.prepare_for_extend",
                                "consumer": "the scheduler loop", "stream": "schedule_stream"},
                 "prefix_overwrites": {"producer": "set_kv_buffer at ForwardBatch.out_cache_loc",
                                       "consumer": "RadixCache.match_prefix (the admitted "
                                                   "request's prefix slots)",
                                       "stream": "forward_stream"},
                 "radix_kv": {"producer": "set_kv_buffer at ForwardBatch.out_cache_loc",
                              "consumer": "RadixCache (the cached tokens' target KV)",
                              "stream": "forward_stream"}},
    session_options=lambda cfg, device: {"route_cuda": device == "sim"},
    strategy=_strategy,
    # flavour and max_steps are "drawn" by never changing them (see strategy.py)
    drawn_knobs=("arrivals", "steps", "topk", "draft_tokens", "mrope", "shared_prefix", "graph_bs",
                 "flavour", "max_steps"))


def _engine_version():
    from .environment import installed_version
    return installed_version()


SCENARIO.engine_version = _engine_version
SCENARIO.engine_modules = ("sglang.",)     # mutate sglang's sites, not the harness's own
# the reviewed sync mutation table of the tested sglang release: `racecheck mutate`'s baseline
SCENARIO.mutate_baseline = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "mutate-0.5.23.json")
