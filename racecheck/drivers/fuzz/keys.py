"""Failure keys: what makes two failing examples the same failure ("RC001 seq_lens", "DIFF x").

    "<RULE> <tensor>"       a detector finding (RC001..RC008), the tensor by its own name
    "DIFF <field>"          the differential oracle: an output differs from the serialized run
    "FAULT <op>"            an op failed when the plan finally ran it (a wrong index, like an IMA)
    "CRASH <Exception>"     the program itself raised under the plan
    "INTERNAL <Exception>"  racecheck itself failed (a bug in racecheck: please report it)
"""
from __future__ import annotations

import re

# "Holder.attr", "function: target", "function: obj.attr[i]": the identifier the tensor goes by
_PATH = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*)(?:\[[^\]]*\])*$")


def finding_key(f) -> str:
    """The distinct-failure key of a finding: "<RULE> <tensor>" (stable across runs).

    A tensor nobody named explicitly is named by whatever holds it when the finding is made
    (`KVLocPlan.seq_lens`) or, when nothing does, by the statement that made it
    (`resolve_seq_lens_cpu: batch.seq_lens`): one race can get either name, depending on which
    views are alive at that moment in that example. The key keeps only the identifier the
    tensor goes by (`seq_lens`), which both carry, so one race is one failure whatever the
    schedule. An unnamed tensor's description carries a storage number that changes between
    runs; such a finding is keyed by where its current access happens instead.
    """
    tensor = f.tensor
    if "storage #" in tensor or tensor.startswith("unnamed tensor"):
        return f"{f.rule} unnamed@{f.current.location or f.current.op}"
    return f"{f.rule} {tensor_key(tensor)}"


def expected_key(rule: str, tensor: str) -> str:
    """The key a variant's expected (rule, tensor) is found under."""
    return f"{rule} {tensor_key(tensor)}"


def tensor_key(name: str) -> str:
    """The identifier a tensor's name ends in: `ForwardBatch.seq_lens` and
    `resolve_seq_lens_cpu: batch.seq_lens` are both `seq_lens`; a name of another shape (a
    parameter, `try_small_copy(dst=...)`; a returned value) is kept whole."""
    path = name.split(": ", 1)[1] if ": " in name else name
    m = _PATH.match(path.strip())
    return m.group(1) if m else name


def failure_kind(key: str) -> str:
    """"finding", "differential", "fault", "crash" or "internal"."""
    head = key.split(" ", 1)[0]
    if head == "DIFF":
        return "differential"
    if head in ("FAULT", "CRASH", "INTERNAL"):
        return head.lower()
    return "finding"
