"""Parallel runs under pytest-xdist that keep what must not run at once on one worker.

``make test`` (and so ``.ci/run``) and ``harness ci`` run pytest with ``-n N -p
harness.xdist_groups``. The scheduling unit of a test (:func:`work_unit`) is:

- **unit and property tests**: the test itself, spread over every worker one at a time (as
  ``--dist load``). They start no server and hold no port; each is independent.
- **integration tests**: their module when the module shares state between its tests (it
  defines a module-, class- or package-scoped fixture: a project built once, a run whose
  results several tests check), so that state is built once and its tests stay together;
  otherwise the test itself, like a unit test. The slowest integration modules (the flake
  hunter's, the pull-request mode's: a few pytest processes per test) share nothing, and one
  worker running all of them in turn would be the run's long pole. Tests on two workers
  cannot collide: SeaweedFS and PostgreSQL (the session fixtures of
  ``suites/integration/{data,tracking}/conftest.py``) take free loopback ports and fresh
  temporary folders, and a session fixture is per worker, so a run starts at most one server
  of each kind per worker (a few seconds each).
- **distributed tests**: one shared unit, on one worker, in collection order. Each test starts
  a multi-process torch.distributed (gloo) group of 2-8 processes that busy-wait on each other;
  two such groups at once on a 2-core runner would multiply the oversubscription and push
  their collectives towards the timeouts, for no gain in coverage.

Why a scheduler and not ``--dist loadgroup`` with ``xdist_group`` marks: loadgroup appends
``@group`` to every grouped test's node id before the harness sees it, which changes the
test's derived seed, breaks quarantine matching by node id and prints reproduce commands
pytest cannot run. xdist's documented extension point, a ``LoadScopeScheduling`` whose
``_split_scope`` names the unit, groups the same tests without touching their ids.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SERIAL_TIERS = ("distributed",)
"""Tiers whose tests share one worker, in collection order."""

MODULE_TIERS = ("integration",)
"""Tiers whose tests are scheduled a module at a time."""

SERIAL_GROUP = "harness-serial-tiers"

_SHARED_SCOPES = ("module", "class", "package")


def shares_state(path: Path) -> bool:
    """Whether a test module defines a fixture wider than one test: a call with
    ``scope="module"`` (or class, package) in its code, as ``@pytest.fixture(scope=...)`` is;
    a string that merely spells one (a test project written by the test) does not count.
    Unreadable or unparsable counts as sharing: grouping is the safe side."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return True
    return any(
        isinstance(node, ast.Call)
        and any(
            kw.arg == "scope"
            and isinstance(kw.value, ast.Constant)
            and kw.value.value in _SHARED_SCOPES
            for kw in node.keywords
        )
        for node in ast.walk(tree)
    )


def work_unit(
    nodeid: str,
    suites_dir: str = "suites",
    module_shares_state: Callable[[str], bool] = lambda module: True,
) -> str:
    """The scheduling unit of a test: the shared group for the serial tiers; for the module
    tiers, the module when ``module_shares_state(module path)``, else the test; else the test
    itself."""
    module = nodeid.split("::", 1)[0]
    parts = module.split("/")
    if len(parts) > 2 and parts[0] == suites_dir:
        if parts[1] in SERIAL_TIERS:
            return SERIAL_GROUP
        if parts[1] in MODULE_TIERS and module_shares_state(module):
            return module
    return nodeid


class XdistScheduling:
    """Registered only when pytest-xdist is present (its hook is unknown otherwise)."""

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

        from harness import layout as _layout

        root = config.rootpath
        # The configured layout ([tool.harness], the ini options), as the plugin reads it: a
        # project with its suites in tests/ keeps its integration modules grouped too. A bad
        # layout is the plugin's error to report; the scheduler falls back to the default.
        ini = {f"harness_{k}": config.getini(f"harness_{k}") for k in _layout.KEYS}
        try:
            suites_dir = _layout.read_at(root, config.inipath, ini=ini).suites_dir.strip("/")
        except _layout.LayoutError:
            suites_dir = _layout.DEFAULT_SUITES_DIR

        @functools.cache
        def module_shares_state(module: str) -> bool:
            return shares_state(root / module)

        class TierScheduling(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return work_unit(nodeid, suites_dir, module_shares_state)

        return TierScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(XdistScheduling(), "harness-xdist-groups")
