"""Exceptions that map to the CLI's exit codes."""


class UsageError(Exception):
    """Bad input from the user (unknown scenario, malformed file, bad flag): exit 2, one line."""


class InternalError(Exception):
    """A bug inside racecheck itself: exit 3. The program under test keeps its own results."""


EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
