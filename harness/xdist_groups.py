"""Parallel runs under pytest-xdist that keep the heavy tiers on one worker at a time.

``harness ci`` in pull-request mode runs pytest with ``-n N -p harness.xdist_groups``. Unit
and property tests are spread over every worker one test at a time (as ``--dist load``);
every test of the ``integration`` and ``distributed`` tiers forms one work unit that a single
worker runs in order. Those tests start servers (SeaweedFS, PostgreSQL) from session fixtures
and multi-process torch.distributed groups: spread over workers, each worker would start its
own servers, and two gloo groups would fight for the same cores; on one worker they run one
after another, as in a serial run, while the other workers take the fast tiers.

Why a scheduler and not ``--dist loadgroup`` with ``xdist_group`` marks: loadgroup appends
``@group`` to every grouped test's node id before the harness sees it, which changes the
test's derived seed, breaks quarantine matching by node id and prints reproduce commands
pytest cannot run. xdist's documented extension point, a ``LoadScopeScheduling`` whose
``_split_scope`` names the group, groups the same tests without touching their ids.
"""

from __future__ import annotations

from typing import Any

import pytest

SERIAL_TIERS = ("integration", "distributed")
"""Tiers whose tests share one worker, in collection order."""

SERIAL_GROUP = "harness-serial-tiers"


def work_unit(nodeid: str, suites_dir: str = "suites") -> str:
    """The scheduling unit of a test: the shared group for the serial tiers, else itself."""
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[0] == suites_dir and parts[1] in SERIAL_TIERS:
        return SERIAL_GROUP
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
