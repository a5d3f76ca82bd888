"""Root-cause groups (findings one synchronization fixes), names for temporaries, and console
output that reads in 80 columns."""
from __future__ import annotations

import dis
import json
from dataclasses import replace

import pytest
import torch
from rich.console import Console

import racecheck
from racecheck import scenarios
from racecheck.core.findings import Access, Finding, assign_groups, group_findings
from racecheck.reports import render
from racecheck.reports.console import plain_text, render_text

from helpers import in_session


def _side_write(dm, s, tensors):
    with dm.stream(s):
        for t in tensors:
            t.add_(1)


def _read(tensors):
    out = []
    for t in tensors:
        out.append(t * 2)
    return out


def _read_elsewhere(t):
    return t + 1


def _write_b(dm, s, b):
    with dm.stream(s):
        b.add_(1)


def _plan_stream_and_two_tensors(dm, rc):
    s = dm.Stream()
    rc.name_stream(s, "plan")
    a = racecheck.name(torch.zeros(8), "a")
    b = racecheck.name(torch.zeros(8), "b")
    dm.synchronize()
    return s, a, b


def _session_findings(program):
    rc = in_session(lambda rc: program(rc.device_module, rc))
    assert not rc.internal_errors, rc.internal_errors
    return list(rc.findings)


def test_one_edge_on_two_tensors_is_one_group():
    def program(dm, rc):
        s, a, b = _plan_stream_and_two_tensors(dm, rc)
        _side_write(dm, s, [a, b])
        _read([a, b])
        dm.synchronize()
    found = _session_findings(program)
    assert sorted(f.tensor for f in found) == ["a", "b"]
    [g] = group_findings(found)
    assert g.tensors == ["a", "b"] and g.rules == ["RC001"]
    text = render_text(found, width=80)
    assert text.count("╭─") == 1 and "1 race, 2 findings" in text and "RC001" in text
    assert "on 2 tensors" in text and "`a`" in text and "`b`" in text


def test_one_wait_before_reads_at_other_sites_is_one_group():
    """The same missing edge, the reads in different functions: one wait before the first read
    orders both, so one group, and its fix names where that wait goes."""
    def program(dm, rc):
        s, a, b = _plan_stream_and_two_tensors(dm, rc)
        _side_write(dm, s, [a, b])
        _read([a])
        _read_elsewhere(b)
        dm.synchronize()
    found = _session_findings(program)
    [g] = group_findings(found)
    assert len(found) == 2 and g.tensors == ["a", "b"]
    assert "after `_side_write`" in g.suggestion and "before `_read`" in g.suggestion
    text = render_text(found, width=80)
    assert "1 race, 2 findings" in text and text.count("╭─") == 1


def test_pairs_one_wait_cannot_order_are_two_groups():
    """a is written then read, then b is written then read: a wait before the first read comes
    before b's write, so b needs a second wait (after `_write_b`, before `_read_elsewhere`)."""
    def program(dm, rc):
        s, a, b = _plan_stream_and_two_tensors(dm, rc)
        _side_write(dm, s, [a])
        _read([a])
        _write_b(dm, s, b)
        _read_elsewhere(b)
        dm.synchronize()
    found = _session_findings(program)
    groups = group_findings(found)
    assert len(found) == 2 and len(groups) == 2
    assert {g.first.missing_edge for g in groups} == {("plan", "default")}
    assert "after `_write_b`" in groups[1].suggestion
    assert "before `_read_elsewhere`" in groups[1].suggestion
    assert "2 races, 2 findings" in render_text(found)


def test_one_missing_wait_per_iteration_is_one_group():
    """A loop that misses the same wait every iteration: one group, whatever the count."""
    def program(dm, rc):
        s = dm.Stream()
        for i in range(3):
            t = racecheck.name(torch.zeros(8), f"x{i}")
            dm.synchronize()
            _side_write(dm, s, [t])
            _read([t])
        dm.synchronize()
    found = _session_findings(program)
    assert len(found) == 3
    [g] = group_findings(found)
    assert g.tensors == ["x0", "x1", "x2"]


def test_two_missing_edges_on_one_tensor_are_two_groups():
    def program(dm, rc):
        s1, s2 = dm.Stream(), dm.Stream()
        rc.name_stream(s1, "one")
        rc.name_stream(s2, "two")
        x = racecheck.name(torch.zeros(8), "x")
        dm.synchronize()
        with dm.stream(s1):
            x.add_(1)
        with dm.stream(s2):
            _read([x])
    found = _session_findings(program)
    assert {f.tensor for f in found} == {"x"}
    edges = {f.missing_edge for f in found}
    groups = group_findings(found)
    assert len(groups) == len(edges) == len(found) >= 2
    assert len({g.id for g in groups}) == len(groups)


def _pair(rule, tensor="t", cur_loc="a.py:10", prev_loc="b.py:20", kind="read", fix=None,
          fn="consume"):
    cur = Access("mul", "forward", kind, cur_loc, fn, seq=30)
    prev = Access("add_", "plan", "write", prev_loc, "produce", seq=20)
    fix = fix or (f"record an event on `plan` after `produce` and make `forward` wait on it "
                  f"before `consume`")
    return Finding(rule=rule, tensor=tensor, current=cur, previous=prev, suggestion=fix,
                   missing_edge=("plan", "forward"))


def test_rc005_and_rc001_on_the_same_sites_are_two_groups():
    race = _pair("RC001")
    reuse = _pair("RC005", fix="call `t.record_stream(plan)` before freeing it")
    groups = group_findings([race, reuse])
    assert [g.rules for g in groups] == [["RC001"], ["RC005"]]


def test_rule_family_and_fixes():
    """RC001 and RC003 at the same sites are one fix; a fix that differs in anything but the
    tensor's name (an event, rows, read or write on the host) is another group."""
    raw, waw = _pair("RC001"), _pair("RC003", kind="write")
    assert group_findings([raw, waw])[0].rules == ["RC001", "RC003"]
    r1 = _pair("RC005", "x", fix="call `x.record_stream(plan)` before freeing it")
    r2 = _pair("RC005", "y", fix="call `y.record_stream(plan)` before freeing it")
    assert len(group_findings([r1, r2])) == 1
    s1 = _pair("RC006", "ids", fix="rewrite (e.g. zero) the padded rows 3..7 of `ids`")
    s2 = _pair("RC006", "pos", fix="rewrite (e.g. zero) the padded rows 3..5 of `pos`")
    assert len(group_findings([s1, s2])) == 2
    h1 = _pair("RC004", "h", fix="synchronize on the copy before reading `h` on the host")
    h2 = _pair("RC004", "g", fix="wait for the copy before overwriting `g` on the host")
    assert len(group_findings([h1, h2])) == 2
    # a name that is a substring of another word in the fix does not merge different fixes
    e1 = _pair("RC008", "e", fix="record event #3 before waiting on it")
    e2 = _pair("RC008", "f", fix="record event #4 before waiting on it")
    assert len(group_findings([e1, e2])) == 2


def test_group_order_earliest_edge_then_size():
    late = [_pair("RC001", t, cur_loc="late.py:1", fn="late") for t in "abc"]
    late = [replace(f, current=replace(f.current, seq=90), previous=replace(f.previous, seq=80))
            for f in late]
    early = _pair("RC001", "z", cur_loc="early.py:1", fn="early")
    tie = [_pair("RC001", t, cur_loc="tie.py:1", fn="tie") for t in "uv"]      # another edge
    tie = [replace(f, previous=replace(f.previous, stream="copy"), missing_edge=("copy", "forward"))
           for f in tie]
    groups = group_findings([*late, *tie, early])
    assert [g.first.tensor for g in groups] == ["u", "z", "a"]      # seq 30 (2 tensors), 30, 90


def test_reports_carry_the_group():
    found = assign_groups([_pair("RC001", t) for t in ("a", "b")] +
                          [_pair("RC005", "c", fix="keep `c`")])
    gid = found[0].group_id()
    assert found[1].group_id() == gid != found[2].group_id()
    doc = json.loads(render("json", found))
    assert [d["group"] for d in doc["findings"]] == [gid, gid, found[2].group_id()]
    sarif = json.loads(render("sarif", found))["runs"][0]["results"]
    assert [r["partialFingerprints"]["racecheck/group/v1"] for r in sarif] == \
        [gid, found[2].group_id()]
    assert sarif[0]["properties"]["tensors"] == ["a", "b"]
    assert sarif[0]["properties"]["fingerprints"] == [f.fingerprint() for f in found[:2]]
    junit = render("junit", found)
    assert f"group={gid}" in junit and "2 races, 3 findings" in junit
    html = render("html", found)
    assert f'data-group="{gid}"' in html and "2 races, 3 findings" in html
    text = plain_text(found)
    assert f"group {gid}" in text and text.rstrip().endswith("2 races, 3 findings")


# ---- names for temporaries ------------------------------------------------------------------

def _make_on_side(dm, s, n):
    with dm.stream(s):
        positions = torch.zeros(n)
        positions.add_(1)
    return positions


def _consume(a, dst):
    return a.add_(dst)


def _pass_to_keyword(dm, s, n):
    with dm.stream(s):
        starts = torch.ones(n)
        starts.add_(1)
    _consume(torch.zeros(n), dst=starts)


def _pass_positional(dm, s, acc):
    with dm.stream(s):
        acc.add_(1)
    _consume(acc, torch.zeros(8).add_(1))


def test_temporary_named_by_its_assignment_in_every_iteration():
    def program(dm, rc):
        s = dm.Stream()
        dm.synchronize()
        for n in (4, 8, 12):
            _read([_make_on_side(dm, s, n)])
    found = _session_findings(program)
    rc001 = [f for f in found if f.rule == "RC001"]
    assert [f.tensor for f in rc001] == ["_make_on_side: positions"]
    assert all(f.tensor == "_make_on_side: positions" for f in found)
    assert not any("unnamed" in f.tensor or "unnamed" in f.detail for f in found)


def test_temporary_named_by_the_parameter_it_was_passed_as():
    def program(dm, rc):
        s = dm.Stream()
        dm.synchronize()
        _pass_to_keyword(dm, s, 8)
    found = _session_findings(program)
    assert "_pass_to_keyword: starts" in {f.tensor for f in found}

    def positional(dm, rc):
        s = dm.Stream()
        acc = racecheck.name(torch.zeros(8), "acc")
        dm.synchronize()
        _pass_positional(dm, s, acc)
    names = {f.tensor for f in _session_findings(positional)}
    assert names <= {"acc", "_consume(dst=...)"} and "acc" in names


def test_source_names_from_statements():
    from racecheck.core import sourcenames

    def frame_of(fn, nth=0):
        code = fn.__code__
        calls = [i.offset for i in dis.get_instructions(code) if i.opname == "CALL"]
        return (code, calls[nth])

    def assigned():
        buf = torch.empty(3).zero_()
        return buf

    def kw():
        _consume(torch.ones(1), dst=torch.empty(1))

    def returned():
        return torch.empty(2)

    assert sourcenames.creation_name(frame_of(assigned)) == "assigned: buf"
    assert sourcenames.creation_name(frame_of(kw)) == "_consume(a=...)"
    assert sourcenames.creation_name(frame_of(kw, 1)) == "_consume(dst=...)"
    assert sourcenames.creation_name(frame_of(returned)) == "returned: returned value"
    # a saved trace's frame has a line and no columns: the one assignment on it
    code = assigned.__code__
    line = code.co_firstlineno + 1
    assert sourcenames.creation_name((code.co_filename, line, "assigned")) == "assigned: buf"
    assert sourcenames.creation_name(("/nonexistent.py", 3, "f")) is None


def test_explicit_and_holder_names_win():
    def program(dm, rc):
        s = dm.Stream()
        dm.synchronize()
        t = racecheck.name(_make_on_side(dm, s, 8), "seq_lens")
        _read([t])
    assert {f.tensor for f in _session_findings(program)} == {"seq_lens"}


def test_names_are_made_only_for_findings(monkeypatch):
    """No per-op cost: a clean run never reads source."""
    from racecheck.core import sourcenames
    from racecheck.core.checker import naming
    calls = []
    real = sourcenames.creation_name
    monkeypatch.setattr(naming, "creation_name", lambda fr: calls.append(fr) or real(fr))

    def clean(dm, rc):
        s = dm.Stream()
        for n in (4, 8):
            t = _make_on_side(dm, s, n)
            dm.current_stream().wait_stream(s)
            _read([t])
            t.record_stream(dm.current_stream())
        dm.synchronize()
    assert _session_findings(clean) == [] and calls == []


# ---- the EAGLE v2 model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def eagle():
    return scenarios.get("eagle-v2")


def test_eagle_dropped_sites_name_every_temporary(eagle):
    """The D2H copies' pinned host buffers (made by a helper without an op, written by
    `out.copy_`) are named by the variable the copy writes."""
    site = "racecheck.scenarios.eagle_v2.eagle_worker_v2:GenerationBatchResult.copy_to_cpu:record#0"
    res = scenarios.run(eagle, eagle.config(overrides={"drop_sync": site}), device="sim", seed=0)
    assert res.findings
    assert not [f.tensor for f in res.findings if "unnamed" in f.tensor]
    assert "d2h: out" in {f.tensor for f in res.findings}
    groups = group_findings([f for f in res.findings if f.rule != "DIFF"])
    assert len(groups) < len(res.findings)


def test_eagle_variants_one_panel_per_fix_in_80_columns(eagle):
    for name in ("no-draft_done_event", "no-futuremap_publish", "no-war_barrier"):
        res = scenarios.run(eagle, eagle.config(variant=name), device="sim", seed=0)
        found = [f for f in res.findings if f.rule != "DIFF"]
        assert found and not [f.tensor for f in found if "unnamed" in f.tensor]
        text = render_text(found, width=80)
        _fits(text)
        groups = group_findings(found)
        assert text.count("╭─") == len(groups)
        assert len({g.id for g in groups}) == len(groups)


# ---- 80 columns -----------------------------------------------------------------------------

def _fits(text, width=80):
    for line in text.splitlines():
        assert len(line) <= width, line
        cells = line.strip("│ ")
        assert "…" not in cells or "more" in cells, line       # folded, never cut


def test_tour_table_reads_in_80_columns():
    from racecheck.cli.commands.fuzz_cmd import tour_table
    rows = [("(all fixes on)", "clean", "yes", "1523 examples, 30s"),
            ("no-req_pool_padding_zero", "RC006 req_pool_indices", "yes", "12 examples, 3.1s"),
            ("no-verify_plan_wait-mrope", "RC001 ForwardBatch.mrope_positions",
             "no: expected RC001 mrope_positions", "8 examples, 2.0s")]
    con = Console(width=80, file=__import__("io").StringIO(), color_system=None)
    con.print(tour_table("eagle-v2", rows))
    text = con.file.getvalue()
    _fits(text)
    assert " yes " in text and "ok?" in text


def test_list_and_mutate_tables_read_in_80_columns(capsys, monkeypatch):
    from racecheck.cli import main as cli
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["list"]) == 0
    _fits(capsys.readouterr().out)
    assert cli.main(["mutate", "eagle-v2", "--list"]) == 0
    _fits(capsys.readouterr().out)
