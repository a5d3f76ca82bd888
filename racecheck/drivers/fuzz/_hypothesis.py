"""Every Hypothesis detail racecheck relies on that is not public API, in one place.

Hypothesis offers no public way to choose a test's database key (it hashes the test's source, which
would split the corpus whenever racecheck changes), to seed a run without turning its database off
(`@seed` does), to tell the final replay of a shrunk example from the others, or to replay a saved
choice sequence outside a test. These helpers are small and long-stable, but private: the supported
range is pinned in pyproject and both of its ends are tested (scripts/hypothesis_ends.py).
"""
from __future__ import annotations


def set_database_key(test, key: bytes) -> None:
    """Store `test`'s examples under `key` instead of a hash of its source."""
    test._hypothesis_internal_database_key = key


def set_seed(test, seed: int) -> None:
    """What `hypothesis.seed(n)` sets, without its side effect of turning the database off."""
    test._hypothesis_internal_use_seed = seed


def is_final() -> bool:
    """Whether this call is Hypothesis' final replay of a shrunk failing example."""
    from hypothesis.control import current_build_context
    return current_build_context().is_final


def choices() -> tuple:
    """The choice sequence drawn so far by the running example (what the database stores)."""
    from hypothesis.control import current_build_context
    return tuple(current_build_context().data.choices)


def draw_from_choices(strategy, choices):
    """The value `strategy` draws from a saved choice sequence (raises if they do not fit)."""
    from hypothesis.control import BuildContext
    from hypothesis.internal.conjecture.data import ConjectureData
    data = ConjectureData.for_choices(choices)
    with BuildContext(data, wrapped_test=None):
        return data.draw(strategy)


def choices_to_bytes(choices) -> bytes:
    from hypothesis.database import choices_to_bytes as encode
    return encode(choices)


def choices_from_bytes(buffer: bytes):
    """A saved choice sequence, or None when the bytes are not one."""
    from hypothesis.database import choices_from_bytes as decode
    return decode(buffer)
