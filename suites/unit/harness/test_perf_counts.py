"""The instruction-count tier's logic (harness/perf/counts.py, gating.apply_counts).

Counts and A/B pairs here are constructed or drawn from a seeded generator: the verdicts do
not depend on Valgrind or on how busy the machine is. The real Valgrind run is
suites/integration/harness/test_perf_counts_valgrind.py.
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli.perf import perf as perf_cli
from harness.perf import PerfError, counts
from harness.perf.ab import ABResult
from harness.perf.counts import CountResult, CountSide, CountVerdict, judge_counts
from harness.perf.gate_report import EXIT_OK, EXIT_REGRESSION, EXIT_UNDECIDED, GateReport, Row
from harness.perf.gate_report import RowStatus as S
from harness.perf.gating import apply_counts

BASE = [1_000_000.0, 1_000_003.0, 999_998.0]  # per-call counts, repeats of one side


def scaled(values: list[float], factor: float) -> list[float]:
    return [v * factor for v in values]


@pytest.mark.parametrize(
    ("factor", "verdict"),
    [
        (1.10, CountVerdict.REGRESSED),
        (1.05, CountVerdict.REGRESSED),  # the threshold itself is a regression
        (1.049, CountVerdict.UNCHANGED),
        (1.0, CountVerdict.UNCHANGED),
        (0.96, CountVerdict.UNCHANGED),
        (1 / 1.05, CountVerdict.IMPROVED),
        (0.5, CountVerdict.IMPROVED),
    ],
)
def test_the_count_ratio_against_the_threshold_gives_the_count_verdict(factor, verdict):
    found = judge_counts(BASE, scaled(BASE, factor), 0.05)
    assert found.verdict is verdict
    assert found.ratio == pytest.approx(factor, rel=1e-5)


def test_a_per_benchmark_threshold_moves_the_line():
    assert judge_counts(BASE, scaled(BASE, 1.08), 0.10).verdict is CountVerdict.UNCHANGED
    assert judge_counts(BASE, scaled(BASE, 1.08), 0.05).verdict is CountVerdict.REGRESSED


def test_repeats_that_disagree_are_unstable_not_unchanged():
    # The median 2% above the smallest is more than a quarter of a 4% threshold.
    wobbly = [1_000_000.0, 1_030_000.0, 1_020_000.0]
    found = judge_counts(BASE, wobbly, 0.04)
    assert found.verdict is CountVerdict.UNSTABLE
    assert found.spread == pytest.approx(0.02)
    # The same spread is stable enough at a 10% threshold.
    assert judge_counts(BASE, wobbly, 0.10).verdict is CountVerdict.UNCHANGED


def test_the_smallest_repeat_is_the_count_so_an_allocator_spike_does_not_move_it():
    # pymalloc's housekeeping adds a few percent to some regions, never takes any away.
    spiky = [1_000_000.0, 1_040_000.0, 1_000_002.0, 1_000_001.0, 1_015_000.0]
    found = judge_counts(BASE, spiky, 0.05)
    assert found.verdict is CountVerdict.UNCHANGED
    assert found.ratio == pytest.approx(1_000_000 / 999_998)


def test_no_count_on_a_side_is_a_failed_count():
    assert judge_counts(BASE, [], 0.05).verdict is CountVerdict.FAILED
    assert judge_counts([0.0, math.nan], BASE, 0.05).verdict is CountVerdict.FAILED


@pytest.mark.parametrize("bad", [0, -0.1, math.inf, math.nan, 10, True])
def test_a_threshold_that_is_not_a_fraction_is_refused_by_name(bad):
    with pytest.raises(PerfError, match="not a count threshold"):
        counts.check_threshold(bad)


def side(per_call: list[float], **kw) -> CountSide:
    return CountSide(per_call, {}, 100, 1.0, **kw)


def test_a_benchmark_setting_its_own_threshold_is_judged_at_it():
    result = CountResult("b.T.time_x", side(BASE), side(scaled(BASE, 1.08), setting=0.1))
    assert result.judge(0.05).verdict is CountVerdict.UNCHANGED
    assert result.judge(0.05).threshold == 0.1


def test_an_ineligible_side_or_a_failed_run_is_said_so():
    waits = CountResult("b", side(BASE), side(BASE, ineligible="waited in 3 of 3"))
    found = waits.judge(0.05)
    assert found.verdict is CountVerdict.INELIGIBLE and "head: waited in 3 of 3" in found.why
    failed = CountResult("b", side(BASE), None, error="head: valgrind exited 1")
    assert failed.judge(0.05).verdict is CountVerdict.FAILED


def test_worker_reports_become_counts_per_call_and_ineligibility():
    # Two repeats of (10 calls, 20 calls), each region carrying 5,000 of its own: the
    # difference of a large region and the smallest small one is 10 calls' count.
    dumps = {
        "harness-rep-0-a": {"Ir": 1_005_000, "D1mr": 600},
        "harness-rep-0-b": {"Ir": 2_005_000, "D1mr": 1_100},
        "harness-rep-1-a": {"Ir": 1_045_000, "D1mr": 700},  # an allocator spike
        "harness-rep-1-b": {"Ir": 2_005_010, "D1mr": 1_200, "DLmr": 10},
    }
    reply = {"number": 10, "reps": 2, "regions": 4, "threads": 1, "waits": 0}
    got = counts._side_from(reply, dumps, 3.0)
    assert got.per_call == [100_000.0, 100_001.0]
    # callgrind leaves trailing zero events out: DLmr is 0 where it is missing.
    assert got.events == {"D1mr": 55.0, "DLmr": 0.5}
    assert got.ineligible == ""
    busy = dict(reply, threads=4, waits=4, children_cpu_s=0.5, blocks=4, cuda=True)
    why = counts._side_from(busy, dumps, 3.0).ineligible
    for part in ("4 threads", "waited in 4 of 4", "child processes", "block I/O in 4", "CUDA"):
        assert part in why
    # Some regions that waited or read a block are chance, not a benchmark that waits.
    assert counts._side_from(dict(reply, waits=1, blocks=3), dumps, 3.0).ineligible == ""
    assert counts._side_from({"opt_out": "harness_counts = False"}, {}, 1.0).ineligible
    with pytest.raises(PerfError, match="no counted region"):
        counts._side_from(reply, {}, 1.0)


def test_callgrind_part_files_are_read_by_their_dump_name(tmp_path):
    prefix = tmp_path / "callgrind.out"
    (tmp_path / "callgrind.out.1").write_text(
        "version: 1\ndesc: Trigger: Client Request: harness-rep-0\nevents: Ir Dr\n"
        "fn=(1) f\n3 5 1\nsummary: 123 45\ntotals: 123 45\n"
    )
    (tmp_path / "callgrind.out.2").write_text(
        "desc: Trigger: Client Request: harness-empty\nevents: Ir Dr\ntotals: 7 1\n"
    )
    assert counts.parse_dumps(prefix) == {
        "harness-rep-0": {"Ir": 123, "Dr": 45},
        "harness-empty": {"Ir": 7, "Dr": 1},
    }


# --------------------------------------------------------------------------------------------
# The counts and the A/B confirmation together (gating.apply_counts)


def report_with(status: S = S.UNCHANGED) -> GateReport:
    row = Row("b.T.time_x", "env", status, 1.0, 1.0, "seconds", 60, 60, ratio=1.0, kind="time")
    row.low, row.high, row.factor_used = 0.98, 1.02, 1.2
    code = {S.UNCHANGED: EXIT_OK, S.UNDECIDED: EXIT_UNDECIDED}[status]
    return GateReport(code, "a" * 40, "b" * 40, "m", 1.2, [row], [])


def pairs(ratio: float, noise: float, n: int = 60, seed: int = 1) -> ABResult:
    rng = random.Random(seed)
    base = [1e-3 * math.exp(rng.gauss(0, noise)) for _ in range(n)]
    head = [ratio * 1e-3 * math.exp(rng.gauss(0, noise)) for _ in range(n)]
    return ABResult("b.T.time_x", base, head)


def count(ratio: float) -> dict[str, counts.CountComparison]:
    return {"b.T.time_x": judge_counts(BASE, scaled(BASE, ratio), 0.05)}


def test_a_count_regression_confirmed_by_ab_pairs_fails_the_gate():
    out = apply_counts(report_with(), count(1.10), {"b.T.time_x": pairs(1.10, 0.01)})
    assert out.exit_code == EXIT_REGRESSION
    assert out.rows[0].status is S.REGRESSED
    assert "confirmed by A/B at 1.05" in out.rows[0].counts
    assert out.rows[0].method == "A/B pairs (count confirmation)"


def test_a_count_regression_the_pairs_refute_keeps_the_rows_verdict():
    out = apply_counts(report_with(), count(1.10), {"b.T.time_x": pairs(1.0, 0.005)})
    assert out.exit_code == EXIT_OK
    assert out.rows[0].status is S.UNCHANGED
    assert "not confirmed" in out.rows[0].counts


def test_a_count_regression_the_pairs_cannot_tell_is_undecided_never_ok():
    out = apply_counts(report_with(), count(1.10), {"b.T.time_x": pairs(1.05, 0.3)})
    assert out.exit_code == EXIT_UNDECIDED
    assert out.rows[0].status is S.UNDECIDED
    assert "neither confirmed nor refuted" in out.rows[0].counts
    failed = ABResult("b.T.time_x", [], [], error="base: worker exited 1")
    out = apply_counts(report_with(), count(1.10), {"b.T.time_x": failed})
    assert out.exit_code == EXIT_UNDECIDED
    assert "confirmation failed" in out.rows[0].counts


def test_an_unchanged_count_never_clears_an_undecided_row():
    out = apply_counts(report_with(S.UNDECIDED), count(1.0), {})
    assert out.exit_code == EXIT_UNDECIDED
    assert out.rows[0].status is S.UNDECIDED
    assert "count unchanged" in out.rows[0].counts


def test_an_unchanged_count_is_evidence_only_and_a_failed_count_is_exit_2():
    assert apply_counts(report_with(), count(1.01), {}).exit_code == EXIT_OK
    failed = {"b.T.time_x": judge_counts([], BASE, 0.05)}
    out = apply_counts(report_with(), failed, {})
    assert out.exit_code == EXIT_UNDECIDED
    assert any("could not decide" in p for p in out.problems)


# --------------------------------------------------------------------------------------------
# Missing tools: clear errors, exit 2, before any work


def test_a_missing_valgrind_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PerfError, match="valgrind"):
        counts.find_valgrind()


def test_a_missing_compiler_or_header_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-cc-here")
    with pytest.raises(PerfError, match="'no-such-cc-here'"):
        counts.build_shim(tmp_path / "cache")
    fake = tmp_path / "fakecc"
    fake.write_text(
        "#!/bin/sh\necho 'shim.c:1:10: fatal error: valgrind/callgrind.h: No such file' >&2\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(PerfError, match=r"valgrind/callgrind\.h was not found"):
        counts.build_shim(tmp_path / "cache")


def test_gate_and_ci_with_counts_exit_2_naming_valgrind_when_it_is_missing(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    for args in (["gate", "HEAD~1", "HEAD", "--counts"], ["ci", "--counts"]):
        result = CliRunner().invoke(perf_cli, args)
        assert result.exit_code == 2, result.output
        assert "valgrind" in result.output.lower()


def test_a_bad_counts_threshold_on_the_command_line_exits_2_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(perf_cli, ["gate", "A", "B", "--counts-threshold", "inf"])
    assert result.exit_code == 2
    assert "inf" in result.output


def test_the_shim_is_built_once_into_the_cache(tmp_path):
    if counts.shutil.which("cc") is None or not Path("/usr/include/valgrind/callgrind.h").exists():
        pytest.skip("no C compiler or no valgrind/callgrind.h on this machine")
    first = counts.build_shim(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert counts.build_shim(tmp_path) == first and first.stat().st_mtime_ns == stamp


def test_the_tier_sends_only_count_regressions_to_ab_pairs_at_their_own_threshold(monkeypatch):
    from harness.perf import step

    report = report_with()
    report.rows.append(dataclasses.replace(report.rows[0], name="b.T.time_y"))
    report.rows.append(dataclasses.replace(report.rows[0], name="m.GpuX.time_z"))
    counted = {
        "b.T.time_x": CountResult("b.T.time_x", side(BASE), side(scaled(BASE, 1.2), setting=0.1)),
        "b.T.time_y": CountResult("b.T.time_y", side(BASE), side(scaled(BASE, 1.01))),
    }
    asked: list[tuple[list[str], float]] = []

    def fake_counts(root, base, names, **kw):
        assert "m.GpuX.time_z" not in names  # the GPU group is never counted
        return {n: counted[n] for n in names}

    def fake_ab(root, base, names, *, factor, **kw):
        asked.append((list(names), factor))
        return {n: pairs(1.25, 0.01) for n in names}

    monkeypatch.setattr(step, "measure_counts", fake_counts)
    monkeypatch.setattr(step, "measure_ab", fake_ab)
    out, note = step.counts_tier(".", report, "a" * 40, threshold=0.05)
    assert asked == [(["b.T.time_x"], pytest.approx(1.1))]  # its own threshold, 10%
    assert {r.name: r.status for r in out.rows}["b.T.time_x"] is S.REGRESSED
    assert {r.name: r.status for r in out.rows}["b.T.time_y"] is S.UNCHANGED
    assert out.exit_code == EXIT_REGRESSION and "1 count regression" in note


def test_the_counted_run_gets_no_coverage_tracer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under `harness impact record` (or pytest-cov) these are set for every process: a tracer
    # in the counted process would be counted with the benchmark.
    from harness.perf import Project

    (tmp_path / "asv.conf.json").write_text('{"version": 1, "benchmark_dir": "benchmarks"}')
    for name in counts.COVERAGE_START_VARS:
        monkeypatch.setenv(name, "/tmp/coveragerc")
    monkeypatch.setenv("KEPT_FOR_THE_BENCHMARK", "1")
    env = counts.count_environ(Project.load(tmp_path))
    assert not set(counts.COVERAGE_START_VARS) & set(env)
    assert env["KEPT_FOR_THE_BENCHMARK"] == "1"
    assert env["PYTHONHASHSEED"] == counts.COUNT_ENV["PYTHONHASHSEED"]
