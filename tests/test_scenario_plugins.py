"""Scenarios from outside racecheck: the `racecheck.scenarios` entry-point group and --scenario-path."""
import json
import os
import textwrap

import pytest

from racecheck.cli import main as cli

from racecheck import scenarios
from racecheck.core.errors import UsageError

from helpers import racecheck_cli

SCENARIO_SOURCE = textwrap.dedent('''
    import torch

    import racecheck
    from racecheck.scenarios import Knob, Scenario, Switch, Variant


    def runner(cfg, ctx):
        dm = ctx.dm
        x = racecheck.name(torch.zeros(4, device=ctx.device), "x")
        side = dm.Stream()
        dm.synchronize()
        with dm.stream(side):
            x.add_(1)
        if cfg["join"]:
            dm.current_stream().wait_stream(side)
        y = x * 2
        dm.synchronize()
        return {{"y": {{"0": y.tolist()}}}}


    SCENARIO = Scenario(
        "{name}", "a plug-in scenario: one side-stream write", [Knob("join", True, "bool", "fix switch")],
        [Switch("join", "-", "x", "RC001", "wait for the side stream")],
        [Variant("no-join", {{"join": False}}, [("RC001", "x")], "no wait")],
        runner=runner, resolve=lambda c: c, reference=lambda c: dict(c, join=True), diff_fields={{}})
''')


@pytest.fixture
def registry(monkeypatch):
    """Leave the registry and RACECHECK_SCENARIO_PATH as they were."""
    monkeypatch.setenv(scenarios.PATH_ENV, "")
    before = dict(scenarios._SCENARIOS)
    paths = set(scenarios._paths_loaded)
    yield
    scenarios._SCENARIOS.clear()
    scenarios._SCENARIOS.update(before)
    scenarios._paths_loaded.clear()
    scenarios._paths_loaded.update(paths)


def _write(tmp_path, name, filename="plug_scenario.py"):
    path = tmp_path / filename
    path.write_text(SCENARIO_SOURCE.format(name=name))
    return path


def _distribution(tmp_path, monkeypatch, entry: str, module_name="plugdemo_scenario", name="plug-demo"):
    """An installed distribution (a .dist-info on sys.path) declaring one scenario entry point."""
    (tmp_path / f"{module_name}.py").write_text(SCENARIO_SOURCE.format(name=name))
    info = tmp_path / "plugdemo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugdemo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[racecheck.scenarios]\n{entry}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_an_installed_package_registers_a_scenario_by_entry_point(tmp_path, monkeypatch, registry, capsys):
    _distribution(tmp_path, monkeypatch, "plug-demo = plugdemo_scenario:SCENARIO")
    assert "plug-demo" in scenarios.names() and scenarios.names()[0] == "eagle-v2"
    assert cli.main(["run", "plug-demo"]) == 0
    assert cli.main(["run", "plug-demo", "--variant", "no-join"]) == 1
    assert "RC001" in capsys.readouterr().out


def test_a_broken_entry_point_is_one_usage_line_and_spares_the_others(tmp_path, monkeypatch, registry, capsys):
    _distribution(tmp_path, monkeypatch, "plug-demo = no_such_module_xyz:SCENARIO")
    assert scenarios.get("eagle-v2").name == "eagle-v2"          # loaded by name: not affected
    with pytest.raises(UsageError, match=r"scenario 'plug-demo' \(entry point racecheck.scenarios "
                                         r"no_such_module_xyz:SCENARIO\) failed to load: ModuleNotFoundError"):
        scenarios.get("plug-demo")
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plug-demo" in err


def test_an_entry_point_must_name_its_scenario(tmp_path, monkeypatch, registry):
    _distribution(tmp_path, monkeypatch, "other-name = plugdemo_scenario:SCENARIO")
    with pytest.raises(UsageError, match="is named 'plug-demo'"):
        scenarios.get("other-name")


def test_scenario_path_loads_a_file_for_every_command(tmp_path, registry, capsys):
    path = _write(tmp_path, "path-demo")
    assert cli.main(["--scenario-path", str(path), "list", "--json"]) == 0
    listed = [s["name"] for s in json.loads(capsys.readouterr().out)["scenarios"]]
    assert listed[0] == "eagle-v2" and "path-demo" in listed
    assert cli.main(["--scenario-path", str(path), "run", "path-demo", "--variant", "no-join"]) == 1


def test_scenario_path_reaches_child_processes(tmp_path, registry):
    """Fuzz workers and the gate's runs are new processes: they find the path in the environment."""
    path = _write(tmp_path, "child-demo")
    scenarios.add_path(path)
    assert str(path) in os.environ[scenarios.PATH_ENV].split(os.pathsep)
    r = racecheck_cli("list", "--json")
    assert r.returncode == 0, r.stderr
    assert "child-demo" in [s["name"] for s in json.loads(r.stdout)["scenarios"]]


def test_a_package_folder_works_too(tmp_path, registry):
    pkg = tmp_path / "my_engine_scenarios"
    pkg.mkdir()
    _write(pkg, "pkg-demo", "__init__.py")
    scenarios.add_path(pkg)
    assert scenarios.get("pkg-demo").variants["no-join"].expected == [("RC001", "x")]


@pytest.mark.parametrize("content,message", [
    (None, "not a Python file or a package folder"),
    ("X = 1\n", "defines no SCENARIO"),
    ("SCENARIO = 'eagle'\n", "defines no SCENARIO"),
    ("raise RuntimeError('broken engine import')\n", "RuntimeError: broken engine import"),
])
def test_bad_scenario_paths_are_usage_errors(tmp_path, registry, capsys, content, message):
    path = tmp_path / "scn.py"
    if content is not None:
        path.write_text(content)
    assert cli.main(["--scenario-path", str(path), "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
