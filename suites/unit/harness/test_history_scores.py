"""The history's verdicts on small, hand-written histories, the un-quarantine formula, and
score() against the observation-by-observation scoring it replaced, on seeded random histories."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence

import pytest

from harness.history import scores as sc
from harness.history.records import _OUTCOME_OF, HistoryError, Observation, Outcome


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


_LETTER = {Outcome.PASS: "P", Outcome.FAIL: "F", Outcome.SKIP: "s"}


def _reference_score(
    nodeid: str, history: Sequence[Observation], *, min_runs: int = sc.DEFAULT_MIN_RUNS
) -> sc.Score:
    """``score`` as it was before it read columns (ml-harness 67ddaeb): the oracle."""
    kind_of, skip = _OUTCOME_OF.get, Outcome.SKIP  # Outcome.of, without a call per outcome
    kinds = [kind_of(o.outcome, skip) for o in history]
    strip = "".join(_LETTER[k] for k in kinds)
    judged = [o for o, k in zip(history, kinds, strict=True) if k is not Outcome.SKIP]
    fails = [o for o, k in zip(history, kinds, strict=True) if k is Outcome.FAIL]
    n, f = len(judged), len(fails)
    if not fails:
        # Most tests never fail: answered without the seed, tree and runner bookkeeping.
        return sc.score_without_failures(nodeid, strip, min_runs=min_runs)
    # The judged outcomes' kinds, in order (each observation's verdict looked up once).
    jk = [k for k in kinds if k is not Outcome.SKIP]
    flips = sum(a is not b for a, b in zip(jk, jk[1:], strict=False))

    by_tree: dict[str, set[Outcome]] = defaultdict(set)
    by_seed_tree: dict[tuple[int, str | None], set[Outcome]] = defaultdict(set)
    seed_outcomes: dict[int, Counter[Outcome]] = defaultdict(Counter)
    for o, kind in zip(judged, jk, strict=True):
        if o.tree is not None:
            by_tree[o.tree].add(kind)
        if o.seed is not None:
            by_seed_tree[(o.seed, o.tree)].add(kind)
            seed_outcomes[o.seed][kind] += 1
    same_tree = sum(len(v) == 2 for v in by_tree.values())
    # A pass and a fail under one seed: on one tree, or on unknown trees (a dirty checkout).
    same_seed = sum(len(v) == 2 for v in by_seed_tree.values())
    failing_seeds = sorted({o.seed for o in fails if o.seed is not None})
    recurring = [s for s in failing_seeds if seed_outcomes[s][Outcome.FAIL] >= 2]
    mixed_seeds = [s for s in failing_seeds if seed_outcomes[s][Outcome.PASS]]

    last_fail = n - 1 - jk[::-1].index(Outcome.FAIL)  # there is one: f > 0
    streak = n - 1 - last_fail  # passes since the last failure
    tail_fails = 0
    for kind in reversed(jk):
        if kind is not Outcome.FAIL:
            break
        tail_fails += 1

    evidence: list[str] = []
    if n:
        evidence.append(f"failed {f} of {n} runs ({f / n:.0%})")
    if flips:
        evidence.append(f"{flips} flip(s) between pass and fail")
    if same_tree:
        evidence.append(f"passed and failed on {same_tree} identical git tree(s)")
    if same_seed:
        evidence.append(f"passed and failed under {same_seed} identical seed(s)")
    if recurring:
        shown = ", ".join(str(s) for s in recurring[:5])
        evidence.append(f"failed again each time seed(s) {shown} came back")
    runners = {o.runner for o in judged if o.runner}
    fail_runners = Counter(o.runner for o in fails if o.runner)
    if f >= 2 and len(runners) >= 2 and len(fail_runners) == 1:
        (runner, k), *_ = fail_runners.items()
        there = sum(o.runner == runner for o in judged)
        evidence.append(
            f"all {k} failures on runner {runner} ({k}/{there} there, 0/{n - there} elsewhere)"
        )

    def done(verdict: sc.Verdict) -> sc.Score:
        return sc.Score(
            nodeid,
            verdict,
            n,
            f,
            flips,
            same_tree,
            same_seed,
            failing_seeds,
            streak,
            evidence,
            strip,
            fails[-1] if fails else None,
        )

    if f == n:
        if n >= sc.BROKEN_STREAK:
            return done(sc.Verdict.BROKEN)
        evidence.append(f"only {n} run(s), all failed; {sc.BROKEN_STREAK} needed to call it broken")
        return done(sc.Verdict.INSUFFICIENT)

    if tail_fails >= sc.BROKEN_STREAK:
        before = jk[: n - tail_fails]
        rate = (sum(kind is Outcome.FAIL for kind in before) + 1) / (len(before) + 2)
        if rate**tail_fails < sc.BROKEN_CHANCE:
            evidence.append(
                f"failed the last {tail_fails} runs in a row, since commit "
                f"{(judged[n - tail_fails].commit or '?')[:12]}"
            )
            return done(sc.Verdict.BROKEN)

    if f == tail_fails and not same_tree:
        # Its only failures are the last run(s), on code it never passed on: a change that
        # broke it, or a flake. Calling it either now would be a guess.
        evidence.append(
            f"failed only the last {f} run(s), on a tree it never passed on: a change that "
            "broke it or a flake; the next runs tell"
        )
        return done(sc.Verdict.INSUFFICIENT)

    # Failures in one block followed by passes only: it was broken, and a change fixed it.
    first = jk.index(Outcome.FAIL)
    if streak and f == n - first - streak and f >= sc.BROKEN_STREAK and not same_seed:
        fixed_at = judged[n - streak]
        evidence.append(
            f"failed {f} runs in a row, then passed {streak} since commit "
            f"{(fixed_at.commit or '?')[:12]}"
        )
        if streak >= min_runs:
            return done(sc.Verdict.HEALTHY)
        evidence.append(f"{min_runs} passing runs needed since the fix to call it healthy")
        return done(sc.Verdict.INSUFFICIENT)

    if recurring and not mixed_seeds and not same_seed:
        return done(sc.Verdict.SEED_DEPENDENT)

    if n < min_runs and not same_seed:
        evidence.append(f"only {n} runs; {min_runs} needed without a same-seed pass and fail")
        return done(sc.Verdict.INSUFFICIENT)
    if not recurring and not mixed_seeds and failing_seeds:
        evidence.append(
            "no failing seed came back: the flake hunter (harness flaky TEST) tells a "
            "seed-dependent failure from a flake"
        )
    return done(sc.Verdict.FLAKY)


OUTCOMES = ["passed", "failed", "skipped", "error", "xfailed", "xpassed", "quarantined", "weird"]


@pytest.mark.parametrize("seed", range(6))
def test_score_equals_the_observation_by_observation_scoring_it_replaced(seed: int) -> None:
    # Random histories (seeded) with every outcome kind, unknown seeds, trees and runners,
    # blocks of failures and passes: score() (columns) answers what the old loop answered,
    # field by field, last failure and evidence included.
    rng = random.Random(seed)
    for case in range(300):
        n = rng.choice([0, 1, 2, 3, 5, 12, 40, 120])
        weights = rng.choice(
            [[90, 5, 3, 1, 1, 0, 0, 0], [40, 40, 10, 5, 1, 1, 2, 1], [1, 1, 1, 1, 1, 1, 1, 1]]
        )
        history = []
        block = rng.random() < 0.3
        for i in range(n):
            if block:
                outcome = (
                    "failed" if n // 3 <= i < 2 * n // 3 or (case % 2 and i >= n - 4) else "passed"
                )
            else:
                outcome = rng.choices(OUTCOMES, weights)[0]
            history.append(
                Observation(
                    run_id=i,
                    started_at=float(i),
                    outcome=outcome,
                    seed=rng.choice([None, 1, 2, 3, rng.randrange(50)]),
                    tree=rng.choice([None, f"t{i // 3}", f"t{i // 7}"]),
                    commit=rng.choice([None, f"c{i}"]),
                    runner=rng.choice([None, "", "cpu-1", "cpu-2", "gpu-1"]),
                    duration_s=rng.random(),
                    run_seed=i,
                )
            )
        for min_runs in (1, 10):
            got = sc.score(f"t::{case}", history, min_runs=min_runs)
            assert got == _reference_score(f"t::{case}", history, min_runs=min_runs), (
                case,
                min_runs,
            )
