"""What `racecheck fuzz sglang-eagle-v2` (and `sglang-overlap`) draws: request schedules, spec
shape, feature knobs.

Every example draws a request schedule (`arrivals`), unless the user fixed it; an exploring
example also draws the spec shape (topk/steps/draft tokens; EAGLE only), radix-cache prefix
sharing and the decode graph buckets. `graphs`, `plan_stream`, `war_barrier`, `prefix_len`,
`stop_token`, `forward_delay_us` and `seed` are drawn from their types by the generic strategy
(so a variant's `graphs=on` stays).

As shipped means as shipped. Without `--variant` or `--drop-sync` the search draws only
configurations some sglang build runs (`SHIPPED` says, per knob, which sglang setting it is and
why each value is one a release ships; checked against sglang 0.5.16-0.5.23, the releases the
front door runs). A setting that takes away a synchronization sglang ships is not a knob value
at all: removing the WAR barrier is the drop-sync variant `no-war_barrier` (the knob's values are
`auto` and `on`), a padding write is a dropped site (`graph_inputs.padding_sites`), and a site is
dropped only by `--drop-sync`, `--set drop_sync=...` or a variant. In particular:

- `plan_stream=off` is what every release runs by default (`SGLANG_ENABLE_OVERLAP_PLAN_STREAM`
  is an `EnvBool(False)` in 0.5.4-0.5.23, docs/SGLANG_RELEASES.md), and `on` is the option every
  release reads: both are drawn. Off moves the verify and draft-extend preparation onto the
  forward stream, where it needs no cross-stream wait; the seeds live on the plan stream, which
  is why the knob's default is on.
- `war_barrier=on` sets sglang's own switch `SGLANG_ENABLE_WAR_BARRIER` (0.5.14 on), which adds
  the barrier where sglang's default (`is_cuda()`) leaves it out (ROCm, Ascend); on cuda it is
  the default. No value removes it.
- `graphs=off` is `--disable-cuda-graph`, `graph_bs` is `--cuda-graph-bs`, the spec shape is
  `--speculative-eagle-topk/num-steps/num-draft-tokens` within what sglang accepts.
- `forward_delay_us` is no setting: it holds the forward stream (a sleep), which changes timing
  and never removes an edge.

The platform flavour is never drawn: it stays the runner's (`--set flavour=hip` on AMD runners,
`npu` on Ascend, default cuda), because the hip and npu flavours of sglang have known races
(docs/FINDINGS.md) that an as-shipped cuda run must not report; fuzz each flavour as its own
target (ci/nightly-fuzz does). `max_steps` stays at its default: the loop ends when every request
has finished; the cap only guards against a loop that never does.

Bounds (one run of the real engine costs seconds on a CPU, the serialized reference run as
much again): up to 3 phases of traffic on the one engine an example builds (requests.py: a
phase starts once the last one's requests finished; more schedules per engine construction),
each of at most 4 request groups, joining at loop steps 0..6, of 1..6 requests each (counts
around the graph buckets, so batches are padded), 1..8 new tokens each, prompts of 3..8 tokens;
a phase's later requests are dropped until its KV demand fits the harness's pool
(`KV_BUDGET`). Every choice shrinks toward one phase, one request joining at step 0 with two new
tokens (one decode step after its prefill), default prompt length, and the knobs' defaults.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from ..serving import batch_sizes, spec_params
from .requests import DEFAULT_PROMPT_LEN, PREFIX_LEN, Group, format_arrivals

# Every knob the as-shipped search may vary, and the sglang configuration it stands for: each
# value drawn is one some sglang build runs (tests/test_sglang_as_shipped.py draws many examples
# and checks it). A knob added to the scenarios must be classified here or in HELD.
SHIPPED = {
    "arrivals": "the traffic: requests arriving at loop steps (TokenizedGenerateReqInput)",
    "shared_prefix": "the traffic: prompts sharing a prefix (radix-cache hits)",
    "prefix_len": "the traffic: the shared prefix's length",
    "stop_token": "a sampling parameter (stop_token_ids)",
    "seed": "the prompts and the dummy weights (load_format=dummy, random_seed)",
    "graphs": "CUDA graphs on, or --disable-cuda-graph",
    "graph_bs": "--cuda-graph-bs (cuda_graph_bs_decode in later releases)",
    "topk": "--speculative-eagle-topk",
    "steps": "--speculative-num-steps",
    "draft_tokens": "--speculative-num-draft-tokens (>= steps + 1, as sglang's tree verify needs)",
    "plan_stream": "SGLANG_ENABLE_OVERLAP_PLAN_STREAM: off is every release's default, on its option",
    "war_barrier": "auto: sglang's own default per platform; on: SGLANG_ENABLE_WAR_BARRIER=1 (adds it)",
    "forward_delay_us": "no setting: a hold on the forward stream before run_batch (timing only)",
}
# Knobs every example keeps at the user's value (or the default): the platform is the runner's,
# the step cap only guards the loop, dropped sites come only from --drop-sync or a variant, the
# hold after the publish exists from sglang 0.5.13 on (a drawn value would stop older releases'
# searches; execution-order plans move the forward stream anyway), and the target model is the
# user's (`--set mrope=on` fuzzes the mrope target: another model is another engine to build).
HELD = ("flavour", "max_steps", "drop_sync", "publish_delay_us", "mrope")

MAX_GROUPS = 4                  # per phase
MAX_PHASES = 3
MAX_PER_GROUP = 6
MAX_STEP = 6
MAX_NEW_TOKENS = 8
# New tokens per request, the simplest first: two, so the simplest schedule already decodes
# once after its prefill (the overlap pipeline's streams, plan streams and verify run from the
# first example on); one (a request done at prefill) stays drawable.
NEW_TOKENS = (2, 1, *range(3, MAX_NEW_TOKENS + 1))
MAX_PROMPT_LEN = 8

# decode graph bucket lists, the default first: padding to 2 (no bucket 1), a gap (3 -> 4),
# one bucket below most batches (more eager batches)
GRAPH_BUCKETS = ([1, 2, 4, 8], [2, 4, 8], [1, 4], [1, 2, 3, 4, 6, 8], [2])


@st.composite
def groups(draw, buckets=(1, 2, 4, 8)):
    """A list of requests.Group: who joins at which loop step, how many, for how long."""
    out = []
    for i in range(draw(st.integers(1, MAX_GROUPS))):
        step = 0 if i == 0 else draw(st.integers(0, MAX_STEP))
        count = draw(batch_sizes(buckets, maximum=MAX_PER_GROUP))
        new = draw(st.sampled_from(NEW_TOKENS))
        plen = draw(st.one_of(st.just(DEFAULT_PROMPT_LEN), st.integers(PREFIX_LEN, MAX_PROMPT_LEN)))
        out.append(Group(step, count, new, plen))
    return sorted(out, key=lambda g: g.step)


@st.composite
def traffic(draw, buckets=(1, 2, 4, 8)):
    """Phases of groups: a first schedule, then up to MAX_PHASES - 1 more, each starting once
    the last one's requests finished, on the same engine (shrinks toward one phase)."""
    out = list(draw(groups(buckets)))
    for phase in range(1, 1 + draw(st.integers(0, MAX_PHASES - 1))):
        out += [replace(g, phase=phase) for g in draw(groups(buckets))]
    return out


def arrivals(buckets=(1, 2, 4, 8)) -> st.SearchStrategy:
    """Request schedules in the `arrivals` knob's text form (`STEP:COUNTxNEW[+PROMPT];...`,
    phases separated by `|`)."""
    return traffic(buckets).map(format_arrivals)


# The server's KV pool (server.MAX_TOTAL_TOKENS) is sized so that drawn schedules never fill it:
# a full pool makes sglang retract requests, which a schedule cannot predict. Drawn schedules
# keep their KV demand (prompt, new tokens, and per decode step the drafts and the verify
# window) within a quarter of the pool.
KV_BUDGET = 512


def _defaults(sc) -> dict:
    spec = {"steps": 0, "topk": 0, "draft_tokens": 0}
    return {k: sc.knobs[k].default if k in sc.knobs else v for k, v in spec.items()}


def kv_demand(groups, steps: int, topk: int, draft_tokens) -> int:
    """A bound on the KV slots a schedule takes: per request its prompt, its new tokens and
    one decode step's drafts (topk x steps) and verify window (draft tokens)."""
    if draft_tokens == "auto":
        draft_tokens = steps + 1 if topk == 1 else 2 * steps
    per_step = topk * steps + int(draft_tokens)
    return sum(g.count * (g.prompt_len + g.max_new_tokens + per_step) for g in groups)


def _within_kv(text: str, cfg: dict) -> str:
    """The drawn schedule with each phase's later requests dropped until the phase fits
    KV_BUDGET (a phase starts once the last one's requests finished: their slots are the radix
    cache's to keep or evict)."""
    from .requests import parse_arrivals, phases
    out = []
    for phase in phases(parse_arrivals(text)):
        mine = []
        for g in phase:
            while g.count > 0 and kv_demand(mine + [g], cfg["steps"], cfg["topk"],
                                            cfg["draft_tokens"]) > KV_BUDGET:
                g = replace(g, count=g.count - 1)
            if g.count == 0:
                break
            mine.append(g)
        if not mine:      # one request, whatever it takes (the largest shapes need ~100 slots)
            mine = [replace(phase[0], count=1)]
        out += mine
    return format_arrivals(out)


def _spec_shape(sp: dict, fixed: dict) -> dict:
    """The drawn spec shape, consistent with the knobs the user fixed, and one sglang runs.

    sglang 0.5.23's tree verify gathers the accepted path (steps + 1 tokens) into each request's
    block of draft tokens (`eagle_worker_common._compact_accept_to_front`): with topk > 1 and
    fewer than steps + 1 draft tokens it raises a shape error (an engine limit, not a race; its
    server arguments do not reject the combination), so draft tokens stay >= steps + 1."""
    steps = fixed.get("steps", sp["steps"])
    topk = fixed.get("topk", sp["topk"])
    if fixed.get("flavour") == "npu" and "topk" not in fixed:
        topk = sp["topk"] = 1          # the npu flavour runs chain drafts only (`_resolve`)
    out = {k: v for k, v in sp.items() if k not in fixed}
    if "draft_tokens" not in fixed:
        draft = sp["draft_tokens"]
        if topk == 1:
            draft = "auto"
        elif draft != "auto":
            draft = min(max(draft, steps + 1), topk * steps + 1)
        out["draft_tokens"] = draft
    return out


@st.composite
def overrides(draw, sc, fixed: dict, explore: bool):
    """The overrides of `drawn_knobs` for one example; knobs in `fixed` are left alone."""
    cfg = {}
    buckets = fixed.get("graph_bs")
    if buckets is None and explore:
        buckets = draw(st.sampled_from(GRAPH_BUCKETS))
        if buckets != sc.knobs["graph_bs"].default:
            cfg["graph_bs"] = buckets
    buckets = list(buckets or sc.knobs["graph_bs"].default)
    if "arrivals" not in fixed:
        cfg["arrivals"] = draw(arrivals(buckets))
    if explore and "topk" in sc.knobs:
        cfg.update(_spec_shape(draw(spec_params(sc)), fixed))
    if "arrivals" in cfg:
        cfg["arrivals"] = _within_kv(cfg["arrivals"], {**_defaults(sc), **fixed, **cfg})
    if not explore:
        return cfg
    if "shared_prefix" not in fixed:
        shared = draw(st.one_of(st.just(True), st.booleans()))
        if not shared:
            cfg["shared_prefix"] = False
    return cfg
