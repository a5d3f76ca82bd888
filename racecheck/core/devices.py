"""The device kinds a session can run on (one list: the CLI's choices and every check)."""
from racecheck.core.errors import UsageError

DEVICES = ("sim", "cuda", "npu")


def check_device(device) -> str:
    """`device` if racecheck knows it, else a one-line UsageError naming the choices."""
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    return device
