"""`racecheck exec -- python prog.py [args]`: run any program under the detector."""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import traceback

from racecheck.core.devices import DEVICES
from racecheck.core.errors import EXIT_CLEAN, UsageError
from racecheck.cli.gate import report_session


def add_arguments(p) -> None:
    p.add_argument("--device", default="sim", choices=DEVICES,
                   help="backend to run the program on (default: sim)")
    p.add_argument("--report", action="append", default=[], metavar="FORMAT=FILE",
                   help="also write findings as FORMAT (json, sarif, junit, html, perfetto) to FILE")
    p.add_argument("--save-trace", metavar="FILE", help="save the trace as JSON lines for `racecheck check`")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    p.add_argument("--no-route-cuda", action="store_true",
                   help="on sim, leave torch.cuda alone (by default sim stands in for it, so a "
                        "program written for a GPU runs unchanged; also RACECHECK_ROUTE_CUDA=0)")
    p.add_argument("argv", nargs="*", metavar="-- python PROG [ARGS]",
                   help="the program: `python prog.py args`, `python -m module args`, or `prog.py args`")


def _split_program(argv):
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]
    if not argv:
        raise UsageError("exec: no program given (usage: racecheck exec -- python prog.py [args])")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise UsageError("exec: -m needs a module name")
        return "module", argv[1], argv[1:]
    if argv[0].startswith("-"):
        raise UsageError(f"exec: unsupported interpreter option {argv[0]!r}")
    if not os.path.isfile(argv[0]):
        raise UsageError(f"exec: no such program file: {argv[0]!r}")
    return "path", argv[0], argv


def _run_program(kind, target, keep: list) -> int:
    """Run the program as `python` would; its exit status. A missing module is a usage error.
    Its globals go into `keep`, alive until the session is over: the program's tensors die with
    the interpreter, not in the middle of the check (no allocator reuse at exit, and findings
    name tensors by the globals holding them)."""
    if kind == "module":
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise UsageError(f"exec: no module named {target!r}")
        keep.append(runpy.run_module(target, run_name="__main__", alter_sys=True))
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        keep.append(runpy.run_path(target, run_name="__main__"))
    return 0


def _print_program_traceback(exc: BaseException) -> None:
    """The program's own traceback: racecheck's and runpy's frames above it left out."""
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in ours
                              or os.path.abspath(tb.tb_frame.f_code.co_filename) in ours):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def main(args) -> int:
    import racecheck
    from racecheck.session import route_cuda_default
    kind, target, prog_argv = _split_program(args.argv)
    if args.report:
        from racecheck.reports import parse_report_specs
        parse_report_specs(args.report)  # bad specs fail before the program runs
    route = route_cuda_default(args.device) and not args.no_route_cuda
    old_argv = sys.argv
    sys.argv = list(prog_argv)
    program_status = 0
    usage = None
    rc = racecheck.session(device=args.device, record_trace=bool(args.save_trace), route_cuda=route)
    program_globals: list = []
    with rc:
        try:
            program_status = _run_program(kind, target, program_globals)
        except UsageError as exc:
            usage = exc
        except SystemExit as exc:
            code = exc.code
            if isinstance(code, int):
                program_status = code
            elif code is None:
                program_status = 0
            else:
                sys.stderr.write(f"{code}\n")
                program_status = 1
        except BaseException as exc:
            _print_program_traceback(exc)
            program_status = 1
        finally:
            sys.argv = old_argv
    program_globals.clear()
    if usage is not None:
        raise usage
    if args.save_trace:
        rc.save_trace(args.save_trace)
    status = report_session(rc, args.report, quiet=args.quiet)
    if status == EXIT_CLEAN and program_status:
        return program_status
    return status
