"""Packaging: the wheel holds every package of the four folders; the core imports without torch."""
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from racecheck import _layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# source folder -> its path inside the wheel (racecheck/_layout.py maps import names to folders)
FOLDERS = {folder: package.replace(".", "/") for package, folder in _layout.FOLDERS.items()}


def _source_packages() -> set:
    out = set()
    for folder, package in FOLDERS.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, base).replace(os.sep, "/")
                out.add(package if rel == "." else f"{package}/{rel}")
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("setuptools")
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"       # a clean copy: a build/ folder left in the checkout would leak into the wheel
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".racecheck"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip().splitlines()[-1:]}")
    [whl] = list(out.glob("racecheck-*.whl"))
    return zipfile.ZipFile(whl)


def test_wheel_has_every_subpackage(wheel):
    names = set(wheel.namelist())
    in_wheel = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    expected = _source_packages()
    assert "racecheck/scenarios/eagle_v2" in expected
    assert expected <= in_wheel, sorted(expected - in_wheel)
    assert not any(n.split("/", 1)[0] in ("scenarios", "reports", "instrumentation", "tests")
                   for n in names)
    assert "racecheck/reports/findings.schema.json" in names


_NO_TORCH = textwrap.dedent("""
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is not installed (blocked by the test)")
    sys.meta_path.insert(0, _Block())
""")


def _without_torch(tmp_path, code: str, *args):
    (tmp_path / "sitecustomize.py").write_text(_NO_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_import_and_offline_commands_need_no_torch(tmp_path):
    from helpers import in_session
    from test_cli_polish import _racy
    trace = tmp_path / "t.jsonl"
    in_session(_racy, record_trace=True).save_trace(str(trace))
    code = textwrap.dedent("""
        import sys
        import racecheck
        assert "torch" not in sys.modules
        from racecheck.cli.main import main
        assert main(["check", sys.argv[1], "--report", "json=f.json"]) == 1
        assert main(["report", "f.json", "-f", "sarif", "-o", "f.sarif"]) == 1
        assert main(["baseline", "f.json", "-o", "b.json"]) == 0
        assert main(["explain", sys.argv[1], "1"]) == 0
        assert main(["--version"]) == 0
        import racecheck.cli.pytest_plugin
        assert "torch" not in sys.modules, "torch was imported"
        print("ok")
    """)
    proc = _without_torch(tmp_path, code, str(trace))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


def test_pytest_plugin_registers_without_torch(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    code = "import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'test_plain.py']))"
    proc = _without_torch(tmp_path, code)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
