"""Device work outside ATen: Triton launches (footprints from the kernel source) and declared
opaque kernels, on sim with torch.cuda routing."""
import pytest
import torch

import racecheck

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from racecheck.instrumentation.triton_kernels import analyze  # noqa: E402

from helpers import pairs  # noqa: E402


# -- kernels ----------------------------------------------------------------------------------

@triton.jit
def _store_at(ptr, offs, v, mask):
    tl.store(ptr + offs, v, mask=mask)


@triton.jit
def _row_base(table, row, width: tl.constexpr):
    return table + row * width


@triton.jit
def gather_scale(x_ptr, out_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    i = tl.load(idx_ptr + offs, mask=mask, other=0)     # a loaded value is data, not a pointer
    x = tl.load(x_ptr + i, mask=mask)
    _store_at(out_ptr, offs, x * 2, mask)


@triton.jit
def row_copy(table, rows, out, width: tl.constexpr):
    pid = tl.program_id(0)
    row = tl.load(rows + pid)
    src = _row_base(table, row, width)
    cols = tl.arange(0, width)
    tl.store(out + pid * width + cols, tl.load(src + cols))


@triton.jit
def count(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(x_ptr + offs, 1, mask=offs < n)


@triton.jit
def block_ptr_copy(src, dst, n: tl.constexpr):
    s = tl.make_block_ptr(base=src, shape=(n,), strides=(1,), offsets=(0,), block_shape=(n,),
                          order=(0,))
    d = tl.make_block_ptr(base=dst, shape=(n,), strides=(1,), offsets=(0,), block_shape=(n,),
                          order=(0,))
    tl.store(d, tl.load(s))


def _python_helper(p):
    return p


@triton.jit
def opaque_use(a, b):
    tl.store(b, tl.load(_python_helper(a)))


@triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})], key=["n"])
@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)


@triton.heuristics(values={"BLOCK": lambda args: 8})
@triton.jit
def fill_seven(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full((BLOCK,), 7.0, tl.float32), mask=offs < n)


# -- analysis ---------------------------------------------------------------------------------

def test_loaded_values_are_not_pointers_and_helpers_are_followed():
    acc = analyze(gather_scale)
    assert {"x_ptr", "idx_ptr"} <= acc.reads and "out_ptr" not in acc.reads
    assert "out_ptr" in acc.writes and not ({"x_ptr", "idx_ptr"} & acc.writes)
    assert not acc.unknown


def test_a_helpers_returned_pointer_keeps_its_provenance():
    acc = analyze(row_copy)
    assert {"table", "rows"} <= acc.reads and acc.writes == {"out"}


def test_atomics_read_and_write():
    acc = analyze(count)
    assert "x_ptr" in acc.reads and "x_ptr" in acc.writes


def test_block_pointers():
    acc = analyze(block_ptr_copy)
    assert "src" in acc.reads and acc.writes == {"dst"}


def test_unknown_calls_are_approximate():
    acc = analyze(opaque_use)
    assert "a" in acc.unknown and acc.reason
    assert acc.writes == {"b"}


# -- launches on sim --------------------------------------------------------------------------

def _race_through(kernel_launch, *, wait):
    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = torch.cuda.Stream()
        x = racecheck.name(torch.arange(8, dtype=torch.float32, device="cuda"), "x")
        out = racecheck.name(torch.zeros(8, device="cuda"), "out")
        idx = torch.arange(8, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            kernel_launch(x, out, idx)
        if wait:
            torch.cuda.current_stream().wait_stream(s)
        total = out.sum().item()
    return rc, total


def test_triton_write_on_a_side_stream_read_without_wait_is_rc001():
    rc, total = _race_through(lambda x, out, idx: gather_scale[(2,)](x, out, idx, 8, BLOCK=4),
                              wait=False)
    assert [(f.rule, f.tensor, f.previous.op) for f in rc.findings] == [
        ("RC001", "out", "gather_scale")]
    assert total == 56.0          # the interpreter really ran the kernel
    assert not rc.internal_errors


def test_on_a_gpu_a_launch_covers_its_whole_tensors_and_the_finding_says_so():
    """The GPU path (the real kernel runs; its offsets are runtime values): every footprint is
    the whole tensor argument, marked approximate, so a finding on it tells the reader that sim
    would give the exact bytes. Driven on sim with the launch itself stubbed out."""
    from racecheck.instrumentation import current
    from racecheck.instrumentation.triton_kernels import TritonHook

    def launch_as_on_a_gpu(x, out, idx):
        hook = TritonHook(current.backend())
        hook.interpret = False
        hook.launch(lambda *a, **k: None, gather_scale, (x, out, idx, 8), (2,), {"BLOCK": 4})
    rc, _ = _race_through(launch_as_on_a_gpu, wait=False)
    [f] = rc.findings
    assert (f.rule, f.tensor, f.previous.op) == ("RC001", "out", "gather_scale")
    assert "gather_scale on a GPU: its whole tensor argument" in f.approx
    assert not rc.internal_errors


def test_triton_synchronized_is_clean():
    rc, total = _race_through(lambda x, out, idx: gather_scale[(2,)](x, out, idx, 8, BLOCK=4),
                              wait=True)
    assert rc.findings == [] and total == 56.0


def test_autotuned_kernel_runs_once_with_the_first_config():
    with racecheck.session(device="sim", route_cuda=True, record_trace=True) as rc:
        s = torch.cuda.Stream()
        x = racecheck.name(torch.zeros(8, device="cuda"), "x")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            add_one[lambda meta: (triton.cdiv(8, meta["BLOCK"]),)](x, 8)
        x.sum()
    launches = [e for e in rc.trace.events if getattr(e, "op", None) == "add_one"]
    assert len(launches) == 1, "autotuning on sim must not benchmark"
    assert pairs(rc.findings) == [("RC001", "x")]
    assert add_one.best_config.kwargs == {"BLOCK": 4}


def test_heuristics_kernel():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        out = torch.zeros(8, device="cuda")
        fill_seven[(1,)](out, 8)
        got = out.tolist()
    assert got == [7.0] * 8 and rc.findings == []


def test_triton_launch_inside_a_graph_is_replayed():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        x = torch.zeros(8, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            add_one[(2,)](x, 8)
        before = x.sum().item()
        g.replay()
        g.replay()
        after = x.sum().item()
    assert (before, after) == (8.0, 24.0)
    assert not rc.internal_errors


def test_queued_executor_runs_triton_in_stream_order():
    from racecheck.instrumentation.adversarial import AdversarialExecutor
    plan = {"priorities": {"#0": 5, "#1": 1}, "host": 9}
    with racecheck.session(device="sim", route_cuda=True,
                           executor=AdversarialExecutor(plan)) as rc:
        s = torch.cuda.Stream()
        out = torch.zeros(8, device="cuda")
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fill_seven[(1,)](out, 8)
        torch.cuda.current_stream().wait_stream(s)
        got = out.tolist()
    assert got == [7.0] * 8 and rc.findings == []


# -- opaque kernels ---------------------------------------------------------------------------

def test_declared_python_launcher_race_is_found():
    @racecheck.kernel(reads=["x"], writes=["out"])
    def scale(x, out):
        out.copy_(x * 3)            # stands in for an extension's launch

    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = torch.cuda.Stream()
        x = racecheck.name(torch.ones(4, device="cuda"), "x")
        out = racecheck.name(torch.zeros(4, device="cuda"), "out")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            scale(x, out)
        out.sum()
    assert [(f.rule, f.tensor, f.previous.op) for f in rc.findings] == [("RC001", "out", "scale")]


def test_declared_by_import_path_with_a_reference_on_sim(tmp_path, monkeypatch):
    mod = tmp_path / "fake_ext.py"
    mod.write_text("def fused(a, out):\n    raise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fake_ext
    decl = racecheck.kernel("fake_ext.fused", reads=["a"], writes=["out"],
                            reference=lambda a, out: out.copy_(a + 1))
    try:
        with racecheck.session(device="sim", route_cuda=True) as rc:
            s = torch.cuda.Stream()
            a = racecheck.name(torch.ones(4, device="cuda"), "a")
            out = racecheck.name(torch.zeros(4, device="cuda"), "out")
            torch.cuda.synchronize()
            with torch.cuda.stream(s):
                fake_ext.fused(a, out)
            got = out.tolist()
        assert got == [2.0] * 4
        assert pairs(rc.findings) == [("RC001", "out")]
    finally:
        from racecheck.instrumentation import kernels
        kernels._by_path.pop(decl.target, None)
    assert fake_ext.fused.__name__ == "fused" and not hasattr(fake_ext.fused, "racecheck_kernel")


def _define_ext_op(name):
    lib = torch.library.Library("rctest", "FRAGMENT")
    lib.define(f"{name}(Tensor x, Tensor out) -> ()")        # no (a!): writes undeclared

    def impl(x, out):
        out.copy_(x * 2)
    lib.impl(name, impl, "CPU")
    return lib


def test_undeclared_extension_op_is_listed_in_coverage():
    lib = _define_ext_op("scale_undeclared")
    with racecheck.session(device="sim", route_cuda=True) as rc:
        x = torch.ones(4, device="cuda")
        out = torch.zeros(4, device="cuda")
        torch.ops.rctest.scale_undeclared(x, out)
        torch.ops.rctest.scale_undeclared(x, out)
    cov = rc.coverage["unchecked"]
    assert [(c["kernel"], c["launches"]) for c in cov] == [("rctest::scale_undeclared", 2)]
    assert cov[0]["site"].startswith("test_kernels.py:")
    del lib


def test_declared_extension_op_race_is_found():
    lib = _define_ext_op("scale_declared")
    racecheck.kernel("rctest::scale_declared", reads=["x"], writes=["out"])
    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = torch.cuda.Stream()
        x = racecheck.name(torch.ones(4, device="cuda"), "x")
        out = racecheck.name(torch.zeros(4, device="cuda"), "out")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            torch.ops.rctest.scale_declared(x, out)
        out.sum()
    assert pairs(rc.findings) == [("RC001", "out")]
    assert rc.coverage["unchecked"] == []
    del lib


def test_bad_declarations_are_usage_errors():
    from racecheck.core.errors import UsageError
    with pytest.raises(UsageError):
        @racecheck.kernel(writes=["nope"])
        def f(x):
            pass
    with pytest.raises(UsageError):
        racecheck.kernel(reads=[3])


# -- exact footprints on sim, constexpr branches, indirect pointers ----------------------------

@triton.jit
def write_rows(buf, first, width: tl.constexpr, ROWS: tl.constexpr):
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, width)[None, :]
    tl.store(buf + (first + r) * width + c, tl.full((ROWS, width), 1.0, tl.float32))


@triton.jit
def maybe_write(x_ptr, y_ptr, HAS_Y: tl.constexpr):
    v = tl.load(x_ptr)
    if HAS_Y:
        tl.store(y_ptr, v)
    else:
        tl.store(x_ptr, v + 1)


@triton.jit
def store_through_table(table, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    dst = tl.load(table).to(tl.pointer_type(tl.float32))
    tl.store(dst + i, tl.full((BLOCK,), 5.0, tl.float32), mask=i < n)


def test_constexpr_branches_decide_what_is_written():
    assert analyze(maybe_write, {"HAS_Y": True}).writes == {"y_ptr"}
    assert analyze(maybe_write, {"HAS_Y": False}).writes == {"x_ptr"}
    assert analyze(maybe_write).writes == {"x_ptr", "y_ptr"}      # unknown: both branches


@triton.jit
def _write_if(ptr, v, FLAG: tl.constexpr):
    if FLAG:
        tl.store(ptr, v)


@triton.jit
def sized_maybe_write(x_ptr, y_ptr, BLOCK: tl.constexpr, HAS_Y: tl.constexpr, SCALE: tl.constexpr):
    i = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i) * SCALE
    _write_if(y_ptr + i, v, HAS_Y)


def test_an_analysis_is_reused_by_launches_that_agree_on_what_it_asked(monkeypatch):
    """A constexpr read only as a value (a block size, a scale) does not make the kernel new;
    one that decides a branch, here through a nested call's argument, does."""
    from racecheck.instrumentation import triton_kernels
    runs = []
    real = triton_kernels._Analysis.run
    monkeypatch.setattr(triton_kernels._Analysis, "run",
                        lambda self: runs.append(self.name) or real(self))
    monkeypatch.setattr(triton_kernels, "_cache", {})
    for block in (16, 32, 64):
        for scale in (1.0, 2.0):
            assert analyze(sized_maybe_write, {"BLOCK": block, "HAS_Y": True, "SCALE": scale}
                           ).writes == {"y_ptr"}
    assert runs == ["sized_maybe_write", "_write_if"]
    assert analyze(sized_maybe_write, {"BLOCK": 16, "HAS_Y": False, "SCALE": 1.0}).writes == set()
    assert analyze(sized_maybe_write, {"BLOCK": 8}).writes == {"y_ptr"}     # HAS_Y unknown
    assert analyze(maybe_write, {"HAS_Y": False}).writes == {"x_ptr"}
    assert analyze(maybe_write, {"HAS_Y": True}).writes == {"y_ptr"}
    assert runs.count("sized_maybe_write") == 3 and runs.count("maybe_write") == 2


def test_indirect_pointers_are_flagged_for_the_source_analysis():
    assert analyze(store_through_table).indirect


def _rows_case(read_rows):
    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = torch.cuda.Stream()
        buf = racecheck.name(torch.zeros(8, 4, device="cuda"), "buf")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            write_rows[(1,)](buf, 0, width=4, ROWS=4)     # rows 0..3
        buf[read_rows].sum()
    return rc


def test_sim_footprints_are_the_bytes_the_kernel_touched():
    assert pairs(_rows_case(slice(4, 8)).findings) == []
    rc = _rows_case(slice(2, 6))
    assert pairs(rc.findings) == [("RC001", "buf")]
    assert "rows 2..3" in rc.findings[0].detail


def test_sim_sees_stores_through_pointer_tables():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = torch.cuda.Stream()
        kv = racecheck.name(torch.zeros(8, device="cuda"), "kv")
        table = torch.tensor([kv.data_ptr()], dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            store_through_table[(1,)](table, 8, BLOCK=8)
        got = kv.sum().item()
    assert got == 40.0
    assert [(f.rule, f.tensor, f.previous.op) for f in rc.findings] == [
        ("RC001", "kv", "store_through_table")]


@triton.jit
def copy_through_table(table, out, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    src = tl.load(table).to(tl.pointer_type(tl.float32))
    tl.store(out + i, tl.load(src + i))


def test_a_queued_kernel_keeps_what_it_reaches_through_pointer_tables():
    # sglang's write_cache_indices reads each request's prefix through a table of data_ptr()s;
    # the program may drop a prefix tensor before a slow stream runs the kernel. On a GPU the
    # stream-ordered allocator keeps that memory from other work; the CPU allocator would not.
    from racecheck.instrumentation.adversarial import AdversarialExecutor
    ex = AdversarialExecutor({"priorities": {"#0": -1}, "host": 0})
    with racecheck.session(device="sim", route_cuda=True, executor=ex) as rc:
        out = torch.zeros(64, device="cuda")
        src = torch.arange(64, dtype=torch.float32, device="cuda")
        table = torch.tensor([src.data_ptr()], dtype=torch.int64, device="cuda")
        copy_through_table[(1,)](table, out, BLOCK=64)
        del src
        churn = [torch.full((64,), -1.0) for _ in range(64)]    # reuses freed host memory
        got = out.tolist()
    assert got == [float(i) for i in range(64)]
    assert len(churn) == 64 and rc.findings == [] and ex.faults == []
    assert ex.stats["early_frees"] >= 1          # the drop was reported where it happened


def test_the_interpreter_scans_triton_language_once_per_session(monkeypatch):
    """Triton's interpreter looks for builtins at every launch and nested @jit call; under the
    session each module or class is scanned once, results stay right, and after the session
    the interpreter is Triton's own again."""
    import inspect

    from triton.runtime import interpreter
    own = interpreter._patch_builtin
    scans = []
    real = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda obj, *a: scans.append(obj) or real(obj, *a))
    x = torch.arange(64, dtype=torch.float32)
    idx = torch.arange(63, -1, -1, dtype=torch.int64)
    with racecheck.session(device="sim"):
        for _ in range(3):
            out = torch.zeros(64)
            gather_scale[(4,)](x, out, idx, 64, BLOCK=16)      # a nested helper per program
            assert torch.equal(out, x.flip(0) * 2)
    seen = [s for s in scans if s in (tl, tl.core, tl.math, tl.tensor, tl.core.tensor_descriptor_base)]
    assert len(seen) == len(set(map(id, seen))), "a module or class scanned twice"
    assert interpreter._patch_builtin is own
    assert all(tl.core.is_builtin(getattr(tl, n)) for n in ("load", "store", "arange"))


_CORE_ONLY_HELPER = """
import triton
from triton.language import core


@triton.jit
def doubled(x):
    return core.maximum(x * 2, x * 2)
"""

_THROUGH_CORE_HELPER = """
import triton
import triton.language as tl
from core_only_helper import doubled


@triton.jit
def through_core_helper(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, doubled(tl.load(x_ptr + offs)))
"""


def test_nested_calls_reuse_the_launchs_patched_language(monkeypatch, tmp_path):
    """Triton's interpreter patches `triton.language` at a launch and again at every nested
    `@triton.jit` call; under the session a nested call whose modules the launch patched does
    not, one that sees a module the launch did not patch (`triton.language.core` by that name)
    still is, values' numpy dtypes are looked up once per type, results stay right, and after
    the session the interpreter's functions are Triton's own."""
    import importlib
    import sys

    from triton.runtime import interpreter
    tmp_path.joinpath("core_only_helper.py").write_text(_CORE_ONLY_HELPER)
    tmp_path.joinpath("through_core_helper.py").write_text(_THROUGH_CORE_HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    through_core_helper = importlib.import_module("through_core_helper").through_core_helper
    own_patch, own_dtype = interpreter._patch_lang, interpreter._get_np_dtype
    patched = []
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patched.append(fn.__name__)
                        or own_patch(fn))
    x = torch.arange(64, dtype=torch.float32)
    idx = torch.arange(63, -1, -1, dtype=torch.int64)
    try:
        with racecheck.session(device="sim"):
            for i in range(2):          # other values each time: a launch that is interpreted
                xi, out = x + i, torch.zeros(64)
                gather_scale[(4,)](xi, out, idx, 64, BLOCK=16)     # a nested helper per program
                assert torch.equal(out, xi.flip(0) * 2)
            assert patched == ["gather_scale", "gather_scale"]    # the launches only
            patched.clear()
            out = torch.zeros(64)
            through_core_helper[(4,)](x, out, BLOCK=16)
            assert torch.equal(out, x * 2)
            assert patched == ["through_core_helper", "doubled"]  # core patched once, then kept
        assert interpreter._get_np_dtype is own_dtype
    finally:
        sys.modules.pop("core_only_helper", None)
        sys.modules.pop("through_core_helper", None)
    assert all(tl.core.is_builtin(getattr(tl, n)) for n in ("load", "store", "arange"))


def test_the_interpreter_skips_overflow_checks_nothing_reads(monkeypatch):
    """Without `debug` a compiled launch drops its integer-overflow checks (`device_assert`
    ignores them); under the session the interpreter does not compute them either, and gives
    the same results; after the session its options are Triton's own again."""
    from triton.language import semantic
    from triton.runtime import interpreter
    own = interpreter.interpreter_builder.options
    checks = []
    real = semantic.TritonSemantic.binary_op_sanitize_overflow_impl

    def counted(self, lhs, rhs, op):
        checks.append(self.builder.options.sanitize_overflow)
        return real(self, lhs, rhs, op)
    x = torch.arange(64, dtype=torch.float32)
    idx = torch.arange(63, -1, -1, dtype=torch.int64)
    monkeypatch.setattr(semantic.TritonSemantic, "binary_op_sanitize_overflow_impl", counted)
    with racecheck.session(device="sim"):
        assert interpreter.interpreter_builder.options.sanitize_overflow is False
        out = torch.zeros(64)
        gather_scale[(4,)](x, out, idx, 64, BLOCK=16)
    assert torch.equal(out, x.flip(0) * 2)
    assert checks and not any(checks)       # asked, and answered without computing a check
    assert interpreter.interpreter_builder.options is own and own.sanitize_overflow


def _patched(switch):
    """What a switch replaces while a sim session is installed: (owner, name) pairs."""
    from triton.language import core
    from triton.language.semantic import TritonSemantic
    return {"TYPES_MEMOIZED": [(core.block_type, "__init__"), (core.tensor, "__init__")],
            "BINARY_CHECKS_MEMOIZED": [(TritonSemantic, "binary_op_type_checking_impl")]}[switch]


@pytest.mark.parametrize("switch", ["TYPES_MEMOIZED", "BINARY_CHECKS_MEMOIZED"])
def test_interpreter_memos_give_the_same_runs(monkeypatch, switch):
    """Block types and values' shapes taken from a memo (checked against Triton's constructors
    when the session starts), and binary ops' type checks replayed from one, give the same
    results and the same findings as Triton's own, and after the session Triton's own are
    back."""
    from triton.language import core

    from racecheck.instrumentation import triton_kernels
    own = [owner.__dict__[name] for owner, name in _patched(switch)]
    assert triton_kernels._memoized_inits_agree(
        core, triton_kernels._block_types_memoized(core.block_type.__init__),
        triton_kernels._tensor_shapes_memoized(core.tensor.__init__))
    monkeypatch.setattr(triton_kernels, "LAUNCHES_REPLAYED", False)
    got = {}
    for memo in (False, True):
        monkeypatch.setattr(triton_kernels, switch, memo)
        x = torch.arange(64, dtype=torch.float32)
        idx = torch.arange(63, -1, -1, dtype=torch.int64)
        with racecheck.session(device="sim", record_trace=True) as rc:
            now = [owner.__dict__[name] for owner, name in _patched(switch)]
            assert all((a is b) is not memo for a, b in zip(now, own))
            out = torch.zeros(64)
            gather_scale[(4,)](x, out, idx, 64, BLOCK=16)
            gather_scale[(2,)](x, out, idx, 20, BLOCK=16)
        kernels = [(e.op, e.reads, e.writes) for e in rc.trace.events
                   if type(e).__name__ == "Kernel" and e.op == "gather_scale"]
        got[memo] = (out, kernels, pairs(_rows_case(slice(2, 6)).findings))
    assert len(got[True][1]) == 2 and all(k[1] and k[2] for k in got[True][1])
    assert torch.equal(got[True][0], got[False][0]) and got[True][1:] == got[False][1:]
    assert got[True][2] == [("RC001", "buf")]
    assert [owner.__dict__[name] for owner, name in _patched(switch)] == own


def test_binary_checks_made_once_per_pair_of_types_agree_with_triton():
    """A binary op's type checks replayed from the memo give what Triton's own give, value for
    value (types, numpy data), on drawn operand types, shapes, Python numbers and flags; an op
    Triton rejects is rejected the same way, memo or not."""
    import numpy as np
    from hypothesis import HealthCheck, given, settings, strategies as st
    from triton.language import core
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter

    from racecheck.instrumentation.triton_kernels import _binary_checks_memoized

    orig = TritonSemantic.__dict__["binary_op_type_checking_impl"]
    memoized = _binary_checks_memoized(orig)
    sem = interpreter.interpreter_semantic
    scalars = [core.int1, core.int8, core.int16, core.int32, core.int64, core.uint8,
               core.uint16, core.uint32, core.uint64, core.float16, core.float32, core.float64,
               core.pointer_type(core.float32), core.pointer_type(core.int64)]

    def value(ty, dims, fill):
        np_dtype = np.uint64 if ty.is_ptr() else interpreter._get_np_dtype(ty)
        data = np.full(dims or (1,), fill).astype(np_dtype)
        block = core.block_type(ty, list(dims)) if dims else ty
        return core.tensor(interpreter.TensorHandle(data, ty), block)

    shapes = st.sampled_from([(), (1,), (4,), (4, 1), (1, 8), (4, 8), (2, 4, 8), (8,)])
    tensors = st.builds(value, st.sampled_from(scalars), shapes, st.integers(0, 3))
    numbers = st.one_of(st.integers(-2**64, 2**64), st.booleans(),
                        st.floats(allow_nan=False, width=32), st.sampled_from([2.0**200, -1]))
    operands = st.one_of(tensors, tensors, numbers)

    def outcome(impl, lhs, rhs, flags):
        try:
            got = impl(sem, lhs, rhs, *flags)
        except Exception as e:          # noqa: BLE001 - compared with Triton's own
            return ("raised", type(e).__name__, str(e))
        return tuple((v.type.name, str(v.handle.data.dtype), v.handle.data.tolist(),
                      v.handle.dtype.name) for v in got)

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(operands, operands, st.tuples(st.booleans(), st.booleans(), st.booleans(),
                                         st.booleans()))
    def agree(lhs, rhs, flags):
        want = outcome(orig, lhs, rhs, flags)
        assert outcome(memoized, lhs, rhs, flags) == want       # a miss, or a hit
        assert outcome(memoized, lhs, rhs, flags) == want       # a hit
    agree()


# -- binding a launch's arguments -------------------------------------------------------------

def _plain(a, b, n, BLOCK: tl.constexpr, FLAG: tl.constexpr = True, scale=1.0):
    pass


def _odd(a, *rest, BLOCK: tl.constexpr = 4, **extra):
    pass


@pytest.mark.parametrize("fn", [_plain, _odd])
def test_launch_binding_matches_inspect(fn):
    """A launch's arguments bound without inspect's BoundArguments, as inspect binds them:
    constexprs with defaults applied, and the given names (errors: the positional fallback)."""
    import inspect

    from hypothesis import given, settings, strategies as st

    from racecheck.instrumentation.triton_kernels import _binder, launch_consts

    sig = inspect.signature(fn)
    names = list(sig.parameters) + ["num_warps", "grid"]

    @settings(max_examples=200, deadline=None)
    @given(st.integers(0, 7), st.dictionaries(st.sampled_from(names), st.integers(0, 9),
                                              max_size=4))
    def check(npos, kwargs):
        args = tuple(range(100, 100 + npos))
        known = {k: v for k, v in kwargs.items() if k in sig.parameters}
        try:
            want = sig.bind_partial(*args, **known)
        except TypeError:
            want = None
        try:
            got = _binder(fn).bind(args, kwargs)
        except TypeError:
            got = None
        assert (got is None) == (want is None)
        if want is None:
            assert launch_consts(fn, args, kwargs) == {}
            return
        assert got == dict(want.arguments)
        want.apply_defaults()
        consts = {n: want.arguments[n] for n, p in sig.parameters.items()
                  if "constexpr" in str(p.annotation) and n in want.arguments}
        assert launch_consts(fn, args, kwargs) == consts
    check()
