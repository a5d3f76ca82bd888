"""Package list for the one `racecheck` tree that four top-level folders make up.

Metadata lives in pyproject.toml; this file only finds every subpackage of each folder, so a new
one (a scenario package, say) is in the wheel without anyone listing it, and declares the optional
C hot path: where it cannot be compiled, racecheck runs on its Python reference (racecheck.core.native).
"""
import os
import runpy
import shlex

from setuptools import Extension, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDERS = runpy.run_path(os.path.join(HERE, "racecheck", "_layout.py"))["FOLDERS"]

packages = []
for package, folder in FOLDERS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(folder, exclude=["tests", "tests.*"])]

# RACECHECK_CFLAGS: flags after the defaults (scripts/sanitize.sh builds with sanitizers at -O1)
CFLAGS = ["-O3", "-fvisibility=hidden"] + shlex.split(os.environ.get("RACECHECK_CFLAGS", ""))

speedups = Extension("racecheck.instrumentation._speedups", ["instrumentation/_speedups.c"], optional=True,
                     extra_compile_args=CFLAGS)
# The checker's engine: one module from one C file per concern (racecheck/core/_engine.h lists them)
ENGINE_PARTS = ["", "_state", "_timelines", "_access", "_sync", "_memory", "_graphs", "_naming", "_export"]
engine = Extension("racecheck.core._engine", [f"racecheck/core/_engine{p}.c" for p in ENGINE_PARTS],
                   depends=["racecheck/core/_engine.h"], optional=True, extra_compile_args=CFLAGS)

setup(packages=packages, package_dir=FOLDERS, ext_modules=[speedups, engine])
