"""The breakdown on real gloo processes (2 ranks: this machine has 2 cores, and more ranks than
cores slows gloo ~20x): an injected straggler, and a communication-heavy model.

Timings on a shared machine are noisy, so each check compares medians over steps with margins
of milliseconds, and relies only on what the injection guarantees: a sleep lasts at least as
long as asked.
"""

from __future__ import annotations

import statistics

import pytest

from reference_impls.collectives import LaunchConfig, launch
from reference_impls.scaling import Part, StepRecord, attribute_steps, straggler_scores
from reference_impls.scaling.workload import RankConfig, run_rank

# Large against the scheduling noise of 2 ranks on 2 busy cores (several ms per step when CI
# shares them): every bound below is a fraction of it, so a hiccup cannot cross one.
SLOW_MS = 40.0


def records(results, case="c"):
    return [StepRecord(**r) for res in results for r in res["cases"][case]["records"]]


@pytest.fixture(scope="module")
def straggler_run():
    cfg = RankConfig(
        batches=(("c", 16),), steps=24, warmup=3, overhead_blocks=0, slow_rank=1, slow_ms=SLOW_MS
    )
    return launch(run_rank, cfg, config=LaunchConfig(world_size=2, timeout_s=120))


def test_the_fast_ranks_extra_time_is_waiting_not_transfer(straggler_run):
    attributed = attribute_steps(records(straggler_run))
    wait = {
        r: statistics.median(a.parts[Part.COMM_WAIT] for a in attributed if a.rank == r)
        for r in (0, 1)
    }
    # Rank 0 waits out rank 1's sleep: at least 70% of it (rank 0's own hiccups can eat into
    # it; 12 ms is left for them). Rank 1, the last to arrive, waits for nobody in most steps:
    # under a quarter of the sleep, so a breakdown that put the sleep into its wait fails.
    assert wait[0] >= 0.7 * SLOW_MS * 1e-3, wait
    assert wait[1] < 0.25 * SLOW_MS * 1e-3, wait
    # The transfer is one number per step for both ranks: the sleep did not go into it.
    for step in {a.step for a in attributed}:
        t = {a.parts[Part.COMM_TRANSFER] for a in attributed if a.step == step}
        assert len(t) == 1


def test_the_injected_slow_rank_is_named_as_the_straggler(straggler_run):
    scores = straggler_scores(records(straggler_run))
    assert [s.rank for s in scores if s.straggler] == [1]
    assert scores[1].last_arrival_share > 0.5
    assert scores[1].busy_ms > scores[0].busy_ms + 0.7 * SLOW_MS  # the sleep, less noise


def test_the_breakdown_adds_up_to_the_loops_own_clock_within_5_percent(straggler_run):
    for res in straggler_run:
        case = res["cases"]["c"]
        ratios = sorted(
            r["wall"] / t for r, t in zip(case["records"], case["outer_step_s"], strict=True)
        )
        # The loop's clock also covers the profiler's own bookkeeping after the step; the median
        # step agrees within 5%, as required of the breakdown.
        assert 0.95 <= statistics.median(ratios) <= 1.0 + 1e-9, ratios


def test_per_step_output_is_under_a_kilobyte_per_rank(straggler_run):
    for r in records(straggler_run):
        assert len(r.to_json().encode()) + 1 <= 1024


def test_a_communication_heavy_model_shows_communication_as_a_major_part():
    # One 2048 x 2048 layer (16 MiB of float32 gradients) at a batch of 2 rows with plain SGD:
    # per weight ~3 multiply-adds and one update pass against 4 bytes through gloo (~1 GB/s
    # here), so communication takes about twice the compute on an idle machine (measured 1.6x
    # with 8 other jobs on the 2 cores; medians 1.4-1.9x with two busy loops beside it).
    # Both parts are CPU work on the same 2 cores, so load moves their ratio: one CI run with
    # two busy loops and the rest of the suite beside it read 0.85x. The claim that holds on
    # any machine is that communication is a major part of the step (over half the compute),
    # where a breakdown that lost it (counted it as compute, or not at all) reads near 0.
    cfg = RankConfig(
        batches=(("c", 2),),
        in_features=2048,
        hidden=(2048,),
        optimizer="sgd",
        steps=16,
        warmup=2,
        overhead_blocks=0,
        comm_sizes=(4,),
        comm_reps=1,
    )
    results = launch(run_rank, cfg, config=LaunchConfig(world_size=2, timeout_s=120))
    recs = records(results)
    attributed = attribute_steps(recs)
    comm = statistics.median(
        a.parts[Part.COMM_TRANSFER] + a.parts[Part.COMM_WAIT] for a in attributed
    )
    compute = statistics.median(
        a.parts[Part.FORWARD] + a.parts[Part.BACKWARD] + a.parts[Part.OPTIMIZER] for a in attributed
    )
    assert comm > 0.5 * compute, (comm, compute)
    assert all(r.comm_bytes == 4 * results[0]["params"] for r in recs)  # every gradient, once
