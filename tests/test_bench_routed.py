"""bench_interception's routed configuration runs the same ops on tensors placed on "cuda"
through torch.cuda routing (a sim session with route_cuda=True); no timing is asserted."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_interception as bi  # noqa: E402


def test_routed_config_places_the_workload_on_cuda():
    assert "racecheck-routed" in bi.CONFIGS and bi.ROUTED <= set(bi.CONFIGS)
    with bi.CONFIGS["racecheck-routed"]() as rc:
        work = bi.make_workloads("cuda")
        for fn, _ops in work.values():
            for _ in range(3):
                fn()
        a = fn.__closure__ and [c.cell_contents for c in fn.__closure__
                                if hasattr(c.cell_contents, "is_cuda")]
        assert a and all(t.is_cuda for t in a)
        kernels = rc.checker.events_processed
    assert kernels > 0 and rc.findings == [] and rc.internal_errors == []

