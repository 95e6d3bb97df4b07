"""The real ring on gloo: 2, 3 and 4 CPU processes, against dist.all_reduce and NumPy.

Each world size is one launch that runs every case (all ops, all dtypes, sizes below, at and
above the world size, uneven, segmented, non-contiguous) and then the mismatch scenarios; the
tests below judge its results. Inputs are integer-valued (reference_impls.collectives.checks),
so the ring and gloo must agree bit for bit although they add in different orders; one group
of random-normal cases checks the rounding bound instead.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from harness import assert_equal
from reference_impls.collectives import LaunchConfig, LaunchError, launch
from reference_impls.collectives.checks import (
    SILENT_PEER_CAP_S,
    Case,
    make_input,
    mismatch_errors,
    peer_exits,
    peer_goes_silent,
    self_check,
)

WORLD_SIZES = (2, 3, 4)
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8")


def cases_for(world: int) -> list[Case]:
    sizes = (0, 1, world - 1, world + 1, 1003)  # empty, fewer elements than ranks, uneven
    cases = [
        Case(numel=numel, dtype=dtype, op=op, seed=world)
        for dtype in DTYPES
        for op in (
            ("sum", "max", "min")
            if dtype.startswith(("int", "uint"))
            else ("sum", "mean", "max", "min")
        )
        for numel in sizes
    ]
    cases += [
        Case(numel=65_537, op="sum", segments=3, seed=world),  # interleaved lanes, uneven pieces
        Case(numel=1001, op="max", segments=4, dtype="int64", seed=world),
        Case(numel=3 * 5 * 7, op="sum", shape=(3, 5, 7), seed=world),
        Case(numel=999, op="sum", strided=True, seed=world),
        Case(numel=999, op="min", strided=True, dtype="int32", seed=world),
    ]
    cases += [  # random normal floats: the ring and gloo round differently
        Case(numel=4099, dtype=dtype, op=op, integer_valued=False, seed=world)
        for dtype in ("float32", "float64")
        for op in ("sum", "mean")
    ]
    return cases


_RESULTS: dict[int, list[dict]] = {}


@pytest.fixture(params=WORLD_SIZES, ids=lambda w: f"world{w}")
def world(request) -> int:
    return request.param


@pytest.fixture
def run(world) -> list[dict]:
    """Every rank's results for this world size (launched once, shared by the tests)."""
    if world not in _RESULTS:
        cases = cases_for(world)
        keep = max(c.numel for c in cases)  # every result comes back as an array
        _RESULTS[world] = launch(
            self_check, cases, "cpu", keep, config=LaunchConfig(world_size=world)
        )
    return _RESULTS[world]


def _exact_cases(world):
    return [(i, c) for i, c in enumerate(cases_for(world)) if c.integer_valued]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ring_equals_dist_all_reduce_bit_for_bit(run, world, dtype):
    bad = [
        f"rank {rank}: {c} ({per_rank['cases'][i].mismatched} elements differ)"
        for rank, per_rank in enumerate(run)
        for i, c in _exact_cases(world)
        if c.dtype == dtype and not per_rank["cases"][i].equal
    ]
    assert not bad, "\n".join(bad)


def test_ring_results_equal_numpys_reduction_of_every_ranks_input(run, world):
    for i, case in _exact_cases(world):
        per_rank = [make_input(case, r) for r in range(world)]
        inputs = np.stack(  # (world, *shape); NumPy has no bfloat16
            [(x.float() if case.dtype == "bfloat16" else x).numpy() for x in per_rank]
        )
        if case.numel == 0:
            continue
        expected = {
            "sum": lambda a: np.sum(a, axis=0, dtype=a.dtype),
            "mean": lambda a: np.sum(a, axis=0, dtype=a.dtype) / a.dtype.type(world),
            "max": lambda a: np.max(a, axis=0),
            "min": lambda a: np.min(a, axis=0),
        }[case.op](inputs)
        if case.dtype == "bfloat16":  # NumPy has no bfloat16: round its float32 result like torch
            expected = torch.from_numpy(expected).bfloat16().float().numpy()
        for rank, per_rank in enumerate(run):
            got = per_rank["cases"][i].ring.reshape(expected.shape)
            assert_equal(got, expected, check_dtype=False, msg=f"rank {rank}: {case}")


def test_every_rank_ends_with_identical_bits(run, world):
    for i, case in enumerate(cases_for(world)):
        digests = {per_rank["cases"][i].digest for per_rank in run}
        assert len(digests) == 1, f"{case}: ranks hold different results"


def test_random_floats_agree_with_dist_all_reduce_within_rounding(run, world):
    for i, case in enumerate(cases_for(world)):
        if case.integer_valued:
            continue
        inputs = np.stack(
            [make_input(case, r).double().numpy() for r in range(world)]
        )  # (world, numel)
        divisor = world if case.op == "mean" else 1
        exact = inputs.sum(0) / divisor
        # Both sides sum `world` terms in the input dtype, in different orders: each is within
        # (world + 1) * eps * sum|x| of the exact value (Higham eq. 4.4; +1 for the division).
        eps = np.finfo(case.dtype).eps
        bound = (world + 1) * eps * np.abs(inputs).sum(0) / divisor
        for rank, per_rank in enumerate(run):
            r = per_rank["cases"][i]
            assert (np.abs(r.ring - exact) <= bound).all(), (
                f"rank {rank}: {case}: ring off the bound"
            )
            assert (np.abs(r.ring - r.reference) <= 2 * bound).all(), f"rank {rank}: {case}"


@pytest.mark.parametrize("scenario", ["numel", "dtype", "op", "segments", "unsupported dtype"])
def test_mismatched_arguments_raise_on_every_rank(run, world, scenario):
    for rank, per_rank in enumerate(run):
        error_type, message = per_rank["mismatch"][scenario]
        if scenario == "unsupported dtype" and rank == 0:
            # The rank that passed the bool tensor is told what it did wrong.
            assert error_type == "ValueError", message
            assert "supports dtypes" in message and "got torch.bool" in message
            continue
        assert error_type == "RingMismatchError", f"rank {rank}: {error_type}: {message}"
        assert f"the ranks disagree on {scenario.split()[-1]}" in message, message
    if scenario == "numel":
        # The message names every rank's value, so the odd one out is visible on any rank.
        last = world - 1
        assert f"rank {last}: 99" in run[0]["mismatch"]["numel"][1]


def test_the_group_still_works_after_the_mismatches(run, world):
    for per_rank in run:
        assert_equal(
            per_rank["mismatch"]["after"], np.full(10, world * (world + 1) / 2), check_dtype=False
        )


@pytest.mark.parametrize(
    "check_metadata", [True, False], ids=["during-the-check", "during-the-ring"]
)
def test_a_silent_peer_becomes_a_ring_peer_error_after_the_timeout(check_metadata):
    timeout_s = 1.0
    result = launch(peer_goes_silent, timeout_s, check_metadata, config=LaunchConfig(world_size=2))[
        0
    ]
    error_type, message, elapsed = result
    assert error_type == "RingPeerError", result
    assert f"timeout {timeout_s:g} s" in message
    assert ("metadata exchange" in message) == check_metadata, message
    # Not a speed claim: the error must come from the timeout, not earlier. The silent peer
    # stays silent until rank 0 has its answer (or SILENT_PEER_CAP_S), so a missing timeout
    # shows up as ~SILENT_PEER_CAP_S; half of that is a bound no load on rank 0 reaches.
    assert 0.9 * timeout_s <= elapsed < SILENT_PEER_CAP_S / 2, f"raised after {elapsed:.2f} s"


def test_a_peer_that_exits_becomes_a_ring_peer_error_not_a_hang():
    with pytest.raises(LaunchError) as info:
        launch(peer_exits, config=LaunchConfig(world_size=2, pg_timeout_s=30))
    failures, results = info.value.failures, info.value.results
    assert list(failures) == [1] and failures[1].kind == "exited" and failures[1].exitcode == 3
    error_type, message, elapsed = results[0]
    assert error_type == "RingPeerError", message
    assert elapsed < 30, (
        "rank 0 waited for the group timeout instead of seeing the closed connection"
    )


def test_the_launcher_reports_each_failing_rank_with_its_traceback():
    with pytest.raises(LaunchError) as info:
        launch(mismatch_errors, "no-such-device", config=LaunchConfig(world_size=2))
    assert sorted(info.value.failures) == [0, 1]
    for f in info.value.failures.values():
        assert f.kind == "raised" and "no-such-device" in f.traceback, f
    assert "2 of 2 ranks failed" in str(info.value)


def test_the_launcher_kills_ranks_that_outlive_its_time_limit():
    config = LaunchConfig(world_size=2, timeout_s=1.0)
    with pytest.raises(LaunchError) as info:
        launch(peer_goes_silent, 5.0, True, config=config)  # both ranks need >= 5 s
    assert {f.kind for f in info.value.failures.values()} == {"timeout"}


def test_the_launcher_rejects_functions_the_ranks_cannot_import():
    with pytest.raises(ValueError, match="module-level function"):
        launch(lambda rank, world: None, config=LaunchConfig(world_size=2))


def test_the_self_check_runs_under_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "reference_impls.collectives",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "ring_all_reduce self-check passed (2 ranks, cpu, torchrun)" in proc.stdout
