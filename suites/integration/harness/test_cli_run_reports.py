"""`harness run` from the outside: the JUnit XML, JSON and markdown reports it writes."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

import pytest

MIXED = {
    "suites/unit/test_mixed.py": """
        import pytest

        def test_passes():
            pass

        def test_fails():
            assert 2 + 2 == 5, "arithmetic is broken"

        @pytest.mark.skip(reason="needs a rainy day")
        def test_skipped():
            pass

        def test_quarantined():
            raise RuntimeError("flaky socket")
    """,
}


@pytest.fixture
def mixed(project, quarantine_entry):
    return project(
        {
            **MIXED,
            "quarantine.toml": quarantine_entry("suites/unit/test_mixed.py::test_quarantined"),
        }
    )


def _harness(pytester, *args, env=None):
    return pytester.run(sys.executable, "-m", "harness.cli", *args, timeout=120)


def test_a_mixed_run_writes_junit_json_and_markdown_that_say_exactly_that(
    mixed, pytester, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    result = _harness(pytester, "run", "--tier", "unit", "--report-dir", "out", "--seed", "99")
    assert result.ret == 1  # one real failure
    out = pytester.path / "out"

    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert (
        suite.get("tests"),
        suite.get("failures"),
        suite.get("skipped"),
        suite.get("errors"),
    ) == ("4", "1", "2", "0")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["test_fails"].find("failure") is not None
    assert cases["test_skipped"].find("skipped").get("message") == "needs a rainy day"
    quarantined = cases["test_quarantined"].find("skipped")
    assert quarantined.get("type") == "pytest.xfail"
    assert "quarantined (https://github.com/ORG/REPO/issues/123)" in quarantined.get("message")
    assert "RuntimeError: flaky socket" in quarantined.get("message")
    props = {p.get("name"): p.get("value") for p in cases["test_quarantined"].iter("property")}
    assert props["harness_tier"] == "unit" and props["harness_quarantined"] == "failed in call"
    assert (
        cases["test_passes"].find("failure") is None
        and cases["test_passes"].find("skipped") is None
    )

    report = json.loads((out / "report.json").read_text())
    assert report["seed"] == 99
    outcomes = {t["nodeid"].split("::")[1]: t["outcome"] for t in report["tests"]}
    assert outcomes == {
        "test_passes": "passed",
        "test_fails": "failed",
        "test_skipped": "skipped",
        "test_quarantined": "quarantined",
    }
    assert report["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))

    summary = (out / "summary.md").read_text()
    assert "❌ failed (exit status 1)" in summary
    assert "| tier | passed | failed | skipped | quarantined |" in summary
    assert "| unit | 1 | 1 | 1 | 1 |" in summary
    assert "Seed `99`" in summary
    assert (
        "- `suites/unit/test_mixed.py::test_fails` (failed): AssertionError: arithmetic is broken"
        in summary
    )
    assert "reproduce: `pytest suites/unit/test_mixed.py::test_fails --harness-seed=99`" in summary
    assert "- 1 × needs a rainy day" in summary
    assert "test_quarantined` failed: RuntimeError: flaky socket" in summary
    assert "| torch |" in summary  # the environment fingerprint
    assert summary in result.stdout.str() or "| unit | 1 | 1 | 1 | 1 |" in result.stdout.str()


def test_the_summary_is_appended_to_the_github_step_summary(mixed, pytester, monkeypatch):
    step_summary = pytester.path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    _harness(pytester, "run", "--tier", "unit", "--report-dir", "out")
    text = step_summary.read_text()
    assert text.startswith("earlier step\n")  # appended, never overwritten
    assert "| unit | 1 | 1 | 1 | 1 |" in text


def test_a_passing_run_exits_zero_even_with_a_quarantined_failure(
    project, pytester, quarantine_entry
):
    project(
        {
            "suites/unit/test_ok.py": (
                "def test_ok():\n    pass\n\ndef test_q():\n    assert False\n"
            ),
            "quarantine.toml": quarantine_entry("suites/unit/test_ok.py::test_q"),
        }
    )
    result = _harness(pytester, "run", "--report-dir", "out")
    assert result.ret == 0
    assert "✅ passed" in (pytester.path / "out/summary.md").read_text()


def test_a_run_that_collects_nothing_fails_loudly(project, pytester):
    project({"suites/unit/test_ok.py": "def test_ok():\n    pass\n"})
    result = _harness(pytester, "run", "--tier", "property", "--report-dir", "out")
    assert result.ret == 5
    assert "no tests ran (exit status 5)" in (pytester.path / "out/summary.md").read_text()
    result.stdout.fnmatch_lines(["*pytest collected no tests (exit 5)*"])


def test_a_start_up_error_in_pytest_leaves_reports_that_say_aborted(project, pytester):
    project({"suites/unit/test_ok.py": "def test_ok():\n    pass\n"})
    assert _harness(pytester, "run", "--report-dir", "out").ret == 0
    # An option only pytest checks: the run gets as far as starting pytest.
    result = _harness(pytester, "run", "--report-dir", "out", "--", "--harness-deterministic=x")
    assert result.ret == 4
    out = pytester.path / "out"
    assert json.loads((out / "report.json").read_text())["status"] == "aborted"
    summary = (out / "summary.md").read_text()
    assert "aborted" in summary and "pytest stopped before writing a report" in summary
    assert ET.parse(out / "junit.xml").getroot().find("testsuite").get("errors") == "1"
