"""Parallel runs under pytest-xdist that keep what must not run at once on one worker.

``make test`` (and so ``.ci/run``) and ``harness ci`` run pytest with ``-n N -p
harness.xdist_groups``. The scheduling unit of a test (:func:`work_unit`) is:

- **unit and property tests**: the test itself, spread over every worker one at a time (as
  ``--dist load``). They start no server and hold no port; each is independent.
- **integration tests**: their module. Module-scoped fixtures (a project built once, a server
  a module shares) are then set up once, and the tests of a module keep their order. Two
  modules may run at once on two workers: their servers cannot collide, since SeaweedFS and
  PostgreSQL (the session fixtures of ``suites/integration/{data,tracking}/conftest.py``) take
  free loopback ports and fresh temporary folders, and a session fixture is per worker, so a
  run starts at most one server of each kind per worker (a few seconds each).
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

from typing import Any

import pytest

SERIAL_TIERS = ("distributed",)
"""Tiers whose tests share one worker, in collection order."""

MODULE_TIERS = ("integration",)
"""Tiers whose tests are scheduled a module at a time."""

SERIAL_GROUP = "harness-serial-tiers"


def work_unit(nodeid: str, suites_dir: str = "suites") -> str:
    """The scheduling unit of a test: the shared group for the serial tiers, the module for
    the module tiers, else the test itself."""
    module = nodeid.split("::", 1)[0]
    parts = module.split("/")
    if len(parts) > 2 and parts[0] == suites_dir:
        if parts[1] in SERIAL_TIERS:
            return SERIAL_GROUP
        if parts[1] in MODULE_TIERS:
            return module
    return nodeid


class XdistScheduling:
    """Registered only when pytest-xdist is present (its hook is unknown otherwise)."""

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

        suites_dir = str(config.getini("harness_suites_dir")).strip("/") or "suites"

        class TierScheduling(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return work_unit(nodeid, suites_dir)

        return TierScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(XdistScheduling(), "harness-xdist-groups")
