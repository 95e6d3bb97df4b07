"""Costs of the test history on SQLite (the issue's targets: appending a run of 2,000 tests in
< 1 s; queries over 1,000 runs x 2,000 tests in < 1 s).

asv classes: ``HistoryAppend`` (one run of 2,000 tests into a history of 100 runs) and
``HistoryQuery`` (scores of every test over the last 50, 500 and 1,000 runs of a
1,000-run history, what ``harness history flaky --window N`` computes; one test's whole
history, what un-quarantine reads). The 1,000-run history is built once per asv run in
``setup_cache`` through the real store (``Store.append``), and only read afterwards.

The suite is a mix like a real one (``population``): most tests never fail, some are flaky
(1%, 5%, 20%), seed-dependent, broken at some run, or skipped on one runner. The script also
measures the worst case, where every test fails at 1% (so no test is scored from counts):

    python suites/benchmarks/bench_history.py [--runs 1000] [--tests 2000] [--db PATH]
    python suites/benchmarks/bench_history.py --every-test-flaky ...

docs/benchmarks/harness.md records the numbers with the machine, load and date.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.history.records import RunRecord, TestResult
from harness.history.store import open_store

SEED = 20261202
RUNS = 1000
TESTS = 2000
RUNNERS = ("cpu-1", "cpu-2", "gpu-1")

# outcome(run_index, run_seed, runner, rng) -> pytest outcome
Behaviour = Callable[[int, int, str, random.Random], str]


def _flaky(p: float) -> Behaviour:
    return lambda r, s, w, rng: "failed" if rng.random() < p else "passed"


def population(tests: int, every_test_flaky: bool = False) -> dict[str, Behaviour]:
    """Node id -> behaviour: 90% stable, 5% flaky (1%, 5%, 20%), 2% seed-dependent, 1% broken
    from some run on, 2% GPU tests skipped on the CPU runners; or every test flaky at 1%."""
    out: dict[str, Behaviour] = {}
    for i in range(tests):
        nodeid = f"suites/unit/test_m{i // 20}.py::test_{i}"
        k = i % 100
        if every_test_flaky:
            out[nodeid] = _flaky(0.01)
        elif k < 90:
            out[nodeid] = lambda r, s, w, rng: "passed"
        elif k < 95:
            out[nodeid] = _flaky((0.01, 0.05, 0.2)[k % 3])
        elif k < 97:
            bad = k % 10
            out[nodeid] = lambda r, s, w, rng, bad=bad: "failed" if s % 10 == bad else "passed"
        elif k < 98:
            at = (i * 7) % RUNS
            out[nodeid] = lambda r, s, w, rng, at=at: "failed" if r >= at else "passed"
        else:
            out[nodeid] = lambda r, s, w, rng: "passed" if w == "gpu-1" else "skipped"
    return out


def make_run(r: int, tests: dict[str, Behaviour], rng: random.Random) -> RunRecord:
    seed = rng.randrange(10) + 1000
    runner = RUNNERS[r % len(RUNNERS)]
    return RunRecord(
        run_key=f"bench-{r}",
        started_at=1.7e9 + 60 * r,
        source="harness",
        results=[
            TestResult(n, b(r, seed, runner, rng), 0.01, (seed * 7919 + i) % 2**32)
            for i, (n, b) in enumerate(tests.items())
        ],
        commit=f"{r // 3:040x}",
        tree=f"{r // 3:040x}",
        runner=runner,
        seed=seed,
        status="passed",
    )


def build(
    db: Path, runs: int, tests: int, every_test_flaky: bool = False
) -> list[tuple[float, float]]:
    """Append ``runs`` runs (those not there yet) to ``db``; (wall, CPU) seconds of each."""
    rng = random.Random(SEED)
    pop = population(tests, every_test_flaky)
    records = [make_run(r, pop, rng) for r in range(runs)]
    appends = []
    with open_store(db) as store:
        for record in records[store.run_count() :]:
            t, cpu = time.perf_counter(), time.process_time()
            store.append(record)
            appends.append((time.perf_counter() - t, time.process_time() - cpu))
    return appends


def _timed(label: str, fn: Callable[[], object]) -> object:
    """Run ``fn`` once; print its wall and CPU seconds (on a loaded machine the CPU time is
    what the code costs, the wall time what it waited too)."""
    t, cpu = time.perf_counter(), time.process_time()
    out = fn()
    print(f"{label}: {time.perf_counter() - t:.3f} s wall, {time.process_time() - cpu:.3f} s CPU")
    return out


class HistoryAppend:
    """One run of 2,000 tests appended (one transaction) to a history of 100 runs."""

    timeout = 600
    number = 1
    repeat = (7, 10, 120.0)

    def setup_cache(self):
        db = Path("history.db").resolve()  # asv's folder for this setup_cache, removed after
        build(db, 100, TESTS)
        return str(db)

    def setup(self, db):
        self.dir = tempfile.mkdtemp(prefix="bench-history-")
        for part in Path(db).parent.glob("history.db*"):  # with a -wal file, if one is left
            shutil.copy(part, Path(self.dir) / part.name)
        self.store = open_store(Path(self.dir) / "history.db")
        self.record = make_run(100, population(TESTS), random.Random(SEED + 1))

    def teardown(self, db):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_append_run_of_2000_tests(self, db):
        self.store.append(self.record)


class HistoryQuery:
    """Scores of every test over 1,000 runs x 2,000 tests (and over the last 50 runs), and one
    test's whole history, on a history built once per asv run."""

    timeout = 900

    def setup_cache(self):
        db = Path("history.db").resolve()  # asv's folder for this setup_cache, removed after
        build(db, RUNS, TESTS)
        return str(db)

    def setup(self, db):
        self.store = open_store(db)

    def teardown(self, db):
        self.store.close()

    def time_flaky_window_1000(self, db):
        self.store.scores(1000)

    def time_flaky_window_500(self, db):
        # Half the history: the window counted per test over its index range.
        self.store.scores(500)

    def time_flaky_window_50(self, db):
        self.store.scores(50)

    def time_one_test_whole_history(self, db):
        self.store.observations(None, tests=["suites/unit/test_m4.py::test_91"])

    def track_tests_scored_from_outcomes(self, db):
        # Not a cost: how many of the 2,000 needed their outcomes read (the others were
        # scored from counts); more means the query reads more. Deterministic (seeded).
        return sum(1 for s in self.store.scores(1000) if s.failures or "s" in s.strip)

    track_tests_scored_from_outcomes.unit = "tests"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--tests", type=int, default=TESTS)
    parser.add_argument("--db", type=Path, default=None)
    parser.add_argument(
        "--every-test-flaky", action="store_true", help="every test fails at 1%% (worst case)"
    )
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp()) / "history.db"
    appends = build(db, args.runs, args.tests, args.every_test_flaky)
    if appends:
        walls = sorted(a[0] for a in appends)
        cpus = sorted(a[1] for a in appends)
        print(
            f"append of {args.tests} tests ({len(appends)} runs): first {appends[0][0]:.3f} s, "
            f"median {walls[len(walls) // 2]:.3f} s wall ({cpus[len(cpus) // 2]:.3f} s CPU), "
            f"max {walls[-1]:.3f} s, last {appends[-1][0]:.3f} s"
        )
    with open_store(db) as store:
        for window in (50, args.runs // 2, args.runs):
            scores = _timed(
                f"scores of every test over the last {window} runs",
                lambda w=window: store.scores(w),
            )
            assert isinstance(scores, list)
            read = sum(1 for s in scores if s.failures or "s" in s.strip)
            print(f"  {len(scores)} tests, {read} of them read outcome by outcome")
        nodeid = "suites/unit/test_m4.py::test_91"  # flaky at 5%
        _timed(
            f"one test's whole history ({nodeid})",
            lambda: store.observations(None, tests=[nodeid]),
        )
        _timed("every outcome of every run", lambda: store.observations(None))
    print(f"database: {db} ({db.stat().st_size / 1e6:.0f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
