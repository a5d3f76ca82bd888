"""The public hazard cases of docs/CASES.md as programs over a device module.

Each case takes (dm, device) and returns nothing; the expected verdict lives in EXPECTED.
The same functions run on `sim`, on the npu stand-in and, where a GPU exists, on `cuda`.
"""
from __future__ import annotations

import threading

import torch

import racecheck


def _tensor(device, *shape, fill=0.0, name=None):
    t = torch.full(shape, fill, device=device)
    return racecheck.name(t, name) if name else t


def _setup(dm):
    s, s2, e = dm.Stream(), dm.Stream(), dm.Event()
    return s, s2, e


def p01(dm, device):
    s, _, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)
    y = x * 2  # noqa: F841
    return locals()


def p02(dm, device):
    s, _, e = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)
    e.record(s)
    dm.current_stream().wait_event(e)
    y = x * 2  # noqa: F841
    return locals()


def p03(dm, device):
    s, _, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)
    dm.current_stream().wait_stream(s)
    y = x * 2  # noqa: F841
    return locals()


def p04(dm, device):
    s, s2, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)
    s.synchronize()
    with dm.stream(s2):
        y = x * 2  # noqa: F841
    return locals()


def p05(dm, device):
    s, s2, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)
    dm.synchronize()
    with dm.stream(s2):
        y = x * 2  # noqa: F841
    return locals()


def p06(dm, device):
    s, _, e = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        x.add_(1)
    e.record(s)
    e.synchronize()
    y = x * 2  # noqa: F841
    return locals()


def p07(dm, device):
    s, _, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        a = x + 1  # noqa: F841
    b = x + 2  # noqa: F841
    return locals()


def p08(dm, device):
    s, _, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    a = x + 1  # noqa: F841
    with dm.stream(s):
        x.zero_()
    return locals()


def p09(dm, device):
    s, _, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    x.fill_(1)
    with dm.stream(s):
        x.fill_(2)
    return locals()


def p10(dm, device):
    s, s2, _ = _setup(dm)
    x = _tensor(device, 16, name="x")
    dm.synchronize()
    with dm.stream(s):
        x[0::2].fill_(1)
    with dm.stream(s2):
        x[1::2].fill_(2)
    return locals()


def p11(dm, device):
    s, _, _ = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    with dm.stream(s):
        x[0:4].fill_(1)
    y = x[2:6].sum()  # noqa: F841
    return locals()


def p12(dm, device):
    s, _, _ = _setup(dm)
    x = _tensor(device, 16, name="x")
    m = x.view(4, 4)
    dm.synchronize()
    with dm.stream(s):
        m.t()[0].fill_(1)
    y = m[:, 1].sum()  # noqa: F841
    return locals()


def _index_case(dm, device, read_rows):
    s, _, _ = _setup(dm)
    buf = _tensor(device, 8, 4, name="buf")
    v = torch.ones(2, 4, device=device)
    wi = torch.tensor([0, 1], device=device)
    ri = torch.tensor(read_rows, device=device)
    dm.synchronize()
    with dm.stream(s):
        buf[wi] = v
    y = buf[ri]  # noqa: F841
    return locals()


def p13(dm, device):
    return _index_case(dm, device, [5, 6])


def p14(dm, device):
    return _index_case(dm, device, [1, 7])


def p15(dm, device):
    x = _tensor(device, 8, fill=3.0, name="x")
    h = racecheck.name(torch.empty(8, pin_memory=True), "h")
    dm.synchronize()
    h.copy_(x, non_blocking=True)
    h[0].item()
    return locals()


def p16(dm, device):
    e = dm.Event()
    x = _tensor(device, 8, fill=3.0, name="x")
    h = racecheck.name(torch.empty(8, pin_memory=True), "h")
    dm.synchronize()
    h.copy_(x, non_blocking=True)
    e.record()
    e.synchronize()
    h[0].item()
    return locals()


def p17(dm, device):
    x = _tensor(device, 8, name="x")
    h = racecheck.name(torch.ones(8, pin_memory=True), "h")
    dm.synchronize()
    x.copy_(h, non_blocking=True)
    h.fill_(7)
    return locals()


def p18(dm, device):
    s, _, e = _setup(dm)
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    dm.current_stream().wait_event(e)
    with dm.stream(s):
        x.add_(1)
    e.record(s)
    y = x * 2  # noqa: F841
    return locals()


def _free_case(dm, device, record):
    s, _, _ = _setup(dm)
    t = _tensor(device, 64, fill=1.0, name="t")
    dm.synchronize()
    s.wait_stream(dm.current_stream())
    with dm.stream(s):
        u = t * 2  # noqa: F841
    if record:
        t.record_stream(s)
    del t
    return locals()


def p19(dm, device):
    return _free_case(dm, device, record=False)


def p20(dm, device):
    return _free_case(dm, device, record=True)


def p21(dm, device):
    s, _, _ = _setup(dm)
    inp = _tensor(device, 8, fill=1.0, name="inp")
    out = _tensor(device, 8, name="out")
    g = dm.CUDAGraph()
    with dm.graph(g):
        out.copy_(inp * 2)
    dm.synchronize()
    with dm.stream(s):
        inp.fill_(3)
    g.replay()
    return locals()


def _padding_case(dm, device, zero_tail):
    req_pool_indices = racecheck.name(torch.zeros(8, dtype=torch.int64, device=device),
                                      "req_pool_indices")
    table = torch.arange(64, device=device, dtype=torch.float32).reshape(16, 4)
    out = _tensor(device, 8, 4, name="attn_out")
    g = dm.CUDAGraph()
    with dm.graph(g):
        out.copy_(table[req_pool_indices])
    req_pool_indices[:8].copy_(torch.arange(1, 9, device=device))
    g.replay()
    req_pool_indices[:3].copy_(torch.tensor([4, 5, 6], device=device))
    if zero_tail:
        req_pool_indices[3:8].zero_()
    g.replay()
    dm.synchronize()
    return locals()


def p22(dm, device):
    return _padding_case(dm, device, zero_tail=False)


def p23(dm, device):
    return _padding_case(dm, device, zero_tail=True)


def p24(dm, device):
    inp = _tensor(device, 8, fill=1.0, name="inp")
    static_out = _tensor(device, 8, name="static_out")
    g = dm.CUDAGraph()
    with dm.graph(g):
        static_out.copy_(inp * 2)
    g.replay()
    o = static_out[:4]
    inp.fill_(5)
    g.replay()
    o.sum()
    dm.synchronize()
    return locals()


def p25(dm, device):
    s, _, _ = _setup(dm)
    inp = _tensor(device, 8, fill=1.0, name="inp")
    out = _tensor(device, 8, name="out")
    g = dm.CUDAGraph()
    with dm.graph(g):
        out.copy_(inp * 2)
    with dm.stream(s):
        out.sum()
        inp.fill_(2)
    return locals()


def _threads(dm, device, shared):
    x = _tensor(device, 8, name="x")
    other = _tensor(device, 8, name="other")
    dm.synchronize()
    s, s2 = dm.Stream(), dm.Stream()

    def a():
        with dm.stream(s):
            x.add_(1)

    def b():
        with dm.stream(s2):
            (x if shared else other).mul_(2)

    for fn in (a, b):
        th = threading.Thread(target=fn)
        th.start()
        th.join()
    return locals()


def p26(dm, device):
    return _threads(dm, device, shared=False)


def p27(dm, device):
    x = _tensor(device, 8, name="x")
    dm.synchronize()
    s, s2 = dm.Stream(), dm.Stream()

    def a():
        with dm.stream(s):
            x.add_(1)

    def b():
        with dm.stream(s2):
            y = x * 2  # noqa: F841

    for fn in (a, b):
        th = threading.Thread(target=fn)
        th.start()
        th.join()
    return locals()


# id -> (program, {(rule, tensor), ...} expected exactly)
EXPECTED = {
    "P01": (p01, {("RC001", "x")}),
    "P02": (p02, set()),
    "P03": (p03, set()),
    "P04": (p04, set()),
    "P05": (p05, set()),
    "P06": (p06, set()),
    "P07": (p07, set()),
    "P08": (p08, {("RC002", "x")}),
    "P09": (p09, {("RC003", "x")}),
    "P10": (p10, set()),
    "P11": (p11, {("RC001", "x")}),
    "P12": (p12, set()),
    "P13": (p13, set()),
    "P14": (p14, {("RC001", "buf")}),
    "P15": (p15, {("RC004", "h")}),
    "P16": (p16, set()),
    "P17": (p17, {("RC004", "h")}),
    "P18": (p18, {("RC001", "x"), ("RC008", "x")}),
    "P19": (p19, {("RC005", "t")}),
    "P20": (p20, set()),
    "P21": (p21, {("RC001", "inp")}),
    "P22": (p22, {("RC006", "req_pool_indices")}),
    "P23": (p23, set()),
    "P24": (p24, {("RC007", "static_out")}),
    "P25": (p25, set()),
    "P26": (p26, set()),
    "P27": (p27, {("RC001", "x")}),
}
