"""RC006 with declared intent: stale-tolerant graph inputs, and stale values used as indices."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import racecheck
from racecheck.core.trace import Footprint, Kernel, Trace

from helpers import pairs, recheck


def _run(body, declare=True, record_trace=False):
    """A graph over an 8-row per-replay input `ids`; populate all rows, replay, then rows [:3]
    only and replay again (rows 3..7 are stale at the second replay, as in CASES P22)."""
    with racecheck.session(device="sim", record_trace=record_trace) as rc:
        dm = rc.device_module
        ids = racecheck.name(torch.zeros(8, dtype=torch.int64), "ids")
        if declare:
            racecheck.stale_tolerant(ids)
        state = body(dm, ids, None)
        g = dm.CUDAGraph()
        with dm.graph(g):
            body(dm, ids, state)
        ids.copy_(torch.arange(1, 9))
        g.replay()
        ids[:3].copy_(torch.tensor([4, 5, 6]))
        after = state.get("between")
        if after is not None:
            after()
        g.replay()
        late = state.get("late")
        if late is not None:
            late()
        dm.synchronize()
    return rc


def _as_data(dm, ids, state):
    if state is None:
        return {"out": racecheck.name(torch.zeros(8, dtype=torch.int64), "out")}
    state["out"].copy_(ids * 2)


def _gather_into(writes):
    """`table[ids]`; `writes` in (None, "between", "late"): when the run rewrites table rows."""
    def body(dm, ids, state):
        if state is None:
            table = racecheck.name(torch.arange(64.0).reshape(16, 4), "req_to_token")
            st = {"table": table, "out": torch.zeros(8, 4)}
            if writes is not None:
                st[writes] = lambda: table[2].fill_(7.0)
            return st
        state["out"].copy_(state["table"][ids])
    return body


def test_undeclared_stale_rows_are_rc006_whatever_their_use():
    assert set(pairs(_run(_as_data, declare=False).findings)) == {("RC006", "ids")}
    assert set(pairs(_run(_gather_into(None), declare=False).findings)) == {("RC006", "ids")}


def test_declared_stale_rows_used_as_data_are_silent():
    assert pairs(_run(_as_data).findings) == []


def test_declared_stale_index_into_memory_never_written_after_capture_is_silent():
    assert pairs(_run(_gather_into(None)).findings) == []

    def embed(dm, ids, state):
        if state is None:
            return {"w": racecheck.name(torch.randn(16, 4), "embed_tokens"), "out": torch.zeros(8, 4)}
        state["out"].copy_(F.embedding(ids, state["w"]))
    assert pairs(_run(embed).findings) == []

    def select(dm, ids, state):
        if state is None:
            return {"w": torch.randn(16, 4), "out": torch.zeros(8, 4)}
        state["out"].copy_(torch.index_select(state["w"], 0, ids))
    assert pairs(_run(select).findings) == []


def test_declared_stale_index_into_mutated_memory_stays_rc006():
    rc = _run(_gather_into("between"))
    assert set(pairs(rc.findings)) == {("RC006", "ids")}
    f = rc.findings[0]
    assert "rows 3..7" in f.detail or "elements 3..7" in f.detail
    assert "as indices into `req_to_token`" in f.detail
    assert f.current.op.startswith("index")


def test_the_verdict_does_not_depend_on_when_the_indexed_memory_is_written():
    assert set(pairs(_run(_gather_into("late")).findings)) == {("RC006", "ids")}


def test_stale_kv_write_location_stays_rc006():
    def kv_write(dm, ids, state):
        if state is None:
            return {"kv": racecheck.name(torch.zeros(16, 4), "kv_cache"), "v": torch.ones(8, 4)}
        state["kv"].index_put_((ids,), state["v"])
    rc = _run(kv_write)
    assert set(pairs(rc.findings)) == {("RC006", "ids")}
    assert "`kv_cache`" in rc.findings[0].detail


def test_declaration_covers_only_the_declared_bytes():
    def body(dm, ids, state):
        if state is None:
            return {"out": torch.zeros(8, dtype=torch.int64)}
        state["out"].copy_(ids * 2)
    with racecheck.session(device="sim") as rc:
        dm = rc.device_module
        ids = racecheck.name(torch.zeros(8, dtype=torch.int64), "ids")
        racecheck.stale_tolerant(ids[:5])           # rows 5..7 not declared
        out = torch.zeros(8, dtype=torch.int64)
        g = dm.CUDAGraph()
        with dm.graph(g):
            out.copy_(ids * 2)
        ids.copy_(torch.arange(1, 9))
        g.replay()
        ids[:3].copy_(torch.tensor([4, 5, 6]))
        g.replay()
        dm.synchronize()
    assert set(pairs(rc.findings)) == {("RC006", "ids")}
    assert "5..7" in rc.findings[0].detail and "3..7" not in rc.findings[0].detail
    assert racecheck.stale_tolerant(ids) is ids          # outside a session: a no-op


def test_index_role_and_declarations_round_trip_through_saved_traces(tmp_path):
    rc = _run(_gather_into("between"), record_trace=True)
    path = tmp_path / "t.jsonl"
    offline = recheck(rc, path)
    assert any(e.kind == "stale_tolerant" for e in Trace.iter_file(path))
    assert [f.to_json() for f in offline] == [f.to_json() for f in rc.findings]
    assert recheck(_run(_gather_into(None), record_trace=True), path) == []


def test_index_role_is_recorded_for_index_ops_only():
    with racecheck.session(device="sim", record_trace=True) as rc:
        table = torch.arange(16.0).reshape(8, 2)
        ix = torch.tensor([1, 2])
        table[ix]
        torch.gather(table, 0, torch.zeros(2, 2, dtype=torch.int64))
        F.embedding(ix, table)
        table + 1
    kernels = [e for e in rc.trace.events if isinstance(e, Kernel)]
    roles = {k.op: [f.index_into for f in k.reads] for k in kernels}
    tsid = [f.storage for f in roles and next(k for k in kernels if k.op == "add").reads][0]
    assert roles["index"].count(tsid) == 1 and roles["gather"].count(tsid) == 1
    assert roles["embedding"].count(tsid) == 1
    assert roles["add"] == [None]
    fp = Footprint(3, ((0, 8),)).as_index_into(5)
    assert Footprint.from_json(fp.to_json()) == fp and fp.to_json()["index_into"] == 5
    assert Footprint.from_json(Footprint(3, ((0, 8),)).to_json()).index_into is None
