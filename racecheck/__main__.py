import sys

from racecheck.cli.main import entry

sys.exit(entry())
