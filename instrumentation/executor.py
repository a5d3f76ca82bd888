"""How the sim backend runs device work.

The eager executor runs every op when it is issued, in host issue order: enough for the
checker, whose verdict does not depend on timing. An adversarial executor (see `adversarial`)
queues ops per stream and runs them in an order consistent with happens-before that it
chooses, so a race can also show up as a wrong value on the CPU.
"""
from __future__ import annotations


class Executor:
    """Interface. `eager` executors let the backend call ops directly (the fast path)."""

    eager = True
    deferred_footprints = False    # index ops' footprints are taken when the op runs (queued)

    def bind(self, backend) -> None:
        self.backend = backend

    def run(self, stream, func, args, kwargs):
        return func(*args, **kwargs)

    def launch(self, stream, thunk, name: str = "graph_replay", keep=()) -> None:
        """Device work with no result the host needs now (graph replays, Triton launches);
        `keep`: storages it reaches other than through arguments (queued executors hold them)."""
        thunk()

    def record(self, event, stream) -> None:
        pass

    def wait_event(self, stream, event) -> None:
        pass

    def wait_stream(self, waiter, waitee) -> None:
        pass

    def sync_stream(self, stream) -> None:
        pass

    def sync_event(self, event) -> None:
        pass

    def sync_all(self) -> None:
        pass

    def query_stream(self, stream) -> bool:
        return True

    def query_event(self, event) -> bool:
        return True

    def delay(self, stream, microseconds: float) -> None:
        pass

    def stream_named(self, stream, name: str) -> None:
        """The user named a stream (plans refer to streams by name)."""

    def finish(self) -> None:
        """Session end: run everything still queued."""
        self.sync_all()


class EagerExecutor(Executor):
    """Runs each op at issue time."""
