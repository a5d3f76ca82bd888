"""The start-up hook's session: closed at exit before its report, so end-of-run findings count."""
import os
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent('''
    import torch

    import racecheck
    import racecheck.cli.autostart
    racecheck.cli.autostart.activate()
    dm = racecheck.active_session().device_module
    side = dm.Stream()
    t = racecheck.name(torch.full((64,), 1.0), "t")
    dm.synchronize()
    side.wait_stream(dm.current_stream())
    with dm.stream(side):
        u = t * 2
    {tail}
''')


def _run(tmp_path, tail):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM.format(tail=tail))
    env = dict(os.environ, RACECHECK_ROUTE_CUDA="0")
    return subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env, timeout=300)


def test_a_hazard_open_at_exit_is_reported(tmp_path):
    """`del t` with no record_stream and nothing after it: RC005 once the session ends (CASES P19)."""
    r = _run(tmp_path, "del t")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "RC005" in r.stdout


def test_a_clean_program_keeps_its_exit_status(tmp_path):
    r = _run(tmp_path, "t.record_stream(side)\ndel t")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RC005" not in r.stdout
