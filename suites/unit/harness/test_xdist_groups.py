"""The xdist scheduling unit of each test (harness.xdist_groups.work_unit): pure, no workers."""

from __future__ import annotations

import pytest

from harness.xdist_groups import SERIAL_GROUP, work_unit


@pytest.mark.parametrize(
    "nodeid",
    [
        "suites/unit/data/test_a.py::test_x",
        "suites/property/collectives/test_ring.py::test_y[case-1]",
        "suites/gpu/attention/test_k.py::test_z",
    ],
)
def test_unit_property_and_gpu_tests_are_scheduled_one_test_at_a_time(nodeid: str) -> None:
    assert work_unit(nodeid) == nodeid


def test_integration_tests_are_scheduled_a_module_at_a_time() -> None:
    first = work_unit("suites/integration/data/test_s3.py::test_a[1]")
    assert first == work_unit("suites/integration/data/test_s3.py::TestC::test_b")
    assert first == "suites/integration/data/test_s3.py"
    assert first != work_unit("suites/integration/data/test_local.py::test_a[1]")


def test_every_distributed_test_shares_one_unit_across_modules_and_components() -> None:
    units = {
        work_unit("suites/distributed/collectives/test_ring.py::test_a"),
        work_unit("suites/distributed/training/test_ddp.py::test_b[2]"),
    }
    assert units == {SERIAL_GROUP}


def test_the_configured_suites_folder_decides_and_other_folders_are_per_test() -> None:
    assert work_unit("tests/distributed/test_d.py::test_a", "tests") == SERIAL_GROUP
    assert work_unit("tests/distributed/test_d.py::test_a") == "tests/distributed/test_d.py::test_a"
    # A file directly under the suites folder has no tier.
    assert work_unit("suites/test_top.py::test_a") == "suites/test_top.py::test_a"
