"""The suites are collected without __init__.py files (pytest's default "prepend" import mode),
so a test module is imported under its file name alone: two test files with one basename in
different folders make the second an "import file mismatch" collection error, and the whole run
fails (a clean clone's .ci/run did, 2026-12-02, with suites/unit/harness/test_perf_counts.py
beside suites/integration/harness/test_perf_counts.py)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

SUITES = Path(__file__).resolve().parents[2]


def test_every_test_module_basename_is_unique():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in SUITES.rglob("test_*.py"):
        if ".venv" not in path.parts:
            seen[path.name].append(str(path.relative_to(SUITES)))
    assert len(seen) > 100, f"found only {len(seen)} test modules under {SUITES}"
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename (rename one of each): {clashes}"
