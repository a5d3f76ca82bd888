"""A CPU stand-in for torch_npu's `torch.npu`: the `npu` backend's code path, testable anywhere.

    from racecheck.instrumentation import npu_standin
    npu = npu_standin.install()          # registers device type "npu" and `torch.npu` (once)
    with racecheck.session(device="npu", device_module=npu) as rc:
        x = torch.zeros(8, device="npu")  # device type "npu", data in a CPU tensor
        ...

What it mimics (the API surface of torch_npu 2.x, which copies `torch.cuda`'s):
* tensors of device type "npu" (PrivateUse1 renamed, as torch_npu does): a wrapper tensor whose
  data live in a CPU tensor; every op runs eagerly on the CPU in issue order;
* `Stream` (a `torch.Stream`: `stream_id`, `device_index`, `npu_stream` handle, `wait_event`,
  `wait_stream`, `record_event`, `query`, `synchronize`), `Event` (created lazily at first record,
  `npu_event`, `record`, `wait`, `query`, `synchronize`, `elapsed_time`; a destroyed event's
  handle goes to the next event created, as CUDA's runtime does), `current_stream`,
  `default_stream`, `set_stream`, `stream(s)`, `synchronize`, `device_count` (2), `set_device`,
  `device(i)`, `NPUGraph` / `graph` (capture records ops, replay re-runs them), `_sleep(cycles)`
  (a virtual clock per stream that events read, so delay calibration has something to measure);
* `_C._npu_getCurrentStream(device)` and `_C._activate_npu_trace(mode)`;
* `_npu_trace`: torch_npu's trace registry (`register_callback_for_npu_*(cb, name)`), fired at
  the same points torch_npu's runtime fires it (event creation at first record, record, wait on a
  created event, synchronizations, blocking copies and `.item()` synchronizing their stream).

`make_module(trace=False)` gives a second module object over the same runtime without the trace
registry (like a torch_npu build without it), to exercise the backend's wrapper path.
Nothing here is asynchronous: verdicts are what the stand-in tests; timing is the GPU's business.
"""
from __future__ import annotations

import threading
import types

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["install", "make_module", "NpuTensor", "CYCLES_PER_US", "DEVICE_COUNT"]

CYCLES_PER_US = 1500.0     # the emulated `_sleep` clock rate (what calibration should find)
DEVICE_COUNT = 2
_PU1 = 20                  # c10::DeviceType::PrivateUse1

_lock = threading.RLock()
_module = None             # the module registered as torch.npu


# -- runtime state ----------------------------------------------------------------------------------

class _Registry:
    """torch_npu.utils._npu_trace.CallbackRegistry: callbacks with names; errors are swallowed."""

    def __init__(self, name):
        self.name = name
        self.callback_list = []

    def add_callback(self, cb, cb_name) -> None:
        self.callback_list.append((cb, cb_name))

    def fire_callbacks(self, *args) -> None:
        for cb, _name in self.callback_list:
            try:
                cb(*args)
            except Exception:
                pass


_KINDS = ("event_creation", "event_deletion", "event_record", "event_wait", "memory_allocation",
          "memory_deallocation", "stream_creation", "device_synchronization",
          "stream_synchronization", "event_synchronization")


def _make_trace_module():
    mod = types.ModuleType("racecheck_npu_standin_trace")
    mod.CallbackRegistry = _Registry
    regs = {}
    for kind in _KINDS:
        reg = regs[kind] = _Registry(f"[stream check] NPU {kind.replace('_', ' ')}")

        def register(cb, cb_name, reg=reg):
            reg.add_callback(cb, cb_name)
        register.__name__ = f"register_callback_for_npu_{kind}"
        setattr(mod, register.__name__, register)
    mod._registries = regs
    return mod


class _Runtime:
    def __init__(self):
        self.tls = threading.local()
        self.trace = _make_trace_module()
        self.trace_active = False
        self.next_sid = {}           # device -> next stream id (0 is the default stream)
        self.handles = {}            # (device, stream id) -> raw handle
        self.next_handle = 0x1000
        self.next_event = 0x80000
        self.free_events = []        # handles of destroyed events, reused first (as CUDA's are)
        self.vt = {}                 # (device, stream id) -> virtual microseconds (from _sleep)
        self.sleeps = []             # (device, stream id, cycles): what _sleep was asked for
        self.lag = 0                 # an event's query() is False this many times after a record
        self.epoch = 0               # bumped by synchronizations: earlier records are complete
        self.capture_streams = {}

    def fire(self, kind, *args) -> None:
        if self.trace_active:
            self.trace._registries[kind].fire_callbacks(*args)

    def device(self) -> int:
        return getattr(self.tls, "device", 0)

    def index(self, device) -> int:
        if device is None:
            return self.device()
        if isinstance(device, int):
            return self.device() if device < 0 else device
        d = torch.device(device)
        return self.device() if d.index is None else d.index

    def handle(self, dev, sid) -> int:
        key = (dev, sid)
        h = self.handles.get(key)
        if h is None:
            with _lock:
                h = self.handles.get(key)
                if h is None:
                    h = self.handles[key] = self.next_handle
                    self.next_handle += 0x10
        return h

    def new_sid(self, dev) -> int:
        with _lock:
            sid = self.next_sid.get(dev, 1)
            self.next_sid[dev] = sid + 1
            return sid

    def current(self, dev):
        cur = getattr(self.tls, "cur", None)
        s = cur.get(dev) if cur else None
        return s if s is not None else Stream(stream_id=0, device_index=dev, device_type=_PU1)

    def set_current(self, s) -> None:
        cur = getattr(self.tls, "cur", None)
        if cur is None:
            cur = self.tls.cur = {}
        cur[s.device_index] = s

    def capture(self):
        return getattr(self.tls, "capture", None)


_RT = _Runtime()


# -- streams, events, graphs ------------------------------------------------------------------------

class Stream(torch.Stream):
    """torch_npu.npu.Stream look-alike (a torch.Stream of device type "npu")."""

    def __new__(cls, device=None, priority=0, *, stream_id=None, device_index=None,
                device_type=None, **_kw):
        if stream_id is None:
            device_index = _RT.index(device)
            stream_id = _RT.new_sid(device_index)
            new = True
        else:
            new = False
        s = super().__new__(cls, stream_id=int(stream_id), device_index=int(device_index),
                            device_type=_PU1)
        if new:
            _RT.fire("stream_creation", _RT.handle(int(device_index), int(stream_id)))
        return s

    def __init__(self, *args, **kwargs):
        pass

    @property
    def npu_stream(self) -> int:
        return _RT.handle(self.device_index, self.stream_id)

    @property
    def priority(self) -> int:
        return 0

    def wait_event(self, event) -> None:
        event.wait(self)

    def wait_stream(self, stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        if event is None:
            event = Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _RT.epoch += 1
        _RT.fire("stream_synchronization", self.npu_stream)

    def __enter__(self):
        self._prev = _RT.current(self.device_index)
        _RT.set_current(self)
        return self

    def __exit__(self, *exc):
        _RT.set_current(self._prev)
        return False

    def __eq__(self, other):
        return (isinstance(other, torch.Stream) and other.stream_id == self.stream_id
                and other.device_index == self.device_index and other.device_type == self.device_type)

    def __hash__(self):
        return hash((self.stream_id, self.device_index, _PU1))

    def __repr__(self):
        return f"<npu stand-in Stream device=npu:{self.device_index} npu_stream={self.npu_stream:#x}>"


class Event:
    """torch_npu.npu.Event look-alike: the runtime event is created lazily at the first record."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **_kw):
        self._handle = 0
        self._t = 0.0
        self._lag = 0
        self._epoch = 0

    @property
    def npu_event(self) -> int:
        return self._handle

    def record(self, stream=None) -> None:
        s = stream if stream is not None else current_stream()
        if not self._handle:
            with _lock:
                if _RT.free_events:             # the runtime reuses a destroyed event's handle
                    self._handle = _RT.free_events.pop()
                else:
                    self._handle = _RT.next_event
                    _RT.next_event += 0x10
            _RT.fire("event_creation", self._handle)
        self._t = _RT.vt.get((s.device_index, s.stream_id), 0.0)
        self._lag = _RT.lag
        self._epoch = _RT.epoch
        _RT.fire("event_record", self._handle, s.npu_stream)

    def wait(self, stream=None) -> None:
        s = stream if stream is not None else current_stream()
        if not self._handle:
            return                      # never recorded: nothing happens, nothing is traced
        key = (s.device_index, s.stream_id)
        _RT.vt[key] = max(_RT.vt.get(key, 0.0), self._t)
        _RT.fire("event_wait", self._handle, s.npu_stream)

    def query(self) -> bool:
        """True once the recorded work "completed": after `runtime.lag` polls or a synchronization."""
        if self._lag > 0 and self._epoch == _RT.epoch:
            self._lag -= 1
            return False
        return True

    def synchronize(self) -> None:
        self._lag = 0
        if self._handle:
            _RT.fire("event_synchronization", self._handle)

    def elapsed_time(self, end_event) -> float:
        return (end_event._t - self._t) / 1000.0

    def __del__(self):
        try:
            if self._handle:
                if _RT.trace_active:
                    _RT.fire("event_deletion", self._handle)
                with _lock:
                    _RT.free_events.append(self._handle)
        except Exception:
            pass

    def __repr__(self):
        return f"<npu stand-in Event {self._handle:#x}>" if self._handle else "<npu stand-in Event uninitialized>"


def _rerun(thunks) -> None:
    with _disable_current_modes():
        for func, args, kwargs, out in thunks:
            res = func(*args, **kwargs)
            if res is out:
                continue
            outs = out if isinstance(out, (list, tuple)) else (out,)
            ress = res if isinstance(res, (list, tuple)) else (res,)
            for o, r in zip(outs, ress):
                if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o is not r:
                    o.copy_(r)


class NPUGraph:
    """torch_npu.npu.NPUGraph look-alike: capture records the ops (they run once), replay re-runs."""

    def __init__(self, keep_graph=False):
        self._thunks = None
        self._capture = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if _RT.capture() is not None:
            raise RuntimeError("a graph is already being captured on this thread")
        self._capture = []
        _RT.tls.capture = self._capture

    def capture_end(self):
        _RT.tls.capture = None
        self._thunks, self._capture = self._capture, None

    def replay(self):
        if self._thunks is None:
            raise RuntimeError("replay() of a graph that was never captured")
        _rerun(self._thunks)

    def reset(self):
        self._thunks = None

    def pool(self):
        return (0, id(self))

    def enable_debug_mode(self):
        pass

    def debug_dump(self, path):
        pass


class StreamContext:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        s = self.stream
        if s is not None:
            self._prev = _RT.current(s.device_index)
            _RT.set_current(s)
        return s

    def __exit__(self, *exc):
        if self.stream is not None:
            _RT.set_current(self._prev)
        return False


class graph:
    """torch.npu.graph(g): synchronize, capture on a side stream, restore the stream."""

    _mod = None      # the module this context belongs to (its `synchronize` is called)

    def __init__(self, npu_graph, pool=None, stream=None, capture_error_mode="global"):
        self.npu_graph = npu_graph
        self.capture_stream = stream
        self.pool = () if pool is None else (pool,)

    def __enter__(self):
        mod = self._mod if self._mod is not None else torch.npu
        mod.synchronize()
        dev = _RT.device()
        if self.capture_stream is None:
            s = _RT.capture_streams.get(dev)
            if s is None:
                s = _RT.capture_streams[dev] = Stream(device=dev)
            self.capture_stream = s
        self._ctx = StreamContext(self.capture_stream)
        self._ctx.__enter__()
        self.npu_graph.capture_begin(*self.pool)
        return self.npu_graph

    def __exit__(self, *exc):
        try:
            self.npu_graph.capture_end()
        finally:
            self._ctx.__exit__(*exc)
        return False


class device:
    def __init__(self, device):
        self.idx = _RT.index(device) if device is not None else None

    def __enter__(self):
        self.prev = _RT.device()
        if self.idx is not None:
            _RT.tls.device = self.idx

    def __exit__(self, *exc):
        _RT.tls.device = self.prev
        return False


# -- module functions ---------------------------------------------------------------------------------

def current_stream(device=None):
    return _RT.current(_RT.index(device))


def default_stream(device=None):
    return Stream(stream_id=0, device_index=_RT.index(device), device_type=_PU1)


def set_stream(stream) -> None:
    if stream is not None:
        _RT.set_current(stream)


def stream(stream):
    return StreamContext(stream)


def synchronize(device=None) -> None:
    prev = _RT.device()
    _RT.tls.device = _RT.index(device)
    _RT.epoch += 1
    try:
        _RT.fire("device_synchronization")
    finally:
        _RT.tls.device = prev


def current_device() -> int:
    return _RT.device()


def set_device(device) -> None:
    _RT.tls.device = _RT.index(device)


def device_count() -> int:
    return DEVICE_COUNT


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def manual_seed_all(seed) -> None:
    torch.manual_seed(seed)


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_current_stream_capturing() -> bool:
    return _RT.capture() is not None


def graph_pool_handle():
    return (0, 0)


def empty_cache() -> None:
    pass


def memory_allocated(device=None) -> int:
    return 0


def get_device_name(device=None) -> str:
    return "racecheck npu stand-in"


def _sleep(cycles) -> None:
    """torch_npu.npu._sleep look-alike: advances the current stream's virtual clock."""
    if cycles <= 0:
        raise RuntimeError("_sleep: cycles must be positive")
    s = current_stream()
    key = (s.device_index, s.stream_id)
    _RT.vt[key] = _RT.vt.get(key, 0.0) + cycles / CYCLES_PER_US
    _RT.sleeps.append((s.device_index, s.stream_id, int(cycles)))


def _npu_getCurrentStream(device_index):
    s = _RT.current(_RT.index(device_index))
    return (s.stream_id, s.device_index, _PU1)


def _activate_npu_trace(mode=0) -> None:
    _RT.trace_active = True


# -- "npu" tensors over CPU tensors ---------------------------------------------------------------------

class NpuTensor(torch.Tensor):
    """A tensor of device type "npu" whose data live in a CPU tensor (`_inner`)."""

    @staticmethod
    def __new__(cls, inner, dev):
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, layout=inner.layout, device=dev, requires_grad=False)
        r._inner = inner
        return r

    def untyped_storage(self):
        return self._inner.untyped_storage()

    def tolist(self):
        return self.to("cpu").tolist()

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert npu tensor to numpy: copy it to the host with .cpu() first")

    def __repr__(self, **kwargs):
        text = repr(self._inner)
        return text[:-1] + f", device='{self.device}')" if text.endswith(")") else text

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


_SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}
_NO_OP = {"record_stream"}


def _run(func, args, kwargs):
    """Run one ATen op on the CPU data of its "npu" tensors; wrap fresh outputs as "npu"."""
    name = func._schema.name.split("::")[-1]
    if name in _NO_OP:
        return None
    dev = None
    wrappers = {}
    plain = set()

    def unwrap(x):
        nonlocal dev
        if isinstance(x, NpuTensor):
            if dev is None:
                dev = x.device
            wrappers[id(x._inner)] = x
            return x._inner
        if isinstance(x, torch.Tensor):
            plain.add(id(x))
        return x

    a = tree_map(unwrap, list(args))
    k = tree_map(unwrap, dict(kwargs))
    if "device" in k and k["device"] is not None:
        d = torch.device(k["device"])
        if d.type == "npu":
            dev = torch.device("npu", _RT.index(d))
            k["device"] = torch.device("cpu")
        else:
            dev = None
    if k.get("pin_memory"):
        k["pin_memory"] = False
    blocking_d2h = False
    if name in ("_to_copy", "copy_") and not k.get("non_blocking") and not (len(a) > 2 and a[2]):
        flat, _ = tree_flatten((args, kwargs))
        has_npu = any(isinstance(x, NpuTensor) for x in flat)
        has_cpu = any(isinstance(x, torch.Tensor) and not isinstance(x, NpuTensor) for x in flat)
        blocking_d2h = has_npu and (has_cpu or dev is None)
    out = func(*a, **k)
    cap = _RT.capture()
    if cap is not None and wrappers:
        cap.append((func, a, k, out))
    if blocking_d2h or name in _SYNCING:
        s = current_stream()
        _RT.epoch += 1
        _RT.fire("stream_synchronization", s.npu_stream)
    if dev is None:
        return out

    def wrap(o):
        if isinstance(o, torch.Tensor) and not isinstance(o, NpuTensor):
            w = wrappers.get(id(o))
            if w is not None:
                return w
            if id(o) in plain or o.device.type != "cpu":
                return o
            return NpuTensor(o, dev)
        return o

    return tree_map(wrap, out)


# PrivateUse1 kernels: factories (device="npu") and the ops torch calls with the Python key off
# (`torch.tensor(..., device="npu")` copies into a fresh "npu" tensor that way).
_PU1_OPS = (
    "empty.memory_format", "empty_strided", "_to_copy", "copy_", "_copy_from",
    "_copy_from_and_resize", "lift_fresh", "_local_scalar_dense", "fill_.Scalar", "zero_",
    "arange", "arange.start", "arange.start_step", "full", "zeros", "ones", "rand", "randn",
    "randint", "randint.low", "linspace", "randperm", "scalar_tensor", "eye", "tensor",
)


def _op(qualname):
    base, _, overload = qualname.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


_libs = []


def _register_kernels() -> None:
    lib = torch.library.Library("aten", "IMPL")
    _libs.append(lib)
    for qn in _PU1_OPS:
        op = _op(qn)
        if op is None:
            continue

        def kernel(*args, _op=op, **kwargs):
            return _run(_op, args, kwargs)
        try:
            lib.impl(qn if "." in qn else qn, kernel, "PrivateUse1")
        except RuntimeError:
            pass


# -- modules -------------------------------------------------------------------------------------------

_EXPORTS = ("Stream", "Event", "NPUGraph", "graph", "StreamContext", "device", "current_stream",
            "default_stream", "set_stream", "stream", "synchronize", "current_device",
            "set_device", "device_count", "is_available", "is_initialized", "_lazy_init",
            "_is_in_bad_fork", "manual_seed_all", "get_amp_supported_dtype",
            "is_current_stream_capturing", "graph_pool_handle", "empty_cache", "memory_allocated",
            "get_device_name", "_sleep")


def make_module(trace: bool = True, name: str = "racecheck_npu_standin"):
    """A module with torch.npu's API over the shared stand-in runtime (see the module docstring)."""
    mod = types.ModuleType(name)
    g = globals()
    for n in _EXPORTS:
        setattr(mod, n, g[n])
    mod.graph = type("graph", (graph,), {"_mod": mod})
    mod.EMULATED_ON_CPU = True
    mod.CYCLES_PER_US = CYCLES_PER_US
    mod.runtime = _RT
    c = types.SimpleNamespace(_npu_getCurrentStream=_npu_getCurrentStream)
    if trace:
        c._activate_npu_trace = _activate_npu_trace
        mod._npu_trace = _RT.trace
    mod._C = c
    return mod


def install():
    """Register device type "npu" and `torch.npu` (the stand-in) once per process; return it."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", "npu"):
            raise RuntimeError(f"PrivateUse1 is already taken by {current!r}")
        existing = getattr(torch, "npu", None)
        if existing is not None and not getattr(existing, "EMULATED_ON_CPU", False):
            raise RuntimeError("a real torch.npu (torch_npu) is loaded; the stand-in is not needed")
        mod = make_module(trace=True, name="torch.npu")
        if current == "privateuseone":
            from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
            _setup_privateuseone_for_python_backend("npu", backend_module=mod)
        _register_kernels()
        _module = mod
        return mod
