"""Straggler scores and homogeneity checks on hand-made records and host facts."""

from __future__ import annotations

from reference_impls.scaling import StepRecord, homogeneity_problems, straggler_scores


def steps(n, slow_rank=None, slow_s=0.005, world=3):
    out = []
    for k in range(n):
        busy = {
            r: 0.004 + (slow_s if r == slow_rank else 0.0) + 1e-5 * ((k * 7 + r) % 5)
            for r in range(world)
        }
        end = max(busy.values()) + 0.001  # everyone leaves the all-reduce together
        for r in range(world):
            out.append(StepRecord(step=k, rank=r, wall=end, forward=busy[r], comm=end - busy[r]))
    return out


def test_the_injected_slow_rank_is_named_and_scored_low():
    scores = straggler_scores(steps(20, slow_rank=2))
    assert [s.rank for s in scores if s.straggler] == [2]
    slow = scores[2]
    assert slow.relative < 0.5  # 4 ms of work against 9 ms
    assert slow.last_arrival_share == 1.0
    assert 4.5 < slow.caused_wait_ms < 5.5  # the others wait its extra 5 ms (+- the jitter)
    assert all(s.relative > 0.95 for s in scores if s.rank != 2)


def test_equal_ranks_have_no_straggler_and_scores_near_one():
    scores = straggler_scores(steps(20))
    assert not any(s.straggler for s in scores)
    assert min(s.relative for s in scores) > 0.95


def test_a_slightly_slow_rank_is_not_flagged():
    # 0.1 ms slower on a 5 ms step: the others wait 2% of the step, under the 5% bar.
    scores = straggler_scores(steps(20, slow_rank=1, slow_s=0.0001))
    assert not any(s.straggler for s in scores)


def test_more_ranks_than_cores_is_flagged_with_the_fix():
    facts = [{"rank": r, "host": "h", "cpu_cores": 2, "torch_threads": 1} for r in range(4)]
    (problem,) = homogeneity_problems(facts)
    assert "4 ranks on 2 CPU cores" in problem and "at most one rank per core" in problem


def test_threads_oversubscription_and_different_gpus_are_flagged():
    facts = [
        {"rank": 0, "host": "h", "cpu_cores": 4, "torch_threads": 4, "gpu": "NVIDIA H200"},
        {"rank": 1, "host": "h", "cpu_cores": 4, "torch_threads": 4, "gpu": "NVIDIA H100"},
    ]
    problems = homogeneity_problems(facts)
    assert any("8 threads on 4" in p for p in problems)
    assert any("ranks differ in gpu" in p and "'NVIDIA H100' on ranks [1]" in p for p in problems)


def test_alike_ranks_on_enough_cores_raise_nothing():
    facts = [
        {"rank": r, "host": "h", "cpu_cores": 8, "torch_threads": 1, "gpu": "X"} for r in range(2)
    ]
    assert homogeneity_problems(facts) == []


def test_one_rank_is_never_a_straggler():
    (score,) = straggler_scores(steps(5, world=1))
    assert score.relative == 1.0 and not score.straggler and score.caused_wait_ms == 0.0


def test_a_busy_host_is_flagged():
    facts = [
        {"rank": r, "host": "h", "cpu_cores": 2, "torch_threads": 1, "load_average_1min": 9.5}
        for r in range(2)
    ]
    (problem,) = homogeneity_problems(facts)
    assert "load average 9.5 on 2 CPU cores" in problem
