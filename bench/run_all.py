"""Run every CPU benchmark; `--quick` keeps them working in CI (it asserts nothing about speed)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CPU_BENCHES = ["bench_interception.py", "bench_checker.py", "bench_fuzz.py", "bench_scaling.py",
               "bench_triton_interpreter.py",
               "sim_profile.py", "bench_sglang.py"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    failed = []
    for name in CPU_BENCHES:
        path = os.path.join(HERE, name)
        if not os.path.exists(path):
            continue
        t = time.perf_counter()
        print(f"== {name} {' '.join(argv)}", flush=True)
        rc = subprocess.call([sys.executable, path, *argv])
        print(f"== {name}: exit {rc} in {time.perf_counter() - t:.1f}s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print("benchmarks failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
