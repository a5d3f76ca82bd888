"""The rules: one home for every rule's id, name, title, description and fix help.

Findings, the reports (console, JSON, SARIF, HTML) and README's rule table read from here; ids are
stable (SARIF, suppressions and baselines key on them). Imports nothing else of racecheck.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str             # "RC001"
    name: str           # "read-after-write": short, for headings
    title: str          # one line: the hazard (README's table)
    description: str    # a paragraph: what is wrong (SARIF fullDescription)
    help: str           # the smallest synchronization that fixes it (SARIF help)
    internal: bool = False   # not a happens-before rule (the differential oracle)


_ALL = (
    Rule("RC001", "read-after-write", "read after write on another stream, unordered",
         "A read on one stream of memory written on another stream, with no happens-before edge "
         "(event record/wait, wait_stream or host synchronization) between the write and the read.",
         "Order the write before the read: record an event on the writing stream after the write "
         "(`e.record(writer)`) and make the reading stream wait on it (`reader.wait_event(e)`), or "
         "`reader.wait_stream(writer)` before the read."),
    Rule("RC002", "write-after-read", "write after read on another stream, unordered",
         "A write on one stream of memory read on another stream, with no happens-before edge between "
         "the read and the write: the read may see the new value.",
         "Order the read before the overwrite: record an event on the reading stream after the read and "
         "make the writing stream wait on it before writing, or write into a fresh buffer."),
    Rule("RC003", "write-after-write", "write after write on another stream, unordered",
         "Two writes to the same memory on different streams with no happens-before edge: the final "
         "value depends on timing.",
         "Order the two writes: make the second writer's stream wait on an event recorded after the first "
         "write, or give each stream its own buffer."),
    Rule("RC004", "host-device",
         "host and device unordered on host memory (non-blocking D2H read early, H2D source reused early)",
         "Host code and a device operation touch the same host (pinned) memory unordered, e.g. a "
         "non-blocking D2H result read before the copy completed or an H2D source reused too early.",
         "Synchronize the host with the device before touching host memory: `event.synchronize()` (or "
         "`stream.synchronize()`) after a non-blocking D2H copy before reading it, and before reusing the "
         "source of a non-blocking H2D copy."),
    Rule("RC005", "allocator-reuse",
         "memory reused by the allocator while another stream's access is unordered (missing `record_stream`)",
         "The caching allocator can reuse memory freed on one stream while another stream's access to it "
         "is still unordered (missing record_stream or keep-alive): reported when the allocation stream "
         "issues more work, or the run ends, before it is ordered after that access.",
         "Keep the memory alive until the other stream is done: `tensor.record_stream(other_stream)` "
         "after using it there, or hold a reference until an event recorded on that stream completes."),
    Rule("RC006", "stale-graph-input",
         "stale graph input: a replay reads per-replay input elements not rewritten since the previous replay",
         "A CUDA-graph replay reads elements of a per-replay input buffer (e.g. padding rows) that were "
         "not rewritten since the previous replay, so it sees stale values (for buffers declared "
         "stale-tolerant: only where a stale value indexes memory the run mutates).",
         "Rewrite every per-replay input element the graph reads before each replay, padding rows "
         "included (e.g. `req_pool_indices[raw_bs:].zero_()` so padded rows point at a reserved slot)."),
    Rule("RC007", "graph-output-overwritten",
         "graph output read after a later replay of the same graph overwrote it",
         "A graph output is read after a later replay of the same graph overwrote it.",
         "Copy graph outputs out (`.clone()`) before the next replay of the same graph, or read them before "
         "replaying again."),
    Rule("RC008", "wait-before-record",
         "wait on an event never recorded (a no-op wait) that something relied on",
         "A stream (or the host) waits on an event that was never recorded when the wait ran; the wait "
         "is a no-op, yet later accesses relied on the ordering it was meant to provide.",
         "Record the event before anything waits on it: a wait on a never-recorded event is a no-op, so "
         "move `event.record()` before `stream.wait_event(event)`, and wait on the event the producer "
         "actually recorded."),
    Rule("DIFF", "differential", "outputs differ from a serialized eager run of the same inputs",
         "The overlapped (streams, graphs, delays) pipeline produced outputs different from a serialized "
         "eager run of the same inputs.",
         "The overlapped run's outputs differ from a serialized eager run: look for a field lost or reused "
         "across the overlap (e.g. `mm_input_embeds` dropped by piecewise graph replay).",
         internal=True),
)

RULES: dict = {r.id: r for r in _ALL}


def get(rule_id: str) -> Rule:
    """The rule with this id; an unknown id gets a placeholder (findings from newer versions)."""
    r = RULES.get(rule_id)
    if r is None:
        r = Rule(rule_id, rule_id.lower(), rule_id, rule_id, "See the finding's suggestion.")
    return r


def is_rule_id(text: str) -> bool:
    """Does `text` name a rule ("RC001", "DIFF")? (Fuzzing keys start with one.)"""
    return text in RULES


def readme_table() -> str:
    """README's rule table (the public rules), as Markdown."""
    rows = ["| id | hazard |", "| --- | --- |"]
    rows += [f"| {r.id} | {r.title} |" for r in _ALL if not r.internal]
    return "\n".join(rows) + "\n"
