"""The package's layers stay strict: no import cycle, no import from a lower layer to a higher one.

Every import counts, at module level and inside functions (a lazy import is still a dependency).
A module's layer is where it lives (racecheck/_layout.py, the map setup.py reads too), bottom to
top (docs/ARCHITECTURE.md draws them):

    core             racecheck/core/: trace, checker, findings, recorder, suppressions; no torch hooks
    instrumentation  instrumentation/: turns a running program into trace events
    session          racecheck/__init__.py, racecheck/session.py: the public API
    scenarios        scenarios/ (pipelines under test) and reports/ (renderers)
    drivers          racecheck/drivers/: fuzz, mutate: run scenarios many times
    cli              racecheck/cli/: command lines, the gate, the start-up hook, the pytest plugin
"""
from __future__ import annotations

import ast
import os

import networkx as nx
import pytest

from racecheck._layout import FOLDERS, LAYERS, _under, layer, rank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules() -> dict:
    """import name -> file, for every module of the package (a C extension by its source: it
    imports nothing of the package)."""
    out = {}
    for pkg, folder in FOLDERS.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, base)
            parts = [pkg] + ([] if rel == "." else rel.split(os.sep))
            if len(parts) > 1 and ".".join(parts) in FOLDERS:
                continue                      # a mapped subpackage: walked under its own folder
            for fn in filenames:
                if fn.endswith(".py"):
                    name = ".".join(parts + ([] if fn == "__init__.py" else [fn[:-3]]))
                    out[name] = os.path.join(dirpath, fn)
                elif fn.endswith(".c"):
                    out[".".join(parts + [fn[:-2]])] = os.path.join(dirpath, fn)
    return out


def import_statements(module: str, path: str):
    """(node, source module) for every import in `module`'s source, relative ones resolved."""
    if path.endswith(".c"):
        return
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield node, ".".join(base + ([node.module] if node.module else []))
            else:
                yield node, node.module


def imported(module: str, path: str, known) -> set:
    """Modules of the package that `module` imports anywhere in its source."""
    out = set()
    for node, source in import_statements(module, path):
        if isinstance(node, ast.ImportFrom):
            # `from pkg import submodule` depends on the submodule; `from pkg import name` on pkg
            subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
            names = subs if len(subs) == len(node.names) else subs + [source]
        else:
            names = [source]
        for name in names:
            while name and name not in known:      # `import racecheck.x.y` where y is an attribute
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def import_graph() -> nx.DiGraph:
    mods = modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for m, path in mods.items():
        for t in imported(m, path, mods):
            g.add_edge(m, t)
    return g


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_sees_the_whole_package(graph):
    assert {"racecheck.core.checker", "racecheck.instrumentation.sim", "racecheck.scenarios.eagle_v2.scheduler",
            "racecheck.reports.sarif", "racecheck.drivers.fuzz.search", "racecheck.drivers.mutate", "racecheck.cli.commands.fuzz_cmd"} \
        <= set(graph)
    # lazy imports inside functions count
    assert graph.has_edge("racecheck.session", "racecheck.instrumentation")


def test_no_import_cycle(graph):
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c + c[:1]) for c in cycles[:20])


def test_no_upward_import(graph):
    up = sorted(f"{a} ({layer(a)}) -> {b} ({layer(b)})" for a, b in graph.edges if rank(b) > rank(a))
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_reports_read_only_core(graph):
    """Reports render findings; they never run programs (`racecheck.reports` -> core only)."""
    bad = sorted(f"{a} -> {b}" for a, b in graph.edges
                 if _under(a, "racecheck.reports") and not _under(b, "racecheck.reports") and layer(b) != "core")
    assert not bad, bad


# -- the checks themselves: they must catch what they are for ------------------------------------------

def _edges_of(module: str, source: str, known, tmp_path, is_package=False) -> set:
    p = tmp_path / ("__init__.py" if is_package else "m.py")
    p.write_text(source)
    return imported(module, str(p), known)


KNOWN = {"racecheck", "racecheck.core.trace", "racecheck.session", "racecheck.instrumentation",
         "racecheck.instrumentation.sim", "racecheck.scenarios", "racecheck.scenarios.registry"}


def test_imports_inside_functions_and_relative_ones_are_seen(tmp_path):
    src = ("from .core.trace import Kernel\n"
           "def f():\n"
           "    from racecheck.instrumentation import sim\n"
           "    import racecheck.scenarios.registry\n")
    assert _edges_of("racecheck.session", src, KNOWN, tmp_path) == {
        "racecheck.core.trace", "racecheck.instrumentation.sim", "racecheck.scenarios.registry"}


def test_from_package_import_name_depends_on_the_package(tmp_path):
    assert _edges_of("racecheck.scenarios.registry", "import racecheck\nfrom racecheck import session\n",
                     KNOWN, tmp_path) == {"racecheck", "racecheck.session"}
    assert _edges_of("racecheck.instrumentation.sim", "from ..core import trace\n", KNOWN, tmp_path) \
        == {"racecheck.core.trace"}


def test_an_upward_edge_and_a_cycle_are_reported():
    g = nx.DiGraph([("racecheck.core.trace", "racecheck.instrumentation.sim"),
                    ("racecheck.instrumentation.sim", "racecheck.core.trace")])
    assert list(nx.simple_cycles(g))
    assert [(a, b) for a, b in g.edges if rank(b) > rank(a)] == [("racecheck.core.trace", "racecheck.instrumentation.sim")]


@pytest.mark.parametrize("module,expected", [
    ("racecheck.core.checker", "core"), ("racecheck.core.recorder", "core"), ("racecheck.instrumentation.device", "instrumentation"),
    ("racecheck", "session"), ("racecheck.session", "session"), ("racecheck.reports.sarif", "scenarios"),
    ("racecheck.scenarios.eagle_v2", "scenarios"), ("racecheck.drivers.fuzz.repro", "drivers"), ("racecheck.cli.gate", "cli"),
    ("racecheck.cli.commands.run_cmd", "cli"), ("racecheck.cli.pytest_plugin", "cli")])
def test_layer_of(module, expected):
    assert layer(module) == expected


def test_the_top_folder_holds_only_the_public_api():
    """Everything else lives in the folder of its layer: a new module at the top is a mistake."""
    top = {m for m, path in modules().items() if os.path.dirname(path) == os.path.join(ROOT, "racecheck")}
    assert top <= {"racecheck", "racecheck.session", "racecheck.__main__", "racecheck._layout"}, sorted(top)


def missing_imports(path: str, module: str, known) -> set:
    """`import racecheck.x` / `from racecheck.x import ...` naming no module of the package (a
    module that moved): the import graph cannot see those, and they fail only when run."""
    return {s for _, s in import_statements(module, path)
            if (s == "racecheck" or s.startswith("racecheck.")) and s not in known}


def test_every_import_of_the_package_names_a_module():
    mods = modules()
    missing = {m: sorted(missing_imports(p, m, mods)) for m, p in mods.items()}
    assert not {m: v for m, v in missing.items() if v}


def test_a_moved_module_is_reported(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from racecheck.scenarios.fuzz import Fuzzer\n")
    assert missing_imports(str(path), "racecheck.cli.commands.m", {"racecheck.scenarios"}) == {
        "racecheck.scenarios.fuzz"}


def test_the_architecture_picture_matches_the_folders():
    """docs/ARCHITECTURE.md draws the layers with their folders: each drawn folder exists, and
    every package folder of the tree is drawn."""
    import re
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as fh:
        picture = fh.read().split("```")[1]
    drawn = set(re.findall(r"(?<![\w/.])((?:racecheck|instrumentation|scenarios|reports)/(?:\w+/)?)",
                           picture))
    assert drawn, picture
    assert all(os.path.isdir(os.path.join(ROOT, d)) for d in drawn), sorted(drawn)
    packages = {f"racecheck/{d}/" for d in os.listdir(os.path.join(ROOT, "racecheck"))
                if os.path.isfile(os.path.join(ROOT, "racecheck", d, "__init__.py"))}
    packages |= {f"{folder}/" for folder in FOLDERS.values() if folder != "racecheck"}
    assert packages <= drawn, sorted(packages - drawn)
