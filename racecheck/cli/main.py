"""`racecheck` command line: list | run | fuzz | mutate | repro | exec | check | explain | report | baseline | hook.

Exit codes: 0 clean, 1 findings, 2 usage or input error, 3 internal error (141 when the reader of
stdout goes away, as for any Unix tool cut off by SIGPIPE).
Each subcommand lives in `racecheck.cli.commands.<name>` with `add_arguments(parser)` and `main(args)`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from racecheck.cli.cliparse import Parser, exit_now_after_engine
from racecheck.core.errors import EXIT_INTERNAL, EXIT_USAGE, InternalError, UsageError

EXIT_BROKEN_PIPE = 141      # 128 + SIGPIPE, what a shell reports for a tool whose reader closed

COMMANDS = {
    "list": "show scenarios, their knobs, fix switches and variants",
    "run": "run one scenario (variant) once and report",
    "fuzz": "fuzz a scenario with Hypothesis; shrink and save every distinct failure",
    "mutate": "drop each synchronization site of a clean run in turn: necessary or silent",
    "repro": "replay a saved repro record deterministically",
    "exec": "run a Python program under the detector: racecheck exec -- python prog.py ...",
    "check": "check a saved trace (.jsonl) offline",
    "explain": "show the happens-before path ordering two accesses of a saved trace, or that none does",
    "report": "render a findings JSON file as console, json, sarif, junit, html or perfetto",
    "baseline": "write a baseline of current findings' fingerprints",
    "hook": "install the start-up hook that makes RACECHECK=1 run any program under racecheck",
}


def _version() -> str:
    from racecheck import __version__
    return f"racecheck {__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="racecheck", description="Stream-synchronization race detector for GPU inference engines.")
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--scenario-path", action="append", default=[], metavar="PATH",
                        help="also load the scenarios of a Python file or package folder (repeatable; "
                             "also RACECHECK_SCENARIO_PATH); goes before COMMAND")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(f"racecheck.cli.commands.{name}_cmd")
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv=None) -> int:
    def err_line(text: str) -> None:
        sys.stderr.write(" ".join(text.split("\n")) + "\n")  # one line, never wrapped

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        if args.scenario_path:
            from racecheck import scenarios
            for path in args.scenario_path:
                scenarios.add_path(path)
        status = int(args._module.main(args) or 0)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # the reader went away (`racecheck list --json | head -1`): stop quietly, as a Unix tool
        # killed by SIGPIPE would, and keep the interpreter's final flush from failing again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    except UsageError as exc:
        err_line(f"racecheck: error: {exc}")
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        err_line("racecheck: interrupted")
        return 130
    except InternalError as exc:
        err_line(f"racecheck: internal error: {exc}")
        return EXIT_INTERNAL
    except Exception as exc:  # a bug in racecheck: never report it as a finding or a usage error
        import traceback
        traceback.print_exc()
        err_line(f"racecheck: internal error: {type(exc).__name__}: {exc}")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())


def entry() -> int:
    """The `racecheck` program (console script, `python -m racecheck`): `main`, then leave."""
    status = main()
    exit_now_after_engine(status)
    return status
