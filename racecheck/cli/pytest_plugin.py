"""`pytest --racecheck`: run every test's call phase inside `racecheck.session`; findings fail the test.

Loaded through the `pytest11` entry point and inert without `--racecheck` (or a `racecheck`
marker), so it costs nothing in suites that don't use it. Only the call phase is checked:
fixtures run before the session starts, so tensors they create are not session memory.

Options: `--racecheck`, `--racecheck-device sim|cuda|npu`, `--racecheck-report FORMAT=FILE`
(repeatable), `--racecheck-suppressions FILE`, `--racecheck-baseline FILE`.
Marker: `@pytest.mark.racecheck` checks one test without the flag; `racecheck(enabled=False)`
leaves one out; `racecheck(device="cuda")` picks its device.
Fixture: `racecheck_session`, the active session inside the test (`.device_module`, `.name_stream`).
"""
from __future__ import annotations

import time

import pytest

from racecheck.core.devices import DEVICES

_STATE = pytest.StashKey()
_FINDINGS = pytest.StashKey()


class _State:
    """Per-run plugin state, kept on `config.stash` (no module globals: pytester runs nest)."""

    def __init__(self, config):
        self.enabled = bool(config.getoption("racecheck"))
        self.device = config.getoption("racecheck_device")
        self.specs = list(config.getoption("racecheck_report") or [])
        self.suppressions = []
        self.baseline = set()
        self.results = []       # (nodeid, kept, suppressed, baselined, duration, internal_errors)
        self.used = set()       # indexes of suppressions that matched something
        self.written = []


def pytest_addoption(parser):
    group = parser.getgroup("racecheck", "stream-synchronization race detection")
    group.addoption("--racecheck", action="store_true", default=False,
                    help="run each test under the racecheck detector; races fail the test")
    group.addoption("--racecheck-device", default="sim", choices=DEVICES,
                    help="racecheck backend (default: sim)")
    group.addoption("--racecheck-report", action="append", default=[], metavar="FORMAT=FILE",
                    help="write all findings at the end (console, json, sarif, junit, html, perfetto); repeatable")
    group.addoption("--racecheck-suppressions", default=None, metavar="FILE",
                    help="suppressions file (`RULE TENSOR_GLOB [LOCATION_GLOB] # reason` per line)")
    group.addoption("--racecheck-baseline", default=None, metavar="FILE",
                    help="baseline of accepted findings (written by `racecheck baseline`)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "racecheck(enabled=True, device=None): run this test under the racecheck detector "
                   "(enabled=False leaves it out when --racecheck is on)")
    state = _State(config)
    config.stash[_STATE] = state
    if state.enabled or state.specs or config.getoption("racecheck_suppressions") \
            or config.getoption("racecheck_baseline"):
        from racecheck.core.errors import UsageError
        try:
            from racecheck.reports import parse_report_specs
            from racecheck.core.suppressions import load_baseline, load_suppressions
            parse_report_specs(state.specs)
            if config.getoption("racecheck_suppressions"):
                state.suppressions = load_suppressions(config.getoption("racecheck_suppressions"))
            if config.getoption("racecheck_baseline"):
                state.baseline = load_baseline(config.getoption("racecheck_baseline"))
        except UsageError as exc:
            raise pytest.UsageError(f"racecheck: {exc}") from None


def pytest_report_header(config):
    state = config.stash.get(_STATE, None)
    if state is not None and state.enabled:
        return f"racecheck: device={state.device}"
    return None


def _settings(item):
    """(enabled, device, route_cuda) for one test: the flags, overridden by its `racecheck`
    marker (`@pytest.mark.racecheck(route_cuda=False)`: CPU tensors are device memory, as in
    tests written against `racecheck_session.device_module`)."""
    from racecheck.session import route_cuda_default
    state = item.config.stash[_STATE]
    enabled, device = state.enabled, state.device
    marker = item.get_closest_marker("racecheck")
    route = None
    if marker is not None:
        enabled = bool(marker.kwargs.get("enabled", marker.args[0] if marker.args else True))
        device = marker.kwargs.get("device") or device
        route = marker.kwargs.get("route_cuda")
    route = route_cuda_default(device) if route is None else bool(route) and device == "sim"
    return enabled, device, route


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    enabled, device, route = _settings(item)
    if not enabled:
        yield
        return
    import racecheck
    start = time.perf_counter()
    rc = racecheck.session(device=device, route_cuda=route)
    with rc:
        yield  # the test body; its own outcome (pass, fail, skip) stays the test's
    item.stash[_FINDINGS] = (list(rc.findings), list(rc.internal_errors), time.perf_counter() - start)


def _gate(state, findings):
    from racecheck.core.suppressions import filter_findings
    res = filter_findings(findings, state.suppressions, state.baseline)
    stale = {id(x) for x in res.stale}
    state.used.update(i for i, x in enumerate(state.suppressions) if id(x) not in stale)
    return res.kept, res.suppressed, res.baselined


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "call":
        return
    got = item.stash.get(_FINDINGS, None)
    if got is None:
        return
    findings, internal, duration = got
    state = item.config.stash[_STATE]
    kept, suppressed, baselined = _gate(state, findings)
    state.results.append((item.nodeid, findings, kept, suppressed, baselined, duration, internal))
    rep = outcome.get_result()
    for msg in internal:
        rep.sections.append(("racecheck internal error", msg))
    if not kept:
        return
    from racecheck.reports.console import render_text
    text = render_text(kept, title=f"racecheck: {len(kept)} race finding(s) in {item.nodeid}", width=110)
    if rep.passed:
        rep.outcome = "failed"
        rep.longrepr = text
    elif rep.failed:  # keep the test's own failure, add the races next to it
        rep.sections.append(("racecheck findings", text))


def pytest_sessionfinish(session, exitstatus):
    state = session.config.stash.get(_STATE, None)
    if state is None or not state.specs or not state.results:
        return
    from racecheck.reports import parse_report_spec, write_reports
    everything, kept, seen_all, seen_kept, cases = [], [], set(), set(), []
    n_sup = n_base = 0
    for nodeid, findings, k, s, b, duration, internal in state.results:
        n_sup += len(s)
        n_base += len(b)
        for f in findings:
            if f.fingerprint() not in seen_all:
                seen_all.add(f.fingerprint())
                everything.append(f)
        for f in k:
            if f.fingerprint() not in seen_kept:
                seen_kept.add(f.fingerprint())
                kept.append(f)
        file, _, name = nodeid.partition("::")
        cases.append({"name": name or nodeid, "classname": file.replace("/", ".").removesuffix(".py"),
                      "file": file, "time": duration, "fingerprints": [f.fingerprint() for f in k],
                      **({"error": "\n".join(internal)} if internal and not k else {})})
    meta = {"scenario": "pytest", "device": state.device, "suite": "racecheck-pytest", "cases": cases,
            "suppressed": n_sup, "baselined": n_base,
            "stale_suppressions": [str(s) for i, s in enumerate(state.suppressions) if i not in state.used]}
    json_specs = [s for s in state.specs if parse_report_spec(s)[0] == "json"]
    other = [s for s in state.specs if parse_report_spec(s)[0] != "json"]
    state.written += write_reports(everything, json_specs, meta)
    state.written += write_reports(kept, other, meta)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STATE, None)
    if state is None or not state.results:
        return
    tr = terminalreporter
    racy = [(r[0], r[2]) for r in state.results if r[2]]
    n = sum(len(k) for _, k in racy)
    sup = sum(len(r[3]) for r in state.results)
    base = sum(len(r[4]) for r in state.results)
    tr.section("racecheck")
    line = (f"{len(state.results)} test(s) checked on {state.device}: "
            + (f"{n} finding(s) in {len(racy)} test(s)" if n else "no races found"))
    if sup or base:
        line += f" ({sup} suppressed, {base} baselined)"
    tr.write_line(line)
    for nodeid, k in racy:
        for f in k:
            tr.write_line(f"  {nodeid}: {f.rule} {f.tensor} ({f.current.stream} <- {f.previous.stream}) "
                          f"at {f.current.location or '?'}")
    for i, s in enumerate(state.suppressions):
        if i not in state.used:
            tr.write_line(f"warning: stale suppression (matched nothing): {s}")
    for path in state.written:
        tr.write_line(f"racecheck report written: {path}")


class _ActiveSession:
    """Looks up the active session at attribute access: fixtures run before the session opens."""

    def __getattr__(self, name):
        import racecheck
        s = racecheck.active_session()
        if s is None:
            raise RuntimeError("no active racecheck session: run pytest with --racecheck "
                               "or mark the test with @pytest.mark.racecheck")
        return getattr(s, name)


@pytest.fixture
def racecheck_session():
    """The session the test body runs in (use inside the test, not in other fixtures)."""
    return _ActiveSession()
