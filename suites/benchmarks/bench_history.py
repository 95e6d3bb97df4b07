"""Costs of the test history on SQLite: appending a run of 2,000 tests, and reading back a
history of 1,000 runs x 2,000 tests. A script, not a timed test (docs/harness.md records the
numbers with the machine they came from):

    python suites/benchmarks/bench_history.py [--runs 1000] [--tests 2000] [--db PATH]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from harness.history import scores as sc
from harness.history.records import RunRecord, TestResult
from harness.history.store import open_store


def _run(r: int, nodeids: list[str], rng: random.Random) -> RunRecord:
    return RunRecord(
        run_key=f"bench-{r}",
        started_at=1.7e9 + 60 * r,
        source="harness",
        results=[
            TestResult(n, "failed" if rng.random() < 0.01 else "passed", 0.01, rng.getrandbits(32))
            for n in nodeids
        ],
        commit=f"{r // 3:040x}",
        tree=f"{r // 3:040x}",
        runner=f"cpu-{r % 3}",
        seed=r,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--db", type=Path, default=None)
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp()) / "history.db"
    rng = random.Random(0)
    nodeids = [f"suites/unit/test_m{i // 20}.py::test_{i}" for i in range(args.tests)]
    with open_store(db) as store:
        appends = []
        for r in range(store.run_count(), args.runs):
            t = time.perf_counter()
            store.append(_run(r, nodeids, rng))
            appends.append(time.perf_counter() - t)
        if appends:
            print(
                f"append of {args.tests} tests: first {appends[0]:.3f} s, "
                f"median {sorted(appends)[len(appends) // 2]:.3f} s, last {appends[-1]:.3f} s"
            )
        t = time.perf_counter()
        observed = store.observations(50)
        scores = [sc.score(n, o) for n, o in observed.items()]
        print(f"flaky over the last 50 runs ({len(scores)} tests): {time.perf_counter() - t:.3f} s")
        t = time.perf_counter()
        one = store.observations(None, tests=[nodeids[0]])
        print(
            f"one test's whole history ({len(one[nodeids[0]])} runs): "
            f"{time.perf_counter() - t:.3f} s"
        )
        t = time.perf_counter()
        observed = store.observations(None)
        rows = sum(map(len, observed.values()))
        print(f"every outcome of every run ({rows} rows): {time.perf_counter() - t:.3f} s")
    print(f"database: {db} ({db.stat().st_size / 1e6:.0f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
