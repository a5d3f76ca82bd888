"""Package list for the one `racecheck` tree that four top-level folders make up.

Metadata lives in pyproject.toml; this file only finds every subpackage of each folder, so a new
one (a scenario package, say) is in the wheel without anyone listing it.
"""
from setuptools import find_packages, setup

FOLDERS = {
    "racecheck": "racecheck",
    "racecheck.instrumentation": "instrumentation",
    "racecheck.scenarios": "scenarios",
    "racecheck.reports": "reports",
}

packages = []
for package, folder in FOLDERS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(folder, exclude=["tests", "tests.*"])]

setup(packages=packages, package_dir=FOLDERS)
