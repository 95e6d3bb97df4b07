"""`harness report merge` on shard folders whose files say one thing and mean another.

The shard folders are written here in the shape `harness run --shard K/N` writes them (the
real shards are run end to end in suites/integration/harness/test_shards_and_merge.py); each
case is one way a folder can look green to a careless merge while the run it stands for is
not. In-process through click's CliRunner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from harness.cli import main
from harness.shards import collection_digest

A = "suites/unit/test_a.py::test_a"
B = "suites/unit/test_a.py::test_b"


def _junit(tests: int, failures: int = 0) -> str:
    cases = "".join(
        f'<testcase classname="suites.unit.test_a" name="t{i}">'
        + ('<failure message="boom" />' if i < failures else "")
        + "</testcase>"
        for i in range(tests)
    )
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
        f'tests="{tests}" failures="{failures}" errors="0" skipped="0" time="0.1">'
        f"{cases}</testsuite></testsuites>"
    )


def shard(
    folder: Path,
    k: int,
    n: int,
    outcomes: dict[str, str],
    collected: list[str],
    *,
    exit_status: int | None = None,
    junit: str | None = None,
    origin: dict[str, str | None] | None = None,
) -> Path:
    """One shard's folder: report.json (with its shard record) and junit.xml agreeing."""
    failed = [t for t, o in outcomes.items() if o in ("failed", "error")]
    if exit_status is None:
        exit_status = 1 if failed else (0 if outcomes else 5)
    report: dict[str, Any] = {
        "seed": 7,
        "exit_status": exit_status,
        "status": "passed" if exit_status in (0, 5) else "failed",
        "tiers": {"unit": {"selected": True}},
        "quarantine": {"problems": []},
        "tests": [{"nodeid": t, "outcome": o, "tier": "unit"} for t, o in outcomes.items()],
        "shard": {
            "index": k,
            "total": n,
            "collected": collected,
            "digest": collection_digest(collected),
            **({"origin": origin} if origin is not None else {}),
        },
    }
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(report))
    (folder / "junit.xml").write_text(junit or _junit(len(outcomes), len(failed)))
    return folder


def merge(tmp_path: Path, *folders: Path) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "merged"
    result = CliRunner().invoke(
        main,
        ["report", "merge", *map(str, folders), "--report-dir", str(out)],
        catch_exceptions=False,
    )
    report = json.loads((out / "report.json").read_text())
    return result.exit_code, result.output, report


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def test_merged_verdict_is_the_merges_not_the_first_shards(tmp_path: Path) -> None:
    # Shard 1 passed, shard 2 failed a test: the merged report must not say "passed" anywhere.
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B])
    s2 = shard(tmp_path / "s2", 2, 2, {B: "failed"}, [A, B])
    code, output, report = merge(tmp_path, s1, s2)
    assert code == 1
    assert (report["exit_status"], report["status"]) == (1, "failed")
    summary = (tmp_path / "merged/summary.md").read_text()
    assert "✅" not in summary.splitlines()[0] and "❌ failed (exit status 1)" in summary


def test_a_shard_that_exited_1_with_no_failed_test_fails_the_merge(tmp_path: Path) -> None:
    # What a test calling pytest.exit(returncode=1), or a plugin failing the session, leaves:
    # every recorded test passed, pytest's exit status 1 (the unsharded run would fail).
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B], exit_status=1)
    s2 = shard(tmp_path / "s2", 2, 2, {B: "passed"}, [A, B])
    code, output, report = merge(tmp_path, s1, s2)
    assert code == 1 and report["exit_status"] == 1
    assert report["failed_shards"] == [
        "shard 1/2 exited 1 (failed) although its report lists no failed test; its own "
        "summary and log say why"
    ]
    assert "❌ shard 1/2 exited 1 (failed)" in output


def test_junit_failures_beside_a_report_without_them_fail_the_merge(tmp_path: Path) -> None:
    # The CI page shows junit.xml and the gate reads report.json: they must tell one story.
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B])
    s2 = shard(tmp_path / "s2", 2, 2, {B: "passed"}, [A, B], junit=_junit(1, failures=1))
    code, output, report = merge(tmp_path, s1, s2)
    assert code == 1 and report["exit_status"] == 2
    assert report["merge_problems"] == [
        f"{s2}: junit.xml counts 1 failure(s)/error(s) but report.json lists no failed test: "
        "the two files are not from the same run"
    ]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("report-list", "report.json: not a JSON report (a list, not an object)"),
        ("junit-root", "junit.xml: not a JUnit report (root element <html>)"),
        ("outcome", "report.json: unknown test outcome(s) FAILED"),
        ("tests", "report.json: its 'tests' is not a list of test records"),
    ],
)
def test_a_shard_file_of_the_wrong_shape_fails_the_merge_by_name(
    tmp_path: Path, damage: str, problem: str
) -> None:
    s1 = shard(tmp_path / "s1", 1, 1, {A: "passed"}, [A])
    report = json.loads((s1 / "report.json").read_text())
    if damage == "report-list":
        (s1 / "report.json").write_text("[]")
    elif damage == "junit-root":
        (s1 / "junit.xml").write_text("<html><body>502 Bad Gateway</body></html>")
    elif damage == "outcome":
        report["tests"][0]["outcome"] = "FAILED"
        (s1 / "report.json").write_text(json.dumps(report))
    else:
        report["tests"] = {A: "failed"}
        (s1 / "report.json").write_text(json.dumps(report))
    code, output, merged = merge(tmp_path, s1)
    assert code == 1 and merged["exit_status"] == 2
    assert any(problem in p for p in merged["merge_problems"]), merged["merge_problems"]


def test_a_test_run_outside_the_collection_fails_the_merge(tmp_path: Path) -> None:
    stray = "suites/unit/test_b.py::test_new"
    s1 = shard(tmp_path / "s1", 1, 1, {A: "passed", stray: "passed"}, [A])
    code, _, report = merge(tmp_path, s1)
    assert code == 1
    assert report["merge_problems"] == [
        f"1 test(s) ran that the shards did not collect, e.g. {stray}"
    ]


def test_shards_that_collected_nothing_merge_to_no_tests_ran(tmp_path: Path) -> None:
    # Every shard ran and collected nothing (a -k that matches no test): "no tests ran", exit
    # status 5, written as reports like any other merge, not a traceback.
    s1 = shard(tmp_path / "s1", 1, 2, {}, [])
    s2 = shard(tmp_path / "s2", 2, 2, {}, [])
    code, _, report = merge(tmp_path, s1, s2)
    assert code == 1
    assert (report["exit_status"], report["merge_problems"]) == (5, [])
    assert "❌ no tests ran" in (tmp_path / "merged/summary.md").read_text()


# ----------------------------------------------------------------------------- re-run shards
# GitHub re-runs a failed shard job under the same seed and collection: without the run id
# and attempt in each shard's record, its green re-run would merge green, a retry nobody saw.


def _from(run_id: str | None, attempt: str | None) -> dict[str, str | None]:
    return {"run_id": run_id, "run_attempt": attempt}


def _merge_cli(tmp_path: Path, *folders: Path) -> tuple[Result, dict[str, Any], str]:
    out = tmp_path / "merged"
    result = CliRunner().invoke(
        main, ["report", "merge", *map(str, folders), "--report-dir", str(out)]
    )
    report = json.loads((out / "report.json").read_text())
    return result, report, (out / "summary.md").read_text()


def test_a_shard_from_a_later_attempt_fails_the_merge_loudly_by_name(tmp_path: Path) -> None:
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B], origin=_from("42", "1"))
    s2 = shard(tmp_path / "s2", 2, 2, {B: "passed"}, [A, B], origin=_from("42", "2"))
    result, report, summary = _merge_cli(tmp_path, s1, s2)
    assert result.exit_code == 1
    assert (report["exit_status"], report["status"]) == (1, "failed")
    said = "shard 2/2 is from attempt 2 of run 42 (shard 1/2 from attempt 1): an earlier attempt"
    assert len(report["reruns"]) == 1 and report["reruns"][0].startswith(said)
    assert summary.splitlines()[0].startswith(f"- ❌ re-run: {said}")
    assert said in result.stderr
    assert [row["origin"] for row in report["shards"]] == [_from("42", "1"), _from("42", "2")]


def test_a_whole_run_re_run_passes_with_a_warning_on_every_channel(tmp_path: Path) -> None:
    # Every shard from attempt 2: a new run of the whole commit, as a new push would be.
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B], origin=_from("42", "2"))
    s2 = shard(tmp_path / "s2", 2, 2, {B: "passed"}, [A, B], origin=_from("42", "2"))
    result, report, summary = _merge_cli(tmp_path, s1, s2)
    assert result.exit_code == 0 and report["exit_status"] == 0 and report["reruns"] == []
    said = "every shard is from attempt 2 of run 42: the whole run was re-run"
    assert report["rerun_notes"][0].startswith(said)
    assert summary.splitlines()[0].startswith(f"- ⚠️ re-run: {said}")
    assert "WARNING: " + said in result.stderr


@pytest.mark.parametrize(
    ("first", "second", "named"),
    [
        (_from("42", "1"), _from("43", "1"), ["shard 1/2 from run 42", "shard 2/2 from run 43"]),
        (_from("42", "1"), None, ["shard 1/2 from run 42", "shard 2/2 from no CI run"]),
    ],
)
def test_shards_of_different_runs_are_not_one_run(
    tmp_path: Path,
    first: dict[str, str | None],
    second: dict[str, str | None] | None,
    named: list[str],
) -> None:
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B], origin=first)
    s2 = shard(tmp_path / "s2", 2, 2, {B: "passed"}, [A, B], origin=second)
    result, report, _ = _merge_cli(tmp_path, s1, s2)
    assert result.exit_code == 1 and report["exit_status"] == 2
    [problem] = report["merge_problems"]
    assert problem.startswith("the shards come from different workflow runs")
    assert all(name in problem for name in named), problem


def test_an_attempt_that_is_not_a_number_is_a_merge_problem(tmp_path: Path) -> None:
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B], origin=_from("42", "1"))
    s2 = shard(tmp_path / "s2", 2, 2, {B: "passed"}, [A, B], origin=_from("42", "two"))
    result, report, _ = _merge_cli(tmp_path, s1, s2)
    assert result.exit_code == 1 and report["exit_status"] == 2
    assert report["merge_problems"] == [
        "shard 2/2 of run 42 records run attempt 'two', not a number >= 1 (GITHUB_RUN_ATTEMPT): "
        "the merge cannot tell whether it is a re-run"
    ]


def test_local_shards_without_run_ids_merge_as_before(tmp_path: Path) -> None:
    s1 = shard(tmp_path / "s1", 1, 2, {A: "passed"}, [A, B], origin=_from(None, None))
    s2 = shard(tmp_path / "s2", 2, 2, {B: "passed"}, [A, B])  # a record from before origins
    result, report, _ = _merge_cli(tmp_path, s1, s2)
    assert result.exit_code == 0 and report["reruns"] == report["rerun_notes"] == []


def test_a_shards_report_records_the_run_and_attempt_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness import shards

    report = tmp_path / "report.json"
    for env, expected in [
        ({"GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "3"}, _from("4242", "3")),
        ({}, _from(None, None)),
    ]:
        monkeypatch.delenv("GITHUB_RUN_ID", raising=False)
        monkeypatch.delenv("GITHUB_RUN_ATTEMPT", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        report.write_text(json.dumps({"tests": []}))
        written = shards.annotate_report(report, shards.Shard(index=1, total=2), tmp_path / "no")
        assert written["shard"]["origin"] == expected
        assert json.loads(report.read_text())["shard"]["origin"] == expected
