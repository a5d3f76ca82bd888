"""scripts/history.py's tables from results (no sglang run): each upstream fix shows what
racecheck reported on the release before it, in the runs that fix is about."""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _history():
    spec = importlib.util.spec_from_file_location("history", os.path.join(ROOT, "scripts", "history.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(findings=(), known=0, races=None):
    return {"error": "", "findings": list(findings), "known": known,
            "races": len(findings) if races is None else races, "seconds": 1}


def test_a_fix_shows_the_release_before_in_its_own_runs():
    h = _history()
    releases = ["0.5.15.post1", "0.5.16"]
    configs = ["cuda-eager", "cuda-graphs", "overlap"]
    racy = _result([("RC002", "ReqToTokenPool.req_to_token")], known=18)
    results = {(v, c): _result() for v in releases for c in configs}
    results[("0.5.15.post1", "overlap")] = racy
    text = h.render(results, releases, configs, False)
    row = next(ln for ln in text.splitlines() if ln.startswith("| #31687"))
    assert "| 0.5.16 | 0.5.15.post1 |" in row
    assert "cuda-eager: clean / overlap: 1 race: RC002 `ReqToTokenPool.req_to_token` (+18 triaged)" in row
    # a fix without its own runs shows eager / graphs, unlabelled
    row = next(ln for ln in text.splitlines() if "`_draft_extend_for_decode`" in ln)
    assert row.endswith("| clean / clean |")


def test_every_fix_names_a_release_and_known_runs():
    h = _history()
    for fix, first, *own in h.FIXES:
        assert h.version_key(first) > (0, 5, 0), fix
        assert all(c in h.CONFIGS for c in (own[0] if own else h.FIX_CONFIGS)), fix
