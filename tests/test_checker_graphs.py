"""Checker: CUDA graph capture and replay (RC001 through replays, RC006, RC007)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # any pytest import mode

from test_checker import D, H, S, TB, X, Y, Z, fp, rules  # noqa: E402

from racecheck.core.trace import CapturedOp, GraphCapture, GraphReplay, NameTensor  # noqa: E402

INP, TMP, OUT, RPI = 20, 21, 22, 23
G = 5


def capture(tb, graph, ops):
    return tb.add(GraphCapture(H, graph, ops, tb.stack("capture")))


def replay(tb, graph, stream=D, fn="replay", line=200):
    """A replay from one call site (as in an engine's decode loop)."""
    return tb.add(GraphReplay(H, graph, stream, (("/eng/cuda_graph_runner.py", line, fn),
                                                 ("/eng/loop.py", 7, "step"))))


def mul_graph(tb):
    """capture g: out.copy_(inp * 2) — two captured ops through a temporary."""
    for sid, name in ((INP, "inp"), (TMP, "tmp"), (OUT, "static_out")):
        tb.tensor(sid, 32, name)
        tb.k(D, w=[fp(sid)], op="zero_")
    tb.sync()
    capture(tb, G, [
        CapturedOp((fp(INP),), (fp(TMP),), "mul", (("/eng/model.py", 40, "forward"),)),
        CapturedOp((fp(TMP),), (fp(OUT),), "copy_", (("/eng/model.py", 41, "forward"),)),
    ])


def test_capture_makes_no_accesses():
    tb = TB()
    tb.tensor(INP, 32, "inp")
    tb.k(S, w=[fp(INP)], op="fill_")             # unsynchronized with the capture stream
    capture(tb, G, [CapturedOp((fp(INP),), (fp(OUT),), "mul")])
    c = tb.check()
    assert c.findings == []
    assert OUT not in c._shadow                  # nothing ran during capture (P25)


def test_replay_makes_accesses_attributed_to_the_captured_op():
    tb = TB()
    mul_graph(tb)
    tb.k(S, w=[fp(INP)], op="fill_", fn="refill")   # P21: on s, then replay on d, no sync
    rseq = replay(tb, G, D)
    fs = tb.findings()
    assert rules(fs) == [("RC001", "inp")]
    f = fs[0]
    assert f.current.op == f"mul (replay of graph {G})"
    assert f.current.location == "cuda_graph_runner.py:200"
    assert f.current.function == "replay" and f.current.seq == rseq
    assert f.current.stack[0].startswith("cuda_graph_runner.py:")
    assert "model.py:40 in forward" in f.current.stack
    assert f.previous.op == "fill_" and f.previous.stream == "s"
    assert any(c.kind == "replay" for c in f.context)


def test_replay_intra_graph_overlap_and_repeated_replays_are_clean():
    tb = TB()
    mul_graph(tb)
    for _ in range(3):
        tb.k(D, w=[fp(INP)], op="fill_")
        replay(tb, G, D)
        tb.k(D, r=[fp(OUT)], w=[fp(Y)], op="consume")
    assert tb.findings() == []


def test_replays_on_two_streams_race():
    tb = TB()
    mul_graph(tb)
    replay(tb, G, D)
    replay(tb, G, S)
    fs = tb.findings()
    assert ("RC003", "tmp") in rules(fs) and ("RC003", "static_out") in rules(fs)


def test_unknown_graph_replay_is_ignored():
    tb = TB()
    replay(tb, 99, D)
    assert tb.findings() == []


def padded_graph(tb, tail_zero):
    """P22/P23: a graph reads all 8 rows of req_pool_indices; populate writes rows [:bs]."""
    tb.tensor(RPI, 64, "req_pool_indices", row_bytes=8, itemsize=8)
    tb.tensor(OUT, 64, "logits")
    tb.tensor(Z, 64, "weights")
    capture(tb, G, [CapturedOp((fp(RPI, 0, 64), fp(Z, 0, 64)), (fp(OUT, 0, 64),), "gather",
                               (("/eng/model.py", 50, "forward"),))])
    for bs in (8, 3, 3):
        tb.k(D, w=[fp(RPI, 0, bs * 8)], op="copy_", fn="populate_from_forward_batch")
        if tail_zero and bs < 8:
            tb.k(D, w=[fp(RPI, bs * 8, 64)], op="zero_", fn="populate_from_forward_batch")
        replay(tb, G, D)
    return tb.findings()


def test_p22_stale_padding_rows_rc006():
    fs = padded_graph(TB(), tail_zero=False)
    assert rules(fs) == [("RC006", "req_pool_indices")]
    f = fs[0]
    assert "rows 3..7 of req_pool_indices were last written before the previous replay" in f.detail
    assert f.suggestion == "rewrite (e.g. zero) the padded rows 3..7 of `req_pool_indices` before each replay"
    assert f.current.op == f"gather (replay of graph {G})" and f.current.kind == "read"
    # previous: the last outside write that covered the stale rows (the bs=8 populate)
    assert f.previous.kind == "write" and f.previous.function == "populate_from_forward_batch"


def test_p23_zeroed_padding_is_clean():
    assert padded_graph(TB(), tail_zero=True) == []


def test_rc006_not_on_first_replay_after_capture():
    tb = TB()
    tb.tensor(RPI, 64, "req_pool_indices", row_bytes=8, itemsize=8)
    tb.k(D, w=[fp(RPI, 0, 64)], op="copy_")       # before capture: does not count
    capture(tb, G, [CapturedOp((fp(RPI, 0, 64),), (fp(OUT, 0, 64),), "gather")])
    tb.k(D, w=[fp(RPI, 0, 24)], op="copy_")
    replay(tb, G, D)                               # first replay: never RC006
    tb.k(D, w=[fp(RPI, 0, 24)], op="copy_")
    replay(tb, G, D)                               # rows 3..7 never rewritten since capture
    assert tb.findings() == []


def test_rc006_recapture_resets_and_own_writes_do_not_refresh():
    tb = TB()
    tb.tensor(RPI, 64, "req_pool_indices", row_bytes=8, itemsize=8)
    # the graph reads RPI and writes its own rows 3..7: that is not a refresh
    ops = [CapturedOp((fp(RPI, 0, 64),), (fp(RPI, 24, 64),), "scatter")]
    capture(tb, G, ops)
    tb.k(D, w=[fp(RPI, 0, 64)], op="copy_")
    replay(tb, G, D)
    tb.k(D, w=[fp(RPI, 0, 24)], op="copy_")
    replay(tb, G, D)
    fs = tb.findings()
    assert rules(fs) == [("RC006", "req_pool_indices")]
    # the graph's own replay overwrote the stale rows after the outside write: the previous
    # access shown is then the previous replay
    assert fs[0].previous.op == f"replay of graph {G}" and fs[0].previous.kind == "replay"
    # a new capture starts over: the next replay is a first replay again
    capture(tb, G, ops)
    tb.k(D, w=[fp(RPI, 0, 24)], op="copy_")
    replay(tb, G, D)
    assert len(tb.findings()) == 1


def staged_graph(tb, read_first=False, approx=None):
    """A runner that stages its inputs inside the graph: a captured copy writes the 8 rows of
    req_pool_indices from the runner's own buffer (inp), then the model reads them; outside the
    graph only rows [:bs] of req_pool_indices are written (another runner sharing the buffer)."""
    tb.tensor(RPI, 64, "req_pool_indices", row_bytes=8, itemsize=8)
    tb.tensor(INP, 64, "staging")
    tb.tensor(OUT, 64, "logits")
    gather = CapturedOp((fp(RPI, 0, 64),), (fp(OUT, 0, 64),), "gather",
                        (("/eng/model.py", 50, "forward"),))
    stage = CapturedOp((fp(INP, 0, 64),), (fp(RPI, 0, 64, approx=approx),), "copy_",
                       (("/eng/runner.py", 12, "stage"),))
    capture(tb, G, [gather, stage, gather] if read_first else [stage, gather])
    for bs in (8, 3, 3):
        tb.k(D, w=[fp(INP, 0, 64)], op="copy_", fn="populate_from_forward_batch")
        tb.k(D, w=[fp(RPI, 0, bs * 8)], op="copy_", fn="eager_forward")
        replay(tb, G, D)
    return tb.findings()


def test_rc006_bytes_the_graph_writes_before_reading_them_are_not_inputs():
    assert staged_graph(TB()) == []
    # a covering write (a kernel's whole-tensor stand-in in a capture) stages them too
    assert staged_graph(TB(), approx="whole tensors in a capture") == []


def test_rc006_a_read_before_the_graphs_own_write_still_reads_an_input():
    fs = staged_graph(TB(), read_first=True)
    assert rules(fs) == [("RC006", "req_pool_indices")]
    assert "rows 3..7" in fs[0].detail


def rc007_trace(born_at):
    tb = TB()
    tb.tensor(OUT, 32, "static_out")
    capture(tb, G, [CapturedOp((fp(X),), (fp(OUT),), "forward")])
    first = replay(tb, G, D)
    # born: the index the next event has when the view is taken (the session's position)
    marks = {"before": first, "first": first + 1}
    second = replay(tb, G, D)
    marks["second"] = second + 1
    born = marks.get(born_at)
    tb.k(D, r=[fp(OUT, 0, 16, born=born)], w=[fp(Y)], op="argmax", fn="sample")
    return tb.findings()


def test_p24_graph_output_overwritten_rc007():
    fs = rc007_trace("first")                      # view taken after replay 1, read after replay 2
    assert rules(fs) == [("RC007", "static_out")]
    f = fs[0]
    assert f.current.op == "argmax" and f.current.kind == "read"
    assert f.previous.op == f"forward (replay of graph {G})" and f.previous.kind == "write"
    assert f.suggestion == "consume or .clone() the output before the next replay of the graph"


def test_rc007_negatives():
    assert rc007_trace("second") == []             # view taken after the latest replay
    assert rc007_trace("before") == []             # view taken before any replay
    assert rc007_trace(None) == []                 # born unknown: never RC007


def test_rc007_host_read_and_not_after_other_write():
    tb = TB()
    tb.tensor(OUT, 32, "static_out")
    capture(tb, G, [CapturedOp((fp(X),), (fp(OUT),), "forward")])
    r1 = replay(tb, G, D)
    r2 = replay(tb, G, D)
    tb.sync()
    tb.host(r=[fp(OUT, born=r1 + 1)], op="tolist")
    fs = tb.findings()
    assert rules(fs) == [("RC007", "static_out")] and fs[0].current.stream == "main"
    assert fs[0].previous.seq == r2
    # someone rewrote the bytes after the replay: the read sees that write, not a replay output
    tb.k(D, w=[fp(OUT)], op="fill_")
    tb.sync()
    tb.host(r=[fp(OUT, born=r1 + 1)], op="tolist", fn="again")
    assert len(tb.findings()) == 1


def test_named_subrange_in_graph_buffer():
    tb = TB()
    tb.tensor(OUT, 64, "graph_pool")
    tb.add(NameTensor(H, OUT, 0, 32, "mm_input_embeds", 8, 4))
    capture(tb, G, [CapturedOp((fp(X),), (fp(OUT, 0, 64),), "forward")])
    replay(tb, G, D)
    tb.k(S, r=[fp(OUT, 8, 16)], w=[fp(Y)], op="use")
    fs = tb.findings()
    assert rules(fs) == [("RC001", "mm_input_embeds")]
    assert "rows 1 of `mm_input_embeds`" in fs[0].detail
