"""The instruction-count tier for real: the tiny asv project's loop counted under Valgrind.

A head whose loop does 10% more iterations is a count regression, and the working tree
unchanged counts within the threshold of its commit (A/A). Counts do not depend on the
machine's load (the point of the tier); the only skip is a machine without Valgrind, a C
compiler or valgrind/callgrind.h, and it says which.
"""

from __future__ import annotations

import pytest
from tiny_asv_project import BASE_N, TINYLIB, make_repo

from harness.perf import PerfError, counts
from harness.perf.counts import CountVerdict

NAME = "bench_tiny.Loop.time_work"


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    try:
        return counts.check_counts_tools(tmp_path_factory.mktemp("shim-cache"))
    except PerfError as exc:
        pytest.skip(f"the count tier cannot run here: {exc}")


def test_ten_percent_more_iterations_is_a_count_regression_and_unchanged_code_is_not(
    tmp_path, tools
):
    # A smaller loop than the timing tests' (Valgrind runs Python ~50x slower).
    n = BASE_N // 10
    repo, sha = make_repo(tmp_path, n=n)
    cache = tmp_path / "cache"
    same = counts.measure_counts(repo, sha, [NAME], repeats=3, cache_dir=cache)[NAME]
    found = same.judge(0.05)
    assert found.verdict is CountVerdict.UNCHANGED, (found, same.error)
    assert abs(found.ratio - 1) < 0.005, found  # A/A: docs/perf.md measured ~1e-5
    assert same.base is not None and same.base.per_call[0] > 10 * n  # it counted the loop

    (repo / "benchmarks" / "tinylib.py").write_text(TINYLIB.format(n=n + n // 10))
    slower = counts.measure_counts(repo, sha, [NAME], repeats=3, cache_dir=cache)[NAME]
    found = slower.judge(0.05)
    assert found.verdict is CountVerdict.REGRESSED, (found, slower.error)
    # Almost all of a call is the loop: 10% more iterations is close to 10% more instructions.
    assert 1.08 < found.ratio < 1.11, found


def test_a_benchmark_that_sleeps_or_opts_out_is_not_counted(tmp_path, tools):
    extra = (
        "\n\nclass Waits:\n    def time_nap(self):\n        import time\n"
        "        time.sleep(0.001)\n\n\nclass Off:\n    harness_counts = False\n\n"
        "    def time_work(self):\n        tinylib.work(10)\n"
    )
    from tiny_asv_project import bench_source

    repo, sha = make_repo(tmp_path, n=BASE_N // 10, bench=bench_source(extra=extra))
    names = ["bench_tiny.Waits.time_nap", "bench_tiny.Off.time_work"]
    found = counts.measure_counts(repo, sha, names, repeats=1, cache_dir=tmp_path / "c")
    nap = found[names[0]].judge(0.05)
    assert nap.verdict is CountVerdict.INELIGIBLE and "waited" in nap.why, nap
    off = found[names[1]].judge(0.05)
    assert off.verdict is CountVerdict.INELIGIBLE and "harness_counts = False" in off.why
