"""The C++ op observer notes exactly the ops a TorchDispatchMode sees, with the same tensors.

Differential: each program runs once with the observer on and a dispatch mode that logs what it
is handed; the two logs must be equal op for op: name, and every tensor's argument position,
write flag, storage, offset and geometry. One exception, by construction: an op that an autograd
kernel calls around passing its own op on (saving an output for backward: `detach`) is nested
in that op's RecordFunction and not noted; such ops are views (no bytes read or written).
Without a mode a program takes some other paths (`reshape` views with `_reshape_alias` instead
of `view`); the observer alone is compared with that difference allowed.
"""
from __future__ import annotations

import shutil
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hypothesis import given, settings, strategies as st

from racecheck.instrumentation import op_observer
from racecheck.instrumentation.footprints import strided_ranges

OUTPUT = op_observer.OUTPUT


@pytest.fixture(scope="module")
def observer_module():
    mod = op_observer.load()
    if mod is None:
        if shutil.which("c++") or shutil.which("g++"):
            pytest.fail(f"the op observer did not build: {op_observer.why_not()}")
        pytest.skip("no C++ compiler")
    return mod


class Logged(TorchDispatchMode):
    """What a dispatch mode is handed, in the observer's terms."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        notes = []
        for i, a in enumerate(schema.arguments):
            v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
            write = a.alias_info is not None and a.alias_info.is_write
            notes += _tensors(v, i, write)
        out = func(*args, **kwargs)
        outs = tuple(out) if len(schema.returns) > 1 else (out,)
        for j, v in enumerate(outs):
            notes += _tensors(v, OUTPUT + j, True)
        self.ops.append((f"{schema.name}.{schema.overload_name}", notes))
        return out


def _tensors(v, arg, write):
    if isinstance(v, torch.Tensor):
        return [_note(v, arg, write)]
    if isinstance(v, (list, tuple)):
        return [_note(t, arg, write) for t in v if isinstance(t, torch.Tensor)]
    return []


def _note(t, arg, write):
    st = t.untyped_storage()
    return (arg, write, st.data_ptr(), st._cdata, st.nbytes(), t.storage_offset(),
            tuple(t.shape), tuple(t.stride()), t.element_size())


def _observed(program):
    with op_observer.observing() as seen:
        program()
    return _notes(seen)


def _notes(seen):
    return [(op.name, [(t.arg, t.write, t.storage, t.cdata, t.storage_nbytes, t.offset,
                        t.sizes, t.strides, t.itemsize) for t in op.tensors]) for op in seen]


class Registrar:
    """Ids for storages, their deaths stamped with the observer's position (as the storage
    registry's weakrefs would)."""

    def __init__(self):
        self.obs = None
        self.refs = {}
        self.deaths = []            # (id, ops noted before it died)
        self.next = 0

    def __call__(self, storage):
        sid, self.next = self.next, self.next + 1
        cdata = storage._cdata

        def died(_ref, sid=sid, cdata=cdata):
            self.obs.forget(cdata)
            self.deaths.append((sid, self.obs.position()))
        self.refs[sid] = weakref.ref(storage, died)
        return sid


def _registered(program):
    reg = Registrar()
    obs = op_observer.Observer(registrar=reg)
    reg.obs = obs
    with obs:
        program()
        seen = obs.drain()
    return seen, reg


def _both(program):
    """(what the mode saw, what the observer noted) in one run of `program`."""
    with op_observer.observing() as seen:
        with Logged() as mode:
            program()
    return mode.ops, _notes(seen)


def _moded(program):
    with Logged() as mode:
        program()
    return mode.ops


def _decode_step():
    torch.manual_seed(0)
    hidden, heads, vocab, bs = 16, 2, 32, 3
    emb = torch.randn(vocab, hidden)
    wq = torch.randn(hidden, hidden)
    wo = torch.randn(hidden, hidden, dtype=torch.float32)
    kv = torch.zeros(8, hidden)
    ids = torch.tensor([1, 5, 7])
    loc = torch.tensor([2, 3, 6])
    with torch.no_grad():
        x = F.embedding(ids, emb)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        q = F.linear(x, wq)
        kv[loc] = q
        k = kv.view(8, heads, -1).transpose(0, 1)
        scores = q.view(bs, heads, -1).transpose(0, 1) @ k.transpose(1, 2)
        p = torch.softmax(scores.float(), dim=-1)
        o = (p @ k).transpose(0, 1).reshape(bs, hidden)
        logits = F.linear(o, wo) @ emb.t()
        nxt = torch.argmax(logits, dim=-1)
        seq_lens = torch.zeros(bs, dtype=torch.int64)
        seq_lens.add_(1)
        torch.cat([ids, nxt]).tolist()
        return int(nxt.sum().item())


def _index_and_copy():
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    idx = torch.tensor([3, 0])
    a.index_fill_(0, idx, -1.0)
    b = a.index_select(1, torch.tensor([5, 1]))
    c = torch.empty(4, 2)
    c.copy_(b)
    a[:, 2:4] = c
    m = a > 0
    a.masked_fill_(~m, 0)
    torch.where(m, a, torch.zeros_like(a)).nonzero()
    a.scatter_(1, torch.tensor([[0], [1], [2], [3]]), 7.0)
    out = torch.empty(4, 6)
    torch.mul(a, 2, out=out)
    torch.stack([a, out]).sum(0)
    a.clone().to(torch.float64).contiguous()


def _with_autograd():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(2, 5)
    y = (x @ w).relu().sum()
    y.backward()
    w.grad.zero_()


def _foreach_and_lists():
    xs = [torch.ones(3), torch.ones(2)]
    ys = [torch.zeros(3), torch.zeros(2)]
    torch._foreach_copy_(ys, xs)
    torch._foreach_add_(ys, 1.0)
    torch.split(torch.arange(10), [3, 7])
    torch.chunk(torch.arange(9), 3)
    torch.tensor([[1, 2], [3, 4]]).unbind(0)


def _inference_mode():
    with torch.inference_mode():
        a = torch.randn(3, 4)
        b = a.softmax(-1).log()
        b.add_(a).mul_(0.5).clamp_(min=-1)


PROGRAMS = [_decode_step, _index_and_copy, _with_autograd, _foreach_and_lists, _inference_mode]


VIEWS_AN_AUTOGRAD_KERNEL_MAKES = {"aten::detach."}


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__.strip("_"))
def test_observer_sees_what_a_dispatch_mode_sees(observer_module, program):
    want, got = _both(program)
    j = 0
    for op in want:
        if j < len(got) and got[j] == op:
            j += 1
        else:
            assert op[0] in VIEWS_AN_AUTOGRAD_KERNEL_MAKES, (op, got[j:j + 1])
    assert j == len(got), got[j:]


def test_without_a_mode_only_the_paths_a_mode_changes_differ(observer_module):
    def names(ops):
        return [{"aten::_reshape_alias.": "aten::view."}.get(n, n) for n, _ in ops]
    assert names(_observed(_decode_step)) == names(_moded(_decode_step))


def test_nested_ops_are_not_seen(observer_module):
    """`linear` is composite: its `t` and `addmm` are seen, not the ops `addmm` calls inside."""
    x, w, b = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3)
    got = [n for n, _ in _observed(lambda: F.linear(x, w, b))]
    assert got == ["aten::t.", "aten::addmm."]


def test_schema_write_flags(observer_module):
    a, b = torch.zeros(3), torch.ones(3)
    [(name, notes)] = _observed(lambda: a.add_(b))
    assert name == "aten::add_.Tensor"
    assert [(arg, write) for arg, write, *_ in notes] == [(0, True), (1, False), (OUTPUT, True)]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__.strip("_"))
def test_pruned_nested_calls_change_nothing_seen(observer_module, program):
    """RecordFunction switched off inside a seen op (the default) notes what the callback notes
    when every nested call fires and is dropped in it."""
    with op_observer.observing() as everything:
        program()
    want = _aliasing(_notes(everything))
    for _ in range(2):          # ops that nest learnt (where not yet), then pruned
        with op_observer.observing(prune=True) as seen:
            program()
        assert _aliasing(_notes(seen)) == want


def test_calls_nested_in_a_seen_op_stop_firing_once_met(observer_module):
    """`_to_copy`'s kernel calls `empty_strided` and `copy_`: they fire until the observer has
    met them under it, then RecordFunction is off while it runs (the profiler misses them too,
    as documented)."""
    x = torch.ones(4)

    def profiled():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            x.to(torch.float64)
        return {e.name for e in prof.events()}
    with op_observer.observing():
        unpruned = profiled()
    with op_observer.observing(prune=True) as seen:
        profiled()
        pruned = profiled()
    assert {"aten::_to_copy", "aten::copy_"} <= unpruned
    assert "aten::_to_copy" in pruned and "aten::copy_" not in pruned
    assert [op.name for op in seen] == ["aten::_to_copy."] * 2


def _aliasing(ops):
    """Notes of two runs made comparable: addresses apart (the allocator reuses them as it
    goes; which storage is which is what the differential tests against the mode check)."""
    return [(name, [(arg, write, *rest) for arg, write, _storage, _cdata, *rest in notes])
            for name, notes in ops]


def test_an_op_that_raises_switches_record_function_back_on(observer_module):
    """The op's guard closes it on the way out of an exception: later ops, nested calls of
    unseen composites included, are noted as before."""
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with op_observer.observing(prune=True):
        torch.ones(2, 3) @ torch.ones(3, 5)      # `mm` met calling other ops, if it does
    with op_observer.observing(prune=True) as seen:
        with pytest.raises(RuntimeError):
            torch.ones(2, 3) @ torch.ones(4, 5)
        F.linear(x, w)
    assert [op.name for op in seen] == ["aten::ones.", "aten::ones.", "aten::mm.",
                                        "aten::t.", "aten::mm."]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__.strip("_"))
def test_byte_ranges_are_the_footprints(observer_module, program):
    """Each noted tensor's bytes, worked out in C++ from its geometry, are the ranges racecheck's
    footprints give that geometry."""
    with op_observer.observing() as seen:
        program()
    tensors = [t for op in seen for t in op.tensors]
    if program is _index_and_copy:                   # `a[:, 2:4] = c`: a view of 4 runs
        assert any(len(t.ranges) > 1 for t in tensors)
    for t in tensors:
        ranges, approx = strided_ranges(t.offset, t.sizes, t.strides, t.itemsize)
        assert (t.ranges, t.approx) == (tuple(ranges), approx is not None), t


_GEOMETRY = st.integers(0, 4).flatmap(lambda n: st.tuples(
    st.integers(0, 40), st.lists(st.integers(0, 9), min_size=n, max_size=n),
    st.lists(st.integers(-30, 30), min_size=n, max_size=n), st.sampled_from([1, 2, 4, 8])))


@settings(max_examples=400, deadline=None)
@given(geometry=_GEOMETRY, big=st.booleans())
def test_byte_ranges_of_any_geometry(observer_module, geometry, big):
    """Any view geometry, negative and zero strides, empty views and views of more runs than
    are listed (the bounding interval, approx) included."""
    offset, sizes, strides, itemsize = geometry
    if big and sizes:
        sizes = [s * 23 for s in sizes]
    ranges, approx = strided_ranges(offset, sizes, strides, itemsize)
    assert observer_module.byte_ranges(offset, sizes, strides, itemsize) == \
        (tuple(tuple(r) for r in ranges), approx is not None)


def test_off_outside_the_block(observer_module):
    with op_observer.observing() as seen:
        pass
    torch.ones(2).add(1)
    assert seen == []
    assert not observer_module.active()


class LoggedStreams(Logged):
    """Also the stream current on the op's device, as the observer notes it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.streams.append(torch.cuda.current_stream().stream_id)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def __init__(self):
        super().__init__()
        self.streams = []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_cuda_ops_and_their_streams(observer_module):
    """On the device: the decode step's ops with a plan stream, each op's stream as torch has it."""
    plan = torch.cuda.Stream()
    ready = torch.cuda.Event()

    def program():
        x = torch.randn(8, 64, device="cuda")
        w = torch.randn(64, 64, device="cuda")
        positions = torch.zeros(8, dtype=torch.int64, device="cuda")
        plan_buf = torch.zeros(8, dtype=torch.int64, device="cuda")
        plan.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(plan):
            plan_buf.copy_(positions + 1)
            torch.ones(8, dtype=torch.int64, device="cuda")   # a factory: no tensor argument
        ready.record(plan)
        h = torch.relu(x @ w)
        torch.cuda.current_stream().wait_event(ready)
        positions.copy_(plan_buf)
        return (h + positions.unsqueeze(1).to(h.dtype))[0, 0].item()

    with op_observer.observing() as seen:
        with LoggedStreams() as mode:
            program()
    got = [(op.name, op.stream) for op in seen]
    want = [(name, s) for (name, _), s in zip(mode.ops, mode.streams)]
    assert got == want
    assert {s for _, s in got} == {torch.cuda.default_stream().stream_id, plan.stream_id}
    assert _notes(seen) == mode.ops


def test_stacks_are_the_dispatch_paths(observer_module):
    """Each op's frames are what racecheck's per-op path captures: the program's line."""
    from racecheck.core.trace import frame_info

    a = torch.zeros(4)

    def program():
        a.add_(1)                                   # the line
        return torch.relu(a)
    with op_observer.observing(stacks=True) as seen:
        program()
    lines = {op.name: frame_info(op.stack[0]) for op in seen}
    first = program.__code__.co_firstlineno
    assert lines["aten::add_.Tensor"][1:] == (first + 1, "program")
    assert lines["aten::relu."][1:] == (first + 2, "program")
    assert all(len(op.stack) >= 2 for op in seen)   # the test function's frame too


def test_ops_of_every_thread_with_their_own_nesting(observer_module):
    """The callback is global: another thread's ops are noted too, each thread's nesting apart."""
    import threading

    a = torch.zeros(4)
    b = torch.zeros(4)
    with op_observer.observing() as seen:
        t = threading.Thread(target=lambda: F.linear(b.view(1, 4), torch.ones(2, 4)))
        t.start()
        t.join()
        a.add_(1)
    by_thread: dict = {}
    for op in seen:
        by_thread.setdefault(op.thread, []).append(op.name)
    assert sorted(by_thread.values()) == sorted([
        ["aten::view.", "aten::ones.", "aten::t.", "aten::mm."], ["aten::add_.Tensor"]])


def test_storages_registered_where_first_seen_and_their_deaths_placed(observer_module):
    """A temporary born and dead between two drains is registered in the callback; its death
    falls between the op that last used it and the next."""
    x = torch.ones(4)

    def program():
        a = x + 1                 # a's storage born
        b = a * 2
        del a                     # a dies: before the sum
        return b.sum()
    seen, reg = _registered(program)
    assert [op.name for op in seen] == ["aten::add.Tensor", "aten::mul.Tensor", "aten::sum."]
    a_sid = seen[0].tensors[-1].sid
    assert seen[1].tensors[0].sid == a_sid and seen[0].tensors[0].sid != a_sid
    assert (a_sid, seen[2].number) in reg.deaths
    assert [op.number for op in seen] == [seen[0].number + k for k in range(3)]


def test_a_storage_at_a_dead_one_s_address_is_new(observer_module):
    """Freed StorageImpls are reused by the allocator: each new one gets its own id."""
    def program():
        t = None
        for i in range(50):
            t = torch.ones(3) * i
        return t
    seen, reg = _registered(program)
    outputs = [op.tensors[-1] for op in seen]
    assert len(outputs) == 100
    assert len({t.sid for t in outputs}) == 100
    assert len({t.cdata for t in outputs}) < 100        # addresses were reused
