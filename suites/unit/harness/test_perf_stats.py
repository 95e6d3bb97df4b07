"""The gate's statistics (harness/perf/stats.py) and the pass records that feed them.

The numbers here are constructed, not measured: samples where each pass's head is exactly
twice its base while the passes' levels differ (a machine whose load changes between passes),
and seeded random samples compared with asv's own Mann-Whitney test.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from asv._stats import mann_whitney_u
from hypothesis import given
from hypothesis import strategies as st

from harness import perf
from harness.perf import stats, step
from harness.perf.results import Measurement, load_passes, record_pass


def shifted_passes(levels, factor=2.0, per_pass=5, seed=0):
    """One (base, head) stratum per level: base ~ level * U(0.95, 1.05), head = factor * base
    drawn the same way: the load moves whole passes, the change multiplies one side."""
    rng = random.Random(seed)
    strata = []
    for level in levels:
        base = [level * rng.uniform(0.95, 1.05) for _ in range(per_pass)]
        head = [factor * level * rng.uniform(0.95, 1.05) for _ in range(per_pass)]
        strata.append((base, head))
    return strata


def test_exact_p_values_match_asvs_mann_whitney_test_on_one_stratum():
    rng = random.Random(1)
    for n, m in [(7, 7), (5, 9), (10, 10), (3, 12)]:
        base = [rng.random() for _ in range(n)]
        head = [rng.random() + 0.2 for _ in range(m)]
        _, two_sided = mann_whitney_u(base, head)
        ours = 2 * min(stats.p_slower([(base, head)]), stats.p_faster([(base, head)]))
        # Same exact distribution; 1e-9 allows float summation order only.
        assert ours == pytest.approx(min(1.0, two_sided), abs=1e-9)


def test_a_2x_slowdown_is_significant_pass_by_pass_when_pooling_hides_it():
    # Four passes whose levels differ up to 8x (bursts of other jobs between passes): pooled,
    # base and head samples overlap and the rank test cannot tell; within each pass head is
    # clearly slower.
    strata = shifted_passes([1.0, 4.0, 2.0, 8.0])
    pooled = [([x for b, _ in strata for x in b], [x for _, h in strata for x in h])]
    assert stats.p_slower(pooled) > stats.ALPHA
    assert stats.p_slower(strata) < 1e-5
    assert stats.ratio(strata) == pytest.approx(2.0, rel=0.1)  # U(0.95, 1.05) on each side


def test_one_pass_reversed_by_a_spike_moves_the_ratio_little():
    strata = shifted_passes([1.0, 1.0, 1.0])
    strata.append(([3.0] * 5, [2.0] * 5))  # a spike slowed the base of one pass past the head
    assert stats.ratio(strata) > 1.8
    # Significance is weaker than 1e-3 here: that is what the second look is for.
    assert stats.ALPHA < stats.p_slower(strata) < 0.01


def test_unchanged_code_gives_no_significance_in_either_direction():
    strata = shifted_passes([1.0, 2.0, 1.2, 1.7], factor=1.0, seed=3)
    assert stats.p_slower(strata) > stats.ALPHA and stats.p_faster(strata) > stats.ALPHA
    assert stats.ratio(strata) == pytest.approx(1.0, rel=0.1)


@pytest.mark.parametrize(
    ("sizes", "can_flag"),
    [
        ([(6, 6)], False),  # best p = 1/924
        ([(7, 7)], True),
        ([(2, 2)] * 3, False),  # 1/216
        ([(2, 2)] * 4, True),  # 1/1296
        ([(1, 1)] * 9, False),  # 1/512
        ([(5, 5)] * 2, True),
        ([(0, 8), (8, 0)], False),  # no pass has both sides
    ],
)
def test_min_p_says_whether_any_regression_could_ever_be_significant(sizes, can_flag):
    assert (stats.min_p(sizes) < stats.ALPHA) is can_flag


@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(0.1, 10), min_size=1, max_size=6),
            st.lists(st.floats(0.1, 10), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_p_values_are_probabilities_and_never_below_the_attainable_minimum(strata):
    sizes = [(len(b), len(h)) for b, h in strata]
    for p in (stats.p_slower(strata), stats.p_faster(strata)):
        assert stats.min_p(sizes) * (1 - 1e-9) <= p <= 1.0
    r = stats.ratio(strata)
    assert 0 < r < math.inf


def test_nan_samples_are_dropped_and_no_samples_give_no_ratio():
    assert math.isnan(stats.ratio([([math.nan], [1.0])]))
    assert stats.p_slower([([math.nan], [1.0])]) == 1.0


# --------------------------------------------------------------------------------------------
# Pass records


def m(samples, version="v1"):
    return Measurement(value=None, stats=None, samples=samples, version=version)


@pytest.fixture
def project(tmp_path: Path) -> perf.Project:
    (tmp_path / "asv.conf.json").write_text(json.dumps({"version": 1, "results_dir": "r"}))
    return perf.Project.load(tmp_path)


def test_pass_records_tag_the_samples_each_run_added_and_match_the_result_file(project):
    sha = "a" * 40
    record_pass(project, "m1", sha, "env", {}, {"b.t": m([1.0, 2.0])}, ("s", 0), appended=False)
    after = {"b.t": m([1.0, 2.0, 3.0]), "b.u": m([5.0])}
    record_pass(project, "m1", sha, "env", {"b.t": m([1.0, 2.0])}, after, ("s", 1), appended=True)
    assert load_passes(project, "m1", sha, "env", after) == {
        "b.t": {("s", 0): [1.0, 2.0], ("s", 1): [3.0]},
        "b.u": {("s", 1): [5.0]},
    }
    # The result file changed behind the records' back (asv run by hand): records ignored.
    assert load_passes(project, "m1", sha, "env", {"b.t": m([9.0]), "b.u": m([5.0])}) == {
        "b.u": {("s", 1): [5.0]}
    }


def test_a_run_that_replaced_the_samples_starts_a_new_record(project):
    sha = "b" * 40
    before = {"b.t": m([1.0, 2.0])}
    record_pass(project, "m1", sha, "env", {}, before, ("s", 0), appended=False)
    changed = {"b.t": m([7.0], version="v2")}  # the benchmark's code changed: asv replaced them
    record_pass(project, "m1", sha, "env", before, changed, ("t", 0), appended=True)
    assert load_passes(project, "m1", sha, "env", changed) == {"b.t": {("t", 0): [7.0]}}


# --------------------------------------------------------------------------------------------
# A/B pairs decide timing rows


def gate_report(*rows: perf.Row) -> perf.GateReport:
    code = 0 if all(r.comparable for r in rows) else 2
    return perf.GateReport(code, "a" * 40, "b" * 40, "m", 1.3, list(rows), [])


def timing_row(name="b.C.time_x", status="unchanged", kind="time") -> perf.Row:
    return perf.Row(name, "env", status, 1.0, 1.05, "seconds", 7, 7, ratio=1.05, kind=kind)


def test_a_2x_in_the_ab_pairs_overrides_an_unchanged_verdict_from_the_asv_runs():
    rng = random.Random(5)
    base = [rng.uniform(0.9e-3, 1.1e-3) for _ in range(60)]
    head = [2 * rng.uniform(0.9e-3, 1.1e-3) for _ in range(60)]
    base[3], head[11] = 9e-3, 0.5e-3  # two spikes, one on each side
    report = perf.apply_ab(
        gate_report(timing_row()), {"b.C.time_x": perf.ABResult("b.C.time_x", base, head)}
    )
    (row,) = report.rows
    assert report.exit_code == 1 and row.status == "regressed"
    assert row.method == "A/B pairs" and row.passes == 60 and row.low > 1
    assert row.ratio == pytest.approx(2.0, rel=0.15)  # U(0.9, 1.1) on each side


def test_the_json_keeps_every_ab_pair_in_the_order_taken_so_a_verdict_can_be_reexamined():
    rng = random.Random(6)
    base = [rng.uniform(0.9e-3, 1.1e-3) for _ in range(60)]
    head = [rng.uniform(0.9e-3, 1.1e-3) for _ in range(60)]
    report = perf.apply_ab(
        gate_report(timing_row()), {"b.C.time_x": perf.ABResult("b.C.time_x", base, head)}
    )
    (row,) = json.loads(json.dumps(report.to_json()))["rows"]
    assert row["pairs"] == [[b, h] for b, h in zip(base, head, strict=True)]
    # A row the pairs did not judge has none.
    assert perf.apply_ab(gate_report(timing_row()), {}).to_json()["rows"][0]["pairs"] is None


def test_a_failed_ab_keeps_the_asv_verdict_and_says_why():
    report = perf.apply_ab(
        gate_report(timing_row()),
        {"b.C.time_x": perf.ABResult("b.C.time_x", [], [], error="head: ImportError: x")},
    )
    (row,) = report.rows
    assert report.exit_code == 0 and row.status == "unchanged" and row.method == ""
    assert any("A/B of `b.C.time_x` failed (head: ImportError: x)" in p for p in report.problems)


def test_too_few_ab_pairs_fail_the_gate_instead_of_passing_it():
    report = perf.apply_ab(
        gate_report(timing_row()),
        {"b.C.time_x": perf.ABResult("b.C.time_x", [1e-3] * 3, [2e-3] * 3)},  # 3 pairs
    )
    assert report.exit_code == 2 and report.rows[0].status == perf.TOO_FEW_SAMPLES
    assert "TOO FEW SAMPLES" in report.verdict


def test_only_comparable_timing_rows_are_ab_candidates():
    report = gate_report(
        timing_row("b.C.time_ok"),
        timing_row("b.C.time_few", status=perf.TOO_FEW_SAMPLES),
        timing_row("b.C.track_x", kind="track"),
        timing_row("b.C.time_failed", status="failed in head"),
        timing_row("b.C.time_new", status="new in head, no baseline"),
    )
    assert perf.ab_candidates(report) == ["b.C.time_ok", "b.C.time_few"]


def test_a_row_status_reaches_the_json_as_its_plain_string_and_an_unknown_one_is_refused():
    # perf-gate.json is read by people and scripts: a status is the same string it always was.
    report = perf.apply_ab(
        gate_report(timing_row()),
        {"b.C.time_x": perf.ABResult("b.C.time_x", [1e-3] * 60, [3e-3] * 60)},
    )
    assert report.rows[0].status is perf.RowStatus.REGRESSED
    text = json.dumps(report.to_json())
    assert json.loads(text)["rows"][0]["status"] == "regressed"
    assert '"status": "regressed"' in text
    with pytest.raises(ValueError, match="'regresed' is not a valid RowStatus"):
        timing_row(status="regresed")


def test_with_stored_results_only_undecided_or_changed_cpu_rows_are_timed_again_in_pairs():
    report = gate_report(
        timing_row("b.C.time_same", status="unchanged"),
        timing_row("b.C.time_unsure", status="undecided"),
        timing_row("b.C.time_few", status=perf.TOO_FEW_SAMPLES),
        timing_row("b.C.time_slower", status="regressed"),
        timing_row("b.C.time_faster", status="improved"),
        timing_row("b.GpuC.time_kernel", status="undecided"),  # CPU time cannot see a kernel
        timing_row("b.C.track_x", status="regressed", kind="track"),
    )
    stored = ["b.C.time_unsure", "b.C.time_few", "b.C.time_slower", "b.C.time_faster"]
    assert step.ab_names(report, measured_here=False) == stored
    # With the base measured in this run, every CPU timing row is judged on pairs.
    assert step.ab_names(report, measured_here=True) == ["b.C.time_same", *stored]
