"""The pull-request gate's wall time against an older harness, on the same benchmarks, in turn.

An experiment, not a test (docs/perf.md, "The gate's error rates, measured", its wall-time part,
has its results). Issue #25 allows the pull-request gate 1.5x the wall time it had when the
issue was filed (commit 8b48dcd: 20 A/B pairs in one long-lived worker pair, factor 1.3).
Each round runs the pull-request command,

    harness perf ci --measure-base always --require-baseline --passes 4 --base-ref main

(``--passes``: 4 as the pull-request workflow ran it then; ``--new-passes`` for this harness
when its workflow runs another number) once with the older harness (``--old``:
a checkout of it, put first on PYTHONPATH) and once with this one, the order alternating
round by round so that a load change reaches both, on the same repository: the tiny asv
project of the perf tests with a README-only change (``--case tiny``), or a clone of this
repository with a README-only change and real CPU benchmarks (``--case real``, ``--bench``).
One JSON line per gate run to ``--jsonl``.

    git worktree add --detach /tmp/old25 8b48dcd
    .venv/bin/python docs/tools/perf_gate_walltime.py --old /tmp/old25 --case tiny --rounds 6 \\
        --jsonl /tmp/walltime.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import perf_gate_noise  # noqa: E402
import perf_gate_rates  # noqa: E402


def gate(
    harness_root: Path, repo: Path, reports: Path, bench: str | None, passes: int
) -> tuple[int, float]:
    env = perf_gate_rates._env() | {"PYTHONPATH": str(harness_root)}
    cmd = [sys.executable, "-m", "harness.cli", "perf", "ci", "--measure-base", "always"]
    cmd += ["--require-baseline", "--passes", str(passes), "--base-ref", "main"]
    cmd += ["--machine", "walltime", "--report-dir", str(reports)]
    cmd += [] if bench is None else ["--bench", bench]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    return proc.returncode, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="a checkout of the older harness")
    parser.add_argument("--case", choices=["tiny", "real"], required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--passes", type=int, default=4, help="asv passes (4: the pull-request workflow's)"
    )
    parser.add_argument(
        "--new-passes",
        type=int,
        default=None,
        help="asv passes for this harness when its workflow runs another number [--passes]",
    )
    parser.add_argument("--bench", default=perf_gate_rates.REAL_BENCH)
    parser.add_argument("--jsonl", type=Path, required=True)
    args = parser.parse_args()
    passes = {
        "old": args.passes,
        "new": args.passes if args.new_passes is None else args.new_passes,
    }
    old = args.old.resolve()
    for name, rev in (("old", old), ("new", ROOT)):
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=rev, capture_output=True)
        print(f"{name}: {rev} at {sha.stdout.decode().strip()}", flush=True)
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="perf-walltime-") as tmp:
        if args.case == "tiny":
            repo, bench = perf_gate_noise.make_repo(Path(tmp), "same"), None
        else:
            repo, bench = Path(tmp) / "clone", args.bench
            perf_gate_rates.clone_with_readme_change(repo)  # as real-aa's
        for n in range(args.rounds):
            order = [("old", old), ("new", ROOT)]
            for name, harness_root in order if n % 2 == 0 else order[::-1]:
                load = os.getloadavg()[0]
                code, secs = gate(
                    harness_root, repo, Path(tmp) / f"rep-{name}-{n}", bench, passes[name]
                )
                seconds[name].append(secs)
                row = {"case": args.case, "harness": name, "round": n, "exit": code}
                row |= {"passes": passes[name]}
                row |= {"seconds": round(secs, 1), "load1": round(load, 2)}
                row |= {"utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                with args.jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    o, h = statistics.median(seconds["old"]), statistics.median(seconds["new"])
    print(f"median seconds: old {o:.1f}, new {h:.1f}: new / old = {h / o:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
