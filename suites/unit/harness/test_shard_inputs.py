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
