"""sglang's own scheduler process, run in this process through its front door.

What a server launch does, minus the other processes: `ServerArgs` and `PortArgs` as the
launcher makes them, then sglang's `run_scheduler_process`, which publishes the configuration,
builds `Scheduler` (TP worker, model runner, pools, radix cache, attention backend, the EAGLE
workers, graph runners and their captures) and runs sglang's own event loop. racecheck adds:

* a tiny model (`model/`: HF configs of a standard architecture) loaded by sglang's own loader
  with dummy weights;
* a feeder at the request seam (`surface.FEED`): the schedule's arrivals join at their loop
  iteration as `TokenizedGenerateReqInput`s, and the loop ends once every request finished;
* the outputs, read from the ZMQ socket the scheduler sends its token ids to;
* process plumbing: the parent-process signal on a scheduler exception is not sent to the
  user's shell, the process keeps its title, and sglang logs only errors.

Nothing in the loop is ours: sglang's `event_loop_overlap` chooses, launches and processes
every batch, with its own WAR barrier.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import os
import time
import types
from array import array
from dataclasses import dataclass, field

from . import surface
from .surface import mismatch

MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")
VOCAB = 512                       # model/*/config.json
CONTEXT_LEN = 256
MAX_TOTAL_TOKENS = 2048


@dataclass
class Arrival:
    """A request joining at loop iteration `step` of its traffic phase (requests.py)."""

    step: int
    rid: str
    prompt: list
    max_new_tokens: int
    phase: int = 0


@dataclass
class Shape:
    """What the server is started with (ServerArgs): the engine's shape."""

    speculative: bool = True
    topk: int = 1
    steps: int = 3
    draft_tokens: int = 4
    graphs: bool = False
    graph_bs: list = field(default_factory=lambda: [1, 2, 4, 8])
    max_running: int = 8
    seed: int = 0
    page_size: int = 1
    mrope: bool = False     # the target model: model/target-mrope (Qwen2.5-VL), else model/target
    # further ServerArgs fields, as the launcher's flags would set them (a sibling scenario's
    # engine options, e.g. the hierarchical cache's); applied last, checked like the rest
    extra: dict = field(default_factory=dict)


def server_args(shape: Shape):
    """`ServerArgs` as `python -m sglang.launch_server` would make them for this shape; options
    a release does not have are left out (older spellings where they differ)."""
    ServerArgs = _need("sglang.srt.server_args", "ServerArgs")
    accepted = inspect.signature(ServerArgs).parameters
    target = "target-mrope" if shape.mrope else "target"
    kw = dict(model_path=os.path.join(MODEL_DIR, target), load_format="dummy",
              skip_tokenizer_init=True, device="cuda", attention_backend="triton", tp_size=1,
              dtype="float32", random_seed=shape.seed, page_size=shape.page_size,
              context_length=CONTEXT_LEN, max_total_tokens=MAX_TOTAL_TOKENS,
              max_running_requests=shape.max_running, mem_fraction_static=0.5,
              disable_cuda_graph=not shape.graphs, log_level="error",
              # one KV split per request: the Triton decode kernels' grid (and their time in
              # the CPU interpreter) stays small; the split-and-reduce path is the same
              triton_attention_num_kv_splits=1)
    graph_bs = list(shape.graph_bs)
    kw["cuda_graph_bs_decode" if "cuda_graph_bs_decode" in accepted else "cuda_graph_bs"] = graph_bs
    kw["cuda_graph_max_bs_decode" if "cuda_graph_max_bs_decode" in accepted
       else "cuda_graph_max_bs"] = max(graph_bs)
    if "disable_piecewise_cuda_graph" in accepted:
        # 0.5.10-0.5.13 turn the piecewise prefill graph (torch.compile around a custom
        # attention op registered for the CUDA dispatch key only) on by default, even with
        # disable_cuda_graph; sim tensors dispatch as CPU tensors. sglang's own flag (the one its
        # error message names) keeps it off; later releases' disable_cuda_graph covers it
        kw["disable_piecewise_cuda_graph"] = True
    if shape.speculative:
        kw.update(speculative_algorithm="EAGLE",
                  speculative_draft_model_path=os.path.join(MODEL_DIR, "draft"),
                  speculative_eagle_topk=shape.topk, speculative_num_steps=shape.steps,
                  speculative_num_draft_tokens=shape.draft_tokens)
    if gc.get_freeze_count() and "enable_cudagraph_gc" in accepted:
        # the engine process froze the imports it started with (scenarios/fresh.py); sglang's
        # capture would unfreeze it all at its end (`freeze_gc`) unless told to collect
        # during capture instead, sglang's own option. Collector policy only: which pass
        # frees a cycle of garbage, not what the program runs on its streams
        kw["enable_cudagraph_gc"] = True
    kw.update(shape.extra)
    unknown = [k for k in kw if k not in accepted and k not in ("cuda_graph_max_bs_decode",
                                                                  "cuda_graph_max_bs")]
    if unknown:
        raise mismatch(f"ServerArgs has no {', '.join(unknown)}")
    return ServerArgs(**{k: v for k, v in kw.items() if k in accepted})


def _need(module: str, name: str):
    return surface.Touch(f"{module}:{name}", "").get()


class _Stop(BaseException):
    """Ends sglang's endless loop from the feeder on releases without a graceful-exit flag
    (a BaseException: the scheduler's own `except Exception` must not catch it)."""


class Outputs:
    """The scheduler's output socket (what the tokenizer or detokenizer would read): each
    request's token ids and whether it finished."""

    def __init__(self, port_args):
        import zmq
        self._zmq = zmq
        self._ctx = zmq.Context.instance()
        self._sockets = []
        for name in ("tokenizer_ipc_name", "detokenizer_ipc_name"):
            address = getattr(port_args, name, None)
            if address:
                sock = self._ctx.socket(zmq.PULL)
                sock.bind(address)
                self._sockets.append(sock)
        recv = surface.RECV.get() if surface.RECV.exists() else None
        self._recv = recv or (lambda sock, flags=0: sock.recv_pyobj(flags))
        self.tokens: dict = {}
        self.finished: set = set()

    def drain(self) -> None:
        for sock in self._sockets:
            while True:
                try:
                    msg = self._recv(sock, self._zmq.NOBLOCK)
                except self._zmq.Again:
                    break
                self._take(msg)

    def _take(self, msg) -> None:
        rids = getattr(msg, "rids", None) or []
        ids = getattr(msg, "output_ids", None) or getattr(msg, "decode_ids", None) \
            or [()] * len(rids)
        reasons = getattr(msg, "finished_reasons", None) or [None] * len(rids)
        for rid, new, why in zip(rids, ids, reasons):
            self.tokens.setdefault(rid, []).extend(int(t) for t in new)
            if why is not None:
                self.finished.add(rid)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)


def make_request(arrival: Arrival, stop_token: int):
    """A `TokenizedGenerateReqInput` from the struct's own fields (they change by release)."""
    SamplingParams = surface.SAMPLING.get()
    Req = surface.REQUEST.get()
    sp = SamplingParams(max_new_tokens=arrival.max_new_tokens, temperature=0.0,
                        ignore_eos=True, stop_token_ids=[stop_token] if stop_token >= 0 else None)
    sp.normalize(None)
    if "vocab_size" in inspect.signature(sp.verify).parameters:      # releases differ
        sp.verify(VOCAB)
    else:
        sp.verify()
    fields = getattr(Req, "__struct_fields__", None) or getattr(Req, "__dataclass_fields__", {})
    wants_array = "array" in str(getattr(Req, "__annotations__", {}).get("input_ids", ""))
    values = dict(rid=arrival.rid, input_text="",
                  input_ids=array("q", arrival.prompt) if wants_array else list(arrival.prompt),
                  input_embeds=None, mm_inputs=None, image_inputs=None, token_type_ids=None,
                  sampling_params=sp, return_logprob=False, logprob_start_len=-1,
                  top_logprobs_num=0, token_ids_logprob=None, stream=False)
    return Req(**{k: v for k, v in values.items() if k in fields})


class Feeder:
    """Stands at `Scheduler.process_input_requests`: iteration k of the event loop receives the
    arrivals scheduled for k. Traffic comes in phases: a phase starts at the iteration after the
    last one's every request finished, its steps counted from there. Once every request finished
    (or a phase ran `max_steps` iterations) the loop is asked to exit as a shutdown request
    would."""

    def __init__(self, arrivals, outputs: Outputs, *, max_steps: int, stop_token: int,
                 on_first=None, make=None, on_done=None):
        self.make = make or make_request
        self.pending = sorted(arrivals, key=lambda a: (a.phase, a.step))
        self.total = len(arrivals)
        self.outputs = outputs
        self.max_steps = max_steps
        self.stop_token = stop_token
        self.on_first = on_first
        self.on_done = on_done          # called with the scheduler before the loop is asked to exit
        self.step = 0
        self.phase = self.pending[0].phase if self.pending else 0
        self.phase_start = 0
        self.phase_starts: list = [0]       # the loop step each phase started at
        self._released: set = set()

    def install(self):
        Scheduler = surface.FEED.owner_and_name()[0]
        original = surface.FEED.get()
        feeder = self

        def process_input_requests(scheduler, recv_reqs):
            if feeder.on_first is not None:
                feeder.on_first(scheduler)
                feeder.on_first = None
            return original(scheduler, list(recv_reqs) + feeder.arrivals(scheduler))
        process_input_requests.__wrapped__ = original
        return patched(Scheduler, "process_input_requests", process_input_requests)

    def arrivals(self, scheduler) -> list:
        k = self.step
        self.step += 1
        self.outputs.drain()
        if len(self.outputs.finished) >= self.total or k - self.phase_start >= self.max_steps:
            if self.on_done is not None:
                self.on_done(scheduler)
                self.on_done = None
            if not hasattr(scheduler, "gracefully_exit"):           # surface.GRACEFUL_EXIT
                raise _Stop()
            scheduler.gracefully_exit = True
            return []
        if self.pending and self.pending[0].phase != self.phase \
                and self._released <= self.outputs.finished:
            self.phase = self.pending[0].phase
            self.phase_start = k
            self.phase_starts.append(k)
        now = []
        while self.pending and self.pending[0].phase == self.phase \
                and self.pending[0].step <= k - self.phase_start:
            now.append(self.pending.pop(0))
        self._released.update(a.rid for a in now)
        return [self.make(a, self.stop_token) for a in now]


def is_idle(scheduler) -> bool:
    """No request queued or running and no batch result pending (sglang's own test where the
    release has it: `Scheduler.is_fully_idle`)."""
    idle = getattr(scheduler, "is_fully_idle", None)
    if idle is not None:
        return bool(idle())
    running = getattr(scheduler, "running_batch", None)
    last = getattr(scheduler, "last_batch", None)
    return ((running is None or running.is_empty()) and not getattr(scheduler, "waiting_queue", ())
            and (last is None or last.is_empty()) and not getattr(scheduler, "result_queue", ()))


class StretchFeeder(Feeder):
    """A feeder for one engine serving many request schedules (scenarios/sglang/reuse.py).

    Between schedules the event loop asks for requests and waits: the feeder takes the next
    command from `channel` (`None` or `{"op": "close"}`: the loop exits as on shutdown). A
    command `{"arrivals": [...], "max_steps": N, "stop_token": T}` starts a *stretch*:
    `begin(scheduler, command)` is called, the arrivals join at their steps (phases as in
    `Feeder`), and once every request finished and the scheduler is idle (its last batch
    processed) `end(scheduler, timed_out, tokens)` makes the reply, which is sent before the next
    command is read. A stretch that runs `max_steps` iterations of a phase without finishing
    ends with `timed_out` and the loop exits after the reply (the engine is not reused)."""

    def __init__(self, outputs: Outputs, channel, *, begin, end, on_first=None, make=None):
        super().__init__([], outputs, max_steps=1, stop_token=-1, on_first=on_first, make=make)
        self.channel = channel
        self.begin = begin
        self.end = end
        self.active = False

    def _exit(self, scheduler) -> list:
        if not hasattr(scheduler, "gracefully_exit"):
            raise _Stop()
        scheduler.gracefully_exit = True
        return []

    def arrivals(self, scheduler) -> list:
        k = self.step
        self.step += 1
        self.outputs.drain()
        if self.active:
            done = len(self.outputs.finished) >= self.total
            timed_out = not done and k - self.phase_start >= self.max_steps
            if not done and not timed_out:
                return self._release(k)
            if done and not is_idle(scheduler):
                return []                    # the loop processes its last batch first
            self.active = False
            self.outputs.drain()
            self.channel.send(self.end(scheduler, timed_out, dict(self.outputs.tokens)))
            if timed_out:
                return self._exit(scheduler)
        command = self.channel.recv()
        if command is None or command.get("op") == "close":
            return self._exit(scheduler)
        command = self.begin(scheduler, command) or command
        self.outputs.tokens.clear()
        self.outputs.finished.clear()
        self.pending = sorted(command["arrivals"], key=lambda a: (a.phase, a.step))
        self.total = len(self.pending)
        self.max_steps = command["max_steps"]
        self.stop_token = command["stop_token"]
        self.phase = self.pending[0].phase if self.pending else 0
        self.phase_start = k
        self.phase_starts = [k]
        self._released = set()
        self.active = True
        return self._release(k)

    def _release(self, k: int) -> list:
        if self.pending and self.pending[0].phase != self.phase \
                and self._released <= self.outputs.finished:
            self.phase = self.pending[0].phase
            self.phase_start = k
            self.phase_starts.append(k)
        now = []
        while self.pending and self.pending[0].phase == self.phase \
                and self.pending[0].step <= k - self.phase_start:
            now.append(self.pending.pop(0))
        self._released.update(a.rid for a in now)
        return [self.make(a, self.stop_token) for a in now]


class _Pipe:
    """The launcher's pipe: `run_scheduler_process` sends the scheduler's init info on it, once
    the scheduler is built (its graphs captured) and before its event loop starts."""

    def __init__(self):
        self.info = None
        self.sent_at = None

    def send(self, info):
        self.info = info
        self.sent_at = time.perf_counter()


# Seconds of the last `serve` per phase (bench/bench_sglang.py): building the scheduler (model
# load, pools, graph capture) and running the event loop.
TIMINGS: dict = {}


@contextlib.contextmanager
def patched(owner, name, value):
    """`owner.name = value` for a block; the old value (or its absence) comes back after."""
    had = name in vars(owner)
    old = vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, old)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def _own_process_title():
    """sglang names its scheduler process (`sglang::scheduler`); here that is the user's
    process, whose title is given back afterwards."""
    try:
        import setproctitle
    except ImportError:
        yield
        return
    title = setproctitle.getproctitle()
    try:
        yield
    finally:
        setproctitle.setproctitle(title)


@contextlib.contextmanager
def _no_parent_signal():
    """`run_scheduler_process` SIGQUITs its parent when the scheduler raises; here the parent is
    the user's shell. The exception itself still propagates (see `serve`)."""
    owner, name = surface.PARENT.owner_and_name()

    class _Parent:
        def send_signal(self, *args):
            pass

    stand_in = types.SimpleNamespace(Process=lambda *a, **k: types.SimpleNamespace(
        parent=lambda: _Parent()))
    with patched(owner, name, stand_in):
        yield


class SchedulerFailed(RuntimeError):
    """sglang's scheduler raised; its own handler logged the traceback and returned."""


@contextlib.contextmanager
def _catch_scheduler_errors():
    """`run_scheduler_process` logs a scheduler exception and returns; the harness must see it
    (a run that stopped early is not a clean run), so the logged traceback is kept."""
    logger = logging.getLogger(surface.SCHEDULER)
    errors = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.ERROR and "exception" in record.getMessage().lower():
                errors.append(record.getMessage())
    handler = Keep()
    logger.addHandler(handler)
    try:
        yield errors
    finally:
        logger.removeHandler(handler)


def serve(shape: Shape, arrivals, *, max_steps: int, stop_token: int = -1, on_start=None,
          feeder=None, on_done=None):
    """Start sglang's scheduler process for `shape`, feed it `arrivals`, run its event loop until
    every request finished; returns ({rid: token ids}, the scheduler's init info). `on_start`
    is called with the scheduler before its first loop iteration, `on_done` once every request
    finished, before the loop is asked to exit (sglang's shutdown then releases host memory).
    `feeder(outputs, on_start)`,
    if given, makes the feeder instead (`StretchFeeder`: schedules from a channel)."""
    sa = server_args(shape)
    PortArgs = _need("sglang.srt.server_args", "PortArgs")
    port_args = PortArgs.init_new(sa)
    entry = surface.ENTRY.get()
    pipe = _Pipe()
    kw = {}
    for name, param in inspect.signature(entry).parameters.items():
        if name == "server_args":
            kw[name] = sa
        elif name == "port_args":
            kw[name] = port_args
        elif name == "pipe_writer":
            kw[name] = pipe
        elif name == "dp_rank":
            kw[name] = None
        elif name == "gpu_id" or (name.endswith("_rank") and not name.startswith("display_")):
            kw[name] = 0
        elif param.default is inspect.Parameter.empty:
            raise mismatch(f"run_scheduler_process takes {name!r}, which the front door does "
                           "not know how to fill")
    outputs = Outputs(port_args)
    feeder = Feeder(arrivals, outputs, max_steps=max_steps, stop_token=stop_token,
                    on_first=on_start, on_done=on_done) if feeder is None \
        else feeder(outputs, on_start)
    started = time.perf_counter()
    try:
        with _own_process_title(), _no_parent_signal(), _catch_scheduler_errors() as errors, \
                feeder.install():
            try:
                entry(**kw)
            except _Stop:
                pass
        if errors:
            raise SchedulerFailed(errors[0].splitlines()[-1] if errors[0] else "scheduler error")
        if pipe.info is None:
            raise SchedulerFailed("the scheduler stopped before it was constructed")
        import torch
        torch.get_device_module("cuda").synchronize()
        outputs.drain()
        TIMINGS.update(construction=pipe.sent_at - started,
                       loop=time.perf_counter() - pipe.sent_at, iterations=feeder.step)
    finally:
        outputs.close()
    return {rid: outputs.tokens.get(rid, []) for rid in sorted(a.rid for a in arrivals)}, pipe.info
