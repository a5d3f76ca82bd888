"""Activation by environment: `RACECHECK=1 python prog.py` once the start-up hook is installed.

`racecheck hook install` writes a one-line `.pth` file into site-packages that calls
`activate()` when (and only when) `RACECHECK` is set, like `TORCH_CUDA_SANITIZER=1` for CSAN.
Settings: RACECHECK_DEVICE (sim|cuda|npu, default sim), RACECHECK_REPORT ("FORMAT=FILE,..."),
RACECHECK_ROUTE_CUDA=0 (on sim, leave torch.cuda alone; by default sim stands in for it).
At exit the report is printed; a clean program's exit status becomes 1 when races were found.
"""
from __future__ import annotations

import atexit
import os
import sys

PTH_NAME = "racecheck-autostart.pth"
PTH_LINE = ("import os; exec('import racecheck.cli.autostart as _rc; _rc.activate()') "
            "if os.environ.get('RACECHECK', '') not in ('', '0') else None\n")

_session = None


def activate() -> None:
    global _session
    if _session is not None:
        return
    import racecheck
    from racecheck.session import route_cuda_default
    device = os.environ.get("RACECHECK_DEVICE", "sim")
    _session = racecheck.session(device=device, route_cuda=route_cuda_default(device))
    _session.__enter__()
    atexit.register(_finish)


def _finish() -> None:
    from racecheck.cli.gate import report_session
    _session.__exit__(None, None, None)
    status = report_session(_session, os.environ.get("RACECHECK_REPORT", ""))
    if status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def site_packages() -> str:
    import sysconfig
    return sysconfig.get_paths()["purelib"]


def install_hook() -> str:
    path = os.path.join(site_packages(), PTH_NAME)
    with open(path, "w") as fp:
        fp.write(PTH_LINE)
    return path


def uninstall_hook() -> str | None:
    path = os.path.join(site_packages(), PTH_NAME)
    if os.path.exists(path):
        os.remove(path)
        return path
    return None
