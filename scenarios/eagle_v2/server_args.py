"""Knob values as the engine's server arguments, and the request schedule.

The schedule says when requests arrive and how many tokens each generates (`max_new_tokens`):
`"0:+3x8;2:+1x3;6:+2"` = three requests arrive at loop iteration 0 and finish after 8 output
tokens, one arrives at 2 and finishes after 3, two arrive at 6 and generate `iterations` minus 6
tokens. A finish depends on the request's own tokens only, so the overlapped run (which learns
about a finish one iteration late) and the serialized run produce the same tokens per request.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_ENTRY = re.compile(r"^(\d+):\+(\d+)(?:x(\d+))?$")


@dataclass(frozen=True)
class Arrival:
    iteration: int
    count: int
    max_new_tokens: int | None   # None: iterations - arrival


def parse_schedule(value) -> list:
    """A schedule string (or [[iteration, count, max_new_tokens], ...]) -> sorted list of Arrival."""
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            if isinstance(item, Arrival):
                out.append(item)
                continue
            item = list(item)
            if len(item) not in (2, 3):
                raise ValueError(f"schedule entry {item!r}: expected [iteration, count, max_new_tokens]")
            tokens = item[2] if len(item) == 3 else None
            out.append(_arrival(int(item[0]), int(item[1]), None if tokens in (None, 0) else int(tokens)))
        return sorted(out, key=lambda a: a.iteration)
    text = str(value).strip()
    if not text:
        raise ValueError("empty schedule")
    out = []
    for part in re.split(r"[;\s]+", text):
        if not part:
            continue
        m = _ENTRY.match(part)
        if m is None:
            raise ValueError(f"schedule entry {part!r}: expected ITER:+COUNT[xTOKENS], e.g. 0:+3x8")
        out.append(_arrival(int(m.group(1)), int(m.group(2)),
                            int(m.group(3)) if m.group(3) is not None else None))
    return sorted(out, key=lambda a: a.iteration)


def _arrival(iteration: int, count: int, max_new_tokens) -> Arrival:
    if iteration < 0:
        raise ValueError("schedule iterations start at 0")
    if count < 1:
        raise ValueError("a schedule entry adds at least one request")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError("a request generates at least one token")
    return Arrival(iteration, count, max_new_tokens)


def format_schedule(arrivals) -> str:
    parts = []
    for a in arrivals:
        length = f"x{a.max_new_tokens}" if a.max_new_tokens is not None else ""
        parts.append(f"{a.iteration}:+{a.count}{length}")
    return ";".join(parts)


@dataclass
class ServerArgs:
    """The engine settings the model reads (names follow the engine's flags where it has one)."""

    enable_overlap: bool
    enable_plan_stream: bool            # SGLANG_ENABLE_OVERLAP_PLAN_STREAM
    cuda_graph: bool
    flavour: str                        # cuda | hip | npu
    model_is_mrope: bool
    multimodal: bool
    speculative_eagle_topk: int
    speculative_num_steps: int
    speculative_num_draft_tokens: int
    cuda_graph_bs: list
    schedule: list
    iterations: int
    seq_len_fill_value: int
    needs_cpu_seq_lens: bool
    # fix switches
    draft_done_event: bool
    mrope_recompute: bool
    req_pool_padding_zero: bool
    futuremap_publish: bool
    mm_input_copy: bool
    war_barrier: bool
    record_stream_keepalive: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "ServerArgs":
        return cls(
            enable_overlap=cfg["overlap"], enable_plan_stream=cfg["plan_stream"] and cfg["overlap"],
            cuda_graph=cfg["graphs"], flavour=cfg["flavour"], model_is_mrope=cfg["mrope"],
            multimodal=cfg["multimodal"], speculative_eagle_topk=cfg["topk"],
            speculative_num_steps=cfg["steps"], speculative_num_draft_tokens=cfg["draft_tokens"],
            cuda_graph_bs=sorted(cfg["buckets"]), schedule=parse_schedule(cfg["schedule"]),
            iterations=cfg["iterations"], seq_len_fill_value=cfg["seq_len_fill_value"],
            needs_cpu_seq_lens=cfg["needs_cpu_seq_lens"], draft_done_event=cfg["draft_done_event"],
            mrope_recompute=cfg["mrope_recompute"], req_pool_padding_zero=cfg["req_pool_padding_zero"],
            futuremap_publish=cfg["futuremap_publish"], mm_input_copy=cfg["mm_input_copy"],
            war_barrier=cfg["war_barrier"], record_stream_keepalive=cfg["record_stream_keepalive"])

    @property
    def max_running_requests(self) -> int:
        return max(self.cuda_graph_bs)

    @property
    def alloc_len_per_decode(self) -> int:
        return max(self.speculative_num_steps * self.speculative_eagle_topk,
                   self.speculative_num_draft_tokens)

    @property
    def horizon(self) -> int:
        return self.iterations
