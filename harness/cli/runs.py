"""`harness run`, `harness ci` and `harness flaky`: placeholder."""

COMMANDS: list = []
