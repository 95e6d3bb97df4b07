"""The xdist scheduling unit of each test (harness.xdist_groups.work_unit): no workers started."""

from __future__ import annotations

import pytest

from harness.xdist_groups import SERIAL_GROUP, shares_state, work_unit


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


def test_an_integration_module_that_shares_state_is_scheduled_as_one_unit() -> None:
    def shares(module: str) -> bool:
        return module == "suites/integration/data/test_s3.py"

    first = work_unit("suites/integration/data/test_s3.py::test_a[1]", "suites", shares)
    assert first == work_unit("suites/integration/data/test_s3.py::TestC::test_b", "suites", shares)
    assert first == "suites/integration/data/test_s3.py"
    # A module that shares nothing is spread one test at a time, like the unit tier.
    other = "suites/integration/data/test_local.py::test_a[1]"
    assert work_unit(other, "suites", shares) == other


def test_without_a_way_to_tell_an_integration_module_is_one_unit() -> None:
    assert work_unit("suites/integration/x/test_y.py::test_a") == "suites/integration/x/test_y.py"


@pytest.mark.parametrize(
    ("source", "shared"),
    [
        ('@pytest.fixture(scope="module")\ndef run():\n    pass\n', True),
        ("@pytest.fixture(scope = 'class')\ndef run():\n    pass\n", True),
        ('@pytest.fixture(scope="package")\ndef run():\n    pass\n', True),
        ("@pytest.fixture\ndef run(tmp_path):\n    pass\n", False),
        ('@pytest.fixture(scope="function")\ndef run():\n    pass\n', False),
        # A test project the test writes out is not this module's own fixture.
        ('PROJECT = """\n@pytest.fixture(scope="module")\ndef run():\n    pass\n"""\n', False),
    ],
)
def test_a_module_shares_state_when_it_defines_a_fixture_wider_than_a_test(
    tmp_path, source: str, shared: bool
) -> None:
    path = tmp_path / "test_m.py"
    path.write_text("import pytest\n\n" + source)
    assert shares_state(path) is shared


def test_an_unreadable_or_unparsable_module_counts_as_sharing_state(tmp_path) -> None:
    assert shares_state(tmp_path / "gone.py") is True
    (tmp_path / "broken.py").write_text("def (:\n")
    assert shares_state(tmp_path / "broken.py") is True


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
