"""Races the caller sets apart by rule and code site (a scenario's triaged upstream races): the
checker makes their findings without looking for the program's names, which is what costs on a
real engine, and the split of findings is the one it was without."""
from __future__ import annotations

import pytest
import torch

import racecheck
from racecheck.core import native
from racecheck.core.checker import Checker
from racecheck.core.fastchecker import FastChecker
from racecheck.core.suppressions import filter_findings, parse_suppressions, settled_by

STARTUP = "RC00[13] * test_settled.py:*__init__  # start-up write, triaged\n"


class Pool:
    def __init__(self):
        self.buf = torch.zeros(8)


def _program(**opts):
    with racecheck.session(device="sim", record_trace=True, **opts) as rc:
        dm = rc.device_module
        side = dm.Stream()
        pool = Pool()
        with dm.stream(side):
            pool.buf.add_(1)            # nothing orders it after the zero-fill on the default stream
        dm.synchronize()
    assert rc.internal_errors == []
    return rc


def test_a_race_known_by_rule_and_site_is_made_without_a_name_and_still_set_apart():
    sups = parse_suppressions(STARTUP)
    named = _program().findings
    settled = _program(known_races=sups).findings
    assert [(f.rule, f.tensor) for f in named] == [("RC001", "Pool.buf")]
    assert [f.rule for f in settled] == ["RC001"]
    # neither the holder nor the creating statement was looked for
    assert settled[0].tensor.startswith("unnamed tensor (first used by zeros at test_settled.py:")
    for findings in (named, settled):
        split = filter_findings(findings, sups)
        assert (split.kept, len(split.suppressed)) == ([], 1)


@pytest.mark.parametrize("entry", [
    "RC00[13] Pool.* test_settled.py:*__init__  # needs the name to match\n",
    "RC00[13] * elsewhere.py:*__init__  # another site\n",
    "RC002 * test_settled.py:*__init__  # another rule\n",
])
def test_an_entry_that_needs_the_name_or_matches_nothing_leaves_the_name(entry):
    assert [f.tensor for f in _program(known_races=parse_suppressions(entry)).findings] \
        == ["Pool.buf"]


def test_only_entries_that_take_every_tensor_settle():
    assert settled_by(parse_suppressions("RC001 Pool.buf  # named\n")) is None
    assert settled_by([]) is None
    assert settled_by(parse_suppressions(STARTUP)) is not None


@pytest.mark.skipif(native.engine_built is None, reason="the C engine is not built here")
def test_the_engine_hands_the_settled_races_to_the_python_checker():
    rc = _program()
    settled = settled_by(parse_suppressions(STARTUP))
    asked = []

    def namer(storage, lo, hi):
        asked.append(storage)
        return "held"

    out = {}
    for name, checker in (("python", Checker()), ("engine", FastChecker(engine=native.engine_built))):
        checker.namer, checker.settled = namer, settled
        out[name] = [(f.rule, f.tensor) for f in checker.process_all(rc.trace.events).findings]
    assert out["python"] == out["engine"] and out["python"][0][1].startswith("unnamed tensor")
    assert asked == []


def _padded_replays():
    """A graph reading 8 rows of an unnamed buffer whose rows [:bs] alone are rewritten before
    each replay (RC006 on the padded rows)."""
    from test_checker import D, TB, Z, fp
    from test_checker_graphs import G, capture, replay
    from racecheck.core.trace import CapturedOp
    rows, out = 40, 41
    tb = TB()
    tb.tensor(rows, 64)
    tb.tensor(out, 64, "logits")
    tb.tensor(Z, 64, "weights")
    capture(tb, G, [CapturedOp((fp(rows, 0, 64), fp(Z, 0, 64)), (fp(out, 0, 64),), "gather",
                               (("/eng/model.py", 50, "forward"),))])
    for bs in (8, 3, 3):
        tb.k(D, w=[fp(rows, 0, bs * 8)], op="copy_", fn="populate")
        replay(tb, G, D)
    return tb.events


@pytest.mark.parametrize("entry, named", [("RC006 * model.py:*  # padded rows, triaged\n", False),
                                          ("RC006 * other.py:*  # another site\n", True)])
def test_a_settled_stale_padding_read_is_not_named(entry, named):
    asked = []

    def namer(storage, lo, hi):
        asked.append(storage)
        return "held_rows"

    checker = Checker()
    checker.namer, checker.settled = namer, settled_by(parse_suppressions(entry))
    found = checker.process_all(_padded_replays()).findings
    assert [f.rule for f in found] == ["RC006"]
    assert (found[0].tensor == "held_rows") is named and bool(asked) is named
