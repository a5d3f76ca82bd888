"""The HTML report in a real headless Chromium: the page renders lanes and the highlighted pair."""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from racecheck.reports import load_findings, render
from racecheck.reports.html_report import CURRENT_COLOR, PREVIOUS_COLOR

DATA = Path(__file__).parent / "data"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def findings():
    return load_findings(DATA / "findings_eagle.json")


def test_html_is_self_contained(findings):
    page = render("html", findings, {"scenario": "eagle-v2", "variant": "no-mrope_recompute"})
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r'(src|href)="(https?:)?//', page), "no external assets"
    assert page.count('class="finding"') == len(findings)
    assert page.count("<svg") == len(findings)
    assert 'class="missing-edge"' in page and 'stroke-dasharray' in page
    assert 'class="sync-edge"' in page
    assert "compute_spec_mrope_positions" in page and "Fix:" in page


def test_html_escapes_user_text():
    from racecheck.core.findings import Access, Finding
    f = Finding(rule="RC001", tensor="<script>alert(1)</script>", suggestion="a & b",
                current=Access(op="x", stream="<s>", kind="read", location="a.py:1"),
                previous=Access(op="y", stream="t", kind="write", location="b.py:2"))
    page = render("html", [f])
    assert "<script>alert" not in page and "&lt;script&gt;" in page


def test_html_clean_page():
    page = render("html", [], {"scenario": "eagle-v2", "variant": "all-fixes"})
    assert "no races found" in page and "<svg" not in page


def _chromium(args, tmp_path, timeout=120):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def read_png(path):
    """(width, height, rows of RGB tuples) from an 8-bit RGB/RGBA PNG, without Pillow."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, [[tuple(r[x * bpp:x * bpp + 3]) for x in range(width)] for r in rows]


def count_color(pixels, hex_color, tol=6):
    want = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return sum(1 for row in pixels for px in row if all(abs(p - w) <= tol for p, w in zip(px, want)))


@needs_chromium
def test_html_renders_in_headless_chromium(findings, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render("html", findings, {"scenario": "eagle-v2", "variant": "no-mrope_recompute"}))
    url = page.as_uri()

    dom = _chromium(["--dump-dom", "--virtual-time-budget=2000", url], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    # the page's script ran and counted what the browser parsed
    m = re.search(r'id="render-status">rendered (\d+) timeline\(s\), (\d+) lane\(s\), (\d+) racing pair\(s\)', html)
    assert m, html[:2000]
    assert int(m.group(1)) == len(findings)
    assert int(m.group(2)) >= 2 * len(findings) - 1
    assert int(m.group(3)) == len(findings)
    assert 'data-rendered="3"' in html

    shot = tmp_path / "shot.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1400,800", url], tmp_path)
    assert shot.exists(), res.stderr[-2000:]
    w, h, pixels = read_png(shot)
    assert (w, h) == (1400, 800)
    # the highlighted pair: solid boxes of both highlight colors (a 116x34 box is ~3900 px)
    assert count_color(pixels, CURRENT_COLOR) > 2000
    assert count_color(pixels, PREVIOUS_COLOR) > 2000
    # lanes: the alternating lane backgrounds are painted
    assert count_color(pixels, "#eef1f5", tol=2) > 10000
    artifacts = os.environ.get("RACECHECK_TEST_ARTIFACTS")
    if artifacts:  # keep the screenshot for a human look in CI
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / "html-report.png")
