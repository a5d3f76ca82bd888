"""The core layer: trace events, the happens-before checker (and its C engine), findings, rules,
suppressions. Data and analysis only: nothing here hooks torch, runs a scenario or prints."""
