"""The command-line layer: argument parsing, printing, exit codes. Inside it the entry points sit
above what they share: `cliparse`, then `gate`, then `autostart` and `pytest_plugin`, then
`commands`, then `main` (the `racecheck` command)."""
