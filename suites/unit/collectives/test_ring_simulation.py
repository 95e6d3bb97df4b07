"""The NumPy ring simulation: results, message log, cost model and input validation."""

from __future__ import annotations

import time

import numpy as np
import pytest

from harness import assert_equal
from reference_impls.collectives import (
    RING_SCHEDULE,
    Message,
    bus_bandwidth_factor,
    chunk_bounds,
    ring_cost,
    simulate_ring_allreduce,
)
from reference_impls.collectives.schedule import ALL_GATHER, REDUCE_SCATTER

NUMPY_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


def _arrays(rng, n, length, dtype):
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-20, 21, size=length).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(length).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("length", [0, 1, 2, 5, 13, 64])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_every_worker_gets_numpys_exact_reduction_of_integers(n, length, op):
    arrays = _arrays(np.random.default_rng(n * 100 + length), n, length, np.int32)
    expected = (
        NUMPY_REDUCE[op](np.stack(arrays), axis=0).astype(np.int32)
        if length
        else np.zeros(0, np.int32)
    )
    for worker, result in enumerate(simulate_ring_allreduce(arrays, op)):
        assert result.dtype == np.int32 and result.shape == (length,)
        assert_equal(result, expected, msg=f"worker {worker} of {n}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_float_results_match_numpy_within_the_summation_error_bound(dtype, op):
    n, length = 5, 101
    arrays = _arrays(np.random.default_rng(7), n, length, dtype)
    stacked = np.stack(arrays).astype(np.float64)
    expected = stacked.sum(0) / (n if op == "mean" else 1)
    # Each chunk is summed in its own ring order, in the input dtype: n - 1 roundings of
    # partial sums bounded by sum|x| (plus one for the mean's division), so the error is
    # at most n * eps * sum|x| per element (Higham, Accuracy and Stability, eq. 4.4).
    eps = np.finfo(dtype).eps
    bound = n * eps * np.abs(stacked).sum(0) / (n if op == "mean" else 1)
    for result in simulate_ring_allreduce(arrays, op):
        err = np.abs(result.astype(np.float64) - expected)
        assert (err <= bound).all(), (
            f"worst excess {np.max(err - bound)} at {np.argmax(err - bound)}"
        )


def test_all_workers_end_bit_identical_because_the_all_gather_copies():
    arrays = _arrays(np.random.default_rng(3), 6, 1000, np.float32)
    results = simulate_ring_allreduce(arrays, "sum")
    for r in results[1:]:
        assert r.tobytes() == results[0].tobytes()


def test_inputs_are_never_mutated_and_results_are_new_arrays():
    arrays = _arrays(np.random.default_rng(4), 3, 10, np.float64)
    copies = [a.copy() for a in arrays]
    results = simulate_ring_allreduce(arrays, "sum")
    for a, c, r in zip(arrays, copies, results, strict=True):
        assert_equal(a, c)
        assert not np.shares_memory(a, r)
    results[0][:] = 0  # one worker's result is its own
    assert results[1].any()


def test_one_worker_returns_a_copy_of_its_array():
    a = np.arange(5, dtype=np.float32)
    (result,) = simulate_ring_allreduce([a], "mean")
    assert_equal(result, a)
    assert not np.shares_memory(result, a)


def test_multidimensional_arrays_keep_their_shape():
    arrays = [np.full((2, 3, 4), i, dtype=np.int64) for i in range(3)]
    results = simulate_ring_allreduce(arrays, "sum")
    assert all(r.shape == (2, 3, 4) for r in results)
    assert_equal(results[2], np.full((2, 3, 4), 3, dtype=np.int64))


def test_the_message_log_has_every_step_in_order():
    n, length = 4, 10  # chunks of 3, 3, 2, 2 elements
    log: list[Message] = []
    simulate_ring_allreduce(
        _arrays(np.random.default_rng(0), n, length, np.float32), message_log=log
    )
    assert len(log) == n * 2 * (n - 1)
    assert [m.step for m in log] == sorted(m.step for m in log)
    assert {m.phase for m in log if m.step < n - 1} == {REDUCE_SCATTER}
    assert {m.phase for m in log if m.step >= n - 1} == {ALL_GATHER}
    assert all(m.receiver == (m.sender + 1) % n for m in log)
    sizes = np.diff(chunk_bounds(length, n))
    assert all(m.nbytes == sizes[m.chunk] * 4 for m in log)
    # The textbook schedule: reduce-scatter step k sends chunk (r - k), all-gather (r + 1 - k).
    first = [m for m in log if m.step == 0]
    assert [(m.sender, m.chunk) for m in first] == [(r, r) for r in range(n)]
    gather0 = [m for m in log if m.step == n - 1]
    assert [(m.sender, m.chunk) for m in gather0] == [(r, (r + 1) % n) for r in range(n)]


def test_message_counts_and_bytes_match_the_cost_model():
    for n, length in [(2, 8), (3, 10), (5, 3), (8, 1000)]:
        log: list[Message] = []
        simulate_ring_allreduce(
            _arrays(np.random.default_rng(n), n, length, np.float64), message_log=log
        )
        cost = ring_cost(n, length, 8)
        for r in range(n):
            sent = [m for m in log if m.sender == r]
            assert len(sent) == cost.messages_per_worker == 2 * (n - 1)
            assert sum(m.nbytes for m in sent) == cost.bytes_sent[r]
            # Uneven chunks: the exact count is within 2 elements of 2(n-1)/n of the array.
            assert abs(cost.bytes_sent[r] - cost.approx_bytes_per_worker) <= 2 * 8


def test_lengths_smaller_than_the_worker_count_send_empty_messages_without_padding():
    n = 5
    log: list[Message] = []
    arrays = [np.array([float(i), 10.0 * i]) for i in range(n)]  # 2 elements, 5 chunks
    results = simulate_ring_allreduce(arrays, "max", message_log=log)
    assert_equal(results[0], np.array([4.0, 40.0]))
    assert sum(m.nbytes == 0 for m in log) == 3 * 2 * (n - 1)  # 3 of 5 chunks are empty
    assert len(log) == n * 2 * (n - 1)


def test_bus_bandwidth_factor_follows_nccl_tests():
    assert bus_bandwidth_factor(1) == 0
    assert bus_bandwidth_factor(2) == 1
    assert bus_bandwidth_factor(4) == 1.5
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        bus_bandwidth_factor(0)


def test_chunk_bounds_follow_numpy_array_split():
    for length, n in [(10, 3), (2, 5), (0, 4), (12, 4)]:
        bounds = chunk_bounds(length, n)
        pieces = np.array_split(np.arange(length), n)
        assert [len(p) for p in pieces] == list(np.diff(bounds))
    with pytest.raises(ValueError, match="number of chunks must be >= 1, got 0"):
        chunk_bounds(5, 0)


def test_the_correct_schedule_gives_each_worker_chunk_r_plus_1_after_the_reduce_scatter():
    for n in (2, 3, 8):
        assert [RING_SCHEDULE.owned_chunk(r, n) for r in range(n)] == [
            (r + 1) % n for r in range(n)
        ]


@pytest.mark.parametrize(
    "arrays, op, message",
    [
        ([], "sum", "at least one worker's array, got none"),
        (
            [np.zeros(3), np.zeros(4)],
            "sum",
            r"worker 0 has \(3,\) float64, worker 1 has \(4,\) float64",
        ),
        ([np.zeros(3), np.zeros(3, np.float32)], "sum", "worker 1 has \\(3,\\) float32"),
        ([np.zeros(3)], "prod", "op must be one of sum, mean, max, min; got 'prod'"),
        ([np.zeros(3, np.int64)], "mean", "op='mean' needs a floating-point dtype, got int64"),
        ([np.zeros(3, bool)], "sum", "integer or floating-point type, got bool"),
    ],
)
def test_bad_inputs_raise_value_errors_that_name_the_problem(arrays, op, message):
    with pytest.raises(ValueError, match=message):
        simulate_ring_allreduce(arrays, op)


def test_an_int8_sum_that_would_wrap_is_refused_naming_the_element_and_the_fix():
    arrays = [np.array([[1, 2], [3, 100]], np.int8)] * 4  # 4 x 100 = 400 > 127

    with pytest.raises(ValueError) as info:
        simulate_ring_allreduce(arrays, "sum")

    assert str(info.value) == (
        "op='sum' over 4 workers overflows int8: element (1, 1) sums to 400, outside "
        "[-128, 127] (1 of 4 elements overflow). The ring would give every worker a value "
        "wrapped modulo 2**8: use a wider dtype (int16 holds these sums) or a floating-point one"
    )


def test_an_int8_sum_whose_partial_sums_wrap_but_whose_total_fits_is_exact():
    # 100 + 100 wraps to -56 on its way round the ring; adding -100 twice wraps back: the
    # result is the true sum, 0 (additions modulo 2**8 do not depend on the order).
    arrays = [np.full(7, v, np.int8) for v in (100, 100, -100, -100)]
    for result in simulate_ring_allreduce(arrays, "sum"):
        assert_equal(result, np.zeros(7, np.int8))
    # max and min cannot overflow: any values pass.
    extremes = [np.array([-128, 127], np.int8)] * 3
    assert simulate_ring_allreduce(extremes, "max")[0].tolist() == [-128, 127]


def test_64_workers_of_a_million_float32_stay_exact_on_integer_values():
    # The size the issue names (64 x 1M float32); integer values keep every sum exact, so the
    # whole result is checked, not a sample. Its speed is measured in
    # suites/benchmarks/bench_collectives.py, not asserted here.
    rng = np.random.default_rng(64)
    arrays = [rng.integers(-8, 9, size=1 << 20).astype(np.float32) for _ in range(64)]
    start = time.perf_counter()
    results = simulate_ring_allreduce(arrays, "sum")
    elapsed = time.perf_counter() - start
    expected = np.sum(np.stack(arrays), axis=0)
    for r in (results[0], results[37], results[63]):
        assert_equal(r, expected)
    print(f"64 x 1M float32 simulated in {elapsed:.2f} s")


# ---- configuration of the real ring and its launcher (no processes started) --------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"segments": 0}, "segments must be an int >= 1, got 0"),
        ({"segments": 1.5}, "segments must be an int >= 1, got 1.5"),
        ({"timeout_s": 0}, "timeout_s must be None or > 0 seconds, got 0"),
        ({"combine_ctas": 0}, "combine_ctas must be None or an int >= 1, got 0"),
        ({"combine_ctas": True}, "combine_ctas must be None or an int >= 1, got True"),
    ],
)
def test_ring_config_rejects_bad_values_with_the_value_in_the_message(kwargs, message):
    from reference_impls.collectives import RingConfig

    with pytest.raises(ValueError, match=message):
        RingConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_size": 0}, "world_size must be an int >= 1, got 0"),
        (
            {"world_size": 2, "backend": "mpi"},
            "backend must be one of gloo, nccl, cpu:gloo,cuda:nccl; got 'mpi'",
        ),
        ({"world_size": 2, "start_method": "fork"}, "'fork' is unsafe"),
        ({"world_size": 2, "timeout_s": -1}, "timeout_s must be > 0 seconds, got -1"),
        ({"world_size": 2, "threads_per_rank": 0}, "threads_per_rank must be None or >= 1, got 0"),
    ],
)
def test_launch_config_rejects_bad_values_with_the_value_in_the_message(kwargs, message):
    from reference_impls.collectives import LaunchConfig

    with pytest.raises(ValueError, match=message):
        LaunchConfig(**kwargs)


# --- edges found by mutation testing (docs/benchmarks/mutation.md) ----------------------------


def test_a_multidimensional_array_with_uneven_chunks_is_reduced_element_by_element():
    # 6 elements over 4 workers: chunks of 2, 2, 1, 1, so the first chunks cut across rows.
    arrays = [np.arange(6, dtype=np.int32).reshape(2, 3) * (w + 1) for w in range(4)]
    for result in simulate_ring_allreduce(arrays, "sum"):
        assert_equal(result, np.arange(6, dtype=np.int32).reshape(2, 3) * 10)


@pytest.mark.parametrize(
    ("arrays", "op", "message"),
    [
        ([], "sum", "simulate_ring_allreduce needs at least one worker's array, got none"),
        (
            [np.zeros(3, np.int16)] * 2,
            "mean",
            "op='mean' needs a floating-point dtype, got int16: the mean of integers is not an "
            "integer; reduce with op='sum' and divide, or cast to a float dtype first",
        ),
    ],
)
def test_the_whole_message_says_what_to_do(arrays, op, message):
    with pytest.raises(ValueError) as info:
        simulate_ring_allreduce(arrays, op)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("dtype", "values", "counted", "advice"),
    [
        # int8 sums to exactly the range's ends are fine; only the element past them counts.
        ("int8", [[-64, 64, 100], [-64, 63, 100]], "element (2,) sums to 200", "int16 holds"),
        ("int8", [[-100, 64, 0], [-29, 63, 0]], "element (0,) sums to -129", "int16 holds"),
        ("int16", [[32767, -32768], [1, 0]], "element (0,) sums to 32768", "int32 holds"),
        ("int32", [[2**31 - 1], [1]], "element (0,) sums to 2147483648", "int64 holds"),
        ("int32", [[-(2**31)], [-1]], "sums to -2147483649", "int64 holds"),
        ("int64", [[2**62], [2**62]], "sums to 9223372036854775808", "no 64-bit integer dtype"),
        ("int64", [[-(2**62) - 1], [-(2**62)]], "sums to -9223372036854775809", "no 64-bit"),
    ],
)
def test_an_overflow_counts_only_the_elements_past_the_range_and_names_the_narrowest_fix(
    dtype, values, counted, advice
):
    arrays = [np.array(v, dtype) for v in values]
    with pytest.raises(ValueError) as info:
        simulate_ring_allreduce(arrays, "sum")
    message = str(info.value)
    assert counted in message and advice in message
    assert f"(1 of {arrays[0].size} elements overflow)" in message


@pytest.mark.parametrize("bits", [16, 32, 64])
def test_the_advice_names_the_narrowest_signed_type_holding_the_sums_at_its_exact_edges(bits):
    from reference_impls.collectives.simulation import _wider

    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1  # iinfo(int<bits>).min and .max
    assert f"int{bits} holds" in _wider(low, high)
    past = (
        "no 64-bit integer dtype holds these sums: use a floating-point dtype"
        if bits == 64
        else f"use a wider dtype (int{2 * bits} holds these sums) or a floating-point one"
    )
    assert _wider(low - 1, high) == past
    assert _wider(low, high + 1) == past


def test_chunk_bounds_are_integers_that_slice_the_array_into_its_chunks():
    bounds = chunk_bounds(10, 3)
    assert bounds.dtype == np.int64  # float offsets cannot index: a[1.0:4.0] raises
    data = np.arange(10)
    assert [data[bounds[c] : bounds[c + 1]].tolist() for c in range(3)] == [
        [0, 1, 2, 3],
        [4, 5, 6],
        [7, 8, 9],
    ]


def test_a_negative_length_or_world_size_is_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"^length must be >= 0, got -1$"):
        chunk_bounds(-1, 3)
    with pytest.raises(ValueError, match=r"^world_size must be >= 1, got 0$"):
        ring_cost(0, 10, 4)
