"""`harness perf gate` and the perf step of `harness ci` on a tiny asv project.

Each test works in a temporary git repository holding a tiny asv project (one benchmark that
times a loop whose length lives in the project's code), benchmarked for real with asv in this
interpreter (`-E existing`, wall-clock time), base and head in alternating passes as CI does.

Measured noise on the 2-core machine shared with other jobs (load average 2-5; docs/perf.md
has the table): with 2 passes of 10 samples, 1 in 10 unchanged pairs reached ratio 1.21 and
1 in 10 2x pairs read 0.99; with 4 passes of 5 samples (20 per side) 22 of 22 unchanged pairs
passed and 10 of 10 2x pairs failed. Finer alternation spreads the machine's drift over both
sides, so the tests use 4 passes, with the default factor (1.3).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import perf
from harness.cli.perf import perf as perf_cli

MACHINE = "gate-test"

ASV_CONF = {
    "version": 1,
    "project": "tiny",
    "repo": ".",
    "dvcs": "git",
    "environment_type": "existing",
    "branches": ["HEAD"],
    "benchmark_dir": "benchmarks",
    "env_dir": ".asv/env",
    "results_dir": ".asv/results",
    "html_dir": ".asv/html",
}

# ~1 ms per call at N = 20,000 on the CI machines: long enough to time, short enough that a
# quick run of one benchmark takes a few seconds.
TINYLIB = '''"""The code under benchmark."""

N = {n}


def work(n):
    total = 0
    for i in range(n):
        total += i % 7
    return total
'''

BENCH = """from . import tinylib


class Loop:
    rounds = 1
    repeat = 5  # per pass; 4 passes give 20 samples per side
    warmup_time = 0.05

    def time_work(self):
        tinylib.work({arg})
"""


def _git(repo: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def _commit(
    repo: Path,
    message: str,
    *,
    n: int | None = None,
    bench_arg: str | None = None,
    readme: str | None = None,
) -> str:
    if n is not None:
        (repo / "benchmarks" / "tinylib.py").write_text(TINYLIB.format(n=n))
    if bench_arg is not None:
        (repo / "benchmarks" / "bench_tiny.py").write_text(BENCH.format(arg=bench_arg))
    if readme is not None:
        (repo / "README.md").write_text(readme)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def make_tiny_repo(path: Path) -> tuple[Path, str]:
    """A git repository on branch main with the tiny asv project; returns (repo, first sha)."""
    repo = path / "tiny"
    (repo / "benchmarks").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "asv.conf.json").write_text(json.dumps(ASV_CONF, indent=2))
    (repo / ".gitignore").write_text(".asv/\n")
    (repo / "benchmarks" / "__init__.py").write_text("")
    return repo, _commit(repo, "base", n=20_000, bench_arg="tinylib.N", readme="tiny\n")


def measure(repo: Path, *commits: str, passes: int = 4, **kwargs) -> perf.RunOutcome:
    """Benchmark commits as CI does: alternating passes on one machine, samples appended."""
    outcomes = perf.run_interleaved(
        repo, commits, passes=passes, machine=MACHINE, echo=None, **kwargs
    )
    for outcome in outcomes:
        assert outcome.exit_code == 0, "\n".join(outcome.log[-40:])
    return outcomes[-1]


def gate_cli(repo: Path, monkeypatch, *args: str):
    """`harness perf gate ARGS` in repo, as a user types it; returns (exit code, output)."""
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(perf_cli, ["gate", *args, "--machine", MACHINE])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The tiny project with these commits on main (no results yet):
    base -> docs -> docs2 -> slow (2x the loop) -> bench-changed -> never-run (HEAD)."""
    repo, base = make_tiny_repo(tmp_path_factory.mktemp("perf-gate"))
    commits = {"base": base}
    commits["docs"] = _commit(repo, "docs only", readme="tiny project\n")
    commits["docs2"] = _commit(repo, "docs again", readme="the tiny project\n")
    commits["slow"] = _commit(repo, "twice the work", n=40_000)
    commits["bench-changed"] = _commit(repo, "benchmark does half", bench_arg="tinylib.N // 2")
    commits["never-run"] = _commit(repo, "not benchmarked", readme="never benchmarked\n")
    return repo, commits


def test_a_commit_that_makes_a_benchmark_twice_as_slow_fails_the_gate_with_exit_1(
    project, monkeypatch
):
    repo, c = project
    measure(repo, c["base"], c["slow"])
    code, output = gate_cli(repo, monkeypatch, c["base"], c["slow"])
    assert code == 1, output
    row = next(line for line in output.splitlines() if "bench_tiny.Loop.time_work" in line)
    assert "regressed" in row
    ratio = float(row.split("|")[5])
    assert ratio > perf.DEFAULT_FACTOR, row  # 2x the work (less under a loaded machine)
    assert "REGRESSION" in output


def test_an_unchanged_commit_passes_the_gate_in_five_of_five_runs(project, monkeypatch):
    repo, c = project
    codes, ratios = [], []
    for _ in range(5):
        measure(repo, c["base"], c["docs"])  # fresh measurements of both, each time
        report = perf.gate(repo, c["base"], c["docs"], machine=MACHINE)
        codes.append(report.exit_code)
        ratios.append(report.rows[0].ratio)
    assert codes == [0] * 5, f"exit codes {codes}, ratios {ratios}"
    # The CLI agrees with the library and prints the ratio table.
    code, output = gate_cli(repo, monkeypatch, c["base"], c["docs"])
    assert code == 0, output
    assert "| ratio |" in output and "unchanged" in output


def test_results_recorded_under_another_python_path_exit_2_as_an_environment_mismatch(
    project, monkeypatch
):
    repo, c = project
    bindir = Path(perf.python_path()).parent
    other = next(
        (
            str(bindir / name)
            for name in ("python3", "python3.11", "python3.12")
            if (bindir / name).exists() and str(bindir / name) != perf.python_path()
        ),
        None,
    )
    if other is None:
        pytest.skip(f"no second spelling of this interpreter in {bindir}")
    measure(repo, c["base"], passes=1)
    outcome = measure(repo, c["docs2"], passes=1, python=other)
    assert outcome.env_name != perf.env_name()
    code, output = gate_cli(repo, monkeypatch, c["base"], c["docs2"])
    assert code == 2, output
    assert "environment-name mismatch" in output
    assert outcome.env_name in output and perf.env_name() in output


def test_missing_results_for_either_commit_or_the_machine_exit_2(project, monkeypatch):
    repo, c = project
    measure(repo, c["base"], passes=1)
    for base, head in ((c["base"], c["never-run"]), (c["never-run"], c["base"])):
        code, output = gate_cli(repo, monkeypatch, base, head)
        assert code == 2, output
        assert (
            f"no results for {'head' if head == c['never-run'] else 'base'} "
            f"{c['never-run'][:10]}" in output
        )
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(perf_cli, ["gate", c["base"], c["base"], "--machine", "nope"])
    assert result.exit_code == 2 and "no results for machine `nope`" in result.output


def test_a_changed_benchmark_is_not_comparable_and_exits_2(project, monkeypatch):
    repo, c = project
    measure(repo, c["base"], c["bench-changed"], passes=1)  # not comparable at any noise
    code, output = gate_cli(repo, monkeypatch, c["base"], c["bench-changed"])
    assert code == 2, output
    assert "benchmark code changed, not comparable" in output
    assert "NOT COMPARABLE" in output


def test_ci_step_without_a_baseline_says_so_and_exits_0_or_2_when_a_baseline_is_required(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    monkeypatch.delenv("HARNESS_PERF_BASE_REF", raising=False)
    repo, _ = make_tiny_repo(tmp_path)
    _commit(repo, "second", readme="two\n")  # on main: the baseline would be HEAD^
    result = perf.ci_step(repo, tmp_path / "reports", machine=MACHINE, echo=None)
    assert result.exit_code == 0
    assert result.skipped_reason and "no baseline" in result.skipped_reason
    assert "Perf gate skipped: no baseline" in result.markdown
    assert (tmp_path / "reports" / "perf.md").read_text().strip() == result.markdown.strip()

    required = perf.ci_step(
        repo, tmp_path / "reports", machine=MACHINE, echo=None, require_baseline=True
    )
    assert required.exit_code == 2
    assert "no baseline" in required.skipped_reason


def test_ci_step_on_a_branch_measures_its_merge_base_and_fails_a_2x_slowdown(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    monkeypatch.delenv("HARNESS_PERF_BASE_REF", raising=False)
    repo, base = make_tiny_repo(tmp_path)
    _git(repo, "checkout", "-q", "-b", "feature")
    _commit(repo, "twice the work", n=40_000)
    result = perf.ci_step(
        repo,
        tmp_path / "reports",
        machine=MACHINE,
        echo=None,
        quick=False,
        measure_base="always",
        passes=4,
        require_baseline=True,
    )
    assert result.exit_code == 1, result.markdown
    assert result.skipped_reason is None
    assert f"Baseline: `{base[:10]}` (merge-base of HEAD and main" in result.markdown
    assert "regressed" in result.markdown
    gate_json = json.loads((tmp_path / "reports" / "perf-gate.json").read_text())
    assert gate_json["exit_code"] == 1 and gate_json["base"] == base


def test_ci_step_in_a_checkout_without_benchmarks_reports_why_and_exits_2(tmp_path):
    _git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "README.md").write_text("no benchmarks here\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "first")
    result = perf.ci_step(tmp_path, tmp_path / "reports", machine=MACHINE, echo=None)
    assert result.exit_code == 2
    assert "asv.conf.json" in result.skipped_reason
    assert result.skipped_reason in result.markdown
