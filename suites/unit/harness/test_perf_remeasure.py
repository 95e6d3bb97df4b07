"""A `regressed` A/B reading fails the gate only when an independent measurement reads it too.

The gate's A/A runs on a busy 2-core VM read identical code as 1.21x and 1.37x in 2 of 88 runs,
every block of the run slower on one side (docs/perf.md, "The gate's error rates, measured"):
a difference one measurement carries, which its blocks' interval cannot see. decision.settle
re-measures a regression with new worker processes and takes the verdict two readings share.
Synthetic pairs throughout (seeded): the rule, not the machine, is under test.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from harness.perf.ab import ABResult
from harness.perf.calibrate import calibrate
from harness.perf.counts import judge_counts
from harness.perf.decision import MEASUREMENTS, Verdict, settle
from harness.perf.gate_report import EXIT_OK, EXIT_REGRESSION, EXIT_UNDECIDED, GateReport, Row
from harness.perf.gate_report import RowStatus as S
from harness.perf.gating import apply_ab, apply_counts
from harness.perf.sequential import judge_pairs

R, U, IMP, X = Verdict.REGRESSED, Verdict.UNCHANGED, Verdict.IMPROVED, Verdict.UNDECIDED
NAME = "b.C.time_x"


@pytest.mark.parametrize(
    ("readings", "verdict"),
    [
        ([], None),
        ([U], U),  # only a regression is measured again
        ([IMP], IMP),
        ([X], X),  # undecided fails on its own (exit 2)
        ([R], None),
        ([R, R], R),
        ([R, U], None),  # they disagree: a third decides
        ([R, U, U], U),
        ([R, U, R], R),
        ([R, X, X], X),
        ([R, U, IMP], X),  # no two agree: never a pass
        ([R, IMP, X], X),
    ],
)
def test_settle_takes_the_verdict_two_independent_readings_share(readings, verdict):
    assert settle(readings) is verdict


def test_settle_always_decides_within_the_most_measurements_allowed():
    for first in Verdict:
        for second in Verdict:
            for third in Verdict:
                readings = [first, second, third][:MEASUREMENTS]
                assert settle(readings) is not None


def measured(ratio: float, seed: int, *, shift_every_block: float = 0.0) -> ABResult:
    """60 pairs of ~1 ms with 2% noise; shift_every_block: a bias every block shares (the
    kind of difference one measurement carries), as a factor on the head side."""
    rng = random.Random(seed)
    base = [1e-3 * math.exp(rng.gauss(0, 0.02)) for _ in range(60)]
    head = [ratio * (1 + shift_every_block) * b * math.exp(rng.gauss(0, 0.02)) for b in base]
    result = ABResult(NAME, base, head)
    result.comparison = judge_pairs(base, head, 1.2)
    return result


def with_readings(first: ABResult, *more: ABResult) -> ABResult:
    first.confirmations = list(more)
    return first


def report() -> GateReport:
    row = Row(NAME, "env", S.UNCHANGED, 1.0, 1.0, "seconds", 7, 7, ratio=1.0, kind="time")
    return GateReport(EXIT_OK, "a" * 40, "b" * 40, "m", 1.2, [row], [])


def test_a_regression_one_measurement_carried_and_two_others_refute_passes():
    # The first measurement's every block reads the head 1.3x slower (identical code, a bias
    # of that measurement); two fresh ones read 1.0: unchanged, exit 0, all three on record.
    result = with_readings(
        measured(1.0, 1, shift_every_block=0.3), measured(1.0, 2), measured(1.0, 3)
    )
    assert result.comparison is not None and result.comparison.verdict is R  # the trap
    assert result.settled() is U
    out = apply_ab(report(), {NAME: result})
    (row,) = out.rows
    assert out.exit_code == EXIT_OK and row.status is S.UNCHANGED
    assert row.ratio == pytest.approx(1.0, abs=0.03)  # the row shows a reading that agrees
    assert row.pairs == [
        [b, h]
        for b, h in zip(result.confirmations[0].base, result.confirmations[0].head, strict=True)
    ]
    kept = json.loads(json.dumps(out.to_json()))["rows"][0]["readings"]
    assert [k["verdict"] for k in kept] == ["regressed", "unchanged", "unchanged"]
    assert kept[0]["ratio"] == pytest.approx(1.3, rel=0.03) and len(kept[0]["pairs"]) == 60
    assert "measured regressed 1.30, unchanged 1.00, unchanged 1.00" in out.table()


def test_a_real_regression_read_twice_fails_the_gate():
    result = with_readings(measured(1.5, 4), measured(1.5, 5))
    assert result.settled() is R
    out = apply_ab(report(), {NAME: result})
    assert out.exit_code == EXIT_REGRESSION and out.rows[0].status is S.REGRESSED
    assert out.rows[0].ratio == pytest.approx(1.5, rel=0.03)
    assert [r["verdict"] for r in out.rows[0].readings or []] == ["regressed", "regressed"]


def test_a_regression_confirmed_by_the_third_reading_fails_the_gate():
    result = with_readings(measured(1.5, 6), measured(1.0, 7), measured(1.5, 8))
    out = apply_ab(report(), {NAME: result})
    assert out.exit_code == EXIT_REGRESSION and out.rows[0].status is S.REGRESSED


def test_three_readings_that_disagree_are_undecided_and_say_so():
    noisy = measured(1.0, 9)
    rng = random.Random(10)
    noisy.head = [h * math.exp(rng.gauss(0, 0.5)) for h in noisy.head]
    result = with_readings(measured(1.5, 11), measured(0.5, 12), noisy)
    out = apply_ab(report(), {NAME: result})
    (row,) = out.rows
    assert out.exit_code == EXIT_UNDECIDED and row.status is S.UNDECIDED
    assert "3 independent A/B measurements" in row.would_need
    assert "regressed 1.5" in row.would_need and "improved 0.5" in row.would_need


def test_a_confirmation_that_failed_to_measure_cannot_clear_a_regression():
    failed = ABResult(NAME, [], [], error="head: worker exited 1")
    result = with_readings(measured(1.5, 13), failed, measured(1.0, 14))
    assert result.settled() is X  # regressed, could not tell, unchanged: no two agree
    out = apply_ab(report(), {NAME: result})
    assert out.exit_code == EXIT_UNDECIDED
    assert [r["verdict"] for r in out.rows[0].readings or []][1] == "failed: head: worker exited 1"


def test_a_single_regressed_reading_without_confirmations_still_fails():
    # Callers that measure once (GPU pairs, synthetic results) keep the reading they have.
    out = apply_ab(report(), {NAME: measured(1.5, 15)})
    assert out.exit_code == EXIT_REGRESSION and out.rows[0].readings is None


def test_a_count_regression_needs_two_ab_readings_to_be_confirmed():
    # Counts 10% up at a 5% threshold: a count regression, which A/B pairs at 1.05 confirm.
    found = {NAME: judge_counts([1e6, 1e6 + 3, 1e6 - 2], [1.1e6, 1.1e6 + 1, 1.1e6 - 4], 0.05)}
    biased = with_readings(
        measured(1.0, 16, shift_every_block=0.3), measured(1.0, 17), measured(1.0, 18)
    )
    out = apply_counts(report(), found, {NAME: biased})
    assert out.exit_code == EXIT_OK and out.rows[0].status is S.UNCHANGED
    assert "not confirmed" in out.rows[0].counts and "(3 measurements)" in out.rows[0].counts
    real = with_readings(measured(1.1, 19), measured(1.1, 20))
    out = apply_counts(report(), found, {NAME: real})
    assert out.exit_code == EXIT_REGRESSION and "confirmed by A/B at 1.05" in out.rows[0].counts


def test_calibrate_counts_the_settled_verdict_not_the_first_reading():
    def measure(names, level):
        del level
        return {
            n: with_readings(
                measured(1.0, 21, shift_every_block=0.3), measured(1.0, 22), measured(1.0, 23)
            )
            for n in names
        }

    (found,) = calibrate([NAME], measure, factor=1.2, trials=2, slowdowns=[0.5])
    assert found.false_alarm_rate == 0.0 and found.pass_rate == 1.0


def test_a_count_confirmation_read_once_does_not_inherit_the_rows_earlier_readings():
    # The row's own A/B read [regressed, unchanged, unchanged] (unchanged, 3 readings); the
    # count tier's confirmation then reads once, with too few blocks: the row shows that one
    # reading, not the earlier three, and no interval or advice of theirs.
    first = apply_ab(
        report(),
        {
            NAME: with_readings(
                measured(1.0, 25, shift_every_block=0.3), measured(1.0, 26), measured(1.0, 27)
            )
        },
    )
    assert first.rows[0].readings is not None and len(first.rows[0].readings) == 3
    found = {NAME: judge_counts([1e6, 1e6 + 3, 1e6 - 2], [1.1e6, 1.1e6 + 1, 1.1e6 - 4], 0.05)}
    few = ABResult(NAME, [1e-3] * 20, [1.1e-3] * 20)  # 4 blocks: can never decide
    out = apply_counts(first, found, {NAME: few})
    (row,) = out.rows
    assert out.exit_code == EXIT_UNDECIDED and row.status is S.UNDECIDED
    assert row.readings is None and row.passes == 20
    assert (row.low, row.high) == (None, None)
    assert "can never show a difference" in row.would_need
    assert "(3 measurements)" not in row.counts


def test_the_report_says_what_each_rows_a_b_cost_and_names_the_slowest():
    """Every reading's wall time adds to its row's (a regression measured again costs its
    readings together); the report sums them and names the slowest rows first, so a user sees
    where the gate's minutes go. A sampler that kept no time (None) leaves its row out."""
    rows = [
        Row(f"b.C{i}.time_x", "env", S.UNCHANGED, 1.0, 1.0, "seconds", 7, 7, ratio=1.0, kind="time")
        for i in range(8)
    ]
    results = {}
    for i, row in enumerate(rows):
        result = measured(1.0, 100 + i)
        result.seconds = None if i == 7 else 10.0 * (i + 1)
        results[row.name] = result
    twice = with_readings(measured(1.5, 200), measured(1.0, 201), measured(1.0, 202))
    for n, m in enumerate(twice.measurements()):
        m.seconds = 100.0 + n  # 100 + 101 + 102
    results[rows[0].name] = twice
    out = apply_ab(GateReport(EXIT_OK, "a" * 40, "b" * 40, "m", 1.2, rows, []), results)
    took = {r.name: r.ab_seconds for r in out.rows}
    assert took["b.C0.time_x"] == 303.0 and took["b.C3.time_x"] == 40.0
    assert took["b.C7.time_x"] is None
    assert [k["seconds"] for k in out.rows[0].readings or []] == [100.0, 101.0, 102.0]
    total = 303 + sum(10 * (i + 1) for i in range(1, 7))
    assert (
        f"A/B pairs: {total / 60:.1f} min for 7 benchmarks; the longest: `b.C0.time_x` 303 s, "
        "`b.C6.time_x` 70 s, `b.C5.time_x` 60 s, `b.C4.time_x` 50 s, `b.C3.time_x` 40 s."
    ) in out.markdown()
    assert json.loads(json.dumps(out.to_json()))["rows"][3]["ab_seconds"] == 40.0


def test_a_count_confirmations_a_b_adds_to_its_rows_cost():
    # The row's own A/B took 30 s; the count regression's confirmation at 1.05, two readings of
    # 20 and 25 s: the row cost 75 s, whichever reading decided it.
    found = {NAME: judge_counts([1e6, 1e6 + 3, 1e6 - 2], [1.1e6, 1.1e6 + 1, 1.1e6 - 4], 0.05)}
    own = measured(1.0, 30)
    own.seconds = 30.0
    timed = apply_ab(report(), {NAME: own})
    assert timed.rows[0].ab_seconds == 30.0
    confirmation = with_readings(measured(1.1, 31), measured(1.1, 32))
    confirmation.seconds, confirmation.confirmations[0].seconds = 20.0, 25.0
    out = apply_counts(timed, found, {NAME: confirmation})
    assert out.exit_code == EXIT_REGRESSION and out.rows[0].ab_seconds == 75.0
