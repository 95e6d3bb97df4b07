"""Does the pull-request perf gate catch a 2x slowdown, and pass unchanged code, under load?

An experiment, not a test (docs/perf.md, "Does the pull-request gate catch a 2x regression?",
has its results). It builds a throwaway git repository holding a tiny asv project (one
benchmark timing a pure-Python loop of ~1 ms), commits the base on ``main`` and a change on a
``feature`` branch (``--case slow``: the loop does twice the work; ``--case same``: only the
README changes), and runs the documented pull-request command in it ``--runs`` times:

    harness perf ci --measure-base always --require-baseline

(``--passes`` defaults to 1 here as there; ``--ab-pairs`` to 60; ``--factor`` to the gate's
default unless given). Each run measures base and
head afresh. The project is the one the perf tests use
(suites/integration/harness/tiny_asv_project.py). With ``--load N``, N busy loops
(``python -c 'while True: pass'``) run for the duration of each gate run, started before it and
killed by PID after it. The machine is shared with other jobs, so the load is never only ours:
the load average is printed with each run.

    .venv/bin/python docs/tools/perf_gate_noise.py --case slow --runs 20 --load 2
    .venv/bin/python docs/tools/perf_gate_noise.py --case same --runs 20 --load 2

Prints one line per run (exit code, ratio, p, passes, whether it was measured again, seconds)
and a summary; ``--json FILE`` keeps the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The tiny project the perf tests gate, shared with them (its docstring says why it lives there).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "suites" / "integration" / "harness"))
import tiny_asv_project  # noqa: E402

MACHINE = "noise-experiment"


def make_repo(path: Path, case: str, slowdown: float = 1.0) -> Path:
    """main: the base; feature (checked out): (1 + slowdown) times the work (slow) or a README
    change (same)."""
    repo, _ = tiny_asv_project.make_repo(path)
    tiny_asv_project.git(repo, "checkout", "-q", "-b", "feature")
    if case == "slow":
        n = round((1 + slowdown) * tiny_asv_project.BASE_N)
        tiny_asv_project.commit(repo, f"change: {case}", n=n)
    else:
        tiny_asv_project.commit(repo, f"change: {case}", readme="tiny, documented\n")
    return repo


def gate_once(
    repo: Path,
    reports: Path,
    passes: int,
    load: int,
    factor: float | None = None,
    ab_start: str | None = None,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "perf",
        "ci",
        "--measure-base",
        "always",
        "--require-baseline",
        "--passes",
        str(passes),
        "--base-ref",
        "main",
        "--machine",
        MACHINE,
        "--report-dir",
        str(reports),
    ] + ([] if factor is None else ["--factor", str(factor)])
    cmd += [] if ab_start is None else ["--ab-start", ab_start]
    cmd += list(extra)  # more `harness perf ci` options (perf_gate_rates.py: --counts ...)
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_BASE_REF", "CI")}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    finally:
        for p in busy:  # only the loops this run started, by PID
            p.kill()
            p.wait()
    seconds = time.monotonic() - started
    row: dict[str, Any] = {"exit": proc.returncode, "seconds": round(seconds, 1)}
    row["load1"] = round(os.getloadavg()[0], 2)
    gate_json = reports / "perf-gate.json"
    if gate_json.is_file():
        data = json.loads(gate_json.read_text())
        (bench,) = [r for r in data["rows"] if r["name"].endswith("time_work")]
        row.update(
            ratio=bench["ratio"],
            p=bench["p"],
            passes=bench["passes"],
            method=bench["method"],
            status=bench["status"],
            interval=[bench.get("low"), bench.get("high")],
            pairs=bench["n_base"],
            # a `regressed` reading measured again (decision.settle): each reading's verdict
            readings=[
                [x["verdict"], x["ratio"], x["low"], x["high"]] for x in bench.get("readings") or []
            ],
        )
    row["ab"] = "interleaved A/B pairs" in proc.stdout
    if proc.returncode not in (0, 1) and "UNDECIDED" not in proc.stdout:
        row["tail"] = (proc.stdout + proc.stderr)[-2000:]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=["slow", "same"], required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=0, help="busy loops during each run")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument(
        "--slowdown", type=float, default=1.0, help="slow case: this fraction more work (1: 2x)"
    )
    parser.add_argument("--factor", type=float, default=None, help="the gate's (its default)")
    parser.add_argument(
        "--ab-start", choices=["fork", "exec"], default=None, help="the gate's (its default)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()

    expected = 1 if args.case == "slow" else 0
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="perf-gate-noise-") as tmp:
        repo = make_repo(Path(tmp), args.case, args.slowdown)
        for n in range(args.runs):
            row = gate_once(
                repo, Path(tmp) / f"reports-{n}", args.passes, args.load, args.factor, args.ab_start
            )
            rows.append(row)
            print(
                f"run {n + 1:2d}: exit {row['exit']} {row.get('status')} ratio {row.get('ratio')} "
                f"interval {row.get('interval')} p {row.get('p')} "
                f"compared {row.get('passes')} {row.get('method')} "
                f"{row['seconds']} s load1 {row['load1']}",
                flush=True,
            )
            if "tail" in row:
                print(row["tail"], flush=True)
    hits = sum(r["exit"] == expected for r in rows)
    ratios = [r["ratio"] for r in rows if r.get("ratio") is not None]
    print(
        f"case {args.case}, load {args.load}, passes {args.passes}: exit {expected} in "
        f"{hits} of {len(rows)} runs; ratios {min(ratios):.2f}-{max(ratios):.2f}; "
        f"{sum(r['ab'] for r in rows)} judged on A/B pairs; "
        f"{sum(r['seconds'] for r in rows) / len(rows):.0f} s per run"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
