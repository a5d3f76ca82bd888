"""Where the package's layers live: the one map setup.py and tests/test_layers.py both read.

Four top-level folders make up the one `racecheck` import tree (FOLDERS). Inside it each module's
layer follows from its path (LAYERS, bottom to top, by longest matching prefix), and the CLI
layer's entry points are ranked above what they share (CLI_RANKS). docs/ARCHITECTURE.md draws it.
setup.py runs this file by path (the package is not importable while it is being built), so it
imports nothing.
"""
FOLDERS = {
    "racecheck": "racecheck",
    "racecheck.instrumentation": "instrumentation",
    "racecheck.scenarios": "scenarios",
    "racecheck.reports": "reports",
}

LAYERS = ("core", "instrumentation", "session", "scenarios", "drivers", "cli")

PREFIXES = {
    "racecheck.core": "core",
    "racecheck.instrumentation": "instrumentation",
    "racecheck": "session",                 # the package itself and racecheck.session
    "racecheck.scenarios": "scenarios",
    "racecheck.reports": "scenarios",       # renderers sit beside the programs under test
    "racecheck.drivers": "drivers",
    "racecheck.cli": "cli",
    "racecheck.__main__": "cli",
}

CLI_RANKS = {
    "racecheck.cli.cliparse": 0,
    "racecheck.cli.gate": 1,
    "racecheck.cli.autostart": 2,
    "racecheck.cli.pytest_plugin": 2,
    "racecheck.cli.commands": 3,
    "racecheck.cli.main": 4,
    "racecheck.__main__": 5,
}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer(module: str) -> str:
    """The layer of an import name, from where it lives."""
    best = max((p for p in PREFIXES if _under(module, p)), key=len, default=None)
    if best is None:
        raise ValueError(f"{module} is not part of the racecheck package")
    return PREFIXES[best]


def rank(module: str) -> tuple:
    """Position in the import order: a module may import only modules of lower or equal rank."""
    sub = max(((len(c), r) for c, r in CLI_RANKS.items() if _under(module, c)), default=(0, 0))[1]
    return LAYERS.index(layer(module)), sub
