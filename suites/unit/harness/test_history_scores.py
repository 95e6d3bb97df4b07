"""The history's verdicts on small, hand-written histories, and the un-quarantine formula."""

from __future__ import annotations

import pytest

from harness.history import scores as sc
from harness.history.records import HistoryError, Observation


def _history(strip: str, *, seeds: list[int] | None = None, tree_every: int = 1) -> list:
    """Observations from a strip of P (pass), F (fail), s (skip); a new tree every few runs."""
    outcome = {"P": "passed", "F": "failed", "s": "skipped"}
    return [
        Observation(
            run_id=i,
            started_at=float(i),
            outcome=outcome[c],
            seed=seeds[i] if seeds else i,
            tree=f"tree{i // tree_every}",
            commit=f"c{i // tree_every}",
            runner="cpu-1",
        )
        for i, c in enumerate(strip)
    ]


@pytest.mark.parametrize(
    ("p", "confidence", "n"),
    [(0.05, 0.95, 59), (0.01, 0.95, 299), (0.2, 0.95, 14), (0.5, 0.95, 5), (0.05, 0.99, 90)],
)
def test_the_passes_needed_follow_log_one_minus_c_over_log_one_minus_p(
    p: float, confidence: float, n: int
) -> None:
    assert sc.required_passes(p, confidence) == n


@pytest.mark.parametrize(("p", "confidence"), [(0, 0.95), (1, 0.95), (0.05, 1.0), (-0.1, 0.5)])
def test_a_rate_or_confidence_outside_zero_to_one_is_refused_by_value(
    p: float, confidence: float
) -> None:
    with pytest.raises(HistoryError, match="between 0 and 1"):
        sc.required_passes(p, confidence)


def test_too_few_passing_runs_are_insufficient_never_healthy() -> None:
    assert sc.score("t", _history("P" * 9)).verdict is sc.Verdict.INSUFFICIENT
    assert sc.score("t", _history("P" * 10)).verdict is sc.Verdict.HEALTHY
    assert sc.score("t", _history("")).verdict is sc.Verdict.INSUFFICIENT


def test_skipped_runs_are_no_evidence_either_way() -> None:
    score = sc.score("t", _history("PsPsPsPsPsPsPsPsPs"))
    assert (score.verdict, score.runs, score.strip) == (
        sc.Verdict.INSUFFICIENT,
        9,
        "PsPsPsPsPsPsPsPsPs",
    )


def test_a_pass_and_a_fail_under_one_seed_on_one_tree_is_flaky_even_in_few_runs() -> None:
    score = sc.score("t", _history("PF", seeds=[5, 5], tree_every=2))
    assert score.verdict is sc.Verdict.FLAKY
    assert "passed and failed under 1 identical seed(s)" in score.evidence


def test_a_failure_that_comes_back_with_its_seed_is_seed_dependent() -> None:
    seeds = [1, 2, 3, 9, 4, 5, 9, 6, 7, 8, 9, 1]
    strip = "".join("F" if s == 9 else "P" for s in seeds)
    score = sc.score("t", _history(strip, seeds=seeds))
    assert score.verdict is sc.Verdict.SEED_DEPENDENT
    assert "failed again each time seed(s) 9 came back" in score.evidence


def test_the_last_runs_failing_on_a_new_tree_are_undecided_until_the_streak_is_long() -> None:
    assert sc.score("t", _history("P" * 20 + "FF")).verdict is sc.Verdict.INSUFFICIENT
    assert sc.score("t", _history("P" * 20 + "FFF")).verdict is sc.Verdict.BROKEN


def test_a_failing_block_followed_by_passes_is_a_fix_not_a_flake() -> None:
    assert sc.score("t", _history("FFF" + "P" * 10)).verdict is sc.Verdict.HEALTHY
    assert sc.score("t", _history("FFF" + "P" * 4)).verdict is sc.Verdict.INSUFFICIENT


def test_unquarantine_counts_passes_since_the_last_failure_and_caps_p_at_five_percent() -> None:
    due, streak, needed, p = sc.unquarantine_due(_history("PFPF" + "P" * 58))
    assert (due, streak, needed, p) == (False, 58, 59, 0.05)
    assert sc.unquarantine_due(_history("PFPF" + "P" * 59))[0] is True
    # An observed rate below 5% asks for more passes: 2 failures in 100 runs -> p = 2%.
    due, streak, needed, p = sc.unquarantine_due(_history("F" + "P" * 98 + "F" + "P" * 100))
    assert (p, needed, due) == (0.02, 149, False)
