"""`harness run --shard K/N` and `harness report merge` from the outside, on real shard outputs.

Each test writes a small project, runs its shards through the real CLI (one pytest process per
shard, as on separate runners), then merges the folders the shards wrote.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET

import pytest

from harness.report import RunStatus, write_placeholders

# 7 tests with recorded durations that only a duration-aware split balances: by count the
# shard holding test_slow would get 4 of them and most of the time.
DURATIONS = {
    "suites/unit/test_work.py::test_slow": 8.0,
    "suites/unit/test_work.py::test_mid[0]": 4.0,
    "suites/unit/test_work.py::test_mid[1]": 4.0,
    "suites/unit/test_work.py::test_quick[0]": 1.0,
    "suites/unit/test_work.py::test_quick[1]": 1.0,
    "suites/unit/test_work.py::test_quick[2]": 1.0,
    "suites/unit/test_work.py::test_quick[3]": 1.0,
}

WORK = """
    import os
    import pytest

    def test_slow():
        pass

    @pytest.mark.parametrize("i", range(2))
    def test_mid(i):
        # The shard that runs test_mid[1] can be told to fail it, as a real regression would.
        assert not (i == 1 and os.environ.get("BREAK_MID")), "test_mid[1] broke"

    @pytest.mark.parametrize("i", range(4))
    def test_quick(i):
        pass

    def test_flaky_socket():
        raise ConnectionResetError("flaky socket")
"""

QUARANTINED = "suites/unit/test_work.py::test_flaky_socket"


@pytest.fixture
def work(project, quarantine_entry):
    return project(
        {
            "suites/unit/test_work.py": WORK,
            # The quarantined test has no recorded duration: it counts as the average.
            ".test_durations": json.dumps(DURATIONS),
            "quarantine.toml": quarantine_entry(QUARANTINED),
        }
    )


def _harness(pytester, *args):
    return pytester.run(sys.executable, "-m", "harness.cli", *args, timeout=180)


def _run_shard(pytester, k, n, *extra, seed="7"):
    return _harness(
        pytester, "run", "--shard", f"{k}/{n}", "--seed", seed, "--report-dir", f"shard-{k}", *extra
    )


def _ran(pytester, folder):
    report = json.loads((pytester.path / folder / "report.json").read_text())
    return report, [t["nodeid"] for t in report["tests"]]


def test_shards_run_every_test_once_merge_to_a_pass_and_fail_when_incomplete_or_foreign(
    work, pytester, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    for k in (1, 2):
        assert _run_shard(pytester, k, 2).ret == 0  # the quarantined failure does not gate
    (r1, ran1), (r2, ran2) = _ran(pytester, "shard-1"), _ran(pytester, "shard-2")
    assert (r1["shard"]["index"], r1["shard"]["total"], r1["seed"]) == (1, 2, 7)
    assert r1["shard"]["collected"] == r2["shard"]["collected"]
    everything = set(DURATIONS) | {QUARANTINED}
    assert set(r1["shard"]["collected"]) == everything  # recorded before the split
    assert not set(ran1) & set(ran2) and set(ran1) | set(ran2) == everything

    result = _harness(pytester, "report", "merge", "shard-1", "shard-2", "--report-dir", "merged")
    assert result.ret == 0, result.stdout.str()
    merged = json.loads((pytester.path / "merged/report.json").read_text())
    assert merged["exit_status"] == 0 and merged["merge_problems"] == []
    assert sorted(t["nodeid"] for t in merged["tests"]) == sorted(everything)
    junit = ET.parse(pytester.path / "merged/junit.xml").getroot()
    assert junit.get("tests") == "8" and junit.get("failures") == "0"
    assert len(junit.findall("testsuite")) == 2
    summary = (pytester.path / "merged/summary.md").read_text()
    assert "merged run (2 shard(s)): ✅ passed" in summary
    assert "| unit | 7 | 0 | 0 | 1 |" in summary  # passed, failed, skipped, quarantined
    assert "test_flaky_socket` failed: ConnectionResetError: flaky socket" in summary

    # The same real shards, made incomplete or foreign: each fails the merge, by name.
    shutil.copytree(pytester.path / "shard-2", pytester.path / "crashed")
    (pytester.path / "crashed" / "report.json").unlink()  # pytest died before writing it
    result = _harness(pytester, "report", "merge", "shard-1", "crashed", "--report-dir", "a")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*crashed/report.json: no JSON report*", "*missing shard(s) 2/2*"])

    # The same shard from a run under another seed is not part of this run.
    shutil.copytree(pytester.path / "shard-2", pytester.path / "other-run")
    report = json.loads((pytester.path / "other-run/report.json").read_text())
    report["seed"] = 8
    (pytester.path / "other-run/report.json").write_text(json.dumps(report))
    result = _harness(pytester, "report", "merge", "shard-1", "other-run", "--report-dir", "b")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*the shards ran under different seeds (7, 8)*"])
    # A shard interrupted by Ctrl-C leaves "aborted" placeholder reports: not a shard's part.
    shutil.copytree(pytester.path / "shard-2", pytester.path / "aborted")
    write_placeholders(pytester.path / "aborted", RunStatus.ABORTED, "interrupted by Ctrl-C")
    result = _harness(pytester, "report", "merge", "shard-1", "aborted", "--report-dir", "d")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*aborted: the shard's run was aborted (interrupted by Ctrl-C)*"])
    # A folder that does not exist is a missing shard, named.
    result = _harness(pytester, "report", "merge", "shard-1", "shard-9", "--report-dir", "c")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*shard-9: no such folder*"])


def test_shards_are_balanced_by_recorded_durations_not_by_count(work, pytester):
    # Collect-only runs of each shard: what each would run, without running it.
    shards = []
    for k in (1, 2):
        result = pytester.runpytest(
            "--co", "-q", "-p", "harness.shard_plugin", "--splits=2", f"--group={k}",
            "--splitting-algorithm=least_duration", "--durations-path=.test_durations",
            "-k", "not flaky",
        )  # fmt: skip
        shards.append([line for line in result.outlines if line.startswith("suites/")])
    assert sorted(shards[0] + shards[1]) == sorted(DURATIONS)
    totals = [sum(DURATIONS[t] for t in shard) for shard in shards]
    # 20 s of recorded work splits 10 + 10: exact, since the durations are whole seconds.
    assert totals == [10.0, 10.0], shards
    slow = next(s for s in shards if "suites/unit/test_work.py::test_slow" in s)
    other = next(s for s in shards if s is not slow)
    assert len(slow) < len(other)  # a split by count would give them 4 and 3 the other way


def _collected_shards(pytester, durations):
    (pytester.path / ".test_durations").write_text(json.dumps(durations))
    shards: list[list[str]] = []
    estimates: list[list[str]] = []
    for k in (1, 2):
        result = pytester.runpytest(
            "--co", "-q", "-p", "harness.shard_plugin", "--splits=2", f"--group={k}",
            "--splitting-algorithm=least_duration", "--durations-path=.test_durations",
            "-k", "not flaky",
        )  # fmt: skip
        shards.append([line for line in result.outlines if line.startswith("suites/")])
        estimates.append(re.findall(r"estimated duration: ([0-9.]+)s", result.stdout.str()))
    return shards, estimates


def test_tests_missing_from_the_durations_file_count_as_the_known_average_and_stale_ones_nothing(
    work, pytester
):
    # The committed file always lags the suites (tests added since it was recorded: about half
    # of the unit and property tiers when this test was written; and entries of tests since
    # deleted or renamed). Known here: test_slow (8 s) and the four quick ones (1 s each), so
    # the average is 12 s / 5 = 2.4 s; the two test_mid are missing; a deleted test's stale
    # entry says 1000 s. Longest first, each to the lighter shard: test_slow alone (8 s) on one
    # side, both test_mid (2 x 2.4 s) and the quick ones on the other (8.8 s), which is what
    # each shard estimates. Were the stale entry averaged in (~169 s per missing test), the
    # two test_mid would go to different shards; were missing tests counted as 0, the other
    # shard would estimate 4 s; were they dropped, they would run in no shard.
    known = {t: s for t, s in DURATIONS.items() if "test_mid" not in t}
    gone = {"suites/unit/test_gone.py::test_gone": 1000.0}
    shards, estimates = _collected_shards(pytester, {**known, **gone})
    assert sorted(shards[0] + shards[1]) == sorted(DURATIONS)  # every test runs, once
    alone = next(s for s in shards if "suites/unit/test_work.py::test_slow" in s)
    assert alone == ["suites/unit/test_work.py::test_slow"], shards
    assert sorted(e for shard in estimates for e in shard) == ["8.00", "8.80"], estimates
    # A file that knows none of the collected tests (every one renamed) splits by count.
    shards, _ = _collected_shards(pytester, gone)
    assert sorted(shards[0] + shards[1]) == sorted(DURATIONS)
    assert sorted(len(s) for s in shards) == [3, 4], shards


def test_a_failure_in_one_shard_fails_the_merge_and_a_missing_shard_fails_it_too(
    work, pytester, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert _run_shard(pytester, 1, 2).ret == 0
    monkeypatch.setenv("BREAK_MID", "1")
    failing = _run_shard(pytester, 2, 2)
    _, ran2 = _ran(pytester, "shard-2")
    if "suites/unit/test_work.py::test_mid[1]" not in ran2:
        # The recorded durations moved test_mid[1] into shard 1: run that one broken instead.
        monkeypatch.delenv("BREAK_MID")
        assert failing.ret == 0
        shutil.rmtree(pytester.path / "shard-1")
        monkeypatch.setenv("BREAK_MID", "1")
        failing = _run_shard(pytester, 1, 2)
    assert failing.ret == 1

    result = _harness(pytester, "report", "merge", "shard-1", "shard-2", "--report-dir", "m")
    assert result.ret == 1
    summary = (pytester.path / "m/summary.md").read_text()
    assert "❌ failed (exit status 1)" in summary
    assert (
        "`suites/unit/test_work.py::test_mid[1]` (failed): AssertionError: test_mid[1] broke"
        in summary
    )

    # Shard 2's artifact never arrived: the merge knows there should be two.
    result = _harness(pytester, "report", "merge", "shard-1", "--report-dir", "m1")
    assert result.ret == 1
    merged = json.loads((pytester.path / "m1/report.json").read_text())
    assert merged["merge_problems"] == [
        "missing shard(s) 2/2: a merge without them would pass tests that never ran"
    ]
    assert "❌ incomplete" in (pytester.path / "m1/summary.md").read_text()
    # ... also when even the count is lost with it: --expect-shards says how many to expect.
    result = _harness(pytester, "report", "merge", "shard-1", "--expect-shards", "3")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*expected 3 shards, but the shards' reports say 2*"])


def test_store_durations_records_every_test_that_ran(work, pytester):
    result = _harness(
        pytester, "run", "--store-durations", "--durations-path", "fresh.json", "--report-dir", "o"
    )
    assert result.ret == 0
    stored = json.loads((pytester.path / "fresh.json").read_text())
    assert set(stored) == set(DURATIONS) | {QUARANTINED}
    assert all(seconds >= 0 for seconds in stored.values())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3/2", "the shard index must be between 1 and 2, got 3"),
        ("0/2", "the shard index must be between 1 and 2, got 0"),
        ("1/0", "the shard count must be >= 1, got 0"),
        ("half", "expected K/N such as 1/2 (shard K of N), got 'half'"),
    ],
)
def test_a_bad_shard_spec_exits_2_naming_the_value(value, message):
    from click.testing import CliRunner

    from harness.cli import main

    result = CliRunner().invoke(main, ["run", "--shard", value])
    assert result.exit_code == 2
    assert message in result.output and "--shard" in result.output
