"""One engine per process, as the engine itself runs.

sglang builds its parallel runtime, its process groups and its pools of graph input buffers once
per server process (a second `Scheduler` in one process refuses to start). A scenario that drives
such an engine sets `Scenario.fresh_process`; each of its runs, instrumented or reference, then
happens in a child forked from this process, which itself never builds the engine. A fork is
cheap (the engine's modules are already imported), and the child's process-wide state is the
parent's: fresh.

Only on sim: a process that has initialized CUDA cannot fork safely; a GPU run is one engine in
the `racecheck run` process.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys


class EngineProcessDied(RuntimeError):
    """The child running the engine ended without a result (a crash in native code)."""


def available(sc, device: str) -> bool:
    return bool(getattr(sc, "fresh_process", False)) and device == "sim" and hasattr(os, "fork")


def call(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` in a forked child; its return value, or its exception, here."""
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
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
               else f"exit status {os.WEXITSTATUS(status)}")
        raise EngineProcessDied(f"the engine's process died ({how})")
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value
