"""Small helpers shared by the file formats (location parsing, rule texts)."""
from __future__ import annotations

import os
import re
from urllib.parse import quote

from racecheck.findings import RULES

_LOC = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::(?P<col>\d+))?$")
_FRAME = re.compile(r"^(?P<loc>.+?:\d+(?::\d+)?)(?:\s+in\s+(?P<fn>.+))?$")

# Rule help: the smallest synchronization that fixes each hazard (SARIF help, HTML tooltips).
RULE_HELP = {
    "RC001": "Order the write before the read: record an event on the writing stream after the write "
             "(`e.record(writer)`) and make the reading stream wait on it (`reader.wait_event(e)`), or "
             "`reader.wait_stream(writer)` before the read.",
    "RC002": "Order the read before the overwrite: record an event on the reading stream after the read and "
             "make the writing stream wait on it before writing, or write into a fresh buffer.",
    "RC003": "Order the two writes: make the second writer's stream wait on an event recorded after the first "
             "write, or give each stream its own buffer.",
    "RC004": "Synchronize the host with the device before touching host memory: `event.synchronize()` (or "
             "`stream.synchronize()`) after a non-blocking D2H copy before reading it, and before reusing the "
             "source of a non-blocking H2D copy.",
    "RC005": "Keep the memory alive until the other stream is done: `tensor.record_stream(other_stream)` "
             "after using it there, or hold a reference until an event recorded on that stream completes.",
    "RC006": "Rewrite every per-replay input element the graph reads before each replay, padding rows "
             "included (e.g. `req_pool_indices[raw_bs:].zero_()` so padded rows point at a reserved slot).",
    "RC007": "Copy graph outputs out (`.clone()`) before the next replay of the same graph, or read them before "
             "replaying again.",
    "RC008": "Record the event before anything waits on it: a wait on a never-recorded event is a no-op, so "
             "move `event.record()` before `stream.wait_event(event)`.",
    "DIFF": "The overlapped run's outputs differ from a serialized eager run: look for a field lost or reused "
            "across the overlap (e.g. `mm_input_embeds` dropped by piecewise graph replay).",
}


def rule_name(rule: str) -> str:
    return RULES.get(rule, (rule.lower(), rule))[0]


def rule_title(rule: str) -> str:
    return RULES.get(rule, ("", rule))[1]


def split_location(loc: str):
    """"file.py:123" -> ("file.py", 123, None); "file.py:12:5" -> ("file.py", 12, 5); else (loc, None, None)."""
    loc = (loc or "").strip()
    m = _LOC.match(loc)
    if not m:
        return (loc, None, None)
    col = m.group("col")
    return (m.group("file"), int(m.group("line")), int(col) if col else None)


def split_frame(frame: str):
    """"file.py:123 in fn" -> ("file.py", 123, "fn")."""
    frame = (frame or "").strip()
    m = _FRAME.match(frame)
    if not m:
        return (frame, None, "")
    file, line, _ = split_location(m.group("loc"))
    return (file, line, (m.group("fn") or "").strip())


def relative_uri(path: str, root: str | None = None) -> str:
    """A repo-relative, forward-slash, percent-encoded URI (what code scanning matches on)."""
    p = path.replace("\\", "/")
    if os.path.isabs(path):
        root = os.path.abspath(root or os.getcwd())
        try:
            rel = os.path.relpath(path, root)
            if not rel.startswith(".."):
                p = rel.replace("\\", "/")
        except ValueError:  # another drive on Windows
            pass
    if p.startswith("./"):
        p = p[2:]
    return quote(p, safe="/:@-._~!$&'()*+,;=")


def case_name(meta: dict) -> str:
    """"eagle-v2[no-mrope_recompute]" from meta, or "racecheck"."""
    name = meta.get("scenario") or meta.get("name") or "racecheck"
    variant = meta.get("variant")
    return f"{name}[{variant}]" if variant else str(name)
