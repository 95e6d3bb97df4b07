"""`harness report durations`: the durations file the shards split by, refreshed from the
JSON reports of runs that already happened (CI's merged shards, a full `make test`) instead
of a second run with `--store-durations`. In-process through click's CliRunner, on reports
written here: nothing runs pytest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import shards
from harness.cli import main
from harness.report import RunStatus, placeholder_json

A = "suites/unit/test_a.py::test_a"
B = "suites/unit/test_a.py::test_b[1]"
P = "suites/property/test_p.py::test_p"
I = "suites/integration/test_i.py::test_i"  # noqa: E741 - an id, not a number


def record(nodeid: str, seconds: float, outcome: str = "passed", tier: str = "unit") -> dict:
    return {"nodeid": nodeid, "tier": tier, "outcome": outcome, "duration_s": seconds}


def write_report(path: Path, *tests: dict) -> Path:
    path.write_text(json.dumps({"version": 1, "status": "passed", "tests": list(tests)}))
    return path


def durations(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, float] | None]:
    out = tmp_path / "durations.json"
    result = CliRunner().invoke(main, ["report", "durations", *args, "--durations-path", str(out)])
    stored = json.loads(out.read_text()) if out.exists() else None
    return result.exit_code, result.output, stored


def test_the_reports_times_replace_old_ones_add_new_tests_and_keep_the_rest(tmp_path):
    (tmp_path / "durations.json").write_text(json.dumps({A: 9.0, "gone.py::t": 4.0}))
    report = write_report(
        tmp_path / "r.json",
        record(A, 1.25),
        record(B, 0.5),
        record(P, 7.0, tier="property"),
        record("suites/unit/test_a.py::test_skipped", 0.001, outcome="skipped"),
    )
    code, output, stored = durations(tmp_path, str(report))
    assert code == 0, output
    # A skipped test's milliseconds are not its time: it is left out, not recorded as 0.001.
    assert stored == {A: 1.25, B: 0.5, P: 7.0, "gone.py::t": 4.0}
    assert "3 test time(s) from 1 report(s): 2 new, 1 updated, 0 dropped, 1 kept" in output
    assert "4 in all, 12.8 s" in output  # 1.25 + 0.5 + 7 + 4 = 12.75, printed to one decimal


def test_replace_drops_only_tests_no_report_mentions(tmp_path):
    skipped = "suites/unit/test_a.py::test_skipped"
    (tmp_path / "durations.json").write_text(json.dumps({A: 9.0, skipped: 3.0, "gone.py::t": 4}))
    report = write_report(tmp_path / "r.json", record(A, 2.0), record(skipped, 0, "skipped"))
    code, output, stored = durations(tmp_path, str(report), "--replace")
    assert code == 0, output
    # The skipped test still exists: its earlier time stays; the deleted test's entry goes.
    assert stored == {A: 2.0, skipped: 3.0}
    assert "1 dropped" in output


def test_shards_reports_are_combined_and_a_test_in_two_runs_gets_the_mean(tmp_path):
    one = write_report(tmp_path / "1.json", record(A, 1.0), record(B, 3.0, outcome="failed"))
    two = write_report(tmp_path / "2.json", record(A, 2.0), record(P, 5.0, tier="property"))
    code, output, stored = durations(tmp_path, str(one), str(two))
    assert code == 0, output
    assert stored == {A: 1.5, B: 3.0, P: 5.0}  # a failed test ran: its time counts


def test_tier_keeps_only_the_sharded_tiers(tmp_path):
    report = write_report(
        tmp_path / "r.json",
        record(A, 1.0),
        record(P, 5.0, tier="property"),
        record(I, 60.0, tier="integration"),
    )
    code, output, stored = durations(tmp_path, str(report), "--tier", "unit, property")
    assert code == 0, output
    assert stored == {A: 1.0, P: 5.0}


def test_the_file_is_written_as_pytest_split_writes_it_and_passes_the_shard_check(tmp_path):
    report = write_report(tmp_path / "r.json", record(B, 0.123456), record(A, 2))
    code, output, _ = durations(tmp_path, str(report))
    assert code == 0, output
    path = tmp_path / "durations.json"
    assert path.read_text() == f'{{\n "{A}": 2.0,\n "{B}": 0.123\n}}\n'
    assert shards.check_durations(path) == {A: 2.0, B: 0.123}


@pytest.mark.parametrize(
    ("report", "problem"),
    [
        (placeholder_json(RunStatus.ABORTED, "interrupted"), "status 'aborted'"),
        ({"status": "passed"}, "status 'passed'"),  # no tests list at all
        ({"status": "passed", "tests": [{"outcome": "passed"}]}, "without a node id"),
        ({"status": "passed", "tests": [record(A, -1.0)]}, "-1.0, not a number of seconds"),
        ({"status": "passed", "tests": [record(A, True)]}, "True, not a number of seconds"),
        ({"status": "passed", "tests": [record(A, 0, "skipped")]}, "no timed test in"),
    ],
)
def test_a_report_without_usable_times_is_a_usage_error_and_the_file_is_untouched(
    tmp_path, report, problem
):
    (tmp_path / "durations.json").write_text(json.dumps({A: 9.0}))
    (tmp_path / "r.json").write_text(json.dumps(report))
    code, output, stored = durations(tmp_path, str(tmp_path / "r.json"))
    assert code == 2 and problem in output, output
    assert stored == {A: 9.0}


def test_a_missing_report_and_a_damaged_durations_file_are_usage_errors(tmp_path):
    code, output, stored = durations(tmp_path, str(tmp_path / "nope.json"))
    assert code == 2 and "nope.json: no JSON report" in output and stored is None
    (tmp_path / "durations.json").write_text("{")
    report = write_report(tmp_path / "r.json", record(A, 1))
    args = [
        "report",
        "durations",
        str(report),
        "--durations-path",
        str(tmp_path / "durations.json"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "not valid JSON" in result.output, result.output
    assert (tmp_path / "durations.json").read_text() == "{"
