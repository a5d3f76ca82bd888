"""Small helpers shared by the file formats (location parsing; rule texts come from racecheck.core.rules)."""
from __future__ import annotations

import os
import re
from urllib.parse import quote

from racecheck.core import rules

_LOC = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::(?P<col>\d+))?$")
_FRAME = re.compile(r"^(?P<loc>.+?:\d+(?::\d+)?)(?:\s+in\s+(?P<fn>.+))?$")



def rule_name(rule: str) -> str:
    return rules.get(rule).name


def rule_title(rule: str) -> str:
    return rules.get(rule).title


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
