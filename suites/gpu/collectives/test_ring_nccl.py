"""The ring on NCCL: two processes, one GPU each, against NCCL's own all_reduce.

Skips (with the reason) unless torch sees at least 2 CUDA devices. Inputs are integer-valued
(reference_impls.collectives.checks), so the ring and NCCL must agree bit for bit whatever
order each adds in.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness import assert_equal
from reference_impls.collectives import LaunchConfig, launch
from reference_impls.collectives.checks import (
    Case,
    compare_with_all_reduce,
    graph_replays,
    mismatch_errors,
)
from reference_impls.collectives.launcher import MULTICAST_OFF_ENV

pytestmark = pytest.mark.needs("cuda:2")

# NVLink multicast stays off on the shared GPU hosts (it can put the host's GPUs out of
# service). The launcher sets these for NCCL ranks by default; passing them explicitly keeps
# this file safe whatever that default becomes.
GPU_ENV = dict(MULTICAST_OFF_ENV)

CASES = [
    Case(numel=numel, dtype=dtype, op=op, segments=segments)
    for dtype in ("float32", "bfloat16", "float16", "int32")
    for op in (("sum", "max", "min") if dtype == "int32" else ("sum", "mean", "max", "min"))
    for numel, segments in ((1, 1), (3, 1), (1001, 1), (65_537, 3), ((1 << 22) + 3, 1))
] + [Case(numel=(1 << 24) + 1, op="sum", segments=2)]  # 64 MiB float32 in two interleaved lanes
# The Triton combine (RingConfig.combine_ctas): every dtype's ops, one size below and one far
# above a single program's tile count, so the persistent programs' stride loop runs.
CASES += [
    Case(numel=numel, dtype=dtype, op=op, segments=segments, combine_ctas=8)
    for dtype in ("float32", "bfloat16", "float16", "int32")
    for op in (("sum", "max", "min") if dtype == "int32" else ("sum", "mean", "max", "min"))
    for numel, segments in ((1001, 1), ((1 << 22) + 3, 2))
]


def _launch(fn, *args, backend):
    config = LaunchConfig(
        world_size=2, backend=backend, env=GPU_ENV, timeout_s=300, pg_timeout_s=120
    )
    return launch(fn, *args, config=config)


@pytest.fixture(scope="module")
def nccl_results():
    return _launch(compare_with_all_reduce, CASES, "cuda", backend="cpu:gloo,cuda:nccl")


@pytest.mark.parametrize(
    "index",
    range(len(CASES)),
    ids=[
        f"{c.dtype}-{c.op}-{c.numel}" + (f"-ctas{c.combine_ctas}" if c.combine_ctas else "")
        for c in CASES
    ],
)
def test_nccl_ring_equals_nccl_all_reduce_bit_for_bit(nccl_results, index):
    for rank, results in enumerate(nccl_results):
        r = results[index]
        assert r.case == CASES[index]
        assert r.equal, (
            f"rank {rank}: {r.case}: {r.mismatched} elements differ, max |diff| {r.max_abs_diff}"
        )


def test_nccl_ring_results_are_identical_on_both_gpus(nccl_results):
    for a, b in zip(*nccl_results, strict=True):
        assert a.digest == b.digest, f"{a.case}: the ranks' results differ"


def test_mismatched_calls_raise_on_both_ranks_and_leave_the_group_usable():
    errors = _launch(mismatch_errors, "cuda", backend="cpu:gloo,cuda:nccl")
    for rank, seen in enumerate(errors):
        for name, value in seen.items():
            if name == "after":
                assert_equal(value, np.full(10, 3.0, np.float32), check_dtype=False)
            else:
                assert value[0] in ("RingMismatchError", "ValueError"), (
                    f"rank {rank}, {name}: {value}"
                )


def test_an_nccl_only_group_checks_metadata_on_the_gpu():
    # backend="nccl" has no CPU side: the metadata check all-reduces a CUDA tensor instead.
    cases = [Case(numel=1001, op="sum"), Case(numel=7, dtype="bfloat16", op="max")]
    results = _launch(compare_with_all_reduce, cases, "cuda", backend="nccl")
    for per_rank in results:
        for r in per_rank:
            assert r.equal, f"{r.case}: {r.mismatched} elements differ"
    errors = _launch(mismatch_errors, "cuda", backend="nccl")
    assert all(e["numel"][0] == "RingMismatchError" for e in errors), errors


@pytest.mark.parametrize(
    "case",
    [
        Case(numel=(1 << 20) + 5, op="sum"),
        Case(numel=(1 << 23) + 1, op="mean", segments=2),
        Case(numel=(1 << 23) + 1, op="sum", segments=2, combine_ctas=16),
    ],
    ids=["sum-4MiB", "mean-32MiB-2-segments", "sum-32MiB-2-segments-triton-combine"],
)
def test_a_captured_ring_replays_the_same_result_as_nccl(case):
    per_rank = _launch(graph_replays, case, backend="cpu:gloo,cuda:nccl")
    for rank, replays in enumerate(per_rank):
        assert replays == [(True, True)] * len(replays), (
            f"rank {rank}: (vs NCCL, vs eager ring) {replays}"
        )
