"""torch.cuda routing on sim: programs written for a GPU run unchanged on a CPU."""
import pytest
import torch

import racecheck
from racecheck.core.errors import UsageError
from racecheck.instrumentation.routing import CUDA_NAMES

from helpers import pairs, racecheck_cli


def _snapshot():
    return ({n: torch.cuda.__dict__.get(n, "<absent>") for n in CUDA_NAMES},
            torch.get_device_module, torch.tensor, torch.as_tensor, torch.asarray,
            {n: torch.Tensor.__dict__.get(n) for n in ("to", "cpu", "cuda", "new_tensor", "is_cuda",
                                                      "device", "is_cpu", "get_device")})


def test_routing_is_restored_exactly():
    before = _snapshot()
    with racecheck.session(device="sim", route_cuda=True) as rc:
        assert torch.cuda.Stream is rc.device_module.Stream
        assert torch.get_device_module("cuda") is rc.device_module
        assert torch.get_device_module() is rc.device_module
        assert torch.get_device_module(torch.device("cuda:0")) is rc.device_module
        assert torch.get_device_module("cpu") is torch.cpu
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.cuda.get_device_capability() == (9, 0)
        free, total = torch.cuda.mem_get_info()
        assert 0 < free <= total
    assert _snapshot() == before


def test_not_routed_without_the_option():
    with racecheck.session(device="sim"):
        assert torch.get_device_module("cuda") is not racecheck.active_session().device_module


def test_route_cuda_needs_sim():
    with pytest.raises(UsageError):
        racecheck.session(device="npu", route_cuda=True)


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(4, device="cuda"),
    lambda: torch.empty(4, device="cuda:0"),
    lambda: torch.full((4,), 2.0, device=torch.device("cuda")),
    lambda: torch.ones(4).cuda(),
    lambda: torch.ones(4).to("cuda"),
    lambda: torch.ones(4).to(torch.device("cuda"), non_blocking=True),
    lambda: torch.tensor([1, 2, 3], device="cuda"),
    lambda: torch.as_tensor([1, 2], device="cuda"),
    lambda: torch.zeros(2, device="cuda").new_tensor([1.0, 2.0]),
], ids=["zeros", "empty-index", "full-device", ".cuda()", ".to(cuda)", ".to(device,nb)",
        "tensor", "as_tensor", "new_tensor"])
def test_cuda_placements_are_device_memory(make):
    with racecheck.session(device="sim", route_cuda=True) as rc:
        t = make()
        assert not rc.footprints.registry.is_host(t)
        assert t.is_cuda and not t.is_cpu and t.get_device() == 0
        assert t.device == torch.device("cuda", 0)
        same = torch.zeros(2, device=t.device)     # the idiom: place like another tensor
        assert not rc.footprints.registry.is_host(same)
    assert not rc.internal_errors


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(4),
    lambda: torch.tensor([1, 2]),
    lambda: torch.zeros(4, device="cuda").cpu(),
    lambda: torch.zeros(4, device="cuda").to("cpu"),
    lambda: torch.empty(4, pin_memory=True),
])
def test_cpu_placements_are_host_memory(make):
    with racecheck.session(device="sim", route_cuda=True) as rc:
        t = make()
        assert rc.footprints.registry.is_host(t)
        assert not t.is_cuda and t.device.type == "cpu"
    assert not rc.internal_errors


def test_default_device_cuda():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        torch.set_default_device("cuda")
        try:
            a = torch.zeros(3)
            b = torch.tensor([1, 2])
        finally:
            torch.set_default_device(None)
        with torch.device("cuda"):
            c = torch.ones(2)
        d = torch.ones(2)
        reg = rc.footprints.registry
        assert not reg.is_host(a) and not reg.is_host(b) and not reg.is_host(c)
        assert reg.is_host(d)


def test_nonblocking_d2h_read_before_sync_is_rc004():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        x = torch.arange(8, device="cuda")
        h = racecheck.name(x.to("cpu", non_blocking=True), "h")
        h[0].item()
    assert sorted(pairs(rc.findings)) == [("RC004", "h")]


@pytest.mark.parametrize("sync", ["device", "event", "blocking"])
def test_d2h_read_after_sync_is_clean(sync):
    with racecheck.session(device="sim", route_cuda=True) as rc:
        x = torch.arange(8, device="cuda")
        if sync == "blocking":
            h = x.cpu()
        else:
            h = x.to("cpu", non_blocking=True)
            if sync == "device":
                torch.cuda.synchronize()
            else:
                e = torch.cuda.Event()
                e.record()
                e.synchronize()
        h[0].item()
        h.tolist()
    assert sorted(pairs(rc.findings)) == []


def test_race_through_plain_torch_cuda():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = torch.cuda.Stream()
        x = racecheck.name(torch.zeros(8, device="cuda"), "x")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            x.add_(1)
        y = x * 2  # noqa: F841
    assert sorted(pairs(rc.findings)) == [("RC001", "x")]


def test_host_ops_on_cpu_tensors_are_host_work():
    """A CPU tensor in a GPU program is host memory: its ops never race with streams."""
    with racecheck.session(device="sim", route_cuda=True) as rc:
        s = torch.cuda.Stream()
        lens = torch.tensor([3, 4, 5])
        with torch.cuda.stream(s):
            lens.add_(1)
        lens.sum()
    assert sorted(pairs(rc.findings)) == []


def test_a_number_stored_by_index_lives_with_the_tensor_it_is_stored_into():
    """`t[idx] = False` makes its value tensor without a dispatch: into a CPU tensor it is
    host work (sglang's host KV pool frees its slots so on the schedule stream, then reads them
    on the host); into device memory it is a kernel on the current stream, which races."""
    with racecheck.session(device="sim", route_cuda=True) as rc:
        used = torch.zeros(50, dtype=torch.bool)
        slots = torch.zeros(50, dtype=torch.bool, device="cuda")
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            idx = torch.tensor([3, 4])
            used[idx] = True
            slots[idx.cuda()] = True
        bool(used[2:6].any())
        bool(slots[2:6].any())
    assert sorted(pairs(rc.findings)) == [("RC001", "slots")]


def test_exec_exit_status_is_the_programs_when_clean(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("import sys, torch\nx = torch.zeros(2, device='cuda')\nsys.exit(5)\n")
    r = racecheck_cli("exec", "--", "python", str(prog))
    assert r.returncode == 5, r.stderr


def test_exec_races_win_over_the_programs_status(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text(
        "import sys, torch\ns = torch.cuda.Stream()\nx = torch.zeros(2, device='cuda')\n"
        "torch.cuda.synchronize()\nwith torch.cuda.stream(s):\n    x.add_(1)\ny = x + 1\n"
        "sys.exit(5)\n")
    r = racecheck_cli("exec", "--quiet", "--", "python", str(prog))
    assert r.returncode == 1, r.stderr


def test_exec_program_traceback_has_no_racecheck_frames(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("def f():\n    raise ValueError('boom')\nf()\n")
    r = racecheck_cli("exec", "--", "python", str(prog))
    assert r.returncode == 1
    assert "ValueError: boom" in r.stderr
    assert "runpy" not in r.stderr and "exec_cmd" not in r.stderr and "racecheck" not in r.stderr


@pytest.mark.parametrize("argv", [["-m", "no_such_module_here"], ["no_such_file.py"]])
def test_exec_missing_program_is_a_usage_error(argv):
    r = racecheck_cli("exec", "--", "python", *argv)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_exec_routes_by_default_and_can_opt_out(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("import torch\ns = torch.cuda.Stream()\nprint('ok')\n")
    assert racecheck_cli("exec", "--", "python", str(prog)).returncode == 0
    r = racecheck_cli("exec", "--no-route-cuda", "--", "python", str(prog))
    assert r.returncode == 1 and "CUDA" in r.stderr


def test_a_cuda_generator_draws_on_the_host_and_is_restored():
    Generator = torch.Generator
    with racecheck.session(device="sim", route_cuda=True):
        g = torch.Generator(device="cuda").manual_seed(3)
        assert isinstance(g, Generator)
        x = torch.rand(4, generator=g)
        assert torch.equal(x, torch.rand(4, generator=Generator().manual_seed(3)))
    assert torch.Generator is Generator


def test_a_one_rank_nccl_world_is_made_on_gloo(tmp_path):
    import torch.distributed as dist
    if dist.is_nccl_available():
        pytest.skip("this torch has NCCL")
    init = dist.init_process_group
    with racecheck.session(device="sim", route_cuda=True):
        dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rdzv'}", rank=0,
                                world_size=1)
        try:
            assert dist.get_backend() == "gloo"
            group = dist.new_group(ranks=[0], backend="nccl")
            assert dist.get_backend(group) == "gloo"
        finally:
            dist.destroy_process_group()
    assert dist.init_process_group is init


def test_a_host_copy_during_capture_runs_once_and_is_no_graph_node():
    """sglang fills its host-side graph inputs (seq_lens_cpu) with copy_ between CPU tensors
    while a graph is captured; on a GPU that copy runs on the host at capture time, so the
    host's later writes of the buffer race with no replay."""
    with racecheck.session(device="sim", route_cuda=True) as rc:
        host_src = torch.arange(4)
        host_dst = torch.zeros(4, dtype=torch.int64)
        x = torch.zeros(4, device="cuda")
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            host_dst.copy_(host_src)
            x.add_(1)
        for _ in range(3):
            host_dst.copy_(host_src + 1)     # between replays, no synchronize
            g.replay()
        torch.cuda.synchronize()
    assert rc.findings == [], [f.message() for f in rc.findings]
    assert torch.equal(host_dst, torch.arange(4) + 1)


def test_a_device_to_host_copy_during_capture_is_still_a_graph_node():
    with racecheck.session(device="sim", route_cuda=True) as rc:
        host = torch.zeros(4)
        x = torch.ones(4, device="cuda")
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            host.copy_(x, non_blocking=True)
        g.replay()
        host.add_(1)                          # the replay's copy may still be writing it
        torch.cuda.synchronize()
    assert [f.rule for f in rc.findings] == ["RC004"], [f.message() for f in rc.findings]
