"""The request schedule of a run: who joins at which scheduler step, with what prompt.

`0:3x6;2:2x5+4` reads: at loop step 0 three requests join, each may generate 6 tokens; at step 2
two more join with 4-token prompts (the default prompt length is 5). Prompts are deterministic
from the run's seed; with `shared_prefix` they all start with the same `prefix_len` tokens (a
shorter prompt is all prefix), so requests that join later hit the radix cache.

Traffic comes in phases separated by `|`: `0:3x6|0:2x4;1:1x2` runs the first schedule, and once
its every request has finished the next one starts, its steps counted from there, on the same
running engine (its radix cache, pools and graphs as the first phase left them), as a server sees
one burst of traffic after another.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_PROMPT_LEN = 5
MIN_PROMPT_LEN = 3
PREFIX_LEN = 3                  # the default shared prefix


MAX_PHASES = 8


@dataclass(frozen=True)
class Group:
    step: int                   # loop step, counted from the start of its phase
    count: int
    max_new_tokens: int
    prompt_len: int = DEFAULT_PROMPT_LEN
    phase: int = 0


def parse_arrivals(text) -> list:
    """The groups of every phase, in phase and step order."""
    if isinstance(text, (list, tuple)):
        return [g if isinstance(g, Group) else Group(*g) for g in text]
    groups = []
    phases = str(text).replace(" ", "").split("|")
    if len(phases) > MAX_PHASES:
        raise ValueError(f"{len(phases)} phases: at most {MAX_PHASES}")
    for phase, part in enumerate(phases):
        mine = []
        for item in part.split(";"):
            if not item:
                continue
            try:
                step, rest = item.split(":")
                rest, _, plen = rest.partition("+")
                count, new = rest.split("x")
                g = Group(int(step), int(count), int(new),
                          int(plen) if plen else DEFAULT_PROMPT_LEN, phase)
            except ValueError:
                raise ValueError(f"{item!r}: expected STEP:COUNTxMAX_NEW_TOKENS[+PROMPT_LEN]") \
                    from None
            if g.step < 0 or not 1 <= g.count <= 16 or not 1 <= g.max_new_tokens <= 24 \
                    or not MIN_PROMPT_LEN <= g.prompt_len <= 16:
                raise ValueError(f"{item!r}: step >= 0, 1..16 requests, 1..24 new tokens, "
                                 f"prompts of {MIN_PROMPT_LEN}..16 tokens")
            mine.append(g)
        if not mine:
            raise ValueError("no requests" if len(phases) == 1 else
                             f"phase {phase + 1} of {len(phases)} has no requests")
        groups.extend(mine)
    return sorted(groups, key=lambda g: (g.phase, g.step))


def format_arrivals(groups) -> str:
    phases: dict = {}
    for g in groups:
        phases.setdefault(g.phase, []).append(
            f"{g.step}:{g.count}x{g.max_new_tokens}"
            + ("" if g.prompt_len == DEFAULT_PROMPT_LEN else f"+{g.prompt_len}"))
    return "|".join(";".join(items) for _, items in sorted(phases.items()))


def phases(groups) -> list:
    """The groups of each phase, in order."""
    out: dict = {}
    for g in groups:
        out.setdefault(g.phase, []).append(g)
    return [out[k] for k in sorted(out)]


def prompts(groups, *, seed: int, shared_prefix: bool, vocab: int, prefix_len: int = PREFIX_LEN,
            families: int = 1):
    """[(step, rid, prompt tokens, max_new_tokens)] in arrival order (a group's phase is the
    caller's to carry). With `families` > 1 the shared prefixes are that many (request i starts
    with family i mod `families`'s)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_len)]
    family_prefixes = [prefix] + [[rng.randrange(1, vocab) for _ in range(prefix_len)]
                                  for _ in range(families - 1)]
    out = []
    for g in groups:
        for _ in range(g.count):
            n = min(prefix_len, g.prompt_len)
            prefix = family_prefixes[len(out) % families]
            head = prefix[:n] if shared_prefix else [rng.randrange(1, vocab) for _ in range(n)]
            tail = [rng.randrange(1, vocab) for _ in range(g.prompt_len - n)]
            out.append((g.step, f"r{len(out)}", head + tail, g.max_new_tokens))
    return out
