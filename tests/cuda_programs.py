"""The public hazard cases of docs/CASES.md as plain torch.cuda programs: no racecheck in sight.

    python tests/cuda_programs.py P01            # on a GPU: runs the case
    racecheck exec -- python tests/cuda_programs.py P01     # on any machine: checks it

Each case is the twin of tests/cases.py's (written against a device module) and must get the
same verdict under `racecheck exec` on a CPU-only machine (torch.cuda routed to sim) and on a GPU.
Tensor names in findings come from the variables holding them (each case returns its locals).
"""
import sys
import threading

import torch


def p01():
    s = torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x.add_(1)
    y = x * 2
    return locals()


def p02():
    s, e = torch.cuda.Stream(), torch.cuda.Event()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x.add_(1)
    e.record(s)
    torch.cuda.current_stream().wait_event(e)
    y = x * 2
    return locals()


def p03():
    s = torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    y = x * 2
    return locals()


def p04():
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x.add_(1)
    s.synchronize()
    with torch.cuda.stream(s2):
        y = x * 2
    return locals()


def p05():
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.synchronize()
    with torch.cuda.stream(s2):
        y = x * 2
    return locals()


def p06():
    s, e = torch.cuda.Stream(), torch.cuda.Event()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x.add_(1)
    e.record(s)
    e.synchronize()
    y = x * 2
    return locals()


def p07():
    s = torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        a = x + 1
    b = x + 2
    return locals()


def p08():
    s = torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    a = x + 1
    with torch.cuda.stream(s):
        x.zero_()
    return locals()


def p09():
    s = torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    x.fill_(1)
    with torch.cuda.stream(s):
        x.fill_(2)
    return locals()


def p10():
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x[0::2].fill_(1)
    with torch.cuda.stream(s2):
        x[1::2].fill_(2)
    return locals()


def p11():
    s = torch.cuda.Stream()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x[0:4].fill_(1)
    y = x[2:6].sum()
    return locals()


def p12():
    s = torch.cuda.Stream()
    x = torch.zeros(16, device="cuda")
    m = x.view(4, 4)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        m.t()[0].fill_(1)
    y = m[:, 1].sum()
    return locals()


def _index_case(read_rows):
    s = torch.cuda.Stream()
    buf = torch.zeros(8, 4, device="cuda")
    v = torch.ones(2, 4, device="cuda")
    wi = torch.tensor([0, 1], device="cuda")
    ri = torch.tensor(read_rows, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        buf[wi] = v
    y = buf[ri]
    return locals()


def p13():
    return _index_case([5, 6])


def p14():
    return _index_case([1, 7])


def p15():
    x = torch.full((8,), 3.0, device="cuda")
    h = torch.empty(8, pin_memory=True)
    torch.cuda.synchronize()
    h.copy_(x, non_blocking=True)
    h[0].item()
    return locals()


def p16():
    e = torch.cuda.Event()
    x = torch.full((8,), 3.0, device="cuda")
    h = torch.empty(8, pin_memory=True)
    torch.cuda.synchronize()
    h.copy_(x, non_blocking=True)
    e.record()
    e.synchronize()
    h[0].item()
    return locals()


def p17():
    x = torch.zeros(8, device="cuda")
    h = torch.ones(8, pin_memory=True)
    torch.cuda.synchronize()
    x.copy_(h, non_blocking=True)
    h.fill_(7)
    return locals()


def p18():
    s, e = torch.cuda.Stream(), torch.cuda.Event()
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.current_stream().wait_event(e)
    with torch.cuda.stream(s):
        x.add_(1)
    e.record(s)
    y = x * 2
    return locals()


def _free_case(record):
    s = torch.cuda.Stream()
    t = torch.ones(64, device="cuda")
    torch.cuda.synchronize()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        u = t * 2
    if record:
        t.record_stream(s)
    del t
    return locals()


def p19():
    return _free_case(record=False)


def p20():
    return _free_case(record=True)


def p21():
    s = torch.cuda.Stream()
    inp = torch.ones(8, device="cuda")
    out = torch.zeros(8, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(inp * 2)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        inp.fill_(3)
    g.replay()
    return locals()


def _padding_case(zero_tail):
    req_pool_indices = torch.zeros(8, dtype=torch.int64, device="cuda")
    table = torch.arange(64, device="cuda", dtype=torch.float32).reshape(16, 4)
    attn_out = torch.zeros(8, 4, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        attn_out.copy_(table[req_pool_indices])
    req_pool_indices[:8].copy_(torch.arange(1, 9, device="cuda"))
    g.replay()
    req_pool_indices[:3].copy_(torch.tensor([4, 5, 6], device="cuda"))
    if zero_tail:
        req_pool_indices[3:8].zero_()
    g.replay()
    torch.cuda.synchronize()
    return locals()


def p22():
    return _padding_case(zero_tail=False)


def p23():
    return _padding_case(zero_tail=True)


def p24():
    inp = torch.ones(8, device="cuda")
    static_out = torch.zeros(8, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out.copy_(inp * 2)
    g.replay()
    o = static_out[:4]
    inp.fill_(5)
    g.replay()
    o.sum()
    torch.cuda.synchronize()
    return locals()


def p25():
    s = torch.cuda.Stream()
    inp = torch.ones(8, device="cuda")
    out = torch.zeros(8, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(inp * 2)
    with torch.cuda.stream(s):
        out.sum()
        inp.fill_(2)
    return locals()


def _threads(shared):
    x = torch.zeros(8, device="cuda")
    other = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def a():
        with torch.cuda.stream(s):
            x.add_(1)

    def b():
        with torch.cuda.stream(s2):
            (x if shared else other).mul_(2)

    for fn in (a, b):
        th = threading.Thread(target=fn)
        th.start()
        th.join()
    return locals()


def p26():
    return _threads(shared=False)


def p27():
    x = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def a():
        with torch.cuda.stream(s):
            x.add_(1)

    def b():
        with torch.cuda.stream(s2):
            y = x * 2

    for fn in (a, b):
        th = threading.Thread(target=fn)
        th.start()
        th.join()
    return locals()


CASES = {f"P{n:02d}": globals()[f"p{n:02d}"] for n in range(1, 28)}

if __name__ == "__main__":
    keep = CASES[sys.argv[1]]()
