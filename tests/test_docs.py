"""The documentation the code cites is in the repository, and the case table matches the cases.

A page cited by name (`CASES.md`, `docs/CASES.md`) that is not here leaves the reader with a
dead end; so does a relative link in a page, or an anchor no heading of its target has.
"""
from __future__ import annotations

import re
from pathlib import Path

from cases import EXPECTED

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SCANNED = ["racecheck", "instrumentation", "scenarios", "reports", "tests", "scripts", "bench",
           "docs", "ci", "README.md", "setup.py", "pyproject.toml"]
TEXT = {".py", ".md", ".c", ".h", ".sh", ".toml", ".yml", ".yaml", ".txt", ""}
# Usage texts name output files the user chooses (`--md OUT.md`); they are not citations.
PLACEHOLDERS = {"OUT.md"}

CITATION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z][A-Z0-9_]*\.md)\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
CASE_ROW = re.compile(r"^\|\s*(P\d\d)\s*\|", re.MULTILINE)


def _sources():
    for top in SCANNED:
        path = ROOT / top
        for f in ([path] if path.is_file() else sorted(path.rglob("*"))):
            if (f.is_file() and f.suffix in TEXT and "__pycache__" not in f.parts
                    and f != Path(__file__).resolve()):
                try:
                    yield f, f.read_text()
                except UnicodeDecodeError:
                    continue


def cited(text: str) -> set[str]:
    """The markdown pages a text names, as written (`CASES.md`, `docs/CASES.md`, `../X.md`)."""
    return {m for m in CITATION.findall(text) if m not in PLACEHOLDERS}


def resolves(name: str, where: Path) -> bool:
    """A bare name is a page of docs/ (or the README); a path is from the root or from `where`."""
    bases = [ROOT, where.parent] + ([DOCS] if "/" not in name else [])
    return any((base / name).is_file() for base in bases)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            bad.append(target)
    return bad


def test_the_citation_pattern():
    text = "see CASES.md, docs/TRACE.md, ../X.md and [x](RULES.md#a); WORK/cli.md, --md OUT.md"
    assert cited(text) == {"CASES.md", "docs/TRACE.md", "../X.md", "RULES.md"}
    assert resolves("CASES.md", ROOT / "tests" / "x.py")
    assert resolves("../docs/CASES.md", ROOT / "tests" / "x.py")
    assert not resolves("../CASES.md", ROOT / "tests" / "x.py")
    assert slug("Routing `torch.cuda` to sim") == "routing-torchcuda-to-sim"
    assert slug("RC005: judged when the freed block could first be reused") == \
        "rc005-judged-when-the-freed-block-could-first-be-reused"


def test_broken_links_are_found(tmp_path):
    (tmp_path / "A.md").write_text("# A page\n\n## Some `code` here\n")
    page = tmp_path / "B.md"
    page.write_text("[ok](A.md#some-code-here) [top](#b) [gone](C.md) [no](A.md#nope)\n"
                    "[web](https://example.com)\n\n# B\n\n```\n[in code](D.md)\n```\n")
    assert broken_links(page) == ["C.md", "A.md#nope"]


def test_every_cited_page_exists():
    seen, missing = set(), []
    for f, text in _sources():
        for name in cited(text):
            seen.add(name)
            if not resolves(name, f):
                missing.append(f"{f.relative_to(ROOT)}: {name}")
    assert not missing
    pages = {Path(n).name for n in seen}
    assert {"CASES.md", "CONTRACT.md", "TRACE.md", "EAGLE_PIPELINE.md"} <= pages


def test_relative_links_in_the_docs_resolve():
    pages = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
    bad = [f"{p.relative_to(ROOT)}: {t}" for p in pages for t in broken_links(p)]
    assert not bad


def test_the_case_table_and_the_cases_match():
    rows = CASE_ROW.findall((DOCS / "CASES.md").read_text())
    assert len(rows) == len(set(rows))
    assert sorted(rows) == sorted(EXPECTED)
