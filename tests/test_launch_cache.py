"""Interpreted Triton launches replayed from their exact inputs (instrumentation/launch_cache.py):
a replay gives the bytes and the footprints an interpretation would, and only where the launch
loads the same bytes on the same layout."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import racecheck

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from racecheck.instrumentation import launch_cache, launch_store, triton_kernels  # noqa: E402


@triton.jit
def gather_twice(x_ptr, out_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    i = tl.load(idx_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, tl.load(x_ptr + i, mask=mask) * 2, mask=mask)


@triton.jit
def store_then_load(buf_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(buf_ptr + offs, tl.load(buf_ptr + offs) + 1)
    tl.store(out_ptr + offs, tl.load(buf_ptr + offs) * 3)       # loads what it stored


@triton.jit
def copy_through_table(table, out, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    src = tl.load(table).to(tl.pointer_type(tl.float32))
    tl.store(out + i, tl.load(src + i))


def _kernels(rc):
    return [(e.op, [(f.ranges, f.host) for f in e.reads], [(f.ranges, f.host) for f in e.writes])
            for e in rc.trace if type(e).__name__ == "Kernel"]


def _gathers(values, idx_values, n=6):
    """Two launches of gather_twice on fresh tensors holding the given values."""
    outs = []
    with racecheck.session(device="sim", route_cuda=True, record_trace=True) as rc:
        for xs, ids in zip(values, idx_values):
            x = torch.tensor(xs, dtype=torch.float32, device="cuda")
            idx = torch.tensor(ids, dtype=torch.int64, device="cuda")
            out = torch.full((8,), -1.0, device="cuda")
            gather_twice[(2,)](x, out, idx, n, BLOCK=4)
            outs.append(out.tolist())
    return outs, _kernels(rc)


def _uncached(monkeypatch, fn, *args):
    monkeypatch.setattr(triton_kernels, "LAUNCHES_REPLAYED", False)
    try:
        return fn(*args)
    finally:
        monkeypatch.setattr(triton_kernels, "LAUNCHES_REPLAYED", True)


def test_a_launch_on_the_same_bytes_elsewhere_is_replayed_with_its_footprints(monkeypatch):
    xs, ids = [float(v) for v in range(8)], [5, 4, 3, 2, 1, 0, 7, 7]
    got, kernels = _gathers([xs, xs], [ids, ids])
    assert (launch_cache.CACHE.hits, launch_cache.CACHE.misses) == (1, 1)
    want, want_kernels = _uncached(monkeypatch, _gathers, [xs, xs], [ids, ids])
    assert got == want == [[10.0, 8.0, 6.0, 4.0, 2.0, 0.0, -1.0, -1.0]] * 2
    assert kernels == want_kernels


def test_a_loaded_byte_that_changed_is_interpreted_and_one_never_loaded_is_not(monkeypatch):
    xs, ids = [float(v) for v in range(8)], [5, 4, 3, 2, 1, 0, 7, 7]
    unread = xs[:6] + [70.0, 80.0]                 # x[6], x[7] are never gathered
    loaded = [100.0] + xs[1:]                      # x[0] is
    masked = ids[:6] + [0, 0]                      # idx[6], idx[7] are masked off (n = 6)
    got, kernels = _gathers([xs, unread, loaded, xs], [ids, ids, ids, masked])
    assert launch_cache.CACHE.hits == 2 and launch_cache.CACHE.misses == 2
    want, want_kernels = _uncached(monkeypatch, _gathers, [xs, unread, loaded, xs],
                                   [ids, ids, ids, masked])
    assert got == want and kernels == want_kernels
    assert got[2][5] == 200.0


def test_a_launch_that_loads_what_it_stored_replays_its_final_bytes(monkeypatch):
    def run():
        outs = []
        with racecheck.session(device="sim", route_cuda=True):
            for _ in range(3):
                buf = torch.arange(4, dtype=torch.float32, device="cuda")
                out = torch.zeros(4, device="cuda")
                store_then_load[(1,)](buf, out, BLOCK=4)
                outs.append((buf.tolist(), out.tolist()))
        return outs
    got = run()
    assert launch_cache.CACHE.hits == 2
    assert got == _uncached(monkeypatch, run) == [([1.0, 2.0, 3.0, 4.0], [3.0, 6.0, 9.0, 12.0])] * 3


def test_the_layout_key_tells_aliases_offsets_and_scalars_apart():
    base = torch.zeros(16)
    a, b = torch.zeros(8), torch.zeros(8)

    def key(*args, grid=(1,), **kw):
        return launch_cache.Layout(gather_twice, grid, args, kw).key
    assert key(a, b, 3) == key(torch.zeros(8), torch.zeros(8), 3)      # placed elsewhere
    assert key(a, b, 3) != key(a, a, 3)                                 # one storage twice
    assert key(base[:8], base[8:], 3) != key(a, b, 3)                  # a storage's offset
    assert key(a, b, 3) != key(a, b, 3.0) != key(a, b, 4)
    assert key(a, b, 3, BLOCK=4) != key(a, b, 3, BLOCK=8)
    assert key(a, b, 3, grid=(2,)) != key(a, b, 3)
    with pytest.raises(launch_cache.Uncacheable):
        key(a, b, object())                     # its repr is its address
    with pytest.raises(launch_cache.Uncacheable):
        key(a, b, 3, grid=lambda meta: (1,))


def test_kernels_that_load_pointers_are_always_interpreted():
    with racecheck.session(device="sim", route_cuda=True):
        for _ in range(2):
            src = torch.arange(8, dtype=torch.float32, device="cuda")
            out = torch.zeros(8, device="cuda")
            table = torch.tensor([src.data_ptr()], dtype=torch.int64, device="cuda")
            copy_through_table[(1,)](table, out, BLOCK=8)
            assert out.tolist() == src.tolist()
    assert launch_cache.CACHE.hits == launch_cache.CACHE.misses == 0


def test_records_are_bounded_in_count_and_bytes():
    class L:
        name = None

        def __init__(self, k):
            self.key = k

    def rec(n=0):
        return launch_cache.Record([(0, np.zeros(n, np.int64), np.zeros(n, np.uint8))], [],
                                   ((), ()))
    cache = launch_cache.LaunchCache(entries=3, per_key=2)
    for k in range(5):
        for _ in range(2):
            cache.keep(L(k), rec())
    assert cache.count <= 3 and L(0).key not in cache._records and L(4).key in cache._records
    cache = launch_cache.LaunchCache(nbytes=2000)
    for k in range(4):
        cache.keep(L(k), rec(100))                 # 900 bytes each
    assert cache.nbytes == 1800 and list(cache._records) == [2, 3]
    cache.keep(L(9), rec(1000))                    # more than the bound alone: kept, alone
    assert list(cache._records) == [9] and cache.nbytes == 9000


def test_a_run_for_values_only_replays_but_never_serves_a_checked_launch(monkeypatch):
    xs, ids = [float(v) for v in range(8)], [5, 4, 3, 2, 1, 0, 7, 7]

    def values_only():
        outs = []
        with racecheck.session(device="sim", route_cuda=True, check=False):
            for _ in range(2):
                x = torch.tensor(xs, device="cuda")
                idx = torch.tensor(ids, device="cuda")
                out = torch.full((8,), -1.0, device="cuda")
                gather_twice[(2,)](x, out, idx, 6, BLOCK=4)
                outs.append(out.tolist())
        return outs
    assert values_only() == [[10.0, 8.0, 6.0, 4.0, 2.0, 0.0, -1.0, -1.0]] * 2
    assert (launch_cache.CACHE.hits, launch_cache.CACHE.misses) == (1, 1)
    got, kernels = _gathers([xs], [ids])          # checked: needs footprints, interpreted
    assert launch_cache.CACHE.misses == 2
    assert kernels == _uncached(monkeypatch, _gathers, [xs], [ids])[1]
    assert values_only() and launch_cache.CACHE.hits == 3     # a checked record serves it


def test_a_record_names_its_spans_so_host_and_device_arguments_are_kept_apart(monkeypatch):
    xs, ids = [float(v) for v in range(8)], [5, 4, 3, 2, 1, 0, 7, 7]

    def run():
        with racecheck.session(device="sim", route_cuda=True, record_trace=True) as rc:
            for where in ("cuda", "cpu"):
                x = torch.tensor(xs, device=where)
                idx = torch.tensor(ids, device="cuda")
                out = torch.full((8,), -1.0, device="cuda")
                gather_twice[(2,)](x, out, idx, 6, BLOCK=4)
        return _kernels(rc), [[f.host for f in e.reads] for e in rc.trace
                              if type(e).__name__ == "Kernel"]
    kernels, hosts = run()
    assert launch_cache.CACHE.hits == 0
    assert (kernels, hosts) == _uncached(monkeypatch, run)


SCALE = 2.0


@triton.jit
def scaled_copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * SCALE)


def test_a_global_the_kernel_reads_is_part_of_the_launch(monkeypatch):
    got = []
    with racecheck.session(device="sim", route_cuda=True):
        for scale in (2.0, 2.0, 3.0):
            monkeypatch.setattr(__import__(__name__), "SCALE", scale)
            x = torch.ones(4, device="cuda")
            out = torch.zeros(4, device="cuda")
            scaled_copy[(1,)](x, out, BLOCK=4)
            got.append(out.tolist())
    assert got == [[2.0] * 4, [2.0] * 4, [3.0] * 4]
    assert (launch_cache.CACHE.hits, launch_cache.CACHE.misses) == (1, 2)
    assert [n for _, n in launch_cache._global_reads(gather_twice)] == []


# -- records on disk (instrumentation/launch_store.py) ------------------------------------------

def _record_files(root):
    return sorted(p for p in root.rglob("*.rec"))


def test_records_on_disk_serve_another_process_exactly(monkeypatch, tmp_path):
    monkeypatch.setenv(launch_store.ENV, str(tmp_path))
    xs, ids = [float(v) for v in range(8)], [5, 4, 3, 2, 1, 0, 7, 7]
    first, kernels = _gathers([xs], [ids])
    assert len(_record_files(tmp_path)) == 1
    launch_cache.CACHE.clear()                     # as a new process: memory empty, disk kept
    again, replayed = _gathers([xs, xs], [ids, ids])
    assert (launch_cache.CACHE.hits, launch_cache.CACHE.misses) == (2, 0)
    assert again == first * 2 and replayed == kernels * 2


def test_records_on_disk_can_be_turned_off_and_a_bad_file_is_passed_over(monkeypatch, tmp_path):
    xs, ids = [float(v) for v in range(8)], [5, 4, 3, 2, 1, 0, 7, 7]
    monkeypatch.setenv(launch_store.ENV, "off")
    _gathers([xs], [ids])
    assert launch_store.current() is None and _record_files(tmp_path) == []
    monkeypatch.setenv(launch_store.ENV, str(tmp_path))
    launch_cache.CACHE.clear()
    want = _gathers([xs], [ids])
    for p in _record_files(tmp_path):
        p.write_bytes(b"not a record")
    launch_cache.CACHE.clear()
    assert _gathers([xs], [ids]) == want
    assert (launch_cache.CACHE.hits, launch_cache.CACHE.misses) == (0, 1)


def test_a_folder_keeps_few_records_per_key_and_prunes_the_oldest(monkeypatch, tmp_path):
    monkeypatch.setattr(launch_store, "PER_KEY", 2)
    folder = launch_store.RecordFolder(str(tmp_path))
    for i in range(4):
        folder.save("ab" * 32, (i, (), (), None))
    assert len(_record_files(tmp_path)) == 2
    big = tmp_path / "other" / "old.rec"
    big.parent.mkdir()
    big.write_bytes(b"x" * 4000)
    os.utime(big, (1, 1))                          # the oldest file of all
    launch_store.prune(str(tmp_path), cap=3000)
    assert not big.exists() and len(_record_files(tmp_path)) == 2


_TWICE = r"""
import sys, torch, racecheck
sys.path.insert(0, sys.argv[1])
import test_launch_cache as t
from racecheck.instrumentation import launch_cache
outs, kernels = t._gathers([[float(v) for v in range(8)]], [[5, 4, 3, 2, 1, 0, 7, 7]])
print(launch_cache.CACHE.hits, launch_cache.CACHE.misses, outs, kernels)
"""


def test_a_second_process_replays_what_the_first_recorded(tmp_path):
    env = dict(os.environ, **{launch_store.ENV: str(tmp_path)})
    runs = [subprocess.run([sys.executable, "-c", _TWICE, os.path.dirname(__file__)], env=env,
                           capture_output=True, text=True, check=True).stdout.split(" ", 2)
            for _ in range(2)]
    assert runs[0][:2] == ["0", "1"] and runs[1][:2] == ["1", "0"]
    assert runs[0][2] == runs[1][2]


def test_a_run_for_values_only_keeps_its_records_in_memory(monkeypatch, tmp_path):
    monkeypatch.setenv(launch_store.ENV, str(tmp_path))
    with racecheck.session(device="sim", route_cuda=True, check=False):
        x = torch.ones(4, device="cuda")
        out = torch.zeros(4, device="cuda")
        scaled_copy[(1,)](x, out, BLOCK=4)
    assert launch_cache.CACHE.count == 1 and _record_files(tmp_path) == []
