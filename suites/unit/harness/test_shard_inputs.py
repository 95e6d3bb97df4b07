"""`harness run --shard K/N` refuses a durations file it cannot split by, before pytest starts.

pytest-split reads ``.test_durations`` inside pytest; a damaged file there is an INTERNALERROR
traceback (exit 3) on every runner. The harness checks it first: exit 2 naming the file, what
is wrong with it and the fix, and the reports say "usage error, nothing ran". A missing file
is not an error (pytest-split then splits by count, and says so). In-process through
click's CliRunner: each refusal happens before pytest would start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main

GOOD = {"suites/unit/test_a.py::test_a": 1.5, "suites/unit/test_a.py::test_b": 0}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "not valid JSON"),
        ("5", "not a JSON object of node id -> seconds"),
        ('{"suites/unit/test_a.py::test_a": "fast"}', "'fast'"),
        ('{"suites/unit/test_a.py::test_a": NaN}', "NaN"),
        ('{"suites/unit/test_a.py::test_a": -1}', "-1"),
        ('{"suites/unit/test_a.py::test_a": true}', "True"),
        ('[["suites/unit/test_a.py::test_a"]]', "not a JSON object of node id -> seconds"),
    ],
)
def test_a_damaged_durations_file_is_a_usage_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, problem: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path(".test_durations").write_text(text)
    result = CliRunner().invoke(main, ["run", "--shard", "1/2", "--report-dir", "r"])
    assert result.exit_code == 2, result.output
    assert ".test_durations" in result.output and problem in result.output
    assert "--store-durations" in result.output  # the fix
    report = json.loads(Path("r/report.json").read_text())
    assert report["status"] == "aborted" and "usage error, nothing ran" in report["reason"]


def test_a_durations_path_that_is_a_folder_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("durations").mkdir()
    result = CliRunner().invoke(
        main, ["run", "--shard", "1/2", "--durations-path", "durations", "--report-dir", "r"]
    )
    assert result.exit_code == 2 and "durations" in result.output and "folder" in result.output


def test_the_durations_check_accepts_what_pytest_split_writes_and_a_missing_file(
    tmp_path: Path,
) -> None:
    from harness import shards

    path = tmp_path / ".test_durations"
    assert shards.check_durations(path) is None  # missing: split by count
    path.write_text(json.dumps(GOOD, indent=4, sort_keys=True))
    assert shards.check_durations(path) == GOOD
    path.write_text(json.dumps([[k, v] for k, v in GOOD.items()]))  # its older list format
    assert shards.check_durations(path) == GOOD


@pytest.mark.parametrize("value", ["\u0661/\u0662", "1/\uff12", "\u00b9/2"])
def test_a_shard_spec_in_non_ascii_digits_is_refused_like_a_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # Written like the seeds: plain ASCII decimal digits only (int() would read these).
    monkeypatch.chdir(tmp_path)  # were it accepted, the run would find nothing here
    result = CliRunner().invoke(main, ["run", "--shard", value])
    assert result.exit_code == 2 and "expected K/N such as 1/2" in result.output


@pytest.mark.parametrize("value", ["1/10000000000", "1/257"])
def test_a_shard_count_beyond_the_bound_exits_2_naming_it_before_any_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # pytest-split builds one list per shard: 10**10 of them would exhaust memory, not fail.
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "--shard", value])
    total = value.split("/")[1]
    assert result.exit_code == 2, result.output
    assert "the shard count must be at most 256" in result.output and total in result.output


def test_the_bound_itself_is_a_valid_shard_count() -> None:
    from harness import shards

    assert shards.Shard.parse(f"{shards.MAX_SHARDS}/{shards.MAX_SHARDS}").total == 256


def test_merge_refuses_an_expected_shard_count_beyond_the_bound(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["report", "merge", "--expect-shards", "10000000000", "--report-dir", str(tmp_path)]
    )
    assert result.exit_code == 2 and "10000000000" in result.output


@pytest.mark.parametrize("index_total", [(1, 10**10), (0, 2), ("1", 2), (True, 2)])
def test_merge_refuses_a_shard_record_with_an_impossible_position_by_name(
    tmp_path: Path, index_total: tuple[object, object]
) -> None:
    # A report.json saying "shard 1 of 10**10" must not make the merge count to 10**10.
    k, n = index_total
    folder = tmp_path / "s1"
    folder.mkdir()
    collected = ["suites/unit/test_a.py::test_a"]
    (folder / "report.json").write_text(
        json.dumps(
            {
                "seed": 7,
                "exit_status": 0,
                "status": "passed",
                "tests": [{"nodeid": collected[0], "outcome": "passed", "tier": "unit"}],
                "shard": {"index": k, "total": n, "collected": collected, "digest": "x"},
            }
        )
    )
    (folder / "junit.xml").write_text('<testsuites><testsuite tests="1"/></testsuites>')
    result = CliRunner().invoke(
        main, ["report", "merge", str(folder), "--report-dir", str(tmp_path / "m")]
    )
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "m/report.json").read_text())
    assert report["exit_status"] == 2 and report["status"] == "failed"
    assert any(f"{k!r} of {n!r}" in p for p in report["merge_problems"]), report


def test_more_shards_than_collected_tests_is_a_usage_error_naming_both(
    pytester: pytest.Pytester,
) -> None:
    # Today's alternative was a shard that ran nothing and exited 5 with no reason on it.
    pytester.makepyfile(test_two="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    args = ["-p", "harness.shard_plugin", "--harness-shard-collection=c.json", "-p", "no:randomly"]
    result = pytester.runpytest(*args, "--splits=3", "--group=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*3 shards but only 2 test(s) collected*at most 2 shards*"])
    # As many shards as tests is a split: each runs one.
    for k in (1, 2):
        result = pytester.runpytest(*args, "--splits=2", f"--group={k}")
        assert result.ret == 0
        result.assert_outcomes(passed=1)
