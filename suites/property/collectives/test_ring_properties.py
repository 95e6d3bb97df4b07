"""Properties of the ring simulation over generated worker counts, lengths, dtypes and ops.

Every property is a plain checker (``check_*``) run under ``@given`` twice: against the real
schedule, where it must hold, and against deliberately broken schedules, where hypothesis
must find a counterexample. A property that no broken schedule can fail proves nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from harness import assert_equal, assert_within
from reference_impls.collectives import (
    RING_SCHEDULE,
    RingSchedule,
    ring_cost,
    simulate_ring_allreduce,
)
from reference_impls.collectives.schedule import ALL_GATHER, REDUCE_SCATTER

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
FLOAT_DTYPES = ("float16", "float32", "float64")
OPS = ("sum", "mean", "max", "min")


@dataclasses.dataclass(frozen=True)
class RingCase:
    arrays: list[np.ndarray]
    op: str

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        arrays = [a.tolist() for a in self.arrays]
        return f"RingCase(op={self.op!r}, dtype={self.arrays[0].dtype}, arrays={arrays})"


@st.composite
def ring_cases(draw, ops=OPS, min_workers=1, min_length=0) -> RingCase:
    n = draw(st.integers(min_workers, 9))
    length = draw(st.integers(min_length, 40))  # smaller than n, uneven, and several chunks each
    dtype = np.dtype(draw(st.sampled_from(INT_DTYPES + FLOAT_DTYPES)))
    op = draw(st.sampled_from([o for o in ops if o != "mean" or dtype.kind == "f"]))
    if dtype.kind in "iu" and op == "sum":
        # Sums that fit the dtype (an overflowing sum is refused: see the properties below).
        info = np.iinfo(dtype)
        elements = st.integers(-(-info.min // n), info.max // n)
    elif dtype.kind in "iu":
        elements = st.integers(np.iinfo(dtype).min, np.iinfo(dtype).max)
    else:
        # Bounded so that 9 workers' float16 sums stay finite (max 65504).
        elements = st.floats(-1000, 1000, width=dtype.itemsize * 8, allow_nan=False)
    arrays = [draw(hnp.arrays(dtype, length, elements=elements)) for _ in range(n)]
    return RingCase(arrays, op)


def numpy_reduction(case: RingCase) -> np.ndarray:
    stacked = np.stack(case.arrays)  # (N, length)
    if case.op == "sum":
        return np.sum(stacked, axis=0, dtype=stacked.dtype)  # the cases' sums fit the dtype
    if case.op == "mean":
        return np.mean(stacked.astype(np.float64), axis=0)
    return (np.max if case.op == "max" else np.min)(stacked, axis=0)


def check_matches_numpy(case: RingCase, results: list[np.ndarray]) -> None:
    """Every worker's result is NumPy's reduction: exact for integers and max/min; for float
    sums within the ring's rounding bound."""
    expected = numpy_reduction(case)
    n = len(case.arrays)
    for worker, result in enumerate(results):
        assert result.dtype == case.arrays[0].dtype and result.shape == case.arrays[0].shape
        if case.op in ("max", "min") or result.dtype.kind in "iu":
            assert_equal(result, expected, check_dtype=False, msg=f"worker {worker} of {n}")
            continue
        # Floats: each chunk is summed in ring order in the input dtype. n - 1 additions of
        # partial sums bounded by sum|x|, plus the mean's division and the final rounding:
        # |error| <= (n + 1) * eps * sum|x| (Higham, Accuracy and Stability, eq. 4.4). The
        # mean's one division can also underflow, which that relative model omits: it adds
        # up to half the smallest subnormal (fl(x / y) = (x / y)(1 + d) + e, |e| <= that;
        # Higham eq. 2.8). A sum cannot: a sum landing in the subnormal range is exact.
        # (Found by the nightly profile's examples: the float16 mean of 0 and 2**-24.)
        stacked = np.stack(case.arrays).astype(np.float64)
        scale = np.abs(stacked).sum(0) / (n if case.op == "mean" else 1)
        info = np.finfo(result.dtype)
        underflow = float(info.smallest_subnormal) / 2 if case.op == "mean" else 0.0
        bound = (n + 1) * info.eps * scale + underflow
        exact = stacked.sum(0) / (n if case.op == "mean" else 1)
        err = np.abs(result.astype(np.float64) - exact)
        assert_within(err, bound, msg=f"worker {worker} of {n}")


def check_workers_agree_bitwise(case: RingCase, results: list[np.ndarray]) -> None:
    """The all-gather copies: every worker holds the same bits."""
    for worker, result in enumerate(results[1:], start=1):
        assert result.tobytes() == results[0].tobytes(), f"worker {worker} differs from worker 0"


def check_log_matches_cost_model(case: RingCase, log) -> None:
    n = len(case.arrays)
    cost = ring_cost(n, case.arrays[0].size, case.arrays[0].dtype.itemsize)
    assert len(log) == n * cost.messages_per_worker
    for r in range(n):
        sent = [m for m in log if m.sender == r]
        assert len(sent) == 2 * (n - 1), f"worker {r} sent {len(sent)} messages"
        assert sum(m.nbytes for m in sent) == cost.bytes_sent[r], f"worker {r}'s bytes"
        assert all(m.receiver == (r + 1) % n for m in sent)
    for step in range(2 * (n - 1)):
        phase = REDUCE_SCATTER if step < n - 1 else ALL_GATHER
        at_step = [m for m in log if m.step == step]
        assert sorted(m.sender for m in at_step) == list(range(n))  # one message each per step
        assert {m.phase for m in at_step} == {phase}
        # In one step the N messages carry N different chunks: the ring rotates them.
        assert len({m.chunk for m in at_step}) == n


def results_match_numpy(schedule: RingSchedule, ops=OPS, min_workers=1, min_length=0):
    @given(ring_cases(ops, min_workers, min_length))
    def prop(case: RingCase) -> None:
        copies = [a.copy() for a in case.arrays]
        results = simulate_ring_allreduce(case.arrays, case.op, schedule=schedule)
        for a, c in zip(case.arrays, copies, strict=True):
            assert a.tobytes() == c.tobytes(), "an input was modified"
        check_matches_numpy(case, results)
        check_workers_agree_bitwise(case, results)

    return prop


def log_matches_cost_model(schedule: RingSchedule):
    @given(ring_cases())
    def prop(case: RingCase) -> None:
        log = []
        simulate_ring_allreduce(case.arrays, case.op, message_log=log, schedule=schedule)
        check_log_matches_cost_model(case, log)

    return prop


def test_every_worker_gets_numpys_reduction_and_the_same_bits():
    results_match_numpy(RING_SCHEDULE)()


def test_the_message_log_matches_the_cost_model():
    log_matches_cost_model(RING_SCHEDULE)()


@settings(max_examples=100)
@given(
    n=st.integers(1, 9),
    dtype=st.sampled_from(INT_DTYPES + ("uint64",)),
    data=st.data(),
)
def test_an_integer_sum_is_exact_when_it_fits_and_refused_when_it_would_wrap(n, dtype, data):
    # Any values of the dtype: partial sums wrap on the way round the ring (modulo 2**bits),
    # which must not matter when the true sum fits, and must be an error when it does not.
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    length = data.draw(st.integers(1, 12), label="length")
    elements = st.integers(info.min, info.max)
    arrays = [data.draw(hnp.arrays(dtype, length, elements=elements)) for _ in range(n)]
    true = [sum(int(a[i]) for a in arrays) for i in range(length)]  # Python ints: exact
    outside = [i for i, v in enumerate(true) if not info.min <= v <= info.max]
    if outside:
        i = outside[0]
        with pytest.raises(ValueError, match=rf"element \({i},\) sums to {true[i]}, outside"):
            simulate_ring_allreduce(arrays, "sum")
        return
    for result in simulate_ring_allreduce(arrays, "sum"):
        assert [int(v) for v in result] == true


# ---- the properties catch broken schedules ----------------------------------------------

BROKEN = {
    # The all-gather combines like the reduce-scatter instead of overwriting: with sum, the
    # already-reduced chunks are added again.
    "all-gather adds instead of overwriting": RingSchedule(all_gather_overwrites=False),
    # The all-gather's chunk index runs on the global step (k + N - 1) instead of its own.
    "all-gather indexed by the global step": RingSchedule(
        all_gather_chunk=lambda r, k, n: (r + 1 - (k + n - 1)) % n
    ),
    # The reduce-scatter's chunk index runs on a global step numbered from the other phase
    # (k + N - 1): it still rotates consistently, but each rank ends up owning chunk r + 2
    # while the all-gather starts from chunk r + 1.
    "reduce-scatter indexed by a global step": RingSchedule(
        reduce_scatter_chunk=lambda r, k, n: (r - (k + n - 1)) % n
    ),
    # Every rank sends the same chunk at a step: the receivers combine into chunks that
    # their own senders never reduced.
    "reduce-scatter ignores the rank": RingSchedule(
        reduce_scatter_chunk=lambda r, k, n: (0 * r - k) % n
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_the_result_property_catches_a_broken_schedule(name):
    # At least 2 workers and 2 elements: with one worker or one element every schedule is
    # trivially right. Sum only for the adding all-gather: max and min are idempotent, so an
    # all-gather that combines with them is almost always still correct (see the signed-zero
    # test below for the exception); sum double-counts on every example.
    ops = ("sum",) if name.startswith("all-gather adds") else OPS
    prop = settings(max_examples=200, report_multiple_bugs=False)(
        results_match_numpy(BROKEN[name], ops, min_workers=2, min_length=2)
    )
    with pytest.raises(AssertionError):
        prop()


def test_the_cost_model_property_catches_a_ring_that_sends_the_same_chunk_twice():
    broken = BROKEN["reduce-scatter ignores the rank"]
    prop = settings(max_examples=200, report_multiple_bugs=False)(log_matches_cost_model(broken))
    with pytest.raises(AssertionError):
        prop()


def test_signed_zeros_expose_an_adding_all_gather_even_under_max():
    # Found by hypothesis: with max, an all-gather that combines looks harmless (max(x, x) is
    # x), but max(0.0, -0.0) depends on the order, so the workers stop agreeing bit for bit.
    # Kept as a fixed example because the random search need not find it on every run.
    case = RingCase([np.array([0.0, 0.0], np.float16), np.array([-0.0, -0.0], np.float16)], "max")
    check_workers_agree_bitwise(case, simulate_ring_allreduce(case.arrays, "max"))
    broken = simulate_ring_allreduce(
        case.arrays, "max", schedule=BROKEN["all-gather adds instead of overwriting"]
    )
    with pytest.raises(AssertionError, match="worker 1 differs from worker 0"):
        check_workers_agree_bitwise(case, broken)


# ---- the integer range's exact edges ---------------------------------------------------------


def _split(total: int, n: int) -> list[int]:
    """n integers summing to ``total``, each between 0 and total (or total and 0)."""
    part = abs(total) // n * (1 if total >= 0 else -1)  # so the remainder shares its sign
    return [part] * (n - 1) + [total - part * (n - 1)]


@settings(max_examples=60)
@given(
    n=st.integers(2, 9),
    dtype=st.sampled_from(INT_DTYPES + ("uint64",)),
    edge=st.sampled_from(["max", "min"]),
    data=st.data(),
)
def test_a_sum_of_exactly_the_dtypes_limit_is_exact_and_one_past_it_is_refused(
    n, dtype, edge, data
):
    # The boundary the random property above almost never draws: an element whose true sum is
    # exactly iinfo.max (or .min) fits; one more (one less) overflows and is named.
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    limit = int(info.max if edge == "max" else info.min)
    length = data.draw(st.integers(1, 6), label="length")
    i = data.draw(st.integers(0, length - 1), label="element")
    # The other elements fit whatever n is: each worker's share of the range.
    fits = st.integers(-(-int(info.min) // n), int(info.max) // n)
    arrays = [data.draw(hnp.arrays(dtype, length, elements=fits)) for _ in range(n)]
    for a, part in zip(arrays, _split(limit, n), strict=True):
        a[i] = part
    expected = [sum(int(a[j]) for a in arrays) for j in range(length)]
    assert expected[i] == limit
    for result in simulate_ring_allreduce(arrays, "sum"):
        assert [int(v) for v in result] == expected
    if limit == 0:
        return  # unsigned: nothing below 0 to reach with one more step
    w = data.draw(st.integers(0, n - 2), label="worker nudged")  # its part is not the limit
    arrays[w][i] += 1 if edge == "max" else -1
    past = limit + (1 if edge == "max" else -1)
    with pytest.raises(ValueError, match=rf"element \({i},\) sums to {past}, outside .*\(1 of"):
        simulate_ring_allreduce(arrays, "sum")
