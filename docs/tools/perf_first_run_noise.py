"""Does the stored-baseline path (the first run after a baseline was recorded) catch a slowdown?

An experiment, not a test (docs/perf.md, "Stored baselines are re-judged on A/B pairs too",
has its results). Each run builds a throwaway repository with the tiny asv project of the perf
tests (suites/integration/harness/tiny_asv_project.py), runs the perf step once with no
baseline (it records one: quick asv run, wall time), makes the working tree's loop
``--factor`` times longer (uncommitted), and runs the step again with ``require_baseline``:
the gate against the stored baseline, as a fresh clone's second ``harness ci`` does. Prints
one line per run (load average, exit code, the row) and a summary.

    .venv/bin/python docs/tools/perf_first_run_noise.py --factor 1.5 --runs 10
    .venv/bin/python docs/tools/perf_first_run_noise.py --factor 1.0 --runs 5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "suites" / "integration" / "harness"))
import tiny_asv_project  # noqa: E402

from harness import perf  # noqa: E402


def once(work: float) -> tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="perf-first-run-") as tmp_name:
        tmp = Path(tmp_name)
        repo, _ = tiny_asv_project.make_repo(tmp, bench=tiny_asv_project.bench_source(repeat=5))
        tiny_asv_project.commit(repo, "second", readme="two\n")
        config = perf.PerfStepConfig(machine="first-run-experiment")
        perf.ci_step(repo, tmp / "reports", config, echo=None)
        n = round(work * tiny_asv_project.BASE_N)
        (repo / "benchmarks" / "tinylib.py").write_text(tiny_asv_project.TINYLIB.format(n=n))
        config = perf.PerfStepConfig(machine="first-run-experiment", require_baseline=True)
        result = perf.ci_step(repo, tmp / "reports", config, echo=None)
        row = next((line for line in result.markdown.splitlines() if "bench_tiny.Loop" in line), "")
        return result.exit_code, row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factor", type=float, default=1.5, help="head's work / base's")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    for var in ("GITHUB_BASE_REF", "HARNESS_PERF_BASE_REF", perf.MACHINE_ENV_VAR):
        os.environ.pop(var, None)
    codes = []
    for n in range(args.runs):
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        code, row = once(args.factor)
        codes.append(code)
        print(f"run {n + 1:2d}: load {load} exit {code} {row}", flush=True)
    print(
        f"work x{args.factor:g}: exit 0 in {codes.count(0)}, exit 1 in {codes.count(1)}, "
        f"exit 2 in {codes.count(2)} of {len(codes)} runs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
