"""Real `harness` processes: Ctrl-C leaves reports that say aborted, and untiered tests fail
`harness run` and `harness ci`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLOW = """
    import os, pathlib, time

    def test_slow():
        pathlib.Path(os.environ["SLOW_STARTED"]).write_text(str(os.getpid()))
        time.sleep(120)
"""


def _earlier_passing_reports(report_dir: Path) -> None:
    report_dir.mkdir(parents=True)
    (report_dir / "junit.xml").write_text('<testsuites><testsuite tests="1"/></testsuites>\n')
    (report_dir / "report.json").write_text('{"exit_status": 0, "status": "passed"}\n')
    (report_dir / "summary.md").write_text("## ml-harness run: ✅ passed\n")


def _default_sigint() -> None:
    # A parent that ignores SIGINT (a background job of a non-interactive shell) would pass
    # that on; Python installs its KeyboardInterrupt handler only over the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("target", ["harness only", "process group", "sigterm"])
def test_ctrl_c_during_a_run_exits_130_and_every_report_says_aborted(
    project, pytester, monkeypatch, target
):
    """And a SIGTERM (a cancelled CI job's) the same way, exit 143."""
    root = project({"suites/unit/test_slow.py": SLOW})
    _earlier_passing_reports(root / "out")
    started = root / "started.txt"
    monkeypatch.setenv("SLOW_STARTED", str(started))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "--tier", "unit", "--report-dir", "out"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 60  # pytest start-up on a loaded 2-core runner
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert started.exists(), "the slow test never started"
        if target == "process group":  # what Ctrl-C in a terminal does
            os.killpg(proc.pid, signal.SIGINT)
        elif target == "sigterm":  # to harness alone, as a supervisor or `timeout` sends it
            proc.send_signal(signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == (143 if target == "sigterm" else 130), output
    assert "aborted" in output
    out = root / "out"
    report = json.loads((out / "report.json").read_text())
    how = "a SIGTERM" if target == "sigterm" else "Ctrl-C"
    assert report["status"] == "aborted" and f"interrupted by {how}" in report["reason"]
    assert "❌ aborted" in (out / "summary.md").read_text()
    junit = (out / "junit.xml").read_text()
    assert 'errors="1"' in junit and "passed" not in (out / "summary.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "report.json", "summary.md"]
    pytest_pid = int(started.read_text())
    with pytest.raises(ProcessLookupError):  # the test run stopped with it, nothing behind
        os.kill(pytest_pid, 0)


STRAYS = {
    "suites/unit/test_ok.py": "def test_ok():\n    pass\n",
    "suites/unti/test_typo.py": "def test_typo():\n    assert False\n",
}


def test_harness_run_of_one_tier_fails_on_a_test_file_in_a_misspelled_tier_folder(
    project, pytester, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    root = project(STRAYS)
    result = pytester.run(
        sys.executable, "-m", "harness.cli", "run", "--tier", "unit", "--report-dir", "out"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    summary = (root / "out/summary.md").read_text()
    assert "❌ failed (exit status 2)" in summary
    assert "`suites/unti/test_typo.py` (error): suites/unti/test_typo.py is not in a tier" in (
        summary
    )


def test_harness_ci_fails_its_cpu_step_on_a_test_file_directly_under_suites(
    project, pytester, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    root = project({**STRAYS, "suites/test_loose.py": "def test_loose():\n    assert False\n"})
    result = pytester.run(
        sys.executable, "-m", "harness.cli", "ci", "--no-perf", "--tier", "unit", timeout=300
    )
    assert result.ret == 1
    summary = (root / "reports/summary.md").read_text()
    assert "| cpu tiers | ❌ failed |" in summary
    assert "suites/test_loose.py is not in a tier folder" in summary
    gpu = json.loads((root / "reports/gpu/report.json").read_text())
    assert gpu["status"] in ("skipped", "failed", "passed")  # replaced by this run either way
    if gpu["status"] == "skipped":
        assert "no CUDA device" in gpu["reason"]
