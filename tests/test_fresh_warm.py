"""`fresh.warm`: a parent that forks one engine process per run imports the engine's
dependencies once, never the engine itself (whose import must happen under each run's routing)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

SCRIPT = textwrap.dedent('''
    import json, sys
    from racecheck.scenarios import fresh

    class Toy:
        name = "toy-engine"
        engine_packages = ("xml",)          # the "engine": must stay unimported here

        @staticmethod
        def import_engine():
            import xml.dom.minidom              # the engine's own package
            import tomllib, wave                # its dependencies

        @staticmethod
        def engine_version():
            return "1.0"

    assert "tomllib" not in sys.modules and "wave" not in sys.modules
    fresh.warm(Toy)
    fresh.warm(Toy)                              # once per process
    print(json.dumps({"deps": ["tomllib" in sys.modules, "wave" in sys.modules],
                      "engine": "xml.dom.minidom" in sys.modules,
                      "child_sees": fresh.call(lambda: "wave" in sys.modules)}))
''')


def _run(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_warm_imports_dependencies_not_the_engine_and_caches_the_list(tmp_path):
    first = _run(tmp_path)
    assert first == {"deps": [True, True], "engine": False, "child_sees": True}
    [cached] = list((tmp_path / "racecheck" / "engine-imports").iterdir())
    listed = json.loads(cached.read_text())
    assert "tomllib" in listed and "wave" in listed
    assert not [m for m in listed if m.split(".")[0] in ("xml", "racecheck")]
    cached.write_text(json.dumps(["wave"]))      # a second process reads the list, no probe child
    second = _run(tmp_path)
    assert second["deps"] == [False, True] and not second["engine"]


def test_start_runs_beside_the_caller_and_cancel_reaps():
    import time

    from racecheck.scenarios import fresh

    def slow(x):
        time.sleep(1.0)
        return x * 2
    t0 = time.perf_counter()
    a, b = fresh.start(slow, 1), fresh.start(slow, 2)
    assert (a.result(), b.result()) == (2, 4)
    assert time.perf_counter() - t0 < 1.9, "the two children ran one after the other"
    c = fresh.start(time.sleep, 60)
    c.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(c.pid, os.WNOHANG)


def test_a_child_that_dies_is_reported():
    from racecheck.scenarios import fresh
    with pytest.raises(fresh.EngineProcessDied, match="SIGKILL"):
        fresh.call(lambda: os.kill(os.getpid(), 9))


def _echo_server(chan, scale):
    while True:
        msg = chan.recv()
        if msg is None:
            return
        if msg == "die":
            os._exit(3)
        if msg == "raise":
            raise ValueError("asked to")
        chan.send((os.getpid(), msg * scale))


def test_a_server_answers_many_requests_from_one_process_and_reports_its_end():
    """`fresh.Server`: the long-lived engine process of the fuzzer (one engine, many schedules)."""
    from racecheck.scenarios import fresh
    s = fresh.Server(_echo_server, 3)
    (pid1, a), (pid2, b) = s.request(1), s.request([2])
    assert (a, b) == (3, [2, 2, 2]) and pid1 == pid2 == s.pid != os.getpid()
    s.close()
    assert not s.alive
    with pytest.raises(ChildProcessError):
        os.waitpid(s.pid, os.WNOHANG)
    dying = fresh.Server(_echo_server, 1)
    with pytest.raises(fresh.EngineProcessDied, match="exit status 3"):
        dying.request("die")
    raising = fresh.Server(_echo_server, 1)
    with pytest.raises(ValueError, match="asked to"):
        raising.request("raise")
    raising.kill()


# -- GPUs: a new interpreter per engine run --------------------------------------------------------

def test_engine_runs_fork_on_sim_and_spawn_on_a_gpu():
    """sglang's own import initializes CUDA, and a process that has cannot fork: engine runs on
    a GPU start a new interpreter (found on an H200: a forked reference run died with 'Cannot
    re-initialize CUDA in forked subprocess', the next example with 'init_parallel_runtime()
    ran twice in this process')."""
    from racecheck.scenarios import fresh, get
    sc = get("sglang-eagle-v2")
    assert fresh.mode(sc, "sim") == "fork" and fresh.available(sc, "sim")
    assert fresh.mode(sc, "cuda") == "spawn" and not fresh.available(sc, "cuda")
    assert fresh.mode(sc, "npu") == "spawn"
    assert fresh.mode(get("eagle-v2"), "cuda") is None       # the model runs in this process


def test_spawn_returns_raises_passes_scenarios_by_name_and_reports_a_death():
    import math
    import time
    from racecheck.scenarios import fresh, get
    assert fresh.spawn(math.factorial, 10).result() == 3628800
    with pytest.raises(ValueError):
        fresh.spawn(math.factorial, -1).result()
    assert fresh.spawn(getattr, get("eagle-v2"), "name").result() == "eagle-v2"
    import pickle
    assert pickle.loads(pickle.dumps(get("sglang-eagle-v2"))) is get("sglang-eagle-v2")
    with pytest.raises(fresh.EngineProcessDied, match="exit status 3"):
        fresh.spawn(os._exit, 3).result()
    slow = fresh.spawn(time.sleep, 60)
    t0 = time.monotonic()
    slow.cancel()
    assert time.monotonic() - t0 < 10 and slow.proc.returncode is not None
