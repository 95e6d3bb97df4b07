"""The plugin refuses what would make a run pass without testing: untiered test files, empty
tier names, damaged seed caches, quarantine entries that are options or paths outside the
project, and report paths it cannot write. Each is a clear error, never an INTERNALERROR."""

from __future__ import annotations

import json

import pytest

FAILING_STRAYS = {
    "suites/unit/test_u.py": "def test_u():\n    pass\n",
    # A misspelled tier folder, and a file directly under suites/: both fail when run.
    "suites/unti/test_typo.py": "def test_typo():\n    assert False\n",
    "suites/test_loose.py": "def test_loose():\n    assert False\n",
}


@pytest.mark.parametrize("args", [["--tier", "unit"], []], ids=["tier-unit", "no-tier"])
def test_a_test_file_outside_every_tier_folder_fails_the_run_naming_the_file(
    project, pytester, args
):
    project(FAILING_STRAYS)
    result = pytester.runpytest(*args, "--harness-json=out/report.json", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*suites/test_loose.py is not in a tier folder, so no --tier selection would run"
            "*suites/unit/*",
            "*suites/unti/test_typo.py is not in a tier folder*",
        ],
        consecutive=False,
    )
    report = json.loads((pytester.path / "out/report.json").read_text())
    errors = {t["nodeid"]: t["outcome"] for t in report["tests"] if t["outcome"] == "error"}
    assert errors == {"suites/test_loose.py": "error", "suites/unti/test_typo.py": "error"}
    assert report["status"] == "failed"


def test_the_benchmarks_folder_holds_untiered_tests_that_run_when_named(project, pytester):
    project(
        {
            "suites/unit/test_u.py": "def test_u():\n    pass\n",
            "suites/benchmarks/micro/test_b.py": "def test_b():\n    pass\n",
        }
    )
    result = pytester.runpytest("suites/benchmarks/micro")
    result.assert_outcomes(passed=1)


def test_a_project_without_tier_folders_runs_its_tests_as_before(project, pytester):
    project({"tests/test_plain.py": "def test_plain():\n    pass\n"})
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("value", [",,,", "", "unit,", " , unit"])
def test_a_tier_list_with_an_empty_name_is_a_usage_error_not_every_tier(project, pytester, value):
    project(FAILING_STRAYS | {"suites/unti/test_typo.py": "", "suites/test_loose.py": ""})
    result = pytester.runpytest("--tier", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--tier {value!r} has an empty tier name*"])


@pytest.mark.parametrize("seed", [" 5", "+5", "1_0", "٣", "4294967296", "-1", "9" * 5000])
def test_a_seed_that_is_not_plain_decimal_in_range_is_a_usage_error(project, pytester, seed):
    project({"suites/unit/test_u.py": "def test_u():\n    pass\n"})
    result = pytester.runpytest(f"--harness-seed={seed}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--harness-seed: a seed" in result.stderr.str()


def test_the_largest_seed_is_accepted(project, pytester):
    project({"suites/unit/test_u.py": "def test_u():\n    pass\n"})
    result = pytester.runpytest("--harness-seed=4294967295")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("cached", ['"banana"', "4294967296", "-3", "true", "[1]", "1.5"])
def test_a_damaged_seed_cache_is_a_usage_error_for_seed_last(project, pytester, cached):
    project({"suites/unit/test_u.py": "def test_u():\n    pass\n"})
    seed_file = pytester.path / ".pytest_cache/v/harness/seed"
    seed_file.parent.mkdir(parents=True)
    seed_file.write_text(cached)
    result = pytester.runpytest("--harness-seed=last")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*the seed recorded in the pytest cache (.pytest_cache/v/harness/seed) is *--cache-clear*"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_quarantine_path_naming_a_directory_is_a_usage_error(project, pytester):
    project({"suites/unit/test_u.py": "def test_u():\n    pass\n"})
    result = pytester.runpytest("--harness-quarantine=suites")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*suites: is a directory, not a quarantine file*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(
    "test_id, words",
    [
        ("--junitxml=../outside/evil.py::test_y", "starts with '-'"),
        ("../outside/evil.py::test_y", "path part '..'"),
        ("/etc/evil.py::test_y", "absolute path"),
        ("suites/unit/test_u.py::test_u\\n", "control character '\\n'"),
    ],
)
def test_a_hand_edited_quarantine_entry_that_is_not_a_node_id_is_refused_at_load(
    project, pytester, quarantine_entry, test_id, words
):
    project(
        {
            "suites/unit/test_u.py": "def test_u():\n    pass\n",
            "quarantine.toml": quarantine_entry(test_id),
        }
    )
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "malformed quarantine file" in result.stderr.str()
    assert words in result.stderr.str()


def test_a_quarantine_entry_whose_file_resolves_outside_the_project_fails_the_gate(
    project, pytester, quarantine_entry, tmp_path_factory
):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "test_far.py").write_text("def test_far():\n    pass\n")
    project(
        {
            "suites/unit/test_u.py": "def test_u():\n    pass\n",
            "quarantine.toml": quarantine_entry("suites/link/test_far.py::test_far"),
        }
    )
    (pytester.path / "suites/link").symlink_to(outside)
    result = pytester.runpytest("suites/unit")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*stale quarantine entry*outside the project*"])


def test_a_json_report_path_that_cannot_be_created_fails_at_start_up(project, pytester):
    project(
        {
            "suites/unit/test_u.py": "def test_u():\n    pass\n",
            "blocker": "a file where a folder is wanted\n",
        }
    )
    result = pytester.runpytest("--harness-json=blocker/report.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--harness-json blocker/report.json: cannot create its folder*"])
