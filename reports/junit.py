"""JUnit XML: one testcase per scenario/variant (or pytest test); failures carry the finding text,
one block per root-cause group, and each finding's group id.

Which findings belong to which case comes from `meta["cases"]`, a list of
`{"name", "classname"?, "file"?, "time"?, "fingerprints": [...], "skipped"?: reason, "error"?: text}`;
findings in no case go to one case named after `meta["scenario"]`/`meta["variant"]`.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from racecheck.core.findings import group_findings

from ._common import case_name
from .console import plain_text

_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(s) -> str:
    return _BAD_XML.sub("?", str(s))


def _group(findings, meta):
    cases = [dict(c) for c in meta.get("cases") or ()]
    by_fp = {f.fingerprint(): f for f in findings}
    claimed = set()
    for c in cases:
        c["findings"] = [by_fp[fp] for fp in c.get("fingerprints", ()) if fp in by_fp]
        claimed.update(f.fingerprint() for f in c["findings"])
    rest = [f for f in findings if f.fingerprint() not in claimed]
    if rest or not cases:
        cases.append({"name": case_name(meta), "findings": rest, "time": meta.get("time", 0.0)})
    return cases


def to_xml(findings, meta: dict | None = None) -> ET.Element:
    meta = dict(meta or {})
    findings = list(findings)
    device = meta.get("device") or "sim"
    default_class = f"racecheck.{device}"
    suite_name = meta.get("suite") or "racecheck"
    cases = _group(findings, meta)
    root = ET.Element("testsuites", name=suite_name)
    suite = ET.SubElement(root, "testsuite", name=suite_name)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_time = 0.0
    for c in cases:
        t = float(c.get("time") or 0.0)
        total_time += t
        attrs = {"classname": _clean(c.get("classname") or default_class), "name": _clean(c["name"]),
                 "time": f"{t:.3f}"}
        if c.get("file"):
            attrs["file"] = _clean(c["file"])
        tc = ET.SubElement(suite, "testcase", attrs)
        totals["tests"] += 1
        fs = c["findings"]
        if fs:
            totals["failures"] += 1
            groups = group_findings(fs)
            head = (f"{len(groups)} race{'s' if len(groups) != 1 else ''}, {len(fs)} finding"
                    f"{'s' if len(fs) != 1 else ''}: " + ", ".join(f"{f.rule} {f.tensor}" for f in fs))
            fail = ET.SubElement(tc, "failure", message=_clean(head), type=fs[0].rule)
            fail.text = _clean(plain_text(fs))
            out = ET.SubElement(tc, "system-out")
            out.text = _clean("\n".join(f"{f.rule} {f.tensor} fingerprint={f.fingerprint()} "
                                        f"group={g.id}" for g in groups for f in g.findings)
                              + (f"\nrepro: {meta['repro']}" if meta.get("repro") else ""))
        elif c.get("error"):
            totals["errors"] += 1
            err = ET.SubElement(tc, "error", message=_clean(str(c["error"]).splitlines()[0] if c["error"] else "error"))
            err.text = _clean(c["error"])
        elif c.get("skipped"):
            totals["skipped"] += 1
            ET.SubElement(tc, "skipped", message=_clean(c["skipped"]))
    for el in (root, suite):
        for k, v in totals.items():
            el.set(k, str(v))
        el.set("time", f"{total_time:.3f}")
    return root


def render(findings, meta: dict | None = None) -> str:
    root = to_xml(findings, meta)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
