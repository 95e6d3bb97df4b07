"""How stable are instruction counts, what do they detect, and what do they cost? (counts.py)

An experiment, not a test (docs/perf.md, "Instruction counts (Valgrind)", has its results).

``--case tiny``: a throwaway copy of the tiny asv project (suites/integration/harness/
tiny_asv_project.py, the loop benchmark of the gate tests, at ``--n`` iterations); the
working tree is counted against its own commit (A/A) ``--runs`` times, then with the loop
made ``--slowdown`` longer (repeatable: 0.05, 0.1), ``--runs`` times each.

``--case suite``: the benchmarks of this checkout's CPU group matching ``--bench``, each
counted A/A (the working tree against HEAD's ``git archive``) once, with its Valgrind wall
time per side and why it is not eligible, if it is not.

    .venv/bin/python docs/tools/perf_counts.py --case tiny --runs 5 --slowdown 0.05 --slowdown 0.1
    .venv/bin/python docs/tools/perf_counts.py --case suite --bench 'Planning|Simulation'

``--case edit``: a throwaway clone of this checkout's HEAD; the benchmarks matching
``--bench`` counted A/A, then with ``--old`` replaced by each ``--new`` in ``--file`` (more
work injected into a real benchmark), ``--runs`` times each.

    .venv/bin/python docs/tools/perf_counts.py --case edit --runs 2 \
        --bench 'Planning.time_plan_worker' --file suites/benchmarks/bench_data.py \
        --old 'rng.integers(500, 700, 10_000)' --new 'rng.integers(500, 700, 10_500)'

``--cache-sim`` adds callgrind's cache simulation (the misses per call are printed). Prints
one line per count; ``--json FILE`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "suites" / "integration" / "harness"))
import tiny_asv_project  # noqa: E402

from harness.perf import counts  # noqa: E402
from harness.perf.ab import list_timing_benchmarks  # noqa: E402
from harness.perf.runs import bench_regex  # noqa: E402


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def row(label: str, result: counts.CountResult, threshold: float) -> dict[str, Any]:
    found = result.judge(threshold)
    out: dict[str, Any] = {
        "label": label,
        "name": result.name,
        "verdict": str(found.verdict),
        "ratio": found.ratio,
        "spread": found.spread,
        "why": found.why,
        "load": _load(),
    }
    for side in ("base", "head"):
        s = getattr(result, side)
        if s is not None:
            out[f"{side}_ir_per_call"] = s.per_call
            out[f"{side}_wall_s"] = round(s.wall_s, 1)
            out[f"{side}_cpu_s"] = round(s.cpu_s, 1)
            out[f"{side}_number"] = s.number
            if s.events:
                out[f"{side}_events"] = s.events
    if result.error:
        out["error"] = result.error
    print(json.dumps(out), flush=True)
    return out


def tiny(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    repo, sha = tiny_asv_project.make_repo(tmp, n=args.n)
    name = "bench_tiny.Loop.time_work"
    rows = []
    for level in [0.0, *args.slowdown]:
        n = round(args.n * (1 + level))
        (repo / "benchmarks" / "tinylib.py").write_text(tiny_asv_project.TINYLIB.format(n=n))
        for _ in range(args.runs):
            found = counts.measure_counts(
                repo, sha, [name], repeats=args.repeats, cache_sim=args.cache_sim
            )
            rows.append(row(f"+{level:.0%}", found[name], args.threshold))
    return rows


def suite(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = Path.cwd()
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    pattern = bench_regex("cpu", args.bench)
    names = [n for n in list_timing_benchmarks(root) if not pattern or re.search(pattern, n)]
    rows = []
    for name in names:
        found = counts.measure_counts(
            root,
            sha,
            [name],
            repeats=args.repeats,
            cache_sim=args.cache_sim,
            timeout_s=args.timeout,
        )
        rows.append(row("A/A", found[name], args.threshold))
    return rows


def edit(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(Path.cwd()), str(clone)], check=True)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout.strip()
    pattern = bench_regex("cpu", args.bench)
    names = [n for n in list_timing_benchmarks(clone) if not pattern or re.search(pattern, n)]
    target = clone / args.file
    original = target.read_text()
    if args.old not in original:
        raise SystemExit(f"{args.old!r} is not in {args.file}")
    rows = []
    for new in [args.old, *args.new]:
        target.write_text(original.replace(args.old, new))
        for _ in range(args.runs):
            found = counts.measure_counts(
                clone,
                sha,
                names,
                repeats=args.repeats,
                cache_sim=args.cache_sim,
                timeout_s=args.timeout,
            )
            rows += [row(new, found[name], args.threshold) for name in names]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=["tiny", "suite", "edit"], required=True)
    parser.add_argument("--file", default=None)
    parser.add_argument("--old", default=None)
    parser.add_argument("--new", action="append", default=[])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=tiny_asv_project.BASE_N)
    parser.add_argument("--slowdown", type=float, action="append", default=[])
    parser.add_argument("--bench", default=None)
    parser.add_argument("--repeats", type=int, default=counts.DEFAULT_REPEATS)
    parser.add_argument("--threshold", type=float, default=counts.DEFAULT_COUNT_THRESHOLD)
    parser.add_argument("--timeout", type=float, default=counts.VALGRIND_TIMEOUT_S)
    parser.add_argument("--cache-sim", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print(f"# load {_load()}; {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="perf-counts-") as tmp:
        if args.case == "tiny":
            rows = tiny(args, Path(tmp))
        elif args.case == "edit":
            rows = edit(args, Path(tmp))
        else:
            rows = suite(args)
    print(f"# {len(rows)} counts in {time.monotonic() - start:.0f} s; load {_load()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
