"""Benchmarks of the harness itself: the pytest plugin's per-test overhead and ``assert_close``.

Plugin overhead (target: under 1 ms per test): 1,000 trivial tests in a temporary
folder, run with ``python -m pytest -q -p no:cacheprovider`` once with the installed harness
plugin and once with ``-p no:harness``, both in the same asv run on the same machine. The
``time_`` benchmark times each variant (with samples, so the gate can apply its significance
test); the ``track_`` benchmark reports their difference per test in milliseconds.

Both work against whatever ``harness.plugin`` is installed: when the ``harness`` pytest11
entry point is missing or does not import, the with-plugin variants are skipped (asv shows
n/a) rather than silently timing pytest without it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import harness

N_TESTS = 1000
TESTS_PER_MODULE = 100  # 10 modules: closer to a real suite than one 1,000-test file
PYTEST_ARGS = ("-m", "pytest", "-q", "-p", "no:cacheprovider")

# Variables that change what the plugin does (CI turns on deterministic mode, which imports
# torch's compiler once) or what pytest loads. The benchmark measures the default local run;
# keeping them out makes a CI runner and a laptop measure the same thing.
_SCRUBBED_ENV = ("CI", "GITHUB_ACTIONS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")


def _plugin_problem() -> str | None:
    """Why the harness pytest plugin cannot be benchmarked here, or None when it can."""
    entry_points = importlib.metadata.entry_points(group="pytest11")
    if not any(ep.name == "harness" for ep in entry_points):
        return "no pytest11 entry point named 'harness' is installed"
    try:
        spec = importlib.util.find_spec("harness.plugin")
    except ImportError as exc:  # a broken parent package
        return f"harness.plugin cannot be located: {exc}"
    if spec is None:
        return "the 'harness' entry point names harness.plugin, which is not importable"
    return None


def _write_trivial_tests(root: str) -> str:
    """Write N_TESTS passing tests under root/suites/unit (a tier folder, as in the repo)."""
    tests = os.path.join(root, "suites", "unit")
    os.makedirs(tests, exist_ok=True)
    # An ini file pins rootdir here so no configuration above the temp folder leaks in.
    with open(os.path.join(root, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    body = "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(TESTS_PER_MODULE))
    for module in range(N_TESTS // TESTS_PER_MODULE):
        with open(os.path.join(tests, f"test_trivial_{module:02d}.py"), "w") as f:
            f.write(body)
    return root


def _run_pytest(root: str, plugin: str) -> float:
    """Run pytest on the trivial tests; return wall seconds. plugin: 'harness' or 'no:harness'."""
    cmd = [sys.executable, *PYTEST_ARGS]
    if plugin == "no:harness":
        cmd += ["-p", "no:harness"]
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    # A run that failed or ran the wrong number of tests must not become a timing.
    if proc.returncode != 0 or f"{N_TESTS} passed" not in proc.stdout:
        raise RuntimeError(
            f"{' '.join(cmd)} in {root} exited {proc.returncode}, expected "
            f"'{N_TESTS} passed':\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return elapsed


class _TrivialTests:
    """Shared setup_cache: asv keys it by function, so both classes below reuse one folder."""

    timeout = 600

    def setup_cache(self):
        # asv runs setup_cache in a temporary folder that it removes after the run.
        root = _write_trivial_tests(os.path.abspath("trivial_tests"))
        _run_pytest(root, "no:harness")  # compile the test modules once, outside any sample
        return root


class PluginOverhead(_TrivialTests):
    """Wall time of pytest on 1,000 trivial tests, with and without the harness plugin."""

    harness_counts = False  # runs pytest in a subprocess: not an instruction count (README.md, 9)
    # A/B pairs count the pytest process's CPU time (~2 s a run): 4-5.5 s per pair with two
    # busy loops, 22-32 pairs in the default 120 s, too few to decide (2026-12-03); 60 pairs
    # need ~330 s (README.md, 10).
    harness_ab_budget = 480

    params = ["harness", "no:harness"]
    param_names = ["plugin"]
    # One pytest process per sample. 2 rounds of 4-5 samples: asv runs round 1 of both
    # variants, then round 2, so a drift in machine speed reaches both; 8 samples per variant
    # clear the 7 that asv's Mann-Whitney test (p < 0.002) needs to call anything significant.
    number = 1
    repeat = (4, 5, 60.0)
    rounds = 2
    warmup_time = 0.0

    def setup(self, root, plugin):
        if plugin == "harness":
            problem = _plugin_problem()
            if problem:
                raise NotImplementedError(problem)

    def time_pytest_1000_trivial_tests(self, root, plugin):
        _run_pytest(root, plugin)


class PluginOverheadPerTest(_TrivialTests):
    """Per-test overhead of the harness plugin in ms: (with - without) / 1,000.

    Each call runs 3 pairs in ABBA order (with, without, without, with, ...) so that a drift
    in machine speed during the measurement cancels, and takes the medians' difference.

    ``track_info_``: a difference of two noisy wall times has no samples for asv's test and
    swings by more than any usable factor, so the gate shows it without failing on it
    (suites/benchmarks/README.md). Regressions of the plugin are gated through
    ``PluginOverhead.time_pytest_1000_trivial_tests('harness')``.
    """

    unit = "ms per test"
    pairs = 3

    def setup(self, root):
        problem = _plugin_problem()
        if problem:
            raise NotImplementedError(problem)

    def track_info_plugin_overhead_ms_per_test(self, root):
        with_plugin, without = [], []
        for i in range(self.pairs):
            order = ("harness", "no:harness") if i % 2 == 0 else ("no:harness", "harness")
            for plugin in order:
                seconds = _run_pytest(root, plugin)
                (with_plugin if plugin == "harness" else without).append(seconds)
        return (statistics.median(with_plugin) - statistics.median(without)) / N_TESTS * 1e3


# Inputs shared by the assert_close benchmarks, built once per process and only appended to
# (asv re-runs setup before every sample).
_INPUTS: dict[tuple[int, str, str], tuple[object, object]] = {}


def _close_pair(size: int, kind: str, device: str = "cpu"):
    """A seeded (actual, expected) pair that agrees within the dtype's default tolerance."""
    key = (size, kind, device)
    if key not in _INPUTS:
        rng = np.random.default_rng(20261130 + size)
        expected = rng.standard_normal(size)
        # 1e-8 relative: inside every float32/float64 default tolerance, so each call walks the
        # whole comparison instead of stopping at the first mismatch.
        actual = expected * (1.0 + 1e-8 * rng.standard_normal(size))
        if kind == "numpy.float64":
            pair = (actual, expected)
        else:
            import torch

            dtype = getattr(torch, kind.split(".", 1)[1])
            pair = (
                torch.from_numpy(actual).to(device=device, dtype=dtype),
                torch.from_numpy(expected).to(device=device, dtype=dtype),
            )
        _INPUTS[key] = pair
    return _INPUTS[key]


def _check_assert_close_works(actual, expected) -> None:
    # A placeholder assert_close raises NotImplementedError: asv then skips the benchmark.
    harness.assert_close(actual[:4], expected[:4])


class AssertClose:
    """harness.assert_close on equal-enough inputs (the common, passing path)."""

    params = ([1_000, 100_000, 1_000_000], ["torch.float32", "numpy.float64"])
    param_names = ["size", "kind"]

    def setup(self, size, kind):
        self.actual, self.expected = _close_pair(size, kind)
        _check_assert_close_works(self.actual, self.expected)

    def time_assert_close(self, size, kind):
        harness.assert_close(self.actual, self.expected)


class AssertCloseBesideTorch:
    """harness.assert_close and torch.testing.assert_close on the same float32 tensors.

    Side by side in one run, so the ratio holds on a busy machine: the target is harness within
    1.2x of torch.testing on the CPU (docs/benchmarks/harness.md).
    """

    params = ([1_000_000, 16_000_000], ["harness", "torch.testing"])
    param_names = ["size", "impl"]

    def setup(self, size, impl):
        import torch

        self.actual, self.expected = _close_pair(size, "torch.float32")
        _check_assert_close_works(self.actual, self.expected)
        self.compare = harness.assert_close if impl == "harness" else torch.testing.assert_close

    def time_assert_close(self, size, impl):
        self.compare(self.actual, self.expected)


class GpuAssertClose:
    """harness.assert_close on CUDA tensors (GPU group: skipped without CUDA)."""

    params = ([1_000_000, 16_000_000], ["torch.float32", "torch.bfloat16"])
    param_names = ["size", "kind"]

    def setup(self, size, kind):
        try:
            import torch
        except ImportError:
            raise NotImplementedError("torch is not installed") from None
        if not torch.cuda.is_available():
            raise NotImplementedError("CUDA is not available")
        self.actual, self.expected = _close_pair(size, kind, device="cuda")
        _check_assert_close_works(self.actual, self.expected)
        torch.cuda.synchronize()

    def time_assert_close(self, size, kind):
        # assert_close returns a Python verdict, so the device work is finished on return.
        harness.assert_close(self.actual, self.expected)


class GpuAssertCloseBesideTorch(AssertCloseBesideTorch):
    """The side-by-side pair on CUDA tensors (GPU group: skipped without CUDA); the target is
    harness within 2x of torch.testing at 16M elements."""

    def setup(self, size, impl):
        import torch

        if not torch.cuda.is_available():
            raise NotImplementedError("CUDA is not available")
        self.actual, self.expected = _close_pair(size, "torch.float32", device="cuda")
        _check_assert_close_works(self.actual, self.expected)
        self.compare = harness.assert_close if impl == "harness" else torch.testing.assert_close
        torch.cuda.synchronize()
