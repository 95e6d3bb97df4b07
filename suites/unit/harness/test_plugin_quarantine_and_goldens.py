"""The plugin's quarantine gate, goldens and JSON report, tested from the outside."""

from __future__ import annotations

import datetime as dt
import json

import pytest

TESTS = {
    "suites/unit/test_q.py": """
        import pytest

        def test_broken():
            assert 1 == 2, "broken for real"

        def test_fine():
            pass

        @pytest.mark.parametrize("n", [1, 2])
        def test_param(n):
            assert n == 1
    """
}


def test_a_quarantined_failure_does_not_fail_the_run(project, pytester, quarantine_entry):
    project({**TESTS, "quarantine.toml": quarantine_entry("suites/unit/test_q.py::test_broken")})
    result = pytester.runpytest("-k", "not param")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*harness: 1 quarantined failure(s) (not gating)*",
            "*fails about 1 in 50 on the GPU runner (https://github.com/ORG/REPO/issues/123)",
            "*AssertionError: broken for real*",
            "*1 passed, * 1 quarantined*",
        ]
    )


def test_an_unquarantined_failure_fails_the_run(project, pytester, quarantine_entry):
    project({**TESTS, "quarantine.toml": quarantine_entry("suites/unit/test_q.py::test_fine")})
    result = pytester.runpytest("-k", "not param")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*1 failed, 1 passed*"])


def test_a_quarantined_test_that_passes_is_reported_as_such(project, pytester, quarantine_entry):
    project({**TESTS, "quarantine.toml": quarantine_entry("suites/unit/test_q.py::test_fine")})
    result = pytester.runpytest("-k", "fine")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*harness: quarantined tests that passed*",
            "suites/unit/test_q.py::test_fine: passed while quarantined*",
        ]
    )


def test_an_entry_without_parameters_covers_every_parametrization(
    project, pytester, quarantine_entry
):
    project({**TESTS, "quarantine.toml": quarantine_entry("suites/unit/test_q.py::test_param")})
    result = pytester.runpytest("-k", "param")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 passed, * 1 quarantined*"])


def test_an_expired_entry_fails_the_run_even_when_every_test_passes(
    project, pytester, quarantine_entry
):
    old = dt.date.today() - dt.timedelta(days=40)
    entry = quarantine_entry(
        "suites/unit/test_q.py::test_fine", added=old, expires=old + dt.timedelta(days=30)
    )
    project({**TESTS, "quarantine.toml": entry})
    result = pytester.runpytest("-k", "fine")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*quarantine problems (these fail the run)*",
            "quarantine.toml:1: quarantine of suites/unit/test_q.py::test_fine expired on*",
        ]
    )


@pytest.mark.parametrize(
    ("test", "why"),
    [
        (
            "suites/unit/test_q.py::test_renamed_away",
            "no test test_renamed_away in suites/unit/test_q.py",
        ),
        ("suites/unit/test_gone.py::test_x", "file suites/unit/test_gone.py does not exist"),
    ],
    ids=["missing-function", "missing-file"],
)
def test_an_entry_naming_a_test_that_no_longer_exists_fails_the_run(
    project, pytester, quarantine_entry, test, why
):
    project({**TESTS, "quarantine.toml": quarantine_entry(test)})
    result = pytester.runpytest("-k", "fine")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*stale quarantine entry {test}: {why}*"])


def test_an_entry_for_a_test_outside_the_selection_is_not_mistaken_for_stale(
    project, pytester, quarantine_entry
):
    project(
        {
            **TESTS,
            "suites/property/test_p.py": "class TestP:\n    def test_x(self):\n        pass\n",
            "quarantine.toml": quarantine_entry("suites/property/test_p.py::TestP::test_x"),
        }
    )
    result = pytester.runpytest("--tier", "unit", "-k", "fine")
    assert result.ret == pytest.ExitCode.OK


def test_a_malformed_quarantine_file_fails_the_run_naming_its_line(
    project, pytester, quarantine_entry
):
    broken = (
        quarantine_entry("suites/unit/test_q.py::test_fine")
        + '\n[[quarantine]]\ntest = "suites/unit/test_q.py::test_broken"\n'
    )
    project({**TESTS, "quarantine.toml": broken})
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*malformed quarantine file:*quarantine.toml:8:*"])


def test_the_quarantine_file_can_be_given_explicitly(project, pytester, quarantine_entry):
    project({**TESTS, "ci/q.toml": quarantine_entry("suites/unit/test_q.py::test_broken")})
    result = pytester.runpytest("-k", "broken", "--harness-quarantine", "ci/q.toml")
    assert result.ret == pytest.ExitCode.OK
    missing = pytester.runpytest("--harness-quarantine", "nope.toml")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR


GOLDEN = {
    "suites/integration/test_g.py": """
        import os

        def test_loss(golden):
            golden.check("final_loss", float(os.environ["LOSS"]), rtol=1e-3, atol=0.0)
            golden.check("curve", [1.0, 0.5, float(os.environ["LOSS"])], rtol=1e-3, atol=0.0)
    """
}


def _run(pytester, *args):
    # Deterministic mode (on under CI) would switch torch globally in this process; goldens
    # have nothing to do with it.
    return pytester.runpytest("--harness-deterministic=off", *args)


def _golden_file(pytester):
    return pytester.path / "suites/goldens/integration/test_g.json"


def test_a_missing_golden_fails_under_ci_and_records_nothing(project, pytester, monkeypatch):
    project(GOLDEN)
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("LOSS", "0.25")
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*golden 'final_loss' of test_loss is missing*CI never records goldens*"]
    )
    assert not _golden_file(pytester).exists()


def test_a_missing_golden_is_recorded_locally_as_reviewable_text(project, pytester, monkeypatch):
    project(GOLDEN)
    monkeypatch.setenv("LOSS", "0.25")
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*goldens written (review and commit)*", "recorded 'final_loss'*"])
    data = json.loads(_golden_file(pytester).read_text())
    assert data == {
        "test_loss": {
            "final_loss": {"value": 0.25, "rtol": 1e-3, "atol": 0.0},
            "curve": {"value": [1.0, 0.5, 0.25], "rtol": 1e-3, "atol": 0.0},
        }
    }


@pytest.mark.parametrize(
    ("loss", "passes"),
    [("0.25024", True), ("0.2498", True), ("0.25026", False), ("0.2497", False), ("nan", False)],
)
def test_a_value_outside_the_band_fails_and_inside_passes(
    project, pytester, monkeypatch, loss, passes
):
    project(GOLDEN)
    monkeypatch.setenv("LOSS", "0.25")
    _run(pytester).assert_outcomes(passed=1)  # records 0.25 with rtol 1e-3: band +-0.00025
    before = _golden_file(pytester).read_text()
    monkeypatch.setenv("LOSS", loss)
    monkeypatch.setenv("CI", "true")
    result = _run(pytester)
    result.assert_outcomes(passed=int(passes), failed=int(not passes))
    if not passes and loss != "nan":
        result.stdout.fnmatch_lines(
            ["*golden 'final_loss': got *, recorded 0.25; |difference|*> allowed 0.00025*"]
        )
    assert _golden_file(pytester).read_text() == before  # a comparison never writes


def test_goldens_change_only_with_the_update_flag(project, pytester, monkeypatch):
    project(GOLDEN)
    monkeypatch.setenv("LOSS", "0.25")
    _run(pytester).assert_outcomes(passed=1)
    monkeypatch.setenv("LOSS", "0.5")
    _run(pytester).assert_outcomes(failed=1)
    _run(pytester, "--harness-update-goldens").assert_outcomes(passed=1)
    data = json.loads(_golden_file(pytester).read_text())
    assert data["test_loss"]["final_loss"]["value"] == 0.5
    assert data["test_loss"]["curve"]["value"] == [1.0, 0.5, 0.5]
    _run(pytester).assert_outcomes(passed=1)


def test_a_curve_golden_names_the_first_worst_step(project, pytester, monkeypatch):
    project(GOLDEN)
    monkeypatch.setenv("LOSS", "0.25")
    _run(pytester).assert_outcomes(passed=1)
    golden = _golden_file(pytester)
    data = json.loads(golden.read_text())
    data["test_loss"]["final_loss"]["value"] = 0.25
    data["test_loss"]["curve"]["value"] = [1.0, 0.6, 0.25]
    golden.write_text(json.dumps(data))
    result = _run(pytester)
    result.stdout.fnmatch_lines(
        ["*golden 'curve' at index 1: got 0.5, recorded 0.6*(1 of 3 elements outside the band)*"]
    )


def test_the_json_report_records_outcomes_tiers_seed_and_quarantine(
    project, pytester, quarantine_entry
):
    project(
        {
            **TESTS,
            "suites/gpu/test_gpu.py": "def test_on_gpu():\n    pass\n",
            "quarantine.toml": quarantine_entry("suites/unit/test_q.py::test_param"),
        }
    )
    result = pytester.runpytest(
        "--harness-seed=42", "--harness-json=out/report.json", "-p", "no:randomly"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "out/report.json").read_text())
    assert report["seed"] == 42 and report["exit_status"] == 1
    outcomes = {t["nodeid"]: t["outcome"] for t in report["tests"]}
    assert outcomes == {
        "suites/unit/test_q.py::test_broken": "failed",
        "suites/unit/test_q.py::test_fine": "passed",
        "suites/unit/test_q.py::test_param[1]": "passed",
        "suites/unit/test_q.py::test_param[2]": "quarantined",
        "suites/gpu/test_gpu.py::test_on_gpu": outcomes["suites/gpu/test_gpu.py::test_on_gpu"],
    }
    by_id = {t["nodeid"]: t for t in report["tests"]}
    assert by_id["suites/unit/test_q.py::test_broken"]["repro"] == (
        "pytest suites/unit/test_q.py::test_broken --harness-seed=42"
    )
    assert "broken for real" in by_id["suites/unit/test_q.py::test_broken"]["message"]
    assert by_id["suites/unit/test_q.py::test_param[2]"]["quarantine"]["issue"].endswith("/123")
    assert {t["tier"] for t in report["tests"]} == {"unit", "gpu"}
    assert report["quarantine"]["entries"] == 1 and report["quarantine"]["problems"] == []
    assert "python" in json.dumps(report["environment"])


@pytest.mark.parametrize("stored", [None, "0.25", True, [1.0, "x"], {"v": 1}])
def test_a_hand_edited_golden_without_a_numeric_value_is_a_clear_failure(
    project, pytester, monkeypatch, stored
):
    project(GOLDEN)
    monkeypatch.setenv("LOSS", "0.25")
    _run(pytester).assert_outcomes(passed=1)
    golden = _golden_file(pytester)
    data = json.loads(golden.read_text())
    data["test_loss"]["final_loss"]["value"] = stored
    golden.write_text(json.dumps(data))
    before = golden.read_text()
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden 'final_loss' of test_loss*has no numeric 'value'*"])
    assert golden.read_text() == before
