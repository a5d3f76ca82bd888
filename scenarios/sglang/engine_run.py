"""One run of the `sglang-eagle-v2` scenario: set sglang up for the run's configuration, drive
the overlap scheduler through the request schedule, return each request's output tokens."""
from __future__ import annotations

import contextlib

from . import environment, platform
from .model_runner import CONTEXT_LEN, VOCAB
from .requests import parse_arrivals, prompts
from .scheduler import Arrival, OverlapScheduler

KV_SLOTS = 512


def run_pipeline(cfg: dict, ctx) -> dict:
    """Under the caller's session (sim routing torch.cuda, or a real GPU); without one (the
    reference run) in a private sim session, or uninstrumented where a GPU is present."""
    if ctx.session is not None:
        return _run(cfg, ctx.session, gpu=ctx.session.device != "sim")
    import torch

    from racecheck.session import active_session
    if active_session() is None and torch.cuda.is_available():     # a real GPU, uninstrumented
        return _run(cfg, None, gpu=True)
    import racecheck
    with racecheck.session(device="sim", route_cuda=True) as rc:
        return _run(cfg, rc, gpu=False)


def _run(cfg: dict, rc, *, gpu: bool) -> dict:
    if not gpu and not getattr(rc, "route_cuda", False):
        from racecheck.errors import UsageError
        raise UsageError("sglang-eagle-v2 runs sglang's CUDA code: on sim it needs torch.cuda "
                         "routing (the default for this scenario)")
    engine = environment.load(interpret=not gpu)
    groups = parse_arrivals(cfg["arrivals"])
    arrivals = [Arrival(step, rid, prompt, new) for step, rid, prompt, new in
                prompts(groups, seed=cfg["seed"], shared_prefix=cfg["shared_prefix"], vocab=VOCAB,
                        prefix_len=cfg["prefix_len"])]
    max_running = max(cfg["graph_bs"][-1], sum(g.count for g in groups))
    server_args = environment.configure(
        engine, topk=cfg["topk"], steps=cfg["steps"], draft_tokens=cfg["draft_tokens"],
        graphs=cfg["graphs"], graph_bs=cfg["graph_bs"], max_running=max_running,
        context_len=CONTEXT_LEN)
    run_cfg = dict(cfg, max_running=max_running, kv_slots=KV_SLOTS, radix_cache=True)
    import racecheck
    with contextlib.ExitStack() as stack:
        stack.enter_context(environment.quiet(engine))
        stack.enter_context(environment.fresh_process(engine))
        war_barrier = stack.enter_context(platform.flavour(engine, cfg["flavour"]))
        if cfg["war_barrier"] != "auto":
            war_barrier = cfg["war_barrier"] == "on"
        stack.enter_context(environment.single_rank_graph_capture(engine))
        if rc is not None and rc.device == "sim":
            stack.enter_context(environment.padding_sites(engine, rc.sync_sites))
        scheduler = OverlapScheduler(engine, rc, server_args, run_cfg, war_barrier=war_barrier,
                                     name=racecheck.name, delay=_delay(rc, gpu, cfg))
        outputs = scheduler.run(arrivals, cfg["max_steps"])
        oracles = scheduler.kv_oracles()
    return {"output_ids": {rid: list(ids) for rid, ids in sorted(outputs.items())}, **oracles}


def _delay(rc, gpu: bool, cfg: dict):
    """How the scheduler holds the forward stream back (`forward_delay_us`): through the
    session (a GPU sleep, or a hold under sim's adversarial executor), or a calibrated sleep
    kernel on a GPU run without racecheck."""
    if not cfg["forward_delay_us"]:
        return None
    if rc is not None or not gpu:
        import racecheck
        return racecheck.delay
    import torch

    from racecheck.instrumentation.delays import Sleeper
    sleeper = Sleeper(torch.cuda, "cuda")
    sleeper.prepare(torch.cuda.current_device())
    return lambda stream, us: sleeper.sleep(stream, torch.cuda.current_device(), us)
