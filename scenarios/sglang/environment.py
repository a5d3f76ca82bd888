"""The installed sglang, imported on a CPU-only runner, and the internals the scenario touches.

sglang is written for GPU servers; three things make its decode loop importable and runnable
here, all done in this module and nowhere else:

* Triton kernels run in Triton's CPU interpreter: `TRITON_INTERPRET=1` must be set before the
  first module that defines a kernel is imported (triton decides at decoration time).
* Two multimodal modules import torchvision, whose PyPI wheel does not load next to a CPU torch;
  the decode path never calls them, so a meta-path finder gives them stand-in modules.
* sglang reads its configuration from a process-wide runtime context (ServerArgs, a parallel
  context); `configure()` publishes a single-rank one.

Every sglang name the scenario uses is fetched through `Engine.need()`, so an upstream refactor
fails with one line naming what moved and the version the scenario was tested with.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types

from racecheck.errors import UsageError

TESTED = ("0.5.23",)            # sglang releases this scenario was written and tested against
STUBBED = ("sglang.srt.multimodal.internvl_utils", "sglang.srt.configs.deepseek_ocr")
NATIVE = ("sgl_kernel",)        # imported unguarded where sglang runs on CUDA


class EngineMismatch(UsageError):
    """The installed sglang lacks something the scenario drives (a refactor moved it)."""


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def mismatch(what: str) -> EngineMismatch:
    version = installed_version() or "?"
    return EngineMismatch(f"sglang {version}: {what} (the sglang-eagle-v2 scenario drives "
                          f"sglang {' / '.join(TESTED)}; install that version or update "
                          "scenarios/sglang)")


class _StandIn(types.ModuleType):
    """A module the decode path imports but never uses (torchvision-backed multimodal helpers)."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__module__": self.__name__,       # config classes are registered
                                "model_type": f"racecheck-stand-in-{name}"}) \
            if name[:1].isupper() else (lambda *a, **k: None)
        setattr(self, name, value)
        return value


class _Missing:
    """A name from a native kernel package that is not installed: attributes chain (import-time
    tables like `scalar_types.uint4b8`), a call says what is missing instead of computing."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._path} is a native kernel that is not installed here; the "
                           "sglang-eagle-v2 scenario does not support the path that calls it")

    def __repr__(self):
        return f"<not installed: {self._path}>"


class _NativeStandIn(types.ModuleType):
    """A native kernel package the GPU image lacks (sgl_kernel): sglang imports names from it
    where `_is_cuda`; they are `_Missing` stand-ins."""

    __version__ = "0"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _Missing(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    native: tuple = ()         # top-level native packages stood in for (GPU runs only)

    def find_spec(self, fullname, path, target=None):
        if fullname in STUBBED or fullname.split(".")[0] in self.native:
            spec = importlib.machinery.ModuleSpec(fullname, self)
            if fullname.split(".")[0] in self.native:
                spec.submodule_search_locations = []
            return spec
        return None

    def create_module(self, spec):
        if spec.name.split(".")[0] in self.native:
            return _NativeStandIn(spec.name)
        return _StandIn(spec.name)

    def exec_module(self, module):
        pass


_FINDER = _StandInFinder()


class Engine:
    """The imported sglang modules, fetched by name (see the module docstring)."""

    MODULES = {
        "overlap_utils": "sglang.srt.managers.overlap_utils",
        "scheduler": "sglang.srt.managers.scheduler",
        "schedule_batch": "sglang.srt.managers.schedule_batch",
        "eagle_worker_v2": "sglang.srt.speculative.eagle_worker_v2",
        "eagle_worker_common": "sglang.srt.speculative.eagle_worker_common",
        "eagle_utils": "sglang.srt.speculative.eagle_utils",
        "eagle_info": "sglang.srt.speculative.eagle_info",
        "spec_utils": "sglang.srt.speculative.spec_utils",
        "spec_info": "sglang.srt.speculative.spec_info",
        "forward_batch_info": "sglang.srt.model_executor.forward_batch_info",
        "cuda_graph_buffer_registry": "sglang.srt.model_executor.cuda_graph_buffer_registry",
        "decode_cuda_graph_runner": "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
        "cuda_graph_config": "sglang.srt.model_executor.cuda_graph_config",
        "logits_processor": "sglang.srt.layers.logits_processor",
        "base_attn_backend": "sglang.srt.layers.attention.base_attn_backend",
        "memory_pool": "sglang.srt.mem_cache.memory_pool",
        "allocator_token": "sglang.srt.mem_cache.allocator.token",
        "radix_cache": "sglang.srt.mem_cache.radix_cache",
        "cache_init_params": "sglang.srt.mem_cache.cache_init_params",
        "mem_cache_common": "sglang.srt.mem_cache.common",
        "kv_index_translator": "sglang.srt.mem_cache.kv_index_translator",
        "sampling_params": "sglang.srt.sampling.sampling_params",
        "sampling_batch_info": "sglang.srt.sampling.sampling_batch_info",
        "parallel_state": "sglang.srt.distributed.parallel_state",
        "runtime_context": "sglang.srt.runtime_context",
        "server_args": "sglang.srt.server_args",
        "platforms": "sglang.srt.platforms",
        "platform_interface": "sglang.srt.platforms.interface",
        "cache_locs": "sglang.kernels.ops.speculative.cache_locs",
        "spec_tree": "sglang.kernels.ops.speculative.spec_tree",
        "environ": "sglang.srt.environ",
        "utils_common": "sglang.srt.utils.common",
        "allocation": "sglang.srt.mem_cache.allocation",
        "graph_shared_output": "sglang.srt.model_executor.graph_shared_output",
        "model_runner": "sglang.srt.model_executor.model_runner",
        "tp_worker": "sglang.srt.managers.tp_worker",
        "batch_result_processor":
            "sglang.srt.managers.scheduler_components.batch_result_processor",
        "draft_cuda_graph_runner": "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
        "input_buffers": "sglang.srt.model_executor.input_buffers",
        "graph_pool": "sglang.srt.model_executor.runner_utils.pool",
        "draft_extend_cuda_graph_runner":
            "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    }

    def __init__(self):
        self.version = installed_version()
        self._modules: dict = {}
        self.assembled: set = set()

    def module(self, key: str):
        mod = self._modules.get(key)
        if mod is None:
            name = self.MODULES.get(key, key)
            try:
                mod = importlib.import_module(name)
            except ImportError as exc:
                raise mismatch(f"cannot import {name} ({exc})") from None
            self._modules[key] = mod
        return mod

    def assemble(self, key: str, cls_name: str, **attributes):
        """An instance of an sglang class made without running its __init__ (which would load
        weights or join process groups), holding exactly `attributes`: what the decode path
        reads. A later read of anything else names the attribute (see `explain`)."""
        import dataclasses
        cls = self.need(key, cls_name)
        if dataclasses.is_dataclass(cls):          # components are dataclasses: their own __init__
            try:
                return cls(**attributes)
            except TypeError as exc:
                raise mismatch(f"{cls.__module__}.{cls_name}({exc})") from None
        obj = cls.__new__(cls)
        for name, value in attributes.items():
            setattr(obj, name, value)
        self.assembled.add(cls)
        return obj

    def explain(self, exc: AttributeError):
        """An AttributeError from an assembled object, as the one-line mismatch it is."""
        obj = getattr(exc, "obj", None)
        if obj is None:
            return None
        what = getattr(type(obj), "stands_in_for", None)
        if type(obj) in self.assembled:
            what = f"{type(obj).__module__}.{type(obj).__name__}"
        if what is None:
            return None
        return mismatch(f"sglang reads {what}.{exc.name}, which the scenario does not provide")

    def need(self, key: str, attr: str):
        """`module.attr` (dotted attr for class members), or one clear line if it is gone."""
        obj = self.module(key)
        path = self.MODULES[key]
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise mismatch(f"{path} has no {attr!r}")
            obj = getattr(obj, part)
            path = f"{path}.{part}"
        return obj


_engine: Engine | None = None


def load(interpret: bool = True) -> Engine:
    """Import sglang's spec-v2 decode path once per process (see the module docstring);
    `interpret`: Triton kernels run in the CPU interpreter (sim), else compiled for the GPU."""
    global _engine
    if _engine is not None:
        return _engine
    if installed_version() is None:
        raise UsageError("the sglang-eagle-v2 scenario needs sglang: pip install racecheck[sglang] "
                         "(see docs/SGLANG.md for a CPU-only runner)")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        _FINDER.native = tuple(n for n in NATIVE if importlib.util.find_spec(n) is None)
    os.environ.setdefault("SGLANG_ENABLE_OVERLAP_PLAN_STREAM", "1")
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    engine = Engine()
    import logging
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)       # sglang logs GPU probes it cannot do here
        try:
            for key in Engine.MODULES:
                engine.module(key)
        finally:
            logging.disable(previous)
    _engine = engine
    return engine


@contextlib.contextmanager
def patched(owner, name: str, value):
    """Set `owner.name` for a block; restore it (or delete it) afterwards."""
    own = getattr(owner, "__dict__", None)        # None: a slotted object
    had = own is None or name in own
    old = getattr(owner, name) if own is None else own.get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, old)
        else:
            delattr(owner, name)


def configure(engine: Engine, *, topk: int, steps: int, draft_tokens: int, graphs: bool,
              graph_bs: list, max_running: int, context_len: int):
    """Publish sglang's process-wide configuration for one single-rank run; returns ServerArgs.

    The scheduler, workers and kernels read it through `get_spec()`, `get_schedule()`, ...;
    a single rank has no TP/PP groups, so the parallel context gets single-rank stand-ins."""
    ServerArgs = engine.need("server_args", "ServerArgs")
    CudaGraphConfig = engine.need("cuda_graph_config", "CudaGraphConfig")
    graph_cfg = {"decode": {"backend": "full" if graphs else "disabled", "bs": list(graph_bs)},
                 "prefill": {"backend": "disabled"}}
    sa = ServerArgs(model_path="racecheck-tiny-model", speculative_algorithm="EAGLE",
                    speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=draft_tokens, device="cuda",
                    max_running_requests=max_running, context_length=context_len, page_size=1,
                    cuda_graph_config=CudaGraphConfig.from_dict(graph_cfg))
    rc = engine.module("runtime_context")
    rc.get_context().set_server_args(sa)
    rc.get_parallel().override_permanently(**_single_rank(rc))
    return sa


class _SingleRankGroup:
    """A process group of one: collectives are the identity."""

    stands_in_for = "sglang.srt.distributed.parallel_state.GroupCoordinator (one rank)"

    world_size = 1
    rank = 0
    rank_in_group = 0
    is_first_rank = True
    is_last_rank = True
    device_group = None
    cpu_group = None
    ca_comm = None
    ranks = (0,)

    def __getattr__(self, name):
        if name.endswith("_comm"):         # a group of one has no communicators
            return None
        raise AttributeError(name)

    def barrier(self):
        pass

    def broadcast(self, tensor, *args, **kwargs):
        return tensor

    def all_reduce(self, tensor, *args, **kwargs):
        return tensor

    def all_gather(self, tensor, *args, **kwargs):
        return tensor


def _single_rank(rc) -> dict:
    group = _SingleRankGroup()
    values = {}
    for name in rc._parallel_fields():
        if name.endswith("_group"):
            values[name] = group
        elif name.endswith(("_size", "_ranks")) or name in ("nnodes", "num_dp_ranks"):
            values[name] = 1
        elif name.endswith(("_rank", "_offset")):
            values[name] = 0
        elif name.startswith(("enable_", "disable_")) or name.endswith("_enabled") \
                or name == "dcp_replicate_q_proj":
            values[name] = False
    values.update(cp_strategy=None, dcp_comm_backend=None, load_balance_method="round_robin",
                  dist_init_addr=None, dist_timeout=None, nccl_port=0, gated_launch_port=None,
                  pp_async_batch_depth=0, pp_max_micro_batch_size=None,
                  elastic_ep_initial_size=None, moe_dense_tp_size=None)
    return values


@contextlib.contextmanager
def single_rank_graph_capture(engine: Engine):
    """sglang's `graph_capture()` coordinates TP/PP groups; on one rank it is: wait for the
    current stream, capture on a side stream. Installed where the graph runners imported it."""
    import torch
    ps = engine.module("parallel_state")
    GraphCaptureContext = engine.need("parallel_state", "GraphCaptureContext")

    @contextlib.contextmanager
    def graph_capture(stream=None):
        dm = torch.get_device_module("cuda")
        if stream is None:
            stream = dm.Stream()
        current = dm.current_stream()
        if current is not stream:
            stream.wait_stream(current)
        with dm.stream(stream):
            yield GraphCaptureContext(stream)

    owners = [ps] + [m for m in list(sys.modules.values())
                     if isinstance(m, types.ModuleType) and m is not ps
                     and vars(m).get("graph_capture") is ps.graph_capture]
    with contextlib.ExitStack() as stack:
        for m in owners:
            stack.enter_context(patched(m, "graph_capture", graph_capture))
        yield


@contextlib.contextmanager
def padding_sites(engine: Engine, sites):
    """Graph-input padding writes as synchronization sites: each `GraphSlot.reset_padding` of the
    buffer registry is the site `...fill_from:padding(<slot>)#0`, dropped like a wait (the
    padded rows then keep what the previous replay left there)."""
    GraphSlot = engine.need("cuda_graph_buffer_registry", "GraphSlot")
    reset_padding = GraphSlot.reset_padding
    Policy = engine.need("cuda_graph_buffer_registry", "PaddingPolicy")
    writes = (Policy.ZERO, Policy.FILL_SENTINEL)

    def reset_padding_site(slot, raw_n, padded_n):
        if raw_n < padded_n and slot.buffer is not None and slot.padding_policy in writes \
                and sites.visit("padding", f"padding({slot.name})", sys._getframe(1)):
            return None
        return reset_padding(slot, raw_n, padded_n)

    with patched(GraphSlot, "reset_padding", reset_padding_site):
        yield


@contextlib.contextmanager
def fresh_process(engine: Engine):
    """Each run is a new server process: sglang's process-wide graph input-buffer pool and its
    process resources (graph memory pool, graph capture stream, named streams) start empty (and are restored afterwards), so one run's buffers never leak into
    the next (they would belong to another racecheck session)."""
    buffers = engine.module("input_buffers")
    engine.need("input_buffers", "_forward_input_buffer_pool")
    Resources = engine.need("runtime_context", "Resources")
    context = engine.need("runtime_context", "get_context")()
    if not hasattr(context, "resources"):
        raise mismatch("sglang.srt.runtime_context.RuntimeContext has no 'resources'")
    with patched(buffers, "_forward_input_buffer_pool", {}), \
            patched(context, "resources", Resources()):
        yield


@contextlib.contextmanager
def quiet(engine: Engine):
    """A server's start-up chatter (graph capture progress bars, backend notices) stays out of a
    checker's output: sglang's own log records below errors and its capture bars are muted."""
    import logging

    import tqdm as _tqdm
    runner = engine.module("decode_cuda_graph_runner")
    bars = types.SimpleNamespace(tqdm=lambda *a, **k: _tqdm.tqdm(*a, **dict(k, disable=True)))
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with patched(runner, "tqdm", bars):
            yield
    finally:
        logging.disable(previous)
