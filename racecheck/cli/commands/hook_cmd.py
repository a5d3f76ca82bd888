"""`racecheck hook install|uninstall`: the start-up hook behind `RACECHECK=1 python prog.py`."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("action", choices=["install", "uninstall"])


def main(args) -> int:
    from racecheck.cli import autostart
    if args.action == "install":
        print(f"installed {autostart.install_hook()}: RACECHECK=1 now runs programs under racecheck")
    else:
        path = autostart.uninstall_hook()
        print(f"removed {path}" if path else "no hook installed")
    return 0
