"""`torch._foreach_copy_` and `torch._foreach_zero_` overwrite their destinations.

sglang's graph input registry fills its slots with one grouped `_foreach_copy_`, also inside
captured graphs (the eager runner's `load_batch` under the draft runner's capture). Taken as
read-then-write, as other in-place ops are, a captured copy made its destination look like a
graph input, and a slot the host fills only up to the live rows looked stale (a false RC006 on
the npu flavour, where the slot is not the runner's own padded buffer).
"""
import torch

import racecheck
from racecheck.instrumentation.classify import READ, WRITE, classify


def test_the_destinations_are_written_and_the_sources_read():
    roles = {name: role for _, name, _, role in classify(torch.ops.aten._foreach_copy_.default).args}
    assert roles == {"self": WRITE, "src": READ}
    roles = {name: role for _, name, _, role in classify(torch.ops.aten._foreach_zero_.default).args}
    assert roles == {"self": WRITE}
    roles = {name: role for _, name, _, role in classify(torch.ops.aten._foreach_add_.List).args}
    assert roles["self"] != WRITE                  # a list op that reads its destination


def _staged_graph(dm, refresh_padding: bool):
    """A runner's padded input buffer copied into a staging slot inside the graph, as sglang's
    draft runner does; between replays the host writes the live rows of the staging slot (another
    runner's fill) and the runner's buffer (its own fill), zeroing its padded row or not."""
    runner_buf = racecheck.name(torch.zeros(4, dtype=torch.int64), "runner.req_pool_indices")
    staging = racecheck.name(torch.zeros(7, dtype=torch.int64), "graph.req_pool_indices")
    table = torch.arange(32.0).reshape(8, 4)
    g = dm.CUDAGraph()
    with dm.graph(g):
        torch._foreach_copy_([staging[:4]], [runner_buf[:4]])
        out = table.index_select(0, staging[:4])
    for live in (4, 3, 3):
        staging[:live].copy_(torch.arange(live))          # another runner's fill, live rows only
        if refresh_padding and live < 4:
            runner_buf.zero_()
        runner_buf[:live].copy_(torch.arange(live))
        g.replay()
    dm.synchronize()
    return out


def _findings(refresh_padding):
    with racecheck.session(device="sim") as rc:
        _staged_graph(rc.device_module, refresh_padding)
    return sorted((f.rule, f.tensor) for f in rc.findings)


def test_a_slot_the_graph_overwrites_is_not_a_stale_input():
    assert _findings(refresh_padding=True) == []


def test_the_runners_own_stale_padding_is_still_reported():
    assert _findings(refresh_padding=False) == [("RC006", "runner.req_pool_indices")]


def test_an_unordered_grouped_copy_is_still_a_race():
    with racecheck.session(device="sim") as rc:
        dm = rc.device_module
        s = dm.Stream()
        dst = racecheck.name(torch.zeros(8), "dst")
        src = torch.ones(8)
        dst.add_(1)                                        # written on the default stream
        with dm.stream(s):
            torch._foreach_copy_([dst], [src])             # overwritten on s, unordered
        reader = dst.sum()                                  # noqa: F841
        with dm.stream(s):
            torch._foreach_zero_([dst])
        dm.synchronize()
    assert ("RC003", "dst") in {(f.rule, f.tensor) for f in rc.findings}
