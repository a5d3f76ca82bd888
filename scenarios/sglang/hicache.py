"""sglang's hierarchical KV cache (HiCache) through the front door: what a CPU run needs.

HiCache is a `ServerArgs` switch (`enable_hierarchical_cache`, the host pool's ratio or size,
the write policy, the host layout and I/O backend): sglang itself builds `HiRadixCache`, its
`HiCacheController`, the host KV pool (host memory registered with `cudaHostRegister`) and the
`L2TransferEngine` with its `device_to_host_stream` and `host_to_device_stream`; the scheduler
sets the controller's load and write fences to the forward stream. Nothing of that is built or
copied here. What a CPU run adds, for the run only:

* `device_module`: `l2_transfer.py` and `cache_controller.py` take their device module once at
  import (`get_device_module()`: `torch.cpu` on a CPU, whose streams and events do nothing);
  they get the one sglang takes on CUDA (`torch.cuda`, routed to sim), as a flavour sets
  sglang's other import-time platform flags.
* the KV transfer kernels: on CUDA the host pool calls `sgl_kernel.kvcacheio`'s ops (the JIT
  HiCache kernels are taken only where sglang's own `can_use_hicache_jit_kernel` allows, which
  needs `_is_cuda`; the ops are sglang's fallback on CUDA). `KVCACHEIO` below stands in for
  each op the host pool calls with a torch version that does the same copies as indexed torch
  ops on the current stream (the controller's transfer stream), so every row a transfer reads
  or writes is an exact footprint (host rows of the pinned pool, device rows of the KV buffers).
  The all-layer ops take pointer tables (`make_kernel_ptr_table`): a stand-in resolves each
  pointer to the tensor the calling host pool holds at that address, and fails if none does.
"""
from __future__ import annotations

import contextlib
import sys

from .engine_run import RUN_EXTENSIONS
from .server import patched

DEVICE_MODULE_OWNERS = ("sglang.srt.mem_cache.l2_transfer", "sglang.srt.managers.cache_controller")

L2_STREAMS = (
    ("device_to_host_stream", ("tree_cache.cache_controller.l2_transfer_engine."
                               "device_to_host_stream",
                               "tree_cache.cache_controller.write_stream")),  # before l2_transfer
    ("host_to_device_stream", ("tree_cache.cache_controller.l2_transfer_engine."
                               "host_to_device_stream",
                               "tree_cache.cache_controller.load_stream")),
)


# -- the kvcacheio ops, as torch (each copy an indexed op on the current stream) ----------------

def _rows(indices):
    import torch
    return indices.long() if indices.dtype != torch.long else indices


def _copy_rows(dst, dst_indices, src, src_indices) -> None:
    """dst[dst_indices] = src[src_indices], one gather and one scatter (rows of either side may
    be host or device memory: the kernels read and write registered host memory directly)."""
    # no .to(): on sim both sides are CPU tensors underneath, and a device-to-host .to() would
    # add a synchronization the kernel does not make (it reads and writes through UVA)
    rows = src.index_select(0, _rows(src_indices))
    dst.index_copy_(0, _rows(dst_indices), rows)


def _caller_tensors() -> dict:
    """data_ptr -> tensor for the tensors the calling host pool holds (its device KV buffers and
    its per-layer host views), for the pointer-table ops."""
    frame = sys._getframe(2)
    pool = frame.f_locals.get("self")
    device_pool = frame.f_locals.get("device_pool")       # releases before 0.5.19 or so
    out = {}
    for owner, names in ((pool, ("device_k_buffers", "device_v_buffers", "k_data_refs",
                                 "v_data_refs")),
                         (device_pool, ("k_buffer", "v_buffer"))):
        for name in names:
            for t in getattr(owner, name, None) or ():
                out.setdefault(t.data_ptr(), t)
    return out


def _layers(table, known: dict, n: int) -> list:
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        ptrs = [int(p) for p in table.view(torch.int64)[:n].tolist()]
    missing = [p for p in ptrs if p not in known]
    if missing:
        raise RuntimeError(f"racecheck's kvcacheio stand-in: pointer {missing[0]:#x} is not a "
                           "buffer of the calling host pool")
    return [known[p] for p in ptrs]


def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size,
                          **_):
    _copy_rows(dst_k, dst_indices, src_k, src_indices)
    _copy_rows(dst_v, dst_indices, src_v, src_indices)


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id,
                                item_size, src_layout_dim, **_):
    _copy_rows(dst_k, dst_indices, src_k.select(1, layer_id), src_indices)
    _copy_rows(dst_v, dst_indices, src_v.select(1, layer_id), src_indices)


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices,
                          dst_indices, item_size, num_layers, **_):
    known = _caller_tensors()
    for src, dst in zip(_layers(src_k_layers, known, num_layers) +
                        _layers(src_v_layers, known, num_layers),
                        _layers(dst_k_layers, known, num_layers) +
                        _layers(dst_v_layers, known, num_layers)):
        _copy_rows(dst, dst_indices, src, src_indices)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
                                dst_indices, item_size, dst_layout_dim, num_layers, **_):
    known = _caller_tensors()
    for table, dst in ((src_k_layers, dst_k), (src_v_layers, dst_v)):
        for layer_id, src in enumerate(_layers(table, known, num_layers)):
            _copy_rows(dst.select(1, layer_id), dst_indices, src, src_indices)


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size, **_):
    for src, dst in zip(src_layers, dst_layers):
        _copy_rows(dst, dst_indices, src, src_indices)


KVCACHEIO = {f.__name__: f for f in (transfer_kv_per_layer, transfer_kv_per_layer_pf_lf,
                                     transfer_kv_all_layer, transfer_kv_all_layer_lf_pf,
                                     transfer_kv_direct)}


@contextlib.contextmanager
def stand_ins():
    """What a HiCache run on a CPU needs (the module docstring), for one run; sglang imported."""
    import importlib

    import torch

    from . import surface
    pool = next((t for t in surface.HICACHE_HOST_POOLS if t.exists()), None)
    if pool is None:
        raise surface.mismatch("no " + " or ".join(t.target for t in surface.HICACHE_HOST_POOLS)
                               + ": sglang-hicache drives sglang's host KV pool")
    with contextlib.ExitStack() as stack:
        device_module = torch.get_device_module("cuda")
        for name in DEVICE_MODULE_OWNERS:
            try:
                mod = importlib.import_module(name)
            except ImportError:             # l2_transfer.py is newer than 0.5.16
                continue
            if "device_module" in vars(mod):
                stack.enter_context(patched(mod, "device_module", device_module))
        mha, _ = pool.owner_and_name()
        for name, fn in KVCACHEIO.items():
            bound = vars(mha).get(name)
            # absent (the module imports the ops only on CUDA/HIP), or a name of the stood-in
            # sgl_kernel package (imports.py), which raises when called
            if bound is None or type(bound).__name__ == "_Missing":
                stack.enter_context(patched(mha, name, fn))
        yield


def name_streams(rc, scheduler) -> None:
    from .engine_run import _attr_path
    for label, paths in L2_STREAMS:
        for path in paths:
            obj = _attr_path(scheduler, path)
            if obj is not None:
                rc.name_stream(obj, label)
                break



# -- the scenario ------------------------------------------------------------------------------

# Three prompt families of 16 tokens (12 shared), one request every other loop step, under a
# device pool of 48 tokens: each family's prefix is backed up to host, evicted from the device
# by the next families' requests, and loaded back when its family comes round again.
DEFAULT_ARRIVALS = "0:1x3+16;2:1x3+16;4:1x3+16;6:1x3+16;8:1x3+16;10:1x3+16"
# write_through_selective backs a prefix up on its second hit: each family comes three times
SELECTIVE_ARRIVALS = ";".join(f"{2 * i}:1x3+16" for i in range(9))
# the reference keeps every prefix on the device (HiCache on, no eviction): loads from host
# there are none, so the tokens of the two runs agree only if what came back is what was written
REFERENCE_DEVICE_TOKENS = 2048
POLICIES = ("write_through", "write_through_selective", "write_back")


def _knobs():
    from . import KNOBS, _SCHEDULE_KNOBS
    from ..registry import Knob
    schedule = {k.name: k for k in _SCHEDULE_KNOBS}
    eagle = [k for k in KNOBS if k.name not in schedule]
    own = [
        Knob("speculative", False, "bool", "EAGLE v2 speculative decoding (the draft model's "
             "KV goes to host with the target's)"),
        Knob("write_policy", "write_through", "choice", "--hicache-write-policy: when device "
             "KV is backed up to host (write_through: on insert; write_through_selective: on a "
             "hit; write_back: on eviction)", choices=POLICIES),
        Knob("layout", "page_first", "choice", "--hicache-mem-layout of the host pool",
             choices=("page_first", "layer_first")),
        Knob("io_backend", "kernel", "choice", "--hicache-io-backend (kernel: the kvcacheio "
             "ops; direct: layer_first only here)", choices=("kernel", "direct")),
        Knob("device_tokens", 48, "int", "--max-total-tokens: the device KV pool (small enough "
             "that cached prefixes are evicted to host)", minimum=16, maximum=4096),
        Knob("host_ratio", 2, "int", "--hicache-ratio: host pool size per device pool size",
             minimum=1, maximum=8),
        Knob("families", 3, "int", "prompt families (request i shares family i mod N's prefix)",
             minimum=1, maximum=8),
        Knob("chunked_prefill", 0, "int", "--chunked-prefill-size (0: sglang's default, which "
             "no default prompt reaches): a longer prompt prefills in chunks, and the "
             "scheduler caches each chunk in the tree (a backup, with write_through) while the "
             "forward writing its KV may still run", minimum=0, maximum=4096),
    ]
    # with EAGLE a request waits for device memory longer (the draft's KV too): the cap on loop
    # iterations is only a guard, the loop ends when every request finished
    changed = {"arrivals": DEFAULT_ARRIVALS, "prefix_len": 12, "graphs": False,
               "max_steps": 300}
    out = []
    for k in _SCHEDULE_KNOBS:
        if k.name in changed:
            k = Knob(k.name, changed[k.name], k.type, k.help, k.choices, k.validator, k.minimum,
                     k.maximum)
        out.append(k)
    return own + out[:4] + eagle + out[4:]


def _resolve(cfg: dict) -> dict:
    from . import _resolve as resolve_eagle
    cfg = resolve_eagle(cfg)
    if cfg["io_backend"] == "direct" and cfg["layout"] != "layer_first":
        raise ValueError("io_backend direct runs here with layout layer_first (sglang turns "
                         "page_first into page_first_direct, whose ops have no stand-in yet)")
    return cfg


def server_args(cfg: dict) -> dict:
    """The HiCache flags of a run, as `python -m sglang.launch_server` takes them."""
    args = dict(enable_hierarchical_cache=True, hicache_ratio=float(cfg["host_ratio"]),
                hicache_write_policy=cfg["write_policy"], hicache_mem_layout=cfg["layout"],
                hicache_io_backend=cfg["io_backend"], max_total_tokens=cfg["device_tokens"])
    if cfg.get("chunked_prefill"):
        args["chunked_prefill_size"] = cfg["chunked_prefill"]
    return args


def _reference(cfg: dict) -> dict:
    return dict(cfg, device_tokens=REFERENCE_DEVICE_TOKENS, _reference=True)


TRANSFERS: dict = {}


def _run(cfg: dict, ctx) -> dict:
    from .engine_run import run_pipeline
    run_cfg = dict(cfg, server_args=server_args(cfg))
    TRANSFERS.clear()
    with _counting_transfers() as counted:
        out = run_pipeline(run_cfg, ctx)
    # the reference's device pool is larger (it evicts nothing), so its slots hold other
    # tokens (and float32 KV differs in its last bits across batch sizes): no slot-by-slot
    # comparison here; each run checks its own tiers instead (`kv_tiers`: host copy = device copy)
    out.pop("kv_cache", None)
    if counted and not cfg.get("_reference"):
        # how often KV went each way (the reference, which evicts nothing, has no such field,
        # so the differential oracle does not compare it)
        out["hicache"] = {"device_to_host": TRANSFERS.get("device_to_host", 0),
                          "host_to_device": TRANSFERS.get("host_to_device", 0)}
    return out


@contextlib.contextmanager
def _counting_transfers():
    """Counts the transfer engine's submissions (observation only: it calls sglang's own)."""
    import importlib

    from . import imports
    imports.install()
    try:
        mod = importlib.import_module("sglang.srt.mem_cache.l2_transfer")
    except ImportError:             # releases before the transfer engine: not counted
        yield False
        return
    Engine = mod.L2TransferEngine
    with contextlib.ExitStack() as stack:
        for direction in ("device_to_host", "host_to_device"):
            original = getattr(Engine, f"submit_{direction}")

            def counted(self, *args, _original=original, _key=direction, **kwargs):
                TRANSFERS[_key] = TRANSFERS.get(_key, 0) + 1
                return _original(self, *args, **kwargs)
            counted.__wrapped__ = original
            stack.enter_context(patched(Engine, f"submit_{direction}", counted))
        yield True


# What `racecheck fuzz sglang-hicache` draws (every value a ServerArgs setting sglang ships, or
# the traffic): the write policy, the host layout, the device pool and the host ratio, prompt
# families and a schedule of requests that come back to their family's prefix, and, exploring,
# graphs and EAGLE. The device pool stays >= 40 tokens: one request of the drawn shapes (a 16-
# token prompt, up to 4 new tokens, EAGLE's drafts) always fits.
DEVICE_TOKENS = (40, 48, 64, 96)
# each drawn knob and the sglang setting it is (as shipped means as shipped: none removes a
# synchronization sglang makes)
HICACHE_SHIPPED = {
    "write_policy": "--hicache-write-policy",
    "layout": "--hicache-mem-layout (page_first, sglang's default; layer_first)",
    "io_backend": "--hicache-io-backend (not drawn: kernel, the default)",
    "device_tokens": "--max-total-tokens",
    "host_ratio": "--hicache-ratio",
    "families": "the traffic: how many prompt prefixes requests share",
    "arrivals": "the traffic: one request every GAP loop steps, returning to its family",
    "graphs": "CUDA graphs on, or --disable-cuda-graph",
    "speculative": "--speculative-algorithm EAGLE (spec v2), or none",
    "chunked_prefill": "--chunked-prefill-size (sglang's default, or chunks of 8 tokens)",
}
HICACHE_DRAWN = ("arrivals", "write_policy", "layout", "io_backend", "device_tokens",
                 "host_ratio", "families", "graphs", "speculative", "flavour", "max_steps",
                 "graph_bs", "shared_prefix", "publish_delay_us", "chunked_prefill", "mrope")


def _hicache_strategy(sc, fixed: dict, explore: bool):
    from hypothesis import strategies as st

    @st.composite
    def overrides(draw):
        cfg = {}

        def pick(name, values):
            if name not in fixed:
                value = draw(st.sampled_from(values))
                if value != sc.knobs[name].default:
                    cfg[name] = value
        pick("write_policy", POLICIES)
        pick("layout", ("page_first", "layer_first"))
        pick("device_tokens", DEVICE_TOKENS)
        pick("host_ratio", (2, 1, 4))
        pick("families", (3, 1, 2, 4))
        pick("chunked_prefill", (0, 8))
        if "arrivals" not in fixed:
            n = draw(st.integers(3, 9))
            gap = draw(st.integers(1, 3))
            new = draw(st.integers(1, 4))
            plen = draw(st.integers(12, 16))
            cfg["arrivals"] = ";".join(f"{gap * i}:1x{new}+{plen}" for i in range(n))
        if explore:
            pick("graphs", (False, True))
            pick("speculative", (False, True))
        return cfg
    return overrides()


def _scenario():
    import os

    from ..registry import Scenario
    from . import _DIFF_FIELDS, _engine_version
    sc = Scenario(
        name="sglang-hicache",
        description="the installed sglang through its front door with the hierarchical KV "
                    "cache on (HiRadixCache, HiCacheController, the pinned host pool and its "
                    "device_to_host / host_to_device streams), under a device pool small "
                    "enough that shared prefixes go to host and come back",
        knobs=_knobs(), switches=[], variants=[], runner=_run, resolve=_resolve,
        reference=_reference, diff_fields=_DIFF_FIELDS,
        session_options=lambda cfg, device: {"route_cuda": device == "sim"},
        strategy=_hicache_strategy, drawn_knobs=HICACHE_DRAWN)
    sc.engine_version = _engine_version
    sc.known_findings = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                     "known-races.supp")
    sc.fresh_process = True
    sc.engine_modules = ("sglang.",)
    from . import engine_setup
    engine_setup(sc)
    # the reviewed sync mutation table of the tested release (docs/MUTATE_SGLANG.md)
    sc.mutate_baseline = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      "mutate-hicache-0.5.23.json")
    return sc


def _run_extension(cfg: dict):
    """The run's HiCache stand-ins and stream names, when the run turns HiCache on."""
    if not (cfg.get("server_args") or {}).get("enable_hierarchical_cache"):
        return None
    return stand_ins(), name_streams


RUN_EXTENSIONS.append(_run_extension)
SCENARIO = _scenario()
