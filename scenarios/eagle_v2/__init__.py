"""The `eagle-v2` scenario: SGLang's EAGLE speculative-decoding v2 overlap pipeline.

Knobs set the engine's configuration; one knob per upstream fix (all on by default). A variant
`no-<switch>` turns one fix off under the knob settings where the engine has that bug.
"""
from __future__ import annotations

import inspect

from ..registry import Knob, Scenario, Switch, Variant
from .server_args import format_schedule, parse_schedule

SWITCHES = [
    Switch("draft_done_event", "sglang #21940 (reverted by #25917); #40025 for draft-extend",
           "draft_token, positions, tree_mask, predict", "RC001",
           "event after draft() (and after sampling) that the plan stream waits on before reading "
           "the draft's outputs"),
    Switch("mrope_recompute", "sglang #23423 (NPU only upstream)", "mrope_positions", "RC001",
           "compute mrope_positions on the forward stream after the plan-stream join and copy them "
           "into the graph buffer, instead of in init_new on the plan stream"),
    Switch("req_pool_padding_zero", "sglang #26292", "req_pool_indices", "RC006",
           "padded graph rows point at reserved req_pool slot 0 (req_pool_indices.zero_())"),
    Switch("futuremap_publish", "sglang #25879 / #26380", "seq_lens", "RC001",
           "seq_lens routed through FutureMap.publish + publish_ready wait on the schedule stream"),
    Switch("mm_input_copy", "sglang #23613", "mm_input_embeds", "DIFF",
           "piecewise graph replay keeps mm_input_embeds[:raw_num_tokens] in LogitsProcessorOutput"),
    Switch("war_barrier", "sglang #26380 (CUDA only, #26646)", "req_to_token", "RC002",
           "schedule_stream.wait_stream(forward_stream) at the top of the overlap loop"),
    Switch("record_stream_keepalive", "record_stream_for_v2_verify / record_stream_each / batch_record_buf",
           "out_cache_loc (and other cross-stream temporaries)", "RC005",
           "record_stream calls and the 2-slot keep-alive ring for tensors used on another stream"),
]

DEFAULT_SCHEDULE = "0:+3x28;3:+2x10;6:+1x16"


def _schedule(value):
    return format_schedule(parse_schedule(value))


def _buckets(values):
    vals = sorted(set(int(v) for v in values))
    if vals[0] < 1:
        raise ValueError("bucket sizes must be >= 1")
    if vals[-1] > 32:
        raise ValueError("the largest bucket must be <= 32")
    return vals


def _draft_tokens(value):
    if value == "auto":
        return value
    v = int(value)
    if v < 2:
        raise ValueError("must be >= 2 (the bonus token plus at least one draft token)")
    return v


KNOBS = [
    Knob("overlap", True, "bool",
         "overlap scheduling: schedule stream + forward stream, results one iteration late"),
    Knob("plan_stream", False, "bool",
         "SGLANG_ENABLE_OVERLAP_PLAN_STREAM: verify/draft-extend prep on plan_stream"),
    Knob("graphs", True, "bool", "CUDA graphs: decode (target verify) buckets and piecewise prefill"),
    Knob("flavour", "cuda", "choice", "device flavour: cuda, hip (publish_ready.synchronize(), no barrier by "
         "default), npu (blocking seq_lens.cpu() in graph replay, no D2H stream)",
         choices=("cuda", "hip", "npu")),
    Knob("mrope", False, "bool",
         "the target is an mrope model (mrope_positions via compute_spec_mrope_positions)"),
    Knob("multimodal", False, "bool",
         "even-numbered requests carry an image (encoder features, mm_input_embeds)"),
    Knob("topk", 1, "int", "speculative_eagle_topk (draft candidates per tree level)", minimum=1, maximum=4),
    Knob("steps", 3, "int", "speculative_num_steps (draft tree depth)", minimum=1, maximum=6),
    Knob("draft_tokens", "auto", "int", "speculative_num_draft_tokens (auto: 1 + steps * topk)",
         validator=_draft_tokens, minimum=2),
    Knob("buckets", [1, 2, 4, 8], "int-list", "decode CUDA graph batch-size buckets (cuda_graph_bs)",
         validator=_buckets),
    Knob("schedule", DEFAULT_SCHEDULE, "str", "arrivals ITER:+COUNT[xTOKENS];... (max_new_tokens per "
         "request; default: iterations minus the arrival)", validator=_schedule),
    Knob("iterations", 16, "int", "horizon: max_new_tokens of requests the schedule gives no length",
         minimum=1, maximum=200),
    Knob("seq_len_fill_value", "auto", "int", "padded seq_lens value (auto: 1 on cuda/hip, 0 on npu)",
         minimum=0, maximum=16),
    Knob("needs_cpu_seq_lens", True, "bool", "backend needs the seq_lens CPU mirror (#26128)"),
] + [
    Knob(s.name, "auto" if s.name == "war_barrier" else True, "bool",
         f"fix switch: {s.help} [{s.upstream}]" + ("; auto: on for cuda, off for hip/npu"
                                                   if s.name == "war_barrier" else ""))
    for s in SWITCHES
]

ROW_REUSE_SCHEDULE = "0:+2x24;0:+1x2;3:+1x12"
SMALLER_IN_BUCKET_SCHEDULE = "0:+2x24;0:+1x6;0:+1x24"
FINISH_NO_REUSE_SCHEDULE = "0:+3x24;0:+1x3"

VARIANTS = [
    Variant("no-draft_done_event", {"draft_done_event": False, "plan_stream": True},
            [("RC001", "draft_token"), ("RC001", "positions"), ("RC001", "tree_mask"), ("RC001", "predict")],
            "plan stream on, no event after draft(): replay_prepare copies draft outputs the forward "
            "stream may still be writing; the draft-extend prep reads predict before sampling finished"),
    Variant("no-mrope_recompute", {"mrope_recompute": False, "plan_stream": True, "mrope": True,
                                   "multimodal": True},
            [("RC001", "mrope_positions")],
            "plan stream on, mrope model: init_new on plan_stream computes mrope_positions before "
            "any wait; their text rows are a view of the draft's positions, which the forward "
            "stream may still be writing"),
    Variant("no-req_pool_padding_zero",
            {"req_pool_padding_zero": False, "schedule": SMALLER_IN_BUCKET_SCHEDULE},
            [("RC006", "req_pool_indices")],
            "a 3-request batch follows a 4-request one in bucket 4: the padded row keeps a live "
            "request's req_pool_idx, the graph reads and writes that request's state",
            also=[("DIFF", "output_ids"), ("DIFF", "accept_lens")]),
    Variant("no-futuremap_publish", {"futuremap_publish": False, "war_barrier": False,
                                     "schedule": FINISH_NO_REUSE_SCHEDULE},
            [("RC001", "seq_lens")],
            "before #25879 (and before the barrier of #26380): the schedule stream reads verify's new "
            "seq_lens (filter_batch, the CPU mirror) with no publish_ready wait"),
    Variant("no-mm_input_copy", {"mm_input_copy": False, "multimodal": True, "mrope": True},
            [("DIFF", "mm_input_embeds")],
            "piecewise prefill graph drops mm_input_embeds: the draft re-embeds image placeholders "
            "(a lost field, visible only to the differential oracle)",
            also=[("DIFF", "accept_lens")]),
    Variant("no-war_barrier", {"war_barrier": False, "schedule": ROW_REUSE_SCHEDULE},
            [("RC002", "req_to_token")],
            "a finished request's req_to_token row goes to a joining request while the forward that "
            "still ran the finished request may be reading it",
            value_visible=False,
            why_benign="benign in this model only: it has no radix cache, so the reused row holds "
                       "the joining request's fresh slots, which its own prefill rewrites after "
                       "the stale step. In sglang the row can start with a shared cached prefix, "
                       "and the stale step takes its KV write locations from it: verify writes "
                       "land in the shared prefix (docs/FINDINGS.md; sglang-eagle-v2's "
                       "rocm-prefix-reuse variant)"),
    Variant("no-record_stream_keepalive",
            {"record_stream_keepalive": False, "plan_stream": True, "war_barrier": False},
            [("RC005", "seq_lens")],
            "no record_stream, no keep-alive ring and no WAR barrier (HIP's default): the "
            "schedule stream reuses its pool for the next batch while the forward stream may still "
            "read the freed block",
            also=[("RC005", "input_ids"), ("RC005", "positions"), ("RC005", "out_cache_loc"),
                  ("RC005", "req_pool_indices"), ("RC005", "kv_indices"), ("RC005", "mrope_positions")],
            value_visible=False,
            why_benign="on sim a freed block's bytes never reach another tensor while queued work "
                       "still holds them, so the early reuse cannot change outputs here; with the "
                       "barrier on, the early free is no hazard at all (the reuse is ordered)"),
]


def resolve(cfg: dict) -> dict:
    cfg = dict(cfg)
    if cfg["draft_tokens"] == "auto":
        cfg["draft_tokens"] = 1 + cfg["steps"] * cfg["topk"]
    if cfg["draft_tokens"] > 1 + cfg["steps"] * cfg["topk"]:
        raise ValueError(f"draft_tokens={cfg['draft_tokens']} exceeds 1 + steps * topk = "
                         f"{1 + cfg['steps'] * cfg['topk']}")
    if cfg["seq_len_fill_value"] == "auto":
        cfg["seq_len_fill_value"] = 0 if cfg["flavour"] == "npu" else 1
    if cfg["war_barrier"] == "auto":
        cfg["war_barrier"] = cfg["flavour"] == "cuda"
    return cfg


def reference(cfg: dict) -> dict:
    """The serialized run: one stream, no graphs, no plan stream, every fix on."""
    ref = dict(cfg, overlap=False, plan_stream=False, graphs=False)
    for s in SWITCHES:
        ref[s.name] = True
    return ref


def _run(cfg: dict, ctx) -> dict:
    from .scheduler import run_pipeline
    return run_pipeline(cfg, ctx)


def _location(obj) -> str:
    try:
        import os
        return f"{os.path.basename(inspect.getsourcefile(obj))}:{inspect.getsourcelines(obj)[1]}"
    except (OSError, TypeError):
        return ""


def _diff_fields() -> dict:
    from .eagle_worker_v2 import EagleWorkerV2
    from .piecewise_cuda_graph_runner import PiecewiseCudaGraphRunner
    from .scheduler import Scheduler
    return {
        "mm_input_embeds": {
            "consumer": "_draft_extend_for_prefill", "producer": "PiecewiseCudaGraphRunner.replay",
            "location": _location(EagleWorkerV2._draft_extend_for_prefill),
            "producer_location": _location(PiecewiseCudaGraphRunner.replay),
            "suggestion": "keep `mm_input_embeds=output.mm_input_embeds[:raw_num_tokens]` when the piecewise "
                          "graph replay rebuilds LogitsProcessorOutput (#23613)"},
        "accept_lens": {
            "consumer": "process_batch_result", "producer": "eagle_sample",
            "location": _location(Scheduler.process_batch_result),
            "producer_location": _location(EagleWorkerV2.eagle_sample),
            "suggestion": "the draft state differs from the serialized run: look for a lost or unordered "
                          "draft input (hidden states, topk, mm_input_embeds)"},
        "output_ids": {
            "consumer": "process_batch_result", "producer": "eagle_sample",
            "location": _location(Scheduler.process_batch_result),
            "producer_location": _location(EagleWorkerV2.eagle_sample),
            "suggestion": "the target's tokens differ from the serialized run: an input of the verify "
                          "forward (graph slot, KV, req_to_token, mamba state) was stale or unordered"},
    }


def _strategy(sc, fixed, explore):
    from .strategy import overrides
    return overrides(sc, fixed, explore)


SCENARIO = Scenario(
    "eagle-v2",
    "SGLang EAGLE spec-v2 overlap pipeline: schedule/forward/plan/D2H streams, FutureMap, "
    "decode + piecewise CUDA graphs with padding, mrope, multimodal",
    KNOBS, SWITCHES, VARIANTS, runner=_run, resolve=resolve, reference=reference, diff_fields=_diff_fields,
    strategy=_strategy, drawn_knobs=("iterations", "schedule", "buckets", "steps", "topk", "draft_tokens"))
