"""torch.cuda routing on sim: a program written for a GPU runs unchanged on a CPU.

For the session (and restored exactly afterwards) the sim backend stands in for a one-GPU machine:

* `torch.cuda.<name>` for the names in `CUDA_NAMES`, `torch.get_device_module("cuda")` and
  `torch.get_device_module()` answer with the sim device module;
* `"cuda"` placements become sim device tensors: factory `device=` arguments (rewritten in the
  dispatch mode, `Interceptor`), `.cuda()`, `.to("cuda")`, `torch.tensor(..., device="cuda")`,
  `torch.as_tensor`, `Tensor.new_tensor`, `torch.set_default_device("cuda")`, `with
  torch.device("cuda")`, and random generators (`torch.Generator(device="cuda")` draws on the
  host, where sim device memory lives);
* a one-rank `torch.distributed` world asked for on NCCL, which a CPU build of torch lacks, is
  made on gloo (`init_process_group`, `new_group`): collectives of one rank move no data;
* CPU placements are host memory, as on a GPU machine: `.cpu()` and `.to("cpu")` of a device
  tensor make a new host tensor through a copy on the current stream (`non_blocking=True` leaves
  the host unsynchronized, so reading the result before a sync is RC004).

* sim device tensors say they are on `cuda:0` (`t.device`, `t.is_cuda`, `t.is_cpu`,
  `t.get_device()`), so `torch.zeros(n, device=x.device)` places on the device like x and code
  that branches on the device takes its GPU branch. Tensors from before the session keep
  their own device.

What routing cannot reach: names bound before the session started (`from torch.cuda import
Stream`; `racecheck exec` and the start-up hook start routing before the program's own imports),
C++ extensions that call the CUDA runtime, and the device C++ code sees, which stays the CPU.
Engines that decide platform features at import (`_is_cuda = is_cuda()` globals, as sglang does)
need those flags set by the scenario that drives them.
"""
from __future__ import annotations

import torch

CUDA_NAMES = (
    "Stream", "Event", "CUDAGraph", "graph", "StreamContext", "current_stream", "default_stream",
    "stream", "set_stream", "synchronize", "is_available", "device_count", "current_device",
    "set_device", "get_device_name", "get_device_capability", "get_device_properties",
    "mem_get_info", "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "reset_peak_memory_stats", "is_current_stream_capturing", "graph_pool_handle",
    "is_initialized", "init", "_lazy_init", "device", "manual_seed", "manual_seed_all", "_sleep",
    "cudart",
)
_CPU = torch.device("cpu")
_CUDA0 = torch.device("cuda", 0)


def is_cuda_device(d) -> bool:
    """Does a device argument (str, torch.device, int index) name a CUDA device?"""
    if d is None:
        return False
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return isinstance(d, int) and not isinstance(d, bool)


class _Patches:
    """Attribute patches undone in reverse order; absent attributes are deleted again."""

    def __init__(self):
        self.undo = []

    def set(self, owner, name, value) -> None:
        had = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, value)
        self.undo.append((lambda: setattr(owner, name, old)) if had
                         else (lambda: delattr(owner, name)))


class Router:
    """Placement rules for one session: which transfers are copies, which memory is host."""

    def __init__(self, backend):
        self.backend = backend
        self.registry = backend.footprints.registry

    def is_device(self, t: torch.Tensor) -> bool:
        return not self.registry.is_host(t)

    def is_registered_device(self, t: torch.Tensor) -> bool:
        """Device memory the session has seen (a tensor from before the session is not)."""
        return self.registry.is_known_device(t)

    def to_device(self, t: torch.Tensor, dtype, non_blocking: bool, memory_format):
        """A host tensor's H2D copy into new device memory on the current stream."""
        out = torch.empty_like(t, dtype=dtype or t.dtype, device="cuda",
                               memory_format=memory_format or torch.preserve_format)
        out.copy_(t, non_blocking=non_blocking)
        return out

    def to_host(self, t: torch.Tensor, dtype, non_blocking: bool, memory_format):
        """A device tensor's D2H copy into new host memory on the current stream."""
        with self.backend.allocating_host():
            out = torch.empty_like(t, dtype=dtype or t.dtype,
                                   memory_format=memory_format or torch.preserve_format)
            self.registry.lookup(out, host=True)
        out.copy_(t, non_blocking=non_blocking)
        return out

    def created(self, t: torch.Tensor, on_device: bool) -> torch.Tensor:
        """A tensor made from host data (torch.tensor, as_tensor): its memory kind, and for device
        memory the blocking upload on the current stream."""
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return t
        if not on_device:
            self.registry.lookup(t, host=True)
            return t
        # the data is host memory (a pageable staging tensor): the upload is a blocking H2D
        # copy, which on a GPU synchronizes the host with the current stream (ATen's copy_ with
        # non_blocking=False), so work issued afterwards on any stream is ordered after it
        src = t
        if self.registry.is_known_device(t):
            from torch.utils._python_dispatch import _disable_current_modes
            with _disable_current_modes():
                src = t.clone()                # untraced: the staging copy is host work
        self.registry.lookup(src, host=True)
        out = torch.empty_like(t, device="cuda")
        out.copy_(src)       # through the dispatch mode: a Copy, then the host waits
        return out


def route_cuda_to(backend) -> list:
    """Install the routing for `backend` (a SimBackend); returns the undo steps."""
    p = _Patches()
    dm = backend.module
    router = Router(backend)
    for name in CUDA_NAMES:
        p.set(torch.cuda, name, getattr(dm, name))
    get_device_module = torch.get_device_module

    def routed_get_device_module(device=None):
        if device is None or is_cuda_device(device):
            return dm
        return get_device_module(device)
    p.set(torch, "get_device_module", routed_get_device_module)

    _patch_tensor_methods(p, router)
    _patch_constructors(p, router)
    _patch_generator(p)
    _patch_process_groups(p)
    backend.routes_cuda = True
    p.undo.append(lambda: setattr(backend, "routes_cuda", False))
    return p.undo


def _patch_tensor_methods(p: _Patches, router: Router) -> None:
    T = torch.Tensor
    orig_to, orig_cpu, orig_cuda, orig_new_tensor = T.to, T.cpu, T.cuda, T.new_tensor
    parse_to = torch._C._nn._parse_to

    def to(self, *args, **kwargs):
        if args and isinstance(args[0], torch.dtype) and "device" not in kwargs:
            return orig_to(self, *args, **kwargs)          # a dtype conversion: the common case
        copy = kwargs.pop("copy", False)
        device, dtype, non_blocking, memory_format = parse_to(*args, **kwargs)
        if device is None:
            return orig_to(self, *args, copy=copy, **kwargs)
        if is_cuda_device(device):
            if router.is_device(self):
                return orig_to(self, dtype=dtype, non_blocking=non_blocking, copy=copy,
                               memory_format=memory_format or torch.preserve_format) \
                    if dtype is not None or copy else self
            return router.to_device(self, dtype, non_blocking, memory_format)
        if device.type == "cpu" and router.is_device(self):
            return router.to_host(self, dtype, non_blocking, memory_format)
        return orig_to(self, *args, copy=copy, **kwargs)

    def cpu(self, memory_format=torch.preserve_format):
        if router.is_device(self):
            return router.to_host(self, None, False, memory_format)
        return orig_cpu(self, memory_format=memory_format)

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        if router.is_device(self):
            return self
        return router.to_device(self, None, non_blocking, memory_format)

    def new_tensor(self, data, *args, **kwargs):
        device = kwargs.get("device")
        on_device = is_cuda_device(device) or (device is None and router.is_device(self))
        kwargs["device"] = _CPU
        return router.created(orig_new_tensor(self, data, *args, **kwargs), on_device)

    for name, fn, orig in (("to", to, orig_to), ("cpu", cpu, orig_cpu), ("cuda", cuda, orig_cuda),
                           ("new_tensor", new_tensor, orig_new_tensor)):
        fn.__name__ = name
        fn.__wrapped__ = orig
        p.set(T, name, fn)
    base = torch._C.TensorBase.__dict__
    real_device, real_is_cpu = base["device"], base["is_cpu"]
    orig_get_device = T.get_device
    known = router.is_registered_device

    def device(self):
        return _CUDA0 if known(self) else real_device.__get__(self)

    def is_cpu(self):
        return not known(self) and real_is_cpu.__get__(self)

    def get_device(self):
        return 0 if known(self) else orig_get_device(self)
    get_device.__wrapped__ = orig_get_device
    p.set(T, "is_cuda", property(known, doc="True for sim device memory"))
    p.set(T, "device", property(device, doc="cuda:0 for sim device memory"))
    p.set(T, "is_cpu", property(is_cpu, doc="False for sim device memory"))
    p.set(T, "get_device", get_device)


def _patch_constructors(p: _Patches, router: Router) -> None:
    def wrap(name):
        orig = getattr(torch, name)

        def construct(data, *args, **kwargs):
            device = kwargs.get("device")
            if isinstance(data, torch.Tensor) and name != "tensor":
                if is_cuda_device(device):
                    kwargs.pop("device")
                    return orig(data, *args, **kwargs).cuda()
                return orig(data, *args, **kwargs)
            on_device = is_cuda_device(device) or (device is None and _default_is_cuda())
            kwargs["device"] = _CPU
            if kwargs.pop("pin_memory", False) and on_device:
                raise RuntimeError("pin_memory=True is only for host tensors")
            return router.created(orig(data, *args, **kwargs), on_device)
        construct.__name__ = name
        construct.__wrapped__ = orig
        return construct

    for name in ("tensor", "as_tensor", "asarray"):
        p.set(torch, name, wrap(name))


def _patch_generator(p: _Patches) -> None:
    Generator = torch.Generator

    class RoutedGenerator(Generator):
        """`torch.Generator(device="cuda")` on sim: a host generator (a subclass, so
        `isinstance(g, torch.Generator)` holds for every generator made meanwhile)."""

        def __new__(cls, device="cpu"):
            return Generator.__new__(cls, _CPU if is_cuda_device(device) else device)

        def __init__(self, device="cpu"):
            pass

    RoutedGenerator.__name__ = RoutedGenerator.__qualname__ = "Generator"
    p.set(torch, "Generator", RoutedGenerator)


def _patch_process_groups(p: _Patches) -> None:
    import torch.distributed as dist
    if not dist.is_available() or dist.is_nccl_available():
        return

    def on_gloo(make):
        def routed(*args, **kwargs):
            backend = kwargs.get("backend", args[0] if args and make is init else None)
            if backend is not None and "nccl" in str(backend).lower():
                gloo = str(backend).lower().replace("nccl", "gloo")
                if "backend" in kwargs:
                    kwargs["backend"] = gloo
                else:
                    args = (gloo,) + tuple(args[1:])
            return make(*args, **kwargs)
        routed.__name__ = make.__name__
        routed.__wrapped__ = make
        return routed

    init, new_group = dist.init_process_group, dist.new_group
    p.set(dist, "init_process_group", on_gloo(init))
    p.set(dist, "new_group", on_gloo(new_group))


def _default_is_cuda() -> bool:
    """`torch.set_default_device("cuda")` or `with torch.device("cuda")` is in effect (their
    DeviceContext adds `device="cuda"` to factory calls, which the dispatch mode reroutes)."""
    from torch.utils import _device
    return is_cuda_device(getattr(_device, "CURRENT_DEVICE", None))
