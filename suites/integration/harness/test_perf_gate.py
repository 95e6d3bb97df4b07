"""`harness perf gate` and the perf step of `harness ci` on a tiny asv project.

Each test works in a temporary git repository holding a tiny asv project (one benchmark that
times a loop whose length lives in the project's code), benchmarked for real with asv in this
interpreter (`-E existing`), base and head in alternating passes as CI does.

No assertion here depends on how busy the machine is: the tests check the plumbing (which
results are compared, where the baseline comes from, what is refused and why), and the
verdicts' statistics are tested on synthetic samples (suites/unit/harness/test_perf_decision.py
and test_perf_stats.py). One real end-to-end gate run judges a real change: 10x the work,
which no load can hide, and even there the assertion is "never OK" (regressed, or undecided
saying what it would need), because undecided is an honest answer on an overloaded machine.
"""

from __future__ import annotations

import collections
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiny_asv_project import BASE_N, TINYLIB, bench_source, commit, git, make_repo

from harness import perf
from harness.cli.perf import perf as perf_cli
from harness.perf import step as step_module

MACHINE = "gate-test"

# Samples per benchmark per pass: 4 passes of 5 give 20 per side.
REPEAT = 5


def make_tiny_repo(path: Path, *, repeat: int = REPEAT) -> tuple[Path, str]:
    """The tiny asv project on branch main; returns (repo, first sha).
    repeat: samples per benchmark per pass (the class attribute; --quick overrides it)."""
    return make_repo(path, bench=bench_source(repeat=repeat))


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
    base -> docs -> docs2 -> bench-changed -> never-run (HEAD)."""
    repo, base = make_tiny_repo(tmp_path_factory.mktemp("perf-gate"))
    commits = {"base": base}
    commits["docs"] = commit(repo, "docs only", readme="tiny project\n")
    commits["docs2"] = commit(repo, "docs again", readme="the tiny project\n")
    commits["bench-changed"] = commit(
        repo, "benchmark does half", bench=bench_source("tinylib.N // 2", repeat=REPEAT)
    )
    commits["never-run"] = commit(repo, "not benchmarked", readme="never benchmarked\n")
    return repo, commits


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


@pytest.fixture
def no_base_ref_env(monkeypatch):
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    monkeypatch.delenv("HARNESS_PERF_BASE_REF", raising=False)
    monkeypatch.delenv(perf.MACHINE_ENV_VAR, raising=False)


def test_a_first_run_without_a_baseline_keeps_its_results_and_the_next_run_gates_against_them(
    tmp_path, no_base_ref_env
):
    repo, first = make_tiny_repo(tmp_path)
    commit(repo, "second", readme="two\n")  # on main: the baseline would be HEAD^
    head = git(repo, "rev-parse", "HEAD")
    reports = tmp_path / "reports"
    lines: list[str] = []
    result = perf.ci_step(repo, reports, perf.PerfStepConfig(machine=MACHINE), echo=lines.append)
    assert result.exit_code == 0, result.markdown
    assert result.skipped_reason and "no baseline" in result.skipped_reason
    assert "the next run gates against it" in result.skipped_reason
    assert "Perf gate skipped: no baseline" in result.markdown
    assert any(line.startswith("harness perf: NO BASELINE") for line in lines)  # said loudly
    assert (reports / "perf.md").read_text().strip() == result.markdown.strip()
    assert not (reports / "perf-gate.json").exists()
    manifest = json.loads((repo / ".asv" / "baseline" / f"{MACHINE}.json").read_text())
    [entry] = manifest["baselines"].values()  # one per environment
    assert entry["commit"] == head and entry["env"] == perf.env_name()
    assert result.baseline_recorded == str(repo / ".asv" / "baseline")

    # The next run on the same commit: the working tree now does 10x the work (uncommitted).
    # HEAD's results in .asv/results are overwritten by this run; the kept baseline is not.
    # 10x, not 2x: this test is about where the baseline comes from, not about sensitivity.
    (repo / "benchmarks" / "tinylib.py").write_text(TINYLIB.format(n=200_000))
    # The one real end-to-end verdict: never OK. Regressed, or (on a machine too loaded to
    # tell even in A/B pairs) undecided with what it would need; both fail the step.
    again = perf.ci_step(
        repo, reports, perf.PerfStepConfig(machine=MACHINE, require_baseline=True), echo=None
    )
    assert again.exit_code in (1, 2), again.markdown
    assert "OK: no regression" not in again.markdown
    assert f"Baseline: the baseline recorded on {entry['recorded_at']}" in again.markdown
    gate_json = json.loads((reports / "perf-gate.json").read_text())
    assert gate_json["base"] == head and gate_json["head"] == head
    (row,) = gate_json["rows"]
    if again.exit_code == 1:
        assert row["status"] == "regressed" and again.skipped_reason is None
    else:
        assert row["status"] == "undecided" and "would need" in again.markdown
    assert again.baseline_recorded is None
    assert first != head


def test_without_a_baseline_a_required_baseline_fails_the_step_and_the_run_is_still_kept(
    tmp_path, no_base_ref_env
):
    repo, _ = make_tiny_repo(tmp_path)
    required = perf.ci_step(
        repo,
        tmp_path / "reports",
        perf.PerfStepConfig(machine=MACHINE, require_baseline=True),
        echo=None,
    )
    assert required.exit_code == 2, required.markdown
    assert "no baseline" in required.skipped_reason
    assert "this fails the step (a baseline is required here)" in required.markdown
    assert required.baseline_recorded and Path(required.baseline_recorded).is_dir()


def test_a_stored_baseline_from_another_branch_is_not_used(tmp_path, no_base_ref_env):
    repo, _ = make_tiny_repo(tmp_path)
    perf.ci_step(
        repo, tmp_path / "r1", perf.PerfStepConfig(machine=MACHINE), echo=None
    )  # keeps main's first commit
    git(repo, "checkout", "-q", "--orphan", "unrelated")
    commit(repo, "unrelated history", readme="other\n")
    assert perf.stored_baseline(repo, machine=MACHINE, env=perf.env_name()) is None


def test_perf_run_with_no_benchmark_selected_says_so_and_exits_2(tmp_path, monkeypatch):
    repo, _ = make_tiny_repo(tmp_path)
    monkeypatch.chdir(repo)
    monkeypatch.delenv(perf.MACHINE_ENV_VAR, raising=False)
    result = CliRunner().invoke(
        perf_cli, ["run", "--bench", "NoSuchBenchmark", "--quick", "--machine", MACHINE]
    )
    assert result.exit_code == 2, result.output
    assert "no benchmark matched 'NoSuchBenchmark'" in result.output
    assert "a benchmark failed" not in result.output


def test_a_gate_with_too_few_samples_to_see_a_regression_says_so_and_exits_2(tmp_path, monkeypatch):
    # 3 samples per side in one pass: the best p-value is 1/20, so no difference, not even a
    # 10x one, could ever be significant. Such a gate must fail, not report "unchanged".
    repo, base = make_tiny_repo(tmp_path, repeat=3)
    slow = commit(repo, "ten times the work", n=200_000)
    measure(repo, base, slow, passes=1)
    report = perf.gate(repo, base, slow, machine=MACHINE)
    assert report.exit_code == 2, report.markdown()
    (row,) = report.rows
    assert row.status == perf.TOO_FEW_SAMPLES and (row.n_base, row.n_head) == (3, 3)
    assert "TOO FEW SAMPLES" in report.verdict
    assert "a 2x regression there would pass unseen" in report.markdown()
    code, output = gate_cli(repo, monkeypatch, base, slow)
    assert code == 2 and "too few samples" in output


def pull_request_step(repo: Path, reports: Path, monkeypatch, fake_ab) -> perf.PerfStepResult:
    """The step in pull-request mode (the merge-base measured here, a baseline required), with
    fake_ab in place of the workers' A/B pairs and no CI variable naming another base."""
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    monkeypatch.delenv("HARNESS_PERF_BASE_REF", raising=False)
    monkeypatch.setattr(step_module, "measure_ab", fake_ab)
    config = perf.PerfStepConfig(machine=MACHINE, measure_base="always", require_baseline=True)
    return perf.ci_step(repo, reports, config, echo=None)


INFO_BENCH = """

class Info:
    def time_info_work(self):
        tinylib.work(tinylib.N)
"""


def test_a_time_info_benchmark_is_shown_but_never_gated_nor_measured_in_pairs(
    tmp_path, monkeypatch
):
    """time_info_*: timed by asv and shown with its ratio, never A/B-measured and never
    deciding the exit (an I/O-bound or seconds-per-sample time no shared runner can settle).
    The branch makes its work 10x; the gated Loop does a fixed 1,000 iterations on both sides,
    its A/B pairs synthetic (unchanged), so the exit is the rule's, not the machine's."""
    repo, base = make_repo(tmp_path, bench=bench_source("1000", repeat=REPEAT, extra=INFO_BENCH))
    git(repo, "checkout", "-q", "-b", "feature")
    commit(repo, "ten times the work", n=10 * BASE_N)
    asked: list[str] = []

    def fake_ab(root, base_sha, names, *, factor, pairs, max_seconds, echo, **_):
        asked.extend(names)
        rng = random.Random(8)
        same = [1e-3 * rng.uniform(0.98, 1.02) for _ in range(pairs)]
        return {name: perf.ABResult(name, same, list(same)) for name in names}

    result = pull_request_step(repo, tmp_path / "reports", monkeypatch, fake_ab)
    assert asked == ["bench_tiny.Loop.time_work"]
    assert result.exit_code == 0, result.markdown
    gate_json = json.loads((tmp_path / "reports" / "perf-gate.json").read_text())
    rows = {r["name"]: r for r in gate_json["rows"]}
    info = rows["bench_tiny.Info.time_info_work"]
    assert info["status"] == "informational" and info["ratio"] > 1, info


def test_ci_step_on_a_branch_measures_its_merge_base_and_its_ab_pairs_decide(tmp_path, monkeypatch):
    # asv measures base and head for real; the A/B pairs are synthetic (a seeded 2x with
    # jitter, handed to the step in place of the workers' samples), so the verdict is the
    # statistics', not the machine's load.
    repo, base = make_tiny_repo(tmp_path)
    git(repo, "checkout", "-q", "-b", "feature")
    commit(repo, "twice the work", n=40_000)
    asked: list[tuple[str, list[str], float, int]] = []

    def fake_ab(root, base_sha, names, *, factor, pairs, max_seconds, echo, **_):
        asked.append((base_sha, list(names), factor, pairs))
        rng = random.Random(7)
        return {
            name: perf.ABResult(
                name,
                [1e-3 * rng.uniform(0.95, 1.05) for _ in range(pairs)],
                [2e-3 * rng.uniform(0.95, 1.05) for _ in range(pairs)],
            )
            for name in names
        }

    result = pull_request_step(repo, tmp_path / "reports", monkeypatch, fake_ab)
    assert asked == [(base, ["bench_tiny.Loop.time_work"], perf.DEFAULT_FACTOR, 60)]
    assert result.exit_code == 1, result.markdown
    assert result.skipped_reason is None
    assert f"Baseline: `{base[:10]}` (merge-base of HEAD and main" in result.markdown
    gate_json = json.loads((tmp_path / "reports" / "perf-gate.json").read_text())
    assert gate_json["exit_code"] == 1 and gate_json["base"] == base
    (row,) = gate_json["rows"]
    assert row["method"] == "A/B pairs" and row["status"] == "regressed"
    assert (row["n_base"], row["n_head"]) == (60, 60)
    assert "Judged on interleaved A/B pairs" in result.markdown


@pytest.mark.parametrize("start", perf.AB_STARTS)
def test_ab_pairs_are_taken_for_real_and_a_missing_benchmark_is_an_error(project, start):
    repo, c = project
    git(repo, "checkout", "-q", c["docs"])
    try:
        ab = perf.measure_ab(
            repo,
            c["base"],
            ["bench_tiny.Loop.time_work", "bench_tiny.Loop.time_nope"],
            factor=perf.DEFAULT_FACTOR,
            pairs=10,
            max_pairs=10,
            max_seconds=600,  # far more than 2 blocks need at any load: max_pairs stops it
            start=start,
        )
    finally:
        git(repo, "checkout", "-q", "main")
    good, missing = ab["bench_tiny.Loop.time_work"], ab["bench_tiny.Loop.time_nope"]
    assert good.error is None and len(good.base) == len(good.head) == 10
    assert all(x > 0 for x in good.base + good.head)  # CPU seconds per call
    # 2 blocks of 5 (two fresh process pairs), judged once: too few blocks to decide anything.
    assert good.comparison is not None and good.stopped == "max_pairs"
    assert good.comparison.verdict == "undecided" and good.comparison.units == 2
    assert missing.error and "time_nope" in missing.error and not missing.base


# Draws a number from numpy's global generator in setup (asv_runner imports numpy, not numpy.random:
# the zygote imports that after the first block), as a benchmark seeding nothing does,
# and writes it down with the process id; exits in setup when asked to.
FORKED_BENCH = """

class Draw:
    def setup(self):
        import os

        import numpy.random

        if os.environ.get("TINY_EXIT_IN_SETUP"):
            os._exit(3)
        with open(os.environ["TINY_DRAWS"], "a") as f:
            f.write(f"{os.getpid()} {numpy.random.random()!r}\\n")

    def time_draw(self):
        sum(range(1000))
"""


def test_forked_workers_import_numpy_random_once_yet_draw_afresh_and_a_dying_one_is_named(
    tmp_path, monkeypatch
):
    """Blocks after the first are children of a zygote that imported numpy.random for them:
    each must still draw its own random numbers, as a fresh process does (one state copied
    into every child would repeat the same draw), and one that dies says so, not hangs."""
    repo, base = make_repo(tmp_path, bench=bench_source(extra=FORKED_BENCH))
    draws = tmp_path / "draws.txt"
    monkeypatch.setenv("TINY_DRAWS", str(draws))
    ab = perf.measure_ab(
        repo, base, ["bench_tiny.Draw.time_draw"], factor=1.2, pairs=15, max_pairs=15
    )
    result = ab["bench_tiny.Draw.time_draw"]
    assert result.error is None and len(result.base) == 15
    first: dict[str, str] = {}  # a process's first draw (asv's timer may run setup again)
    for line in draws.read_text().splitlines():
        pid, value = line.split()
        first.setdefault(pid, value)
    # 3 blocks, 2 sides: each a process of its own (with 2 CPUs or more, one more pair was
    # loaded ahead for a fourth block that was not needed; closed when the third block ends,
    # one of its two may not have reached setup yet on a busy machine)
    assert 6 <= len(first) <= 8
    assert len(set(first.values())) == len(first)

    monkeypatch.setenv("TINY_EXIT_IN_SETUP", "1")
    ab = perf.measure_ab(
        repo, base, ["bench_tiny.Draw.time_draw"], factor=1.2, pairs=10, max_pairs=10
    )
    failed = ab["bench_tiny.Draw.time_draw"]
    assert failed.error and "worker exited" in failed.error and not failed.base


# A module that, like bench_attention, sets a variable that an installed module reads when it
# is imported (triton: TRITON_INTERPRET), and a module after it that must not inherit it.
ENV_BENCH = """
import os

os.environ["TINY_SET_BY"] = "bench_env"
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _double(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    # tl.sum is @triton.jit'd in triton's standard library, defined when triton is imported
    tl.store(x_ptr + offs, x * 2 - tl.sum(x, axis=0) / BLOCK)


class Interpreted:
    def setup(self):
        self.x = torch.ones(16)

    def time_double(self):
        _double[(1,)](self.x, BLOCK=16)


class SetsInSetup:
    def setup(self):
        os.environ["TINY_FROM_SETUP"] = "1"  # asv sets it in this benchmark's process alone

    def time_sum(self):
        sum(range(1000))


class ChecksSetup:
    def setup(self):
        if "TINY_FROM_SETUP" in os.environ:
            raise RuntimeError("SetsInSetup's setup reached ChecksSetup")

    def time_sum(self):
        sum(range(1000))
"""

AFTER_BENCH = """
import os


class Clean:
    def setup(self):
        if "TINY_SET_BY" in os.environ:
            raise RuntimeError(f"TINY_SET_BY={os.environ['TINY_SET_BY']} reached bench_after")

    def time_sum(self):
        sum(range(1000))
"""


def test_a_module_that_sets_the_environment_for_its_imports_is_measured_under_it_alone(
    tmp_path, monkeypatch
):
    """Blocks after the first are forked from a zygote that imported what the first block's
    load imported: triton must be imported there under the TRITON_INTERPRET the benchmark's
    module set (else every later block fails: "Cannot call @triton.jit'd outside of the scope of
    a kernel"), and the next module's benchmarks, run by asv in processes of their own, must not
    inherit that module's environment; nor may a benchmark inherit what another one's setup
    set (the zygote stands in for the module's import, not for a setup)."""
    pytest.importorskip("triton", reason="the interpreter benchmark needs triton (gpu extra)")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # suites/conftest.py sets it here
    monkeypatch.delenv("TINY_SET_BY", raising=False)
    repo, _ = make_repo(tmp_path)
    (repo / "benchmarks" / "bench_env.py").write_text(ENV_BENCH)
    (repo / "benchmarks" / "bench_after.py").write_text(AFTER_BENCH)
    base = commit(repo, "two more benchmark modules")
    names = [
        "bench_env.Interpreted.time_double",
        "bench_env.SetsInSetup.time_sum",
        "bench_env.ChecksSetup.time_sum",
        "bench_after.Clean.time_sum",
    ]
    ab = perf.measure_ab(repo, base, names, factor=1.2, pairs=10, max_pairs=10)
    for name in names:
        assert ab[name].error is None, f"{name}: {ab[name].error}"
        assert len(ab[name].base) == len(ab[name].head) == 10  # 2 blocks: a forked one too


# The tiny loop's work done in a child process (as PluginOverhead runs pytest, CpuLaunch a gloo
# group): 50 times N iterations there, so that the child's work outweighs its Python start-up.
CHILD_BENCH = """

class InChild:
    def time_work_in_a_child(self):
        import os
        import subprocess
        import sys

        here = os.path.dirname(tinylib.__file__)
        code = f"import sys; sys.path.insert(0, {here!r}); import tinylib as t; t.work(50 * t.N)"
        subprocess.run([sys.executable, "-S", "-c", code], check=True)


class InForkserverChild:
    # As reference_impls.collectives.launch starts its gloo processes: forked by a forkserver,
    # which is this process's child and reaps them itself.
    def setup(self):
        import multiprocessing

        self.context = multiprocessing.get_context("forkserver")

    def time_work_in_a_forkserver_child(self):
        child = self.context.Process(target=sum, args=(range(100 * tinylib.N),))
        child.start()
        child.join()
"""


def test_work_done_in_other_processes_is_in_the_a_b_samples(tmp_path):
    """A/B samples are CPU time; a benchmark whose work runs in other processes must be timed
    with their CPU time, or a 10x slower child reads as unchanged (the worker only waits for
    it): a child it waits for itself (subprocess), and a child of a forkserver it started
    (which reaps it: the worker sees its time only through the forkserver). The children's
    work on the base is ~50 ms (50 N iterations; a sum over 100 N), on the head 10 times that,
    next to a process start of ~5-20 ms CPU; the bound 3 leaves room for starts 3x slower than
    that, and without the children's time the ratio is ~1 (start, wait and reap alike)."""
    repo, base = make_repo(tmp_path, bench=bench_source(extra=CHILD_BENCH))
    git(repo, "checkout", "-q", "-b", "feature")
    commit(repo, "ten times the work", n=10 * BASE_N)
    names = [
        "bench_tiny.InChild.time_work_in_a_child",
        "bench_tiny.InForkserverChild.time_work_in_a_forkserver_child",
    ]
    ab = perf.measure_ab(repo, base, names, factor=1.2, pairs=10, max_pairs=10)
    for name in names:
        assert ab[name].error is None, f"{name}: {ab[name].error}"
        ratio = statistics.median(ab[name].head) / statistics.median(ab[name].base)
        assert ratio > 3, f"{name}: head/base {ratio:.2f}: the children's CPU time is missing"


# The tiny loop with a budget of its own, and with one that is not a number of seconds.
BUDGET_BENCH = """

class OwnBudget:
    harness_ab_budget = 0.001

    def time_work(self):
        tinylib.work(tinylib.N)


class BadBudget:
    harness_ab_budget = "soon"

    def time_work(self):
        tinylib.work(tinylib.N)
"""


def test_a_benchmark_that_sets_its_own_a_b_budget_is_sampled_for_that_long(tmp_path):
    """harness_ab_budget replaces --ab-budget for its benchmark: 1 ms of pairs after the first
    stops at the first pair whose clock is past it (2 pairs here, never the 60 of the plan,
    which 600 s would buy); a value that is not seconds is an error naming it."""
    repo, base = make_repo(tmp_path, bench=bench_source(extra=BUDGET_BENCH))
    names = ["bench_tiny.OwnBudget.time_work", "bench_tiny.BadBudget.time_work"]
    ab = perf.measure_ab(repo, base, names, factor=1.2, pairs=60, max_seconds=600)
    own = ab["bench_tiny.OwnBudget.time_work"]
    assert own.error is None and own.stopped == "budget" and len(own.base) <= 2
    bad = ab["bench_tiny.BadBudget.time_work"]
    assert bad.error and "harness_ab_budget" in bad.error and "'soon'" in bad.error


# The tiny loop, writing down the parent of each process that sets it up (a zygote, ab.py).
PARENTS_BENCH = """

class Parent:
    def setup(self):
        import os

        with open(os.environ["TINY_PARENTS"], "a") as f:
            f.write(f"{os.getppid()}\\n")

    def time_work(self):
        tinylib.work(tinylib.N)
"""


def test_a_10x_regression_is_measured_again_by_new_processes_and_read_twice(tmp_path, monkeypatch):
    """The real end-to-end run of a regression: a `regressed` reading is measured a second
    time by workers forked from a new zygote pair (decision.settle), and both read 10x.
    CPU time per call, so the machine's load does not move the ratio much; the bound below
    allows it to be read anywhere from 5x to 20x."""
    repo, base = make_repo(tmp_path, bench=bench_source(extra=PARENTS_BENCH))
    git(repo, "checkout", "-q", "-b", "feature")
    commit(repo, "ten times the work", n=10 * BASE_N)
    parents = tmp_path / "parents.txt"
    monkeypatch.setenv("TINY_PARENTS", str(parents))
    ab = perf.measure_ab(
        repo,
        base,
        ["bench_tiny.Parent.time_work"],
        factor=perf.DEFAULT_FACTOR,
        pairs=50,
        max_pairs=50,
        max_seconds=600,  # far more than 10 blocks need at any load: max_pairs stops it
    )
    result = ab["bench_tiny.Parent.time_work"]
    assert result.error is None and result.settled() == "regressed"
    # Two readings that agree settle it; a second that could not decide on a busy machine
    # (undecided: a load burst widened its interval) calls a third.
    readings = result.measurements()
    assert len(readings) in (2, 3) and readings[0].comparison is not None
    regressed = [r for r in readings if r.comparison and r.comparison.verdict == "regressed"]
    assert len(regressed) == 2 and regressed[0] is readings[0]
    for reading in regressed:
        assert reading.comparison is not None and 5 < reading.comparison.estimate < 20
    # Two zygotes (base, head) per reading, new ones for each.
    assert len(set(parents.read_text().split())) == 2 * len(readings)


# A setup_cache that writes down the process that computed it, and a benchmark that uses it and
# the file the setup_cache wrote into its working directory (asv gives it a folder of its own).
CACHED_BENCH = """

class Cached:
    def setup_cache(self):
        import os

        with open(os.environ["TINY_CACHES"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        with open("written-by-setup-cache.txt", "w") as f:
            f.write(str(os.getpid()))
        return [os.getpid()] * 1000

    def setup(self, cached):
        with open("written-by-setup-cache.txt") as f:
            if int(f.read()) != cached[0]:
                raise RuntimeError("the file is another setup_cache's")

    def time_sum(self, cached):
        sum(cached)
"""


def test_setup_cache_is_computed_once_per_side_and_its_value_reused_by_later_blocks(
    tmp_path, monkeypatch
):
    """asv computes a setup_cache once per run; the A/B pairs do so once per side (base and
    head run different code), not once per block: 3 blocks, 2 computations. Each side's runs
    in a folder of its own, where that side's benchmarks run too: a file it writes into its
    working directory is that side's (a shared folder gives one side the other's file)."""
    repo, base = make_repo(tmp_path, bench=bench_source(extra=CACHED_BENCH))
    caches = tmp_path / "caches.txt"
    monkeypatch.setenv("TINY_CACHES", str(caches))
    ab = perf.measure_ab(
        repo, base, ["bench_tiny.Cached.time_sum"], factor=1.2, pairs=15, max_pairs=15
    )
    result = ab["bench_tiny.Cached.time_sum"]
    assert result.error is None and len(result.base) == len(result.head) == 15
    assert len(caches.read_text().splitlines()) == 2


# The tiny loop, writing down each process that sets it up and each that tears it down.
SETUP_BENCH = """

class SetUp:
    def setup(self):
        import os

        with open(os.environ["TINY_SETUPS"], "a") as f:
            f.write(f"setup {os.getpid()}\\n")

    def teardown(self):
        import os

        with open(os.environ["TINY_SETUPS"], "a") as f:
            f.write(f"teardown {os.getpid()}\\n")

    def time_work(self):
        tinylib.work(tinylib.N)
"""


def test_every_worker_that_sets_a_benchmark_up_tears_it_down(tmp_path, monkeypatch):
    """asv runs teardown after every setup (a benchmark's setup makes temporary folders, starts
    servers). So does every A/B worker, the pair set up ahead for a block that sampling then
    did not need among them (prefetch, on two CPUs or more, as in CI): it exited without
    teardown, and every A/B left one setup's folders in /tmp (bench_scaling's, bench_training's;
    found 2026-12-03). 3 blocks of 5 pairs: at least 6 workers, each tearing down as often as it
    set up."""
    repo, base = make_repo(tmp_path, bench=bench_source(extra=SETUP_BENCH))
    log = tmp_path / "setups.txt"
    monkeypatch.setenv("TINY_SETUPS", str(log))
    name = "bench_tiny.SetUp.time_work"
    ab = perf.measure_ab(repo, base, [name], factor=1.2, pairs=15, max_pairs=15)
    assert ab[name].error is None and len(ab[name].base) == 15
    assert ab[name].seconds is not None and ab[name].seconds > 0  # its wall time, kept
    events = [line.split() for line in log.read_text().splitlines()]
    # asv sets a timing benchmark up again (after a teardown) before each sample but the first.
    set_up = collections.Counter(pid for verb, pid in events if verb == "setup")
    torn_down = collections.Counter(pid for verb, pid in events if verb == "teardown")
    assert len(set_up) >= 6
    assert torn_down == set_up, f"set up more often than torn down: {set_up - torn_down}"


# The tiny loop whose teardown fails once the flag file exists (asv also tears down between
# samples, so it must not fail while the benchmark is being set up and calibrated).
TEARDOWN_RAISES_BENCH = """

class TeardownRaises:
    def teardown(self):
        import os

        if os.path.exists(os.environ["TINY_RAISE"]):
            with open(os.environ["TINY_RAISE"], "a") as f:
                f.write("teardown\\n")
            raise RuntimeError("teardown failed")

    def time_work(self):
        tinylib.work(tinylib.N)
"""


def test_a_teardown_that_raises_is_the_requests_error_and_is_not_run_again(tmp_path):
    """A worker tears its benchmark down once: on the driver's request, or when its requests
    end without one. A teardown that raises answers that request with the error, and the end of
    the requests does not run it a second time."""
    repo, _ = make_repo(tmp_path, bench=bench_source(extra=TEARDOWN_RAISES_BENCH))
    flag = tmp_path / "raise.txt"
    worker = subprocess.Popen(
        [sys.executable, str(Path(perf.ab.__file__).with_name("_ab_worker.py")), "benchmarks"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"TINY_RAISE": str(flag)},
        cwd=repo,
    )
    assert worker.stdin is not None and worker.stdout is not None

    def ask(request: dict) -> dict:
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(json.dumps(request) + "\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())

    try:
        loaded = ask({"op": "load", "name": "bench_tiny.TeardownRaises.time_work"})
        assert loaded["ok"], loaded
        flag.write_text("")
        reply = ask({"op": "teardown"})
        assert not reply["ok"] and "teardown failed" in reply["error"]
        worker.stdin.close()
        assert worker.wait(timeout=120) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert flag.read_text().splitlines() == ["teardown"]


def test_a_worker_start_that_is_not_a_choice_is_refused_by_name(project):
    repo, c = project
    with pytest.raises(perf.PerfError, match="'spawn'"):
        perf.measure_ab(repo, c["base"], ["bench_tiny.Loop.time_work"], factor=1.2, start="spawn")


def test_ci_step_in_a_checkout_without_benchmarks_reports_why_and_exits_2(tmp_path):
    git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "README.md").write_text("no benchmarks here\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "first")
    result = perf.ci_step(
        tmp_path, tmp_path / "reports", perf.PerfStepConfig(machine=MACHINE), echo=None
    )
    assert result.exit_code == 2
    assert "asv.conf.json" in result.skipped_reason
    assert result.skipped_reason in result.markdown


@pytest.mark.parametrize(
    "manifest",
    ["{not json", "[]", '{"commit": "abc"}', '{"commit": "HEAD", "env": "@ENV", "machine": '
     '"@MACHINE", "recorded_at": "t", "source": "s"}'],
)  # fmt: skip
def test_a_damaged_stored_baseline_fails_the_step_by_name_and_is_not_replaced(
    tmp_path, no_base_ref_env, manifest
):
    # Read as "no baseline", it would pass the step and be overwritten by this run's results:
    # a regression in this very run would become the next run's baseline.
    repo, _ = make_tiny_repo(tmp_path)
    path = repo / ".asv" / "baseline" / f"{MACHINE}.json"
    path.parent.mkdir(parents=True)
    manifest = manifest.replace("@ENV", perf.env_name()).replace("@MACHINE", MACHINE)
    path.write_text(manifest)
    with pytest.raises(perf.PerfError, match=f"{path}.*delete it"):
        perf.stored_baseline(repo, machine=MACHINE, env=perf.env_name())
    result = perf.ci_step(repo, tmp_path / "r", perf.PerfStepConfig(machine=MACHINE), echo=None)
    assert result.exit_code == 2 and "perf step could not run" in result.markdown
    assert str(path) in result.markdown
    assert path.read_text() == manifest


def test_a_first_run_whose_benchmark_failed_is_not_kept_as_the_baseline(tmp_path, no_base_ref_env):
    # Kept, its failed benchmark would be "failed in base" for every later run against it:
    # never gated, however slow it became once fixed.
    broken = "\n\nclass Broken:\n    def time_broken(self):\n        raise RuntimeError('boom')\n"
    repo, _ = make_repo(tmp_path, bench=bench_source(repeat=REPEAT, extra=broken))
    result = perf.ci_step(repo, tmp_path / "r", perf.PerfStepConfig(machine=MACHINE), echo=None)
    assert result.exit_code == 1, result.markdown  # the failing benchmark fails the step
    assert result.baseline_recorded is None
    assert not (repo / ".asv" / "baseline" / f"{MACHINE}.json").exists()
    assert "nothing was kept as a baseline: benchmarks failed in this run" in result.markdown


def test_a_run_in_another_environment_names_the_stored_baseline_and_keeps_it(
    tmp_path, no_base_ref_env
):
    # The stored baseline is made another environment's (as if the runner's interpreter had
    # changed since): this run must say whose it is, and record its own beside it, not over it.
    repo, _ = make_tiny_repo(tmp_path)
    commit(repo, "second", readme="two\n")
    perf.ci_step(repo, tmp_path / "r1", perf.PerfStepConfig(machine=MACHINE), echo=None)
    env, other = perf.env_name(), "existing-py_opt_other_python3"
    store = repo / ".asv" / "baseline"
    manifest = json.loads((store / f"{MACHINE}.json").read_text())
    entry = {**manifest["baselines"].pop(env), "env": other}
    (store / f"{MACHINE}.json").write_text(json.dumps({"baselines": {other: entry}}))
    [kept] = [p for p in (store / MACHINE).glob("*.json") if p.name != "machine.json"]
    data = json.loads(kept.read_text())
    kept.unlink()
    kept = kept.with_name(f"{entry['commit'][:8]}-{other}.json")
    kept.write_text(json.dumps({**data, "env_name": other}))

    lines: list[str] = []
    result = perf.ci_step(
        repo, tmp_path / "r2", perf.PerfStepConfig(machine=MACHINE), echo=lines.append
    )
    assert result.exit_code == 0 and "no baseline" in (result.skipped_reason or "")
    said = (
        f"this run is machine `{MACHINE}`, environment `{env}`, and the stored baseline(s) are "
        f"for machine `{MACHINE}`, environment `{other}`"
    )
    assert said in result.markdown and any(said in line for line in lines)
    both = json.loads((store / f"{MACHINE}.json").read_text())["baselines"]
    assert sorted(both) == sorted([env, other]) and both[other] == entry
    assert json.loads(kept.read_text())["env_name"] == other  # its results are still there
    assert perf.stored_baseline(repo, machine=MACHINE, env=env) is not None


def test_calibrate_leaves_time_info_benchmarks_out(tmp_path, monkeypatch):
    """A time_info_* benchmark is never gated, so there is no factor to calibrate for it (and
    those are the ones whose pairs cost seconds): with nothing else, calibrate says so."""
    repo, _ = make_repo(tmp_path, bench="from . import tinylib\n" + INFO_BENCH)
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(perf_cli, ["calibrate", "--machine", MACHINE, "--trials", "1"])
    assert result.exit_code == 2, result.output
    assert "no timing benchmark matched" in result.output


def test_calibrate_runs_for_real_and_records_what_it_measured(project, monkeypatch):
    # Wiring only (the worker's list and extra-work requests, the progress bar, the record):
    # one trial at a budget far too small to decide, so no verdict is asserted.
    repo, c = project
    git(repo, "checkout", "-q", c["docs"])
    monkeypatch.chdir(repo)
    try:
        result = CliRunner().invoke(
            perf_cli,
            ["calibrate", "--machine", MACHINE, "--trials", "1", "--slowdown", "0.25"]
            + ["--ab-pairs", "5", "--ab-budget", "2"],
        )
    finally:
        git(repo, "checkout", "-q", "main")
    assert result.exit_code == 0, result.output
    assert "1 benchmark(s), 1 trials of A/A and of +25% at factor 1.2" in result.output
    assert "bench_tiny.Loop.time_work: CV" in result.output
    data = json.loads((repo / ".asv" / "calibration" / f"{MACHINE}.json").read_text())
    record = data["factors"]["1.2"]["bench_tiny.Loop.time_work"]
    assert record["trials"] == 1 and set(record["caught"]) == {"0.25"}
    assert record["errors"] == []  # both levels measured (how many pairs: the load's)
