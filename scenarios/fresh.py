"""One engine per process, as the engine itself runs.

sglang builds its parallel runtime, its process groups and its pools of graph input buffers once
per server process (a second `Scheduler` in one process refuses to start). A scenario that drives
such an engine sets `Scenario.fresh_process`; each of its runs, instrumented or reference, then
happens in a child forked from this process, which itself never builds the engine. A fork is
cheap (the engine's modules are already imported), and the child's process-wide state is the
parent's: fresh.

On a GPU a child is a new interpreter instead (`spawn`): a process that has initialized CUDA
cannot fork, and sglang's own import initializes it (its Triton helpers ask the driver for the
current device at module level), so no warmed parent can serve as a template. Each new
interpreter then pays the imports (a `Server`, kept open for many requests, pays them once); a
scenario crosses over by its registered name (its functions need not pickle).
`RACECHECK_ENGINE_PROCESS=spawn` makes every engine process a new interpreter on sim too.

The engine itself is imported in each child, inside the run's session, because what it binds at
import (platform probes, cached device lookups, names taken from `torch.cuda`) must be what the
run routes. Its third-party dependencies (torch's compiler stack, transformers, the HTTP and
tokenizer stacks: most of the import's time) bind nothing of the run: `warm` imports them here
once, so every child starts with them loaded.
"""
from __future__ import annotations

import gc
import importlib
import os
import pickle
import signal
import sys
import time

from racecheck.core.files import cache_dir

_WARM: dict = {}        # scenario name -> seconds spent warming this process
PROCESS_ENV = "RACECHECK_ENGINE_PROCESS"    # "spawn": a new interpreter per engine on sim too


class EngineProcessDied(RuntimeError):
    """The child running the engine ended without a result (a crash in native code)."""


def mode(sc, device: str) -> str | None:
    """How a run of `sc` on `device` gets its own process: "fork" (sim: a child of this warmed
    process), "spawn" (a new interpreter: on a GPU, where fork is missing, or once this process
    has initialized CUDA) or None (the scenario runs here)."""
    if not getattr(sc, "fresh_process", False):
        return None
    if os.environ.get(PROCESS_ENV) == "spawn":
        return "spawn"
    return "fork" if device == "sim" and hasattr(os, "fork") and not _cuda_initialized() \
        else "spawn"


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:           # noqa: BLE001 - a torch without CUDA
        return False


def serves(sc, device: str) -> bool:
    """Whether an engine of `sc` on `device` can be kept open in a process of its own to serve
    many requests (`serve`: forked, or a new interpreter)."""
    return mode(sc, device) is not None


def start_for(sc, device: str, fn, *args, **kwargs):
    """`start` (a forked child, this process warmed first) or `spawn` (a new interpreter), as
    `mode(sc, device)` says; a Pending either way."""
    if mode(sc, device) == "fork":
        warm(sc)
        return start(fn, *args, **kwargs)
    return spawn(fn, *args, **kwargs)


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


def warmed() -> bool:
    """Whether this process imported an engine's dependencies (`warm`)."""
    return bool(_WARM)


def _cache_path(sc) -> str | None:
    version = getattr(sc, "engine_version", None)
    try:
        v = version() if callable(version) else None
    except Exception:           # noqa: BLE001
        v = None
    if not v:
        return None
    import torch
    key = f"{sc.name}-{v}-py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.__version__}"
    return cache_dir("engine-imports", key.replace(os.sep, "_") + ".json")


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
        return _outcome(data, -os.WTERMSIG(status) if os.WIFSIGNALED(status)
                        else os.WEXITSTATUS(status))


def _computed(fn, args, kwargs) -> bytes:
    """A child's answer, pickled: (True, value) or (False, the exception it raised)."""
    try:
        result = (True, fn(*args, **kwargs))
    except BaseException as exc:                      # noqa: BLE001 - sent to the parent
        result = (False, exc)
    try:
        return pickle.dumps(result)
    except Exception as exc:                          # noqa: BLE001
        return pickle.dumps((False, RuntimeError(
            f"the engine's process could not send its result: {exc}")))


def _outcome(data: bytes, code: int):
    """The child's value, or its exception raised here; no answer at all: it died (`code`: its
    exit status, or minus the signal that ended it)."""
    if not data:
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        raise EngineProcessDied(f"the engine's process died ({how})")
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value


FREEZE_INHERITED = True     # bench_sglang.py --freeze, gpu_sglang.py --thaw: compared with off


def _freeze_inherited() -> None:
    """A forked child keeps what it inherits out of its collector's reach (`gc.freeze`, as
    Python's docs advise for a fork without exec): the warmed parent's imports are most of an
    engine process's objects (about 600,000 of 790,000), which every full collection would walk
    again (sglang collects before each graph capture) and every name lookup would scan
    (`instrumentation/names.py`). The program's own objects, made after the fork, are collected
    and named as before; a tensor the program keeps only in an object the parent made (a
    module the parent imported) is not named."""
    if FREEZE_INHERITED:
        gc.freeze()


def begin_engine_process(sc) -> None:
    """A new interpreter that will build `sc`'s engine starts as a child forked from a warmed
    parent does: the engine's dependencies imported, then frozen."""
    warm(sc)
    _freeze_inherited()


def _begin_for(args) -> None:
    """A new interpreter about to run a call: `begin_engine_process` for the scenarios among
    its arguments."""
    for arg in args:
        if hasattr(arg, "import_engine"):
            begin_engine_process(arg)


def start(fn, *args, **kwargs) -> Pending:
    """Fork a child that computes `fn(*args, **kwargs)`; this process goes on (a reference
    run and the instrumented run side by side, on two cores)."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                                      # the child: run, send, leave
        code = 0
        _freeze_inherited()
        try:
            os.close(read)
            data = _computed(fn, args, kwargs)
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


# -- a new interpreter (GPUs) ----------------------------------------------------------------------

def _spawned_main() -> None:
    """The new interpreter's side of `spawn`: the call arrives pickled on stdin, its answer
    leaves on the file descriptor named in argv. A call for a scenario's engine first imports
    its dependencies and freezes them, as a child forked from a warmed parent starts."""
    fd = int(sys.argv[1])
    try:
        fn, args, kwargs = pickle.load(sys.stdin.buffer)
    except BaseException as exc:                      # noqa: BLE001 - sent to the parent
        data = pickle.dumps((False, RuntimeError(
            f"the engine's process could not read its call: {exc}")))
    else:
        _begin_for(args)
        data = _computed(fn, args, kwargs)
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


class SpawnPending:
    """A new interpreter computing a value; `result()` waits for it."""

    def __init__(self, proc, read: int):
        self.proc, self._read = proc, read

    def cancel(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self._read)

    def result(self):
        with os.fdopen(self._read, "rb") as fh:
            data = fh.read()
        return _outcome(data, self.proc.wait())


def _new_interpreter(entry: str, fds: tuple, stdin=None):
    """A new interpreter with this one's `sys.path` running this module's `entry()`, the file
    descriptors `fds` passed on and named in its argv."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen(
        [sys.executable, "-c", f"from racecheck.scenarios.fresh import {entry}; {entry}()",
         *(str(fd) for fd in fds)], stdin=stdin, pass_fds=fds, env=env)


def spawn(fn, *args, **kwargs) -> SpawnPending:
    """A new interpreter (this one's `sys.path`) that computes `fn(*args, **kwargs)`: `fn` and the
    arguments pickled (a `Scenario` goes by its registered name). Not multiprocessing's spawn,
    which runs the parent's main script again in the child."""
    import subprocess
    payload = pickle.dumps((fn, args, kwargs))
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        proc = _new_interpreter("_spawned_main", (write,), stdin=subprocess.PIPE)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    pending = SpawnPending(proc, read)
    try:
        with proc.stdin:
            proc.stdin.write(payload)
    except BrokenPipeError:     # the child died before reading its call: result() says how
        pass
    return pending


# -- long-lived engine processes -----------------------------------------------------------------
#
# One engine, many request schedules: a child forked from this (warmed) process builds the
# engine once and then serves requests from the parent over a pipe, as a server serves traffic
# (scenarios/sglang/reuse.py, racecheck/drivers/fuzz/engines.py). Messages are pickled, each
# preceded by its length.

def _send(fd: int, obj) -> None:
    data = pickle.dumps(obj)
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _recv(fd: int):
    """The next message, or raise EOFError when the other end closed."""
    def exactly(n):
        chunks, got = [], 0
        while got < n:
            chunk = os.read(fd, n - got)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    return pickle.loads(exactly(int.from_bytes(exactly(8), "little")))


class Channel:
    """The child's end of a `Server`: `recv()` the next request (None once the parent closed
    it), `send(reply)`."""

    def __init__(self, read: int, write: int):
        self._read, self._write = read, write

    def recv(self):
        try:
            return _recv(self._read)
        except EOFError:
            return None

    def send(self, obj) -> None:
        try:
            _send(self._write, (True, obj))
        except Exception as exc:            # noqa: BLE001 - an unpicklable reply says so
            _send(self._write, (False, RuntimeError(
                f"the engine's process could not send its reply: {exc}")))


def _serve_on(chan_read: int, chan_write: int, fn, args) -> None:
    """The child's side of a `Server`: `fn(channel, *args)`; an exception it raises goes to
    the parent as the reply it was waiting for."""
    chan = Channel(chan_read, chan_write)
    try:
        fn(chan, *args)
    except BaseException as exc:             # noqa: BLE001 - sent to the parent
        try:
            _send(chan_write, (False, exc))
        except Exception:                    # noqa: BLE001
            _send(chan_write, (False, RuntimeError(f"{type(exc).__name__}: {exc}")))
    sys.stdout.flush()
    sys.stderr.flush()


def _served_main() -> None:
    """A spawned `Server`'s new interpreter: the call is the channel's first message; a call
    for a scenario's engine first imports its dependencies and freezes them, as a child forked
    from a warmed parent starts."""
    read, write = int(sys.argv[1]), int(sys.argv[2])
    try:
        fn, args = _recv(read)
    except BaseException as exc:                      # noqa: BLE001 - sent to the parent
        _send(write, (False, RuntimeError(f"the engine's process could not read its call: "
                                          f"{exc}")))
        return
    _begin_for(args)
    _serve_on(read, write, fn, args)


class Server:
    """A long-lived child serving requests until closed: forked from this process, or, with
    `spawn`, a new interpreter (on a GPU: a process that initialized CUDA cannot fork) whose
    call arrives pickled as the channel's first message (a `Scenario` goes by its name).

    `fn(channel, *args)` runs in the child: it answers each `channel.recv()` with one
    `channel.send(...)`; a reply `(False, exception)` is raised here. When `fn` returns, the
    child leaves; a child that dies is `EngineProcessDied` at the next `request`."""

    def __init__(self, fn, *args, spawn: bool = False):
        from_parent, to_child = os.pipe()               # (read end, write end)
        from_child, to_parent = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self._proc = None
        if spawn:
            try:
                self._proc = _new_interpreter("_served_main", (from_parent, to_parent))
            except BaseException:
                for fd in (from_parent, to_child, from_child, to_parent):
                    os.close(fd)
                raise
            pid = self._proc.pid
        else:
            pid = os.fork()
            if pid == 0:                                 # the forked child
                code = 0
                _freeze_inherited()
                try:
                    os.close(to_child)
                    os.close(from_child)
                    _serve_on(from_parent, to_parent, fn, args)
                except BaseException:                    # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
        os.close(from_parent)
        os.close(to_parent)
        self.pid = pid
        self._to, self._from = to_child, from_child
        self.alive = True
        if spawn:
            self.send((fn, args))

    def request(self, obj):
        """Send `obj`, wait for the reply."""
        self.send(obj)
        return self.reply()

    def send(self, obj) -> None:
        if not self.alive:
            raise EngineProcessDied("the engine's process was closed")
        try:
            _send(self._to, obj)
        except OSError:
            self._died()

    def reply(self):
        try:
            ok, value = _recv(self._from)
        except EOFError:
            self._died()
        if not ok:
            raise value
        return value

    def _wait(self, block: bool = True) -> int | None:
        """The child's exit status once it left (minus the signal that ended it), else None."""
        if self._proc is not None:
            return self._proc.wait() if block else self._proc.poll()
        pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        if not pid:
            return None
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def _close_fds(self, fds) -> None:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def _died(self):
        self.alive = False
        code = self._wait()
        self._close_fds((self._to, self._from))
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        raise EngineProcessDied(f"the engine's process died ({how})")

    def close(self, timeout: float = 30.0) -> None:
        """Ask the child to leave (its channel reads None), wait a while, then kill it."""
        if not self.alive:
            return
        self.alive = False
        self._close_fds((self._to,))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._wait(block=False) is not None:
                break
            time.sleep(0.05)
        else:
            self._signal_kill()
            self._wait()
        self._close_fds((self._from,))

    def _signal_kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """Stop the child now (its stretch's result is no longer wanted)."""
        if not self.alive:
            return
        self.alive = False
        self._signal_kill()
        self._wait()
        self._close_fds((self._to, self._from))


def serve(sc, fn, *args, device: str = "sim") -> Server:
    """A `Server` running `fn(channel, *args)` for a run of `sc` on `device`: forked from this
    process warmed for `sc`, or a new interpreter where `mode` says so."""
    if mode(sc, device) == "fork":
        warm(sc)
        return Server(fn, *args)
    return Server(fn, *args, spawn=True)
