"""The device kinds a session can run on (one list: the CLI's choices and the session's check)."""

DEVICES = ("sim", "cuda", "npu")
