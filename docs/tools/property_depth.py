"""How many examples each property test runs under the loaded hypothesis profile: a pytest
plugin for a collect-only run (nothing is executed), printing one markdown row per test file.

    CI=true PYTHONPATH=docs/tools .venv/bin/python -m pytest suites/property --collect-only -q \\
        -p property_depth                                       # the ci profile
    HYPOTHESIS_PROFILE=nightly PYTHONPATH=docs/tools .venv/bin/python -m pytest \\
        suites/property --collect-only -q -p property_depth     # the nightly profile

The count is the test's ``max_examples`` as the harness plugin leaves it after collection
(``harness.seeding.nightly_examples`` has raised a pinned count by then under nightly): the
most examples hypothesis generates for the test; it stops earlier only when the strategy has
fewer distinct inputs, or at the first failure. A test that applies ``@settings`` inside its
body (the broken-variant checks, which stop at their first counterexample) is listed as such.
docs/harness.md, "Property tests: what CI runs", holds the table this prints.
"""

from __future__ import annotations

from collections import defaultdict

import pytest


def _count(item: pytest.Item) -> int | None:
    fn = getattr(item, "obj", None)
    if not getattr(fn, "is_hypothesis_test", False):
        return None
    from hypothesis import settings

    pinned = getattr(fn, "_hypothesis_internal_use_settings", None)
    chosen = pinned if isinstance(pinned, settings) else settings()
    return int(chosen.max_examples)


def pytest_collection_finish(session: pytest.Session) -> None:
    from hypothesis import settings

    per_file: dict[str, list[tuple[str, int | None]]] = defaultdict(list)
    for item in session.items:
        per_file[item.nodeid.split("::")[0]].append((item.nodeid, _count(item)))
    profile = settings.get_current_profile_name()
    print(f"\nprofile {profile}: max_examples per test (- not a hypothesis test at top level)")
    print("| file | tests | hypothesis tests | examples per test | examples in all |")
    print("|---|---|---|---|---|")
    for path, rows in sorted(per_file.items()):
        counts = [c for _, c in rows if c is not None]
        spread = (
            f"{min(counts)}-{max(counts)}"
            if counts and min(counts) != max(counts)
            else (str(counts[0]) if counts else "-")
        )
        print(f"| `{path}` | {len(rows)} | {len(counts)} | {spread} | {sum(counts)} |")
