"""pytest-benchmark micro-benchmarks: harness.assert_close on large inputs.

Not part of the normal test run (pyproject.toml's norecursedirs skips suites/benchmarks) and
invisible to asv (this folder has no __init__.py). Run, save a baseline, and compare
(docs/perf.md, "Micro-benchmarks with pytest-benchmark"):

    .venv/bin/python -m pytest suites/benchmarks/micro --benchmark-only --benchmark-save=base
    .venv/bin/python -m pytest suites/benchmarks/micro --benchmark-only \
        --benchmark-compare --benchmark-compare-fail=median:10%

The second command exits 1 when a median is more than 10% slower than the last saved run.
"""

from __future__ import annotations

import numpy as np
import pytest

import harness

SIZE = 16_000_000  # 64 MB of float32: large enough that the comparison, not dispatch, dominates


@pytest.fixture(scope="module")
def pair():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(20261130)
    expected = rng.standard_normal(SIZE, dtype=np.float32)
    # 1e-7 relative: within float32's default tolerance, so the whole tensor is compared.
    actual = expected * (1 + 1e-7 * rng.standard_normal(SIZE, dtype=np.float32))
    return torch.from_numpy(actual), torch.from_numpy(expected)


def test_assert_close_on_a_large_float32_tensor(benchmark, pair):
    actual, expected = pair
    benchmark.pedantic(harness.assert_close, args=(actual, expected), rounds=10, warmup_rounds=1)


def test_assert_close_on_a_large_float64_array(benchmark):
    rng = np.random.default_rng(20261130)
    expected = rng.standard_normal(SIZE // 4)
    actual = expected * (1 + 1e-12 * rng.standard_normal(SIZE // 4))
    benchmark.pedantic(harness.assert_close, args=(actual, expected), rounds=10, warmup_rounds=1)
