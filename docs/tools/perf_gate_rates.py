"""The perf gate's error rates under load, measured case by case and kept across sessions.

An experiment, not a test (docs/perf.md, "The gate's error rates, measured", has its
results). Issue #25 asks for rates: unchanged code passes in >= 99 of 100 gate runs, a 5%
slowdown is caught in >= 19 of 20, 10% in 20 of 20, and a 1.5x slowdown is never exit 0 in
any mode in 50 runs, on the 2-core VM with two busy loops and on an idle one. One gate run
takes 15 s to several minutes, so the runs are spread over sessions: each run appends one
JSON line to ``--jsonl`` (case, exit code, verdict, seconds, load average, the harness commit,
the date), ``--summary`` tallies every line of the file, and the cases are interleaved
(one of each in turn, ``--cycle`` sets the order) so that a load change reaches all of them.

Cases (each a fresh measurement of both sides; the tiny asv project of the perf tests,
suites/integration/harness/tiny_asv_project.py, unless named "real"):

- ``pr-aa``: pull-request mode (``harness perf ci --measure-base always --require-baseline``,
  the gate's default factor and A/B pairs), identical benchmark code: expect exit 0.
- ``pr-1.5x``: the same with the loop doing 1.5x the work: expect exit 1, never 0.
- ``first-1.5x``: a first run records the baseline (no baseline yet, as a fresh clone's
  ``harness ci``), the working tree's loop is made 1.5x, the next run gates against the stored
  result (docs/tools/perf_first_run_noise.py): never exit 0.
- ``stored-1.5x``: the base's results stored by ``harness perf run --commit main`` (main's own
  job), then on the 1.5x branch ``harness perf ci --measure-base never --require-baseline``
  (the head measured, gated against the stored base), then ``harness perf gate main feature``
  on both stored results (no A/B pairs: the asv samples alone): neither may exit 0.
- ``pr-5%-counts``, ``pr-10%-counts``: pull-request mode with ``--counts --counts-threshold
  0.03`` (instruction counts under Valgrind, a count regression confirmed by A/B pairs at
  1.03), the loop doing 5% / 10% more iterations: expect exit 1.
- ``pr-aa-counts``: the same configuration on identical code: expect exit 0.
- ``real-aa``: pull-request mode in a clone of this repository, a branch that changes only the
  README, over real CPU benchmarks (``--bench``, default the pure-Python ``bench_data.Planning``
  and ``bench_distributed_debug.StallReport``): expect exit 0.
- ``group-aa``: the same over the whole CPU group (every CPU benchmark: asv's passes of base
  and head, then A/B pairs for every timing benchmark; about an hour idle): expect exit 0.

It exits 1 when a run of this invocation exited otherwise than its case should (the nightly
job ``perf-group-aa`` then fails), 0 otherwise. With ``--load N`` (default 2), N busy loops
(``python -c 'while True: pass'``) run for the whole experiment; they are started by this
process and killed by PID when it ends.

    .venv/bin/python docs/tools/perf_gate_rates.py --jsonl docs/benchmarks/perf_rates.jsonl \\
        --minutes 120 --load 2
    .venv/bin/python docs/tools/perf_gate_rates.py --summary \\
        --jsonl docs/benchmarks/perf_rates.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "suites" / "integration" / "harness"))
import perf_first_run_noise  # noqa: E402
import perf_gate_noise  # noqa: E402
import tiny_asv_project  # noqa: E402

COUNTS = ["--counts", "--counts-threshold", "0.03"]
REAL_BENCH = r"bench_data\.Planning|bench_distributed_debug\.StallReport"
# What each case must do: the exit codes that count as right, and the one that must never occur.
EXPECT: dict[str, tuple[set[int], int | None]] = {
    "pr-aa": ({0}, None),
    "pr-aa-counts": ({0}, None),
    "real-aa": ({0}, None),
    "group-aa": ({0}, None),
    "pr-1.5x": ({1}, 0),
    "first-1.5x": ({1}, 0),
    "stored-1.5x": ({1}, 0),
    "pr-5%-counts": ({1}, 0),
    "pr-10%-counts": ({1}, 0),
}
DEFAULT_CYCLE = (
    "pr-aa,pr-1.5x,pr-5%-counts,pr-aa,first-1.5x,pr-10%-counts,pr-aa,stored-1.5x,"
    "pr-aa-counts,real-aa"
)


def _env() -> dict[str, str]:
    drop = ("GITHUB_BASE_REF", "CI", "HARNESS_PERF_BASE_REF", "HARNESS_PERF_MACHINE")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
    )


def _rows(report_json: Path) -> list[dict[str, Any]]:
    if not report_json.is_file():
        return []
    return [
        {k: r.get(k) for k in ("name", "status", "ratio", "low", "high", "n_base", "method")}
        | {"readings": [[x["verdict"], x["ratio"]] for x in r.get("readings") or []]}
        for r in json.loads(report_json.read_text())["rows"]
    ]


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-1500:]


def pr_case(tmp: Path, case: str, slowdown: float, extra: list[str]) -> dict[str, Any]:
    repo = perf_gate_noise.make_repo(tmp, case, slowdown)
    return perf_gate_noise.gate_once(repo, tmp / "reports", 1, 0, extra=extra)


def _keep_pairs(row: dict[str, Any], report_json: Path) -> None:
    """A wrong exit keeps its A/B pairs (perf-gate.json's `pairs`, [base, head] seconds in the
    order taken), so what the blocks read can be looked at afterwards."""
    if report_json.is_file():
        rows = json.loads(report_json.read_text())["rows"]
        row["pairs"] = {r["name"]: r.get("pairs") for r in rows if r.get("pairs")}


def first_case(tmp: Path) -> dict[str, Any]:
    del tmp  # perf_first_run_noise makes its own
    code, line = perf_first_run_noise.once(1.5)
    return {"exit": code, "row": line}


def stored_case(tmp: Path) -> dict[str, Any]:
    repo = perf_gate_noise.make_repo(tmp, "slow", 0.5)
    machine = ["--machine", perf_gate_noise.MACHINE]
    run = _harness("perf", "run", "--commit", "main", *machine, cwd=repo)
    if run.returncode != 0:
        return {"exit": -1, "error": "harness perf run --commit main failed", "tail": _tail(run)}
    step = _harness(
        "perf", "ci", "--measure-base", "never", "--require-baseline", "--base-ref", "main",
        *machine, "--report-dir", str(tmp / "reports"), cwd=repo,
    )  # fmt: skip
    gate = _harness(
        "perf", "gate", "main", "feature", *machine, "--json", str(tmp / "gate.json"), cwd=repo
    )
    # The case's exit: the step's; the stored-results gate is a second verdict on the same
    # change, kept beside it (`gate_exit`), and must not be 0 either.
    return {
        "exit": step.returncode,
        "rows": _rows(tmp / "reports" / "perf-gate.json"),
        "gate_exit": gate.returncode,
        "gate_rows": _rows(tmp / "gate.json"),
        **({"tail": _tail(step)} if step.returncode not in (0, 1, 2) else {}),
    }


def clone_with_readme_change(clone: Path) -> None:
    """A clone of this repository: ``main`` at its HEAD, ``feature`` (checked out) one commit
    on, changing only the README."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    tiny_asv_project.git(clone, "checkout", "-q", "-B", "main")
    tiny_asv_project.git(clone, "checkout", "-q", "-b", "feature")
    with (clone / "README.md").open("a") as f:
        f.write("\nA change that touches no benchmark.\n")
    tiny_asv_project.git(clone, "commit", "-qam", "README only")


def real_case(tmp: Path, bench: str) -> dict[str, Any]:
    clone = tmp / "clone"
    clone_with_readme_change(clone)
    step = _harness(
        "perf", "ci", "--measure-base", "always", "--require-baseline", "--base-ref", "main",
        "--machine", "rates-real", "--bench", bench, "--report-dir", str(tmp / "reports"),
        cwd=clone,
    )  # fmt: skip
    rows = _rows(tmp / "reports" / "perf-gate.json")
    return {
        "exit": step.returncode,
        "rows": rows,
        # Unchanged code: any exit but 0 is wrong; keep why (a row that failed names asv's
        # error only in the log: the lines about failures, and the end).
        **({"tail": _why(step)} if step.returncode != 0 else {}),
    }


def _why(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stdout + proc.stderr).splitlines()
    flagged = [x for x in lines if any(w in x for w in ("failed", "Error", "Traceback", "imeout"))]
    return "\n".join(flagged[-60:]) + "\n...\n" + _tail(proc)


def run_case(case: str, bench: str) -> dict[str, Any]:
    cases: dict[str, Callable[[Path], dict[str, Any]]] = {
        "pr-aa": lambda t: pr_case(t, "same", 0.0, []),
        "pr-1.5x": lambda t: pr_case(t, "slow", 0.5, []),
        "pr-5%-counts": lambda t: pr_case(t, "slow", 0.05, COUNTS),
        "pr-10%-counts": lambda t: pr_case(t, "slow", 0.10, COUNTS),
        "pr-aa-counts": lambda t: pr_case(t, "same", 0.0, COUNTS),
        "first-1.5x": first_case,
        "stored-1.5x": stored_case,
        "real-aa": lambda t: real_case(t, bench),
        "group-aa": lambda t: real_case(t, "."),
    }
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"perf-rates-{case.replace('%', 'pc')}-") as tmp:
        row = cases[case](Path(tmp))
        if row["exit"] not in EXPECT[case][0]:
            _keep_pairs(row, Path(tmp) / "reports" / "perf-gate.json")
    return {
        "case": case,
        **row,
        "seconds": round(time.monotonic() - started, 1),
        "load1": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _upper(k: int, n: int, confidence: float = 0.95) -> float:
    """Clopper-Pearson: the one-sided upper bound on a rate seen k times in n trials."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(confidence, k + 1, n - k))


def _remeasured(row: dict[str, Any]) -> bool:
    """Whether a benchmark of this gate run read `regressed` first and was measured again."""
    return bool(row.get("readings")) or any(r.get("readings") for r in row.get("rows") or [])


def summary(path: Path, since: str = "", until: str = "~") -> str:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    lines = [x for x in lines if since <= x["utc"] < until]  # ISO 8601 UTC: text order is time
    by: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for row in lines:
        by[(row["case"], row["busy_loops"])].append(row)
    out = ["| case | busy loops | runs | expected exit | exit 0 / 1 / 2 / other | "
           "wrong exits: 95% upper bound on their rate | must-never exit seen | measured again | "
           "load1 | seconds per run (median) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (case, loops), rows in sorted(by.items()):
        want, never = EXPECT[case]
        codes = collections.Counter(r["exit"] for r in rows)
        other = sum(v for k, v in codes.items() if k not in (0, 1, 2))
        hits = sum(codes[c] for c in want)
        bad = codes[never] if never is not None else 0
        if case == "stored-1.5x":
            bad += sum(r.get("gate_exit") == 0 for r in rows)
        loads = [x for r in rows for x in r["load1"]]
        secs = sorted(r["seconds"] for r in rows)
        out.append(
            f"| {case} | {loops} | {len(rows)} | {'/'.join(map(str, sorted(want)))}: "
            f"**{hits} of {len(rows)}** | {codes[0]} / {codes[1]} / {codes[2]} / {other} | "
            f"{_upper(len(rows) - hits, len(rows)):.1%} | "
            f"{bad if never is not None else '-'} | {sum(map(_remeasured, rows))} | "
            f"{min(loads):.1f}-{max(loads):.1f} | "
            f"{secs[len(secs) // 2]:.0f} |"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jsonl", type=Path, required=True, help="append one line per run")
    parser.add_argument("--summary", action="store_true", help="tally the file and stop")
    parser.add_argument(
        "--since", default="", help="--summary: only runs from this UTC time on (2026-12-03T13:41)"
    )
    parser.add_argument("--until", default="~", help="--summary: only runs before this UTC time")
    parser.add_argument("--cycle", default=DEFAULT_CYCLE, help="cases, comma-separated, in turn")
    parser.add_argument("--minutes", type=float, default=60.0, help="start no run after this")
    parser.add_argument("--cycles", type=int, default=10**6, help="at most this many cycles")
    parser.add_argument("--load", type=int, default=2, help="busy loops for the whole run")
    parser.add_argument("--bench", default=REAL_BENCH, help="real-aa's --bench regex")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.jsonl, args.since, args.until))
        return 0
    cycle = [c.strip() for c in args.cycle.split(",") if c.strip()]
    unknown = sorted(set(cycle) - set(EXPECT))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {sorted(EXPECT)}")
    if shutil.which("valgrind") is None and any("counts" in c for c in cycle):
        parser.error("the counts cases need valgrind on PATH")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]

    def stop(*_: object) -> None:
        for p in busy:  # only the loops this process started, by PID
            p.kill()
        raise SystemExit(130)

    signal.signal(signal.SIGTERM, stop)
    deadline = time.monotonic() + 60 * args.minutes
    host = f"{platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {host}, {commit}", flush=True)
    wrong = 0  # runs of this invocation whose exit was not the case's right one
    try:
        for _ in range(args.cycles):
            for case in cycle:
                if time.monotonic() > deadline:
                    return 1 if wrong else 0
                row = run_case(case, args.bench)
                wrong += row["exit"] not in EXPECT[case][0]
                row |= {
                    "busy_loops": args.load,
                    "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "commit": commit,
                    "host_cpus": os.cpu_count(),
                }
                with args.jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"{row['utc']} {case}: exit {row['exit']} {row.get('status', '')} "
                    f"ratio {row.get('ratio', '')} {row['seconds']} s load1 {row['load1']}",
                    flush=True,
                )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
