"""Step records, their attribution into parts, and the profiler that makes them (CPU clock)."""

from __future__ import annotations

import json
import math
import time

import pytest

from reference_impls.scaling import PARTS, Part, StepProfiler, StepRecord, attribute, mean_parts
from reference_impls.scaling.breakdown import attribute_steps
from reference_impls.scaling.profiler import _union_length


def rec(rank, step=0, **kw):
    base = {
        "wall": 0.010,
        "data": 0.001,
        "forward": 0.002,
        "backward": 0.002,
        "optimizer": 0.001,
        "comm": 0.002,
    }
    base.update(kw)
    return StepRecord(step=step, rank=rank, **base)


def test_the_last_rank_to_arrive_sets_the_transfer_and_the_others_wait():
    # rank 1 computes 5 ms longer and so sits 5 ms less in the all-reduce than rank 0
    fast = rec(0, wall=0.020, forward=0.002, comm=0.0070)
    slow = rec(1, wall=0.020, forward=0.007, comm=0.0020)
    a0, a1 = attribute([fast, slow])
    assert a0.parts[Part.COMM_TRANSFER] == a1.parts[Part.COMM_TRANSFER] == 0.002
    assert a0.parts[Part.COMM_WAIT] == pytest.approx(0.005, abs=1e-12)
    assert a1.parts[Part.COMM_WAIT] == 0.0


def test_the_parts_add_up_to_the_wall_time_of_every_rank():
    steps = attribute([rec(0, comm=0.003), rec(1, comm=0.001, wall=0.012), rec(2, comm=0.002)])
    for s in steps:
        assert sum(s.parts.values()) == pytest.approx(s.wall, rel=1e-12)  # float sums only
        assert set(s.parts) == set(PARTS)
        assert s.parts[Part.OTHER] >= 0


def test_mean_parts_add_up_to_the_mean_step():
    steps = attribute_steps(
        [rec(r, step=k, wall=0.01 + 0.001 * k) for r in (0, 1) for k in range(4)]
    )
    means = mean_parts(steps)
    assert sum(means[str(p)] for p in PARTS) == pytest.approx(means["wall"], rel=1e-12)
    assert means["wall"] == pytest.approx(0.0115, rel=1e-12)


def test_a_step_not_recorded_by_every_rank_is_left_out():
    records = [rec(0, step=0), rec(1, step=0), rec(0, step=1)]
    assert [(a.step, a.rank) for a in attribute_steps(records)] == [(0, 0), (0, 1)]


def test_attribute_refuses_mixed_steps_and_duplicate_ranks():
    with pytest.raises(ValueError, match="one step"):
        attribute([rec(0, step=0), rec(1, step=1)])
    with pytest.raises(ValueError, match="rank appears twice"):
        attribute([rec(0), rec(0)])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("data", -1e-3, "data must be a finite number >= 0"),
        ("wall", math.nan, "wall must be a finite number"),
        ("comm", math.inf, "comm must be a finite number"),
        ("forward", 0.5, "more than the step's wall time"),
    ],
)
def test_a_record_with_impossible_times_is_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        rec(0, **{field: value})


def test_a_record_is_one_json_line_well_under_a_kilobyte():
    r = rec(123456, step=9_999_999, comm_bytes=2**40, start=123456789.123456)
    line = r.to_json()
    assert "\n" not in line
    assert len(line.encode()) <= 1024
    assert StepRecord.from_dict(json.loads(line)) == StepRecord.from_dict(json.loads(line))
    back = StepRecord.from_dict(json.loads(line))
    assert back.comm_bytes == 2**40 and back.wall == pytest.approx(r.wall, abs=1e-6)


def test_from_dict_names_unknown_fields():
    with pytest.raises(ValueError, match=r"unknown StepRecord field\(s\) \['colour'\]"):
        StepRecord.from_dict({"step": 0, "rank": 0, "wall": 1.0, "colour": 1})


def test_union_length_merges_overlapping_intervals():
    assert _union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert _union_length([(0, 1), (0.2, 0.5)]) == 1
    assert _union_length([]) == 0


def test_the_profiler_times_each_phase_and_the_rest_is_other():
    prof = StepProfiler()
    with prof.step():
        with prof.phase("data"):
            time.sleep(0.004)
        with prof.phase("forward"):
            time.sleep(0.002)
        time.sleep(0.003)  # between phases: other
    (r,) = prof.records
    # Sleeps last at least as long as asked; an upper bound would depend on the machine's load.
    assert r.data >= 0.004 and r.forward >= 0.002
    assert r.other >= 0.003
    assert r.measured + r.other == pytest.approx(r.wall, abs=1e-9)


def test_simulated_ddp_communication_splits_backward_into_compute_and_exposed_wait():
    prof = StepProfiler()
    with prof.step(), prof.phase("backward"):
        first = prof.comm_started(100)  # bucket 1 ready early: overlaps compute
        time.sleep(0.003)
        prof.comm_done(first)
        last = prof.comm_started(100)  # last bucket: compute is over
        time.sleep(0.004)  # blocked until the all-reduce completes
        prof.comm_done(last)
    (r,) = prof.records
    assert r.comm >= 0.004  # exposed: from the last bucket's readiness to the phase's end
    # Sleeps give lower bounds only (a loaded runner can stretch any of them); the exact split
    # is pinned on a hand-advanced clock below.
    assert r.backward >= 0.003


class _ManualClock:
    """A host clock the test advances by hand: the breakdown's arithmetic without the
    machine's scheduling in it."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def ready(self, mark: float) -> bool:
        return True

    def seconds(self, origin: float, mark: float) -> float:
        return mark - origin

    def wait(self, mark: float) -> None:
        pass


def test_on_a_manual_clock_the_exposed_wait_is_exactly_the_time_after_the_last_bucket():
    prof = StepProfiler()
    clock = prof.clock = _ManualClock()
    with prof.step(), prof.phase("backward"):
        first = prof.comm_started(100)  # overlaps the 3 ms of compute that follow
        clock.t += 0.003
        prof.comm_done(first)
        last = prof.comm_started(100)  # compute is over: the next 4 ms are exposed wait
        clock.t += 0.004
        prof.comm_done(last)
    (r,) = prof.records
    assert r.comm == pytest.approx(0.004, abs=1e-12)
    assert r.backward == pytest.approx(0.003, abs=1e-12)
    assert r.wall == pytest.approx(0.007, abs=1e-12)
    assert r.comm_overlapped >= 0.003
    assert r.comm_bytes == 200
    assert r.backward + r.comm <= r.wall + 1e-9


def test_a_disabled_profiler_records_nothing_and_the_sink_gets_one_line_per_step(tmp_path):
    path = tmp_path / "r.jsonl"
    with path.open("w") as sink:
        prof = StepProfiler(sink=sink, rank=3)
        for _ in range(3):
            with prof.step(), prof.phase("optimizer"):
                pass
        prof.enabled = False
        with prof.step(), prof.phase("optimizer"):
            pass
        prof.flush()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 == len(prof.records)
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2]
    assert all(json.loads(x)["rank"] == 3 for x in lines)


def test_profiler_misuse_is_named():
    prof = StepProfiler()
    with pytest.raises(ValueError, match="phase must be one of"):
        prof.phase("warmup")
    with pytest.raises(RuntimeError, match="outside a step"), prof.phase("data"):
        pass
    with pytest.raises(RuntimeError, match="without begin_step"):
        prof.end_step()
    prof.begin_step()
    with pytest.raises(RuntimeError, match="inside a step"):
        prof.begin_step()
