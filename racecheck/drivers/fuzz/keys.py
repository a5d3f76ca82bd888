"""Failure keys: what makes two failing examples the same failure ("RC001 seq_lens", "DIFF x").

    "<RULE> <tensor>"       a detector finding (RC001..RC008)
    "DIFF <field>"          the differential oracle: an output differs from the serialized run
    "FAULT <op>"            an op failed when the plan finally ran it (a wrong index, like an IMA)
    "CRASH <Exception>"     the program itself raised under the plan
    "INTERNAL <Exception>"  racecheck itself failed (a bug in racecheck: please report it)
"""
from __future__ import annotations


def finding_key(f) -> str:
    """The distinct-failure key of a finding: "<RULE> <tensor>" (stable across runs).

    An unnamed tensor's description carries a storage number that changes between runs; such a
    finding is keyed by where its current access happens instead.
    """
    tensor = f.tensor
    if "storage #" in tensor:
        tensor = f"unnamed@{f.current.location or f.current.op}"
    return f"{f.rule} {tensor}"


def failure_kind(key: str) -> str:
    """"finding", "differential", "fault", "crash" or "internal"."""
    head = key.split(" ", 1)[0]
    if head == "DIFF":
        return "differential"
    if head in ("FAULT", "CRASH", "INTERNAL"):
        return head.lower()
    return "finding"
