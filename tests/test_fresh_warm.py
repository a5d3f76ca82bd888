"""`fresh.warm`: a parent that forks one engine process per run imports the engine's
dependencies once, never the engine itself (whose import must happen under each run's routing)."""
import importlib.util
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


@pytest.mark.parametrize("spawn", [False, True])
def test_a_server_answers_many_requests_from_one_process_and_reports_its_end(spawn):
    """`fresh.Server`: the long-lived engine process of the fuzzer (one engine, many schedules),
    forked from this process or (GPUs) a new interpreter."""
    from racecheck.scenarios import fresh
    s = fresh.Server(_echo_server, 3, spawn=spawn)
    (pid1, a), (pid2, b) = s.request(1), s.request([2])
    assert (a, b) == (3, [2, 2, 2]) and pid1 == pid2 == s.pid != os.getpid()
    s.close()
    assert not s.alive
    with pytest.raises(ChildProcessError):
        os.waitpid(s.pid, os.WNOHANG)
    dying = fresh.Server(_echo_server, 1, spawn=spawn)
    with pytest.raises(fresh.EngineProcessDied, match="exit status 3"):
        dying.request("die")
    raising = fresh.Server(_echo_server, 1, spawn=spawn)
    with pytest.raises(ValueError, match="asked to"):
        raising.request("raise")
    raising.kill()


def _inherited_is_frozen(marker_id):
    import gc
    return gc.get_freeze_count() > 0, any(id(o) == marker_id for o in gc.get_objects()), \
        len(gc.get_objects()) < gc.get_freeze_count()


def _serve_frozen(chan, marker_id):
    while chan.recv() is not None:
        chan.send(_inherited_is_frozen(marker_id))


def test_forked_engine_processes_freeze_what_they_inherit():
    """An engine process's objects are mostly the warmed parent's imports: frozen in the child,
    the collector's passes (sglang collects before each graph capture) and the name lookups
    skip them; the parent's own collector is left as it was."""
    import gc
    from racecheck.scenarios import fresh
    marker = [object()]
    before = gc.get_freeze_count()
    frozen, seen, few = fresh.call(_inherited_is_frozen, id(marker))
    assert frozen and not seen and few
    s = fresh.Server(_serve_frozen, id(marker))
    assert s.request("how") == (True, False, True)
    s.close()
    assert gc.get_freeze_count() == before
    assert any(o is marker for o in gc.get_objects())


def _capture_collects():
    from racecheck.scenarios.sglang import imports, server
    from racecheck.scenarios.sglang.engine_run import _SIM_ENV, _environment, _import_quietly
    imports.install()
    with _environment(dict(_SIM_ENV)):
        _import_quietly()
        return server.server_args(server.Shape(graphs=True)).enable_cudagraph_gc


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang")
def test_a_frozen_engine_process_keeps_sglangs_capture_from_thawing_it(monkeypatch):
    """sglang's `freeze_gc` around each graph capture ends with `gc.unfreeze()` (everything back
    in the collector's reach) unless its own `enable_cudagraph_gc` says to collect during
    capture: set only where the process froze what it inherited, sglang's default elsewhere."""
    from racecheck.scenarios import fresh
    frozen = fresh.start(_capture_collects)
    monkeypatch.setattr(fresh, "FREEZE_INHERITED", False)
    thawed = fresh.start(_capture_collects)
    assert (frozen.result(), thawed.result()) == (True, False)


# -- GPUs: a new interpreter per engine run --------------------------------------------------------

def test_engine_runs_fork_on_sim_and_spawn_on_a_gpu(monkeypatch):
    """sglang's own import initializes CUDA, and a process that has cannot fork: engine runs on
    a GPU start a new interpreter (found on an H200: a forked reference run died with 'Cannot
    re-initialize CUDA in forked subprocess', the next example with 'init_parallel_runtime()
    ran twice in this process'). Either way an engine can be kept open to serve many requests;
    `RACECHECK_ENGINE_PROCESS=spawn` asks for new interpreters on sim too."""
    from racecheck.scenarios import fresh, get
    sc = get("sglang-eagle-v2")
    assert fresh.mode(sc, "sim") == "fork" and fresh.serves(sc, "sim")
    assert fresh.mode(sc, "cuda") == "spawn" and fresh.serves(sc, "cuda")
    assert fresh.mode(sc, "npu") == "spawn"
    assert fresh.mode(get("eagle-v2"), "cuda") is None       # the model runs in this process
    assert not fresh.serves(get("eagle-v2"), "sim")
    monkeypatch.setenv(fresh.PROCESS_ENV, "spawn")
    assert fresh.mode(sc, "sim") == "spawn"


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


def _frozen_before_the_engine(sc):
    import gc
    return gc.get_freeze_count() > 0, "transformers" in sys.modules, "sglang" in sys.modules


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang")
def test_a_spawned_engine_process_starts_as_a_forked_one_does():
    """Warmed with the engine's dependencies, those frozen, the engine itself not imported."""
    from racecheck.scenarios import fresh, get
    assert fresh.spawn(_frozen_before_the_engine, get("sglang-eagle-v2")).result() == \
        (True, True, False)


LEAVE = textwrap.dedent('''
    import atexit, sys
    from racecheck.cli.cliparse import exit_now_after_engine
    from racecheck.scenarios import fresh

    class Toy:
        name = "toy-engine"
        engine_packages = ("xml",)

        @staticmethod
        def import_engine():
            import wave

        @staticmethod
        def engine_version():
            return "1.0"

    atexit.register(lambda: print("torn down"))
    if sys.argv[1] == "warm":
        fresh.warm(Toy)
    print("reported", end="")                  # unflushed until the exit flushes it
    exit_now_after_engine(5)
    sys.exit(6)
''')


@pytest.mark.parametrize("warm", [True, False])
def test_a_warmed_process_leaves_without_teardown(tmp_path, warm):
    """A process that warmed an engine's dependencies leaves at once, output flushed, its
    status kept; any other process goes on to its own exit."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", LEAVE, "warm" if warm else "cold"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert (p.returncode, p.stdout) == ((5, "reported") if warm else (6, "reportedtorn down\n"))
