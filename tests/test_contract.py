"""docs/CONTRACT.md's first example, without its `dm.synchronize()`, verbatim in behaviour
(outside tests rely on it)."""
import torch

import racecheck


def test_contract_first_example():
    with racecheck.session(device="sim") as rc:
        dm = rc.device_module
        s, e = dm.Stream(), dm.Event()
        x = racecheck.name(torch.zeros(8), "seq_lens")
        rc.name_stream(s, "plan_stream")
        with dm.stream(s):
            x.add_(1)
        y = x * 2  # noqa: F841
    findings = rc.findings
    f = findings[0]
    assert f.rule == "RC001"                       # add_ reads what zeros wrote on default
    assert f.tensor == "seq_lens"
    assert f.streams == ("plan_stream", "default")
    assert (f.current.stream, f.previous.stream) == f.streams
    assert f.current.op == "add_" and f.current.kind == "read"
    assert f.current.location.startswith("test_contract.py:")
    assert "plan_stream" in f.suggestion and "default" in f.suggestion
    assert [g.rule for g in findings].count("RC001") == len(findings)


def test_inplace_ops_read_and_write_but_pure_overwrites_only_write():
    with racecheck.session() as rc:
        dm = rc.device_module
        s = dm.Stream()
        x = racecheck.name(torch.zeros(8), "x")
        dm.synchronize()
        x.fill_(1)
        with dm.stream(s):
            x.fill_(2)        # overwrite after an unordered write: RC003
        dm.synchronize()
        x.add_(1)
        with dm.stream(s):
            x.mul_(2)         # read-modify-write after an unordered write: RC001
    assert [(f.rule, f.tensor) for f in rc.findings] == [("RC003", "x"), ("RC001", "x")]


def test_device_module_surface():
    with racecheck.session() as rc:
        dm = rc.device_module
        s = dm.Stream()
        ev = s.record_event()
        assert ev.query() is True
        dm.current_stream().wait_event(ev)
        s.wait_stream(dm.current_stream())
        e = dm.Event()
        e.record()
        e.wait(s)
        e.synchronize()
        h = torch.empty(4, pin_memory=True)
        assert h.is_pinned()
        x = torch.ones(4)
        x.numpy()
        x.tolist()
        int(x[0]), float(x[1]), bool(x[2])
        x.record_stream(s)
        dm.set_stream(s)
        assert dm.current_stream() is s
        dm.set_stream(dm.default_stream())
        g = dm.CUDAGraph()
        with dm.graph(g):
            x.mul_(2)
        g.replay()
        dm.synchronize()
    assert rc.findings == [] and not rc.internal_errors
