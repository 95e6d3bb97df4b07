"""``Store.scores`` (counts aggregated in SQL, outcomes read only for the tests that need them)
against the definition: ``scores.score`` of every test's observations over the same window.

The histories are built to reach every path of the shortcut: tests that only pass, only skip,
pass and skip, fail; tests missing from some runs (added late, removed, in one runner's runs
only); runs imported out of order (``started_at`` not in id order, so the window is not the
newest ids); windows shorter and longer than the history.
"""

from __future__ import annotations

import importlib
import random
from pathlib import Path

import pytest

from harness.history import scores as sc
from harness.history.records import (
    FAIL_OUTCOMES,
    PASS_OUTCOMES,
    HistoryError,
    RunRecord,
    TestResult,
)
from harness.history.store import (
    HEAD,
    Store,
    _alembic_config,
    _current_revision,
    migrate,
    open_store,
)

OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "quarantined")


def _history(rng: random.Random, runs: int, tests: int) -> list[RunRecord]:
    kinds = [
        rng.choice(["pass", "skip", "pass-skip", "flaky", "mixed", "late"]) for _ in range(tests)
    ]
    order = list(range(runs))
    rng.shuffle(order)  # appended in a shuffled order: ids do not follow started_at
    out = []
    for r in order:
        results = []
        for i, kind in enumerate(kinds):
            if kind == "late" and r < runs // 2:
                continue  # added half-way through the history
            if rng.random() < 0.05:
                continue  # missing from this run (another tier's run, a shard)
            if kind == "pass":
                outcome = "passed"
            elif kind == "skip":
                outcome = "skipped"
            elif kind == "pass-skip":
                outcome = rng.choice(["passed", "skipped"])
            elif kind == "flaky":
                outcome = "failed" if rng.random() < 0.2 else "passed"
            else:
                outcome = rng.choice(OUTCOMES)
            results.append(TestResult(f"t.py::test_{i}_{kind}", outcome, 0.01, rng.randrange(4)))
        out.append(
            RunRecord(
                run_key=f"r{r}",
                started_at=1.7e9 + 60 * r,
                source="harness",
                results=results,
                commit=f"c{r // 2}",
                tree=f"t{r // 2}",
                runner=f"cpu-{r % 3}",
                seed=r,
            )
        )
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scores_from_sql_counts_equal_the_scores_of_every_observation(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    runs = 40
    with open_store(tmp_path / "h.db") as store:
        for record in _history(rng, runs, 60):
            assert store.append(record)
        for window in (1, 3, 12, 25, runs - 1, runs, runs + 10, None):
            for min_runs in (1, 10):
                expected = {
                    n: sc.score(n, obs, min_runs=min_runs)
                    for n, obs in store.observations(window).items()
                }
                got = {s.nodeid: s for s in store.scores(window, min_runs=min_runs)}
                assert got == expected, (window, min_runs)
        # Every path was taken: scored from counts (passes only, skips only) and from outcomes.
        strips = [s.strip for s in store.scores(None)]
        assert any(set(t) == {"P"} for t in strips) and any(set(t) == {"s"} for t in strips)
        assert any(set(t) == {"P", "s"} for t in strips)
        assert any("F" in t for t in strips)


@pytest.mark.parametrize("seed", [4, 5])
def test_scores_equal_the_scores_of_every_observation_when_runs_arrive_out_of_order(
    tmp_path: Path, seed: int
) -> None:
    # Reports imported late: run ids no longer ascend with the start times, so the outcomes
    # read in (test, run id) order must be put back in time order before they are scored.
    rng = random.Random(seed)
    records = _history(rng, 30, 40)
    rng.shuffle(records)
    with open_store(tmp_path / "h.db") as store:
        for record in records:
            assert store.append(record)
        for window in (2, 10, 20, 29, None):
            expected = {n: sc.score(n, obs) for n, obs in store.observations(window).items()}
            got = {s.nodeid: s for s in store.scores(window)}
            assert got == expected, window
        assert any(s.failures for s in store.scores(None))


def test_scores_of_an_empty_history_are_none_and_a_bad_window_is_refused(tmp_path: Path) -> None:
    with open_store(tmp_path / "h.db") as store:
        assert store.scores(50) == []
        with pytest.raises(HistoryError, match="window must be at least 1 run, got 0"):
            store.scores(0)


def summaries(store: Store) -> dict[int, tuple[int, int, int]]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT test_id, results, passes, failures FROM test_summaries"
        ).all()
    return {t: (n, p, f) for t, n, p, f in rows}


def check_summaries_survive_a_downgrade_and_upgrade(store: Store) -> None:
    """The summaries kept at append time equal the ones revision 0002 computes from the
    results already there (downgrade to 0001 drops them; the upgrade recomputes them)."""
    from alembic import command

    kept = summaries(store)
    observed = store.observations(None)
    # What the summaries must say, from every outcome (kept by append, recomputed below).
    names = {n: i for i, n in _ids(store).items()}
    expected = {
        names[n]: (
            len(obs),
            sum(o.outcome in PASS_OUTCOMES for o in obs),
            sum(o.outcome in FAIL_OUTCOMES for o in obs),
        )
        for n, obs in observed.items()
    }
    assert kept == expected
    cfg = _alembic_config()
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
    assert _current_revision(store.engine) == "0001"
    migrate(store.engine)
    assert _current_revision(store.engine) == HEAD
    assert summaries(store) == expected


def _ids(store: Store) -> dict[int, str]:
    with store.engine.connect() as conn:
        return dict(conn.exec_driver_sql("SELECT id, nodeid FROM tests").all())


def test_the_summaries_migration_counts_the_runs_already_there(tmp_path: Path) -> None:
    with open_store(tmp_path / "h.db") as store:
        for record in _history(random.Random(4), 12, 30):
            store.append(record)
        check_summaries_survive_a_downgrade_and_upgrade(store)


def test_the_migrations_outcome_classes_are_the_records_ones() -> None:
    # 0002 spells the classes out in SQL (a migration must not change meaning later); when
    # records.py changes them, a new revision recomputes the summaries.
    rev = importlib.import_module("harness.history.migrations.versions.0002_test_summaries")

    assert str(tuple(sorted(FAIL_OUTCOMES))) == rev.FAIL
    assert str(tuple(sorted(PASS_OUTCOMES))) == rev.PASS
