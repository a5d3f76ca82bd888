"""One engine per process, as the engine itself runs.

sglang builds its parallel runtime, its process groups and its pools of graph input buffers once
per server process (a second `Scheduler` in one process refuses to start). A scenario that drives
such an engine sets `Scenario.fresh_process`; each of its runs, instrumented or reference, then
happens in a child forked from this process, which itself never builds the engine. A fork is
cheap (the engine's modules are already imported), and the child's process-wide state is the
parent's: fresh.

Only on sim: a process that has initialized CUDA cannot fork safely; a GPU run is one engine in
the `racecheck run` process.

The engine itself is imported in each child, inside the run's session, because what it binds at
import (platform probes, cached device lookups, names taken from `torch.cuda`) must be what the
run routes. Its third-party dependencies (torch's compiler stack, transformers, the HTTP and
tokenizer stacks: most of the import's time) bind nothing of the run: `warm` imports them here
once, so every child starts with them loaded.
"""
from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
import time

_WARM: dict = {}        # scenario name -> seconds spent warming this process


class EngineProcessDied(RuntimeError):
    """The child running the engine ended without a result (a crash in native code)."""


def available(sc, device: str) -> bool:
    return bool(getattr(sc, "fresh_process", False)) and device == "sim" and hasattr(os, "fork")


def run(sc, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` in a child forked from this process, warmed for `sc` first."""
    warm(sc)
    return call(fn, *args, **kwargs)


def warm(sc) -> float:
    """Import here what importing `sc`'s engine pulls in, except the engine's own packages
    (`Scenario.engine_packages`) and racecheck. The list comes from importing the engine in a
    throwaway child (`Scenario.import_engine`), kept in the user's cache per engine version and
    Python, so later processes skip that child. Once per process and scenario; returns the
    seconds spent."""
    importer = getattr(sc, "import_engine", None)
    if importer is None or sc.name in _WARM:
        return _WARM.get(sc.name, 0.0)
    started = time.perf_counter()
    own = set(getattr(sc, "engine_packages", ())) | {"racecheck"}
    path = _cache_path(sc)
    modules = _read_list(path)
    if modules is None:
        try:
            modules = [m for m in call(_imported_by, importer) if m.split(".")[0] not in own]
        except Exception:       # noqa: BLE001 - the run itself reports why the engine won't import
            modules = []
        if modules and path:
            _write_list(path, modules)
    for name in modules:
        if name.split(".")[0] in own or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:       # noqa: BLE001 - a module that imports only inside its package's
            pass                # own import (or only on another platform) is left to the child
    _WARM[sc.name] = time.perf_counter() - started
    return _WARM[sc.name]


def _cache_path(sc) -> str | None:
    version = getattr(sc, "engine_version", None)
    try:
        v = version() if callable(version) else None
    except Exception:           # noqa: BLE001
        v = None
    if not v:
        return None
    import torch
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = f"{sc.name}-{v}-py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.__version__}"
    return os.path.join(root, "racecheck", "engine-imports", key.replace(os.sep, "_") + ".json")


def _read_list(path) -> list | None:
    import json
    if not path:
        return None
    try:
        with open(path) as fh:
            data = json.load(fh)
        return [m for m in data if isinstance(m, str)] if isinstance(data, list) else None
    except (OSError, ValueError):
        return None


def _write_list(path: str, modules: list) -> None:
    """Best effort, atomic: a cache that cannot be written only costs the next process time."""
    import json
    import tempfile
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(modules, fh)
        os.replace(tmp, path)
    except OSError:
        pass


def _imported_by(importer) -> list:
    before = set(sys.modules)
    importer()
    return sorted(set(sys.modules) - before)


def call(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` in a forked child; its return value, or its exception, here."""
    return start(fn, *args, **kwargs).result()


class Pending:
    """A forked child computing a value; `result()` waits for it."""

    def __init__(self, pid: int, read: int):
        self.pid, self._read = pid, read

    def cancel(self) -> None:
        """Stop the child and reap it (its result is no longer wanted)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self._read)
        os.waitpid(self.pid, 0)

    def result(self):
        with os.fdopen(self._read, "rb") as fh:
            data = fh.read()
        _, status = os.waitpid(self.pid, 0)
        if not data:
            how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                   else f"exit status {os.WEXITSTATUS(status)}")
            raise EngineProcessDied(f"the engine's process died ({how})")
        ok, value = pickle.loads(data)
        if not ok:
            raise value
        return value


def start(fn, *args, **kwargs) -> Pending:
    """Fork a child that computes `fn(*args, **kwargs)`; this process goes on (a reference
    run and the instrumented run side by side, on two cores)."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                                      # the child: run, send, leave
        code = 0
        try:
            os.close(read)
            try:
                result = (True, fn(*args, **kwargs))
            except BaseException as exc:              # noqa: BLE001 - sent to the parent
                result = (False, exc)
            try:
                data = pickle.dumps(result)
            except Exception as exc:                  # noqa: BLE001
                data = pickle.dumps((False, RuntimeError(
                    f"the engine's process could not send its result: {exc}")))
            with os.fdopen(write, "wb") as fh:
                fh.write(data)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:                         # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    return Pending(pid, read)
