"""Scores and verdicts of one test from its history (pure functions: no database).

Over a window of recent runs, per test: failure rate, flip rate (outcome changes between
consecutive runs of the test), same-tree pass+fail events (one git tree, both outcomes: no
code change explains it), seed attribution and runner attribution. Skipped runs are no
evidence either way.

Seed attribution reads the seed the harness records for every test: a failure whose seed came
back and failed again is attributed to the seed (``seed-dependent``: a bug with a repro, not a
flake); a pass and a fail under one seed is nondeterminism the seed does not control (flaky).
A failure whose seed never came back is not attributed: history alone cannot tell, the flake
hunter (``harness flaky TEST --seed S``) can.

Un-quarantine: a test failing at rate p passes N runs in a row with probability (1-p)^N; N =
ceil(log(1-C)/log(1-p)) passes make "still failing at rate >= p" unlikely at confidence C
(59 at p = 5%, C = 95%). p is the test's observed failure rate, but never above ``DEFAULT_P``:
a rate estimated from a few runs is noisy, and a higher p would ask for fewer passes.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import compress, repeat

from harness.history.records import (
    FAIL_OUTCOMES,
    PASS_OUTCOMES,
    HistoryError,
    Observation,
    Outcome,
)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MIN_RUNS",
    "DEFAULT_P",
    "Score",
    "Verdict",
    "consecutive_passes",
    "required_passes",
    "score",
    "score_columns",
    "score_without_failures",
    "unquarantine_due",
]

DEFAULT_MIN_RUNS = 10
"""Fewer runs with an outcome than this and a test without decisive evidence is
``insufficient``: 0 failures in 10 runs bounds the failure rate below 26% at 95% (the rule of
three, 3/n), which is the least that "healthy" should mean."""
DEFAULT_CONFIDENCE = 0.95
DEFAULT_P = 0.05
BROKEN_STREAK = 3
"""A test that failed this many runs in a row at the end of its history may be broken ..."""
BROKEN_CHANCE = 0.01
"""... when a flaky test failing at its own earlier rate would fail that many in a row with
less than this probability (so a 50% flake needs 7 failures in a row to be called broken)."""


class Verdict(enum.StrEnum):
    """What a test's history says, most disruptive first.

    BROKEN: it fails every run since some run (or since its first). SEED_DEPENDENT: its
    failures come back with their seeds (and no seed both passed and failed). FLAKY: passes and
    failures that neither a change nor a seed explains. HEALTHY: no failure in at least
    ``min_runs`` runs. INSUFFICIENT: too few runs to say. A verdict is recomputed from the
    window every time; a test moves between them as its history grows (an INSUFFICIENT test
    becomes HEALTHY at ``min_runs`` passing runs; a BROKEN one that starts passing is judged on
    its runs since the fix).
    """

    BROKEN = "broken"
    SEED_DEPENDENT = "seed-dependent"
    FLAKY = "flaky"
    HEALTHY = "healthy"
    INSUFFICIENT = "insufficient"


_RANK = {v: i for i, v in enumerate(Verdict)}
_LETTER_OF = {**dict.fromkeys(FAIL_OUTCOMES, "F"), **dict.fromkeys(PASS_OUTCOMES, "P")}
"""Outcome -> strip letter (anything else is a skip, "s")."""


@dataclasses.dataclass
class Score:
    nodeid: str
    verdict: Verdict
    runs: int
    failures: int
    flips: int
    same_tree_events: int
    same_seed_events: int
    failing_seeds: list[int]
    pass_streak: int
    evidence: list[str]
    strip: str
    """The outcomes oldest first: P pass, F fail, s skip (for the page and the JSON)."""
    last_failure: Observation | None = None

    @property
    def failure_rate(self) -> float:
        return self.failures / self.runs if self.runs else 0.0

    @property
    def flip_rate(self) -> float:
        return self.flips / (self.runs - 1) if self.runs > 1 else 0.0

    def sort_key(self) -> tuple[int, int, int, str]:
        """Most disruptive first: each failure is a red run someone looked at."""
        return (-self.failures, -self.flips, _RANK[self.verdict], self.nodeid)


def required_passes(p: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """N = ceil(log(1-C)/log(1-p)): consecutive passes that make a failure rate >= p unlikely
    at confidence C."""
    if not 0 < p < 1:
        raise HistoryError(f"failure rate must be between 0 and 1 (exclusive), got {p}")
    if not 0 < confidence < 1:
        raise HistoryError(f"confidence must be between 0 and 1 (exclusive), got {confidence}")
    # The tiny epsilon keeps an exact quotient (e.g. 2.0000000000000004) from adding a run.
    return math.ceil(math.log(1 - confidence) / math.log(1 - p) - 1e-9)


def consecutive_passes(history: Sequence[Observation]) -> int:
    """Passes since the last failure (skips neither count nor break the streak)."""
    n = 0
    for o in reversed(history):
        if o.verdict is Outcome.FAIL:
            break
        if o.verdict is Outcome.PASS:
            n += 1
    return n


def unquarantine_due(
    history: Sequence[Observation],
    confidence: float = DEFAULT_CONFIDENCE,
    p_cap: float = DEFAULT_P,
) -> tuple[bool, int, int, float]:
    """Whether a quarantined test has passed enough runs in a row to leave quarantine:
    ``(due, streak, needed, p)``. ``history`` is the test's whole history, oldest first."""
    judged = [o for o in history if o.verdict is not Outcome.SKIP]
    streak = consecutive_passes(judged)
    before = judged[: len(judged) - streak]
    fails = sum(o.verdict is Outcome.FAIL for o in before)
    observed = fails / len(before) if before else 0.0
    p = min(observed, p_cap) if observed > 0 else p_cap
    needed = required_passes(p, confidence)
    return streak >= needed, streak, needed, p


def score_without_failures(nodeid: str, strip: str, *, min_runs: int = DEFAULT_MIN_RUNS) -> Score:
    """The score of a test that did not fail in the window, from its outcome ``strip`` alone
    (P and s only): what :func:`score` answers for such a history, without its observations.
    The store scores most tests this way from counts it aggregates in SQL."""
    if "F" in strip:
        raise HistoryError(f"{nodeid}: the strip {strip!r} holds a failure; use score()")
    n = strip.count("P")
    if n >= min_runs:
        note = f"failed 0 of {n} runs; failure rate below {3 / n:.1%} at 95%"
        return Score(nodeid, Verdict.HEALTHY, n, 0, 0, 0, 0, [], n, [note], strip)
    note = f"only {n} run(s) with an outcome; {min_runs} needed to call it healthy"
    return Score(nodeid, Verdict.INSUFFICIENT, n, 0, 0, 0, 0, [], n, [note], strip)


def score(
    nodeid: str, history: Sequence[Observation], *, min_runs: int = DEFAULT_MIN_RUNS
) -> Score:
    """The scores and verdict of one test from its outcomes over a window, oldest first."""
    return score_columns(
        nodeid,
        [o.outcome for o in history],
        [o.seed for o in history],
        [o.tree for o in history],
        [o.runner for o in history],
        history.__getitem__,
        min_runs=min_runs,
    )


def score_columns(
    nodeid: str,
    outcomes: Sequence[str],
    seeds: Sequence[int | None],
    trees: Sequence[str | None],
    runners: Sequence[str | None],
    observation: Callable[[int], Observation],
    *,
    min_runs: int = DEFAULT_MIN_RUNS,
) -> Score:
    """:func:`score` of a history given as columns, oldest first (one entry per outcome), and
    ``observation(i)``, the i-th outcome's :class:`Observation` (built only for the last
    failure and the commits the evidence names). The store scores the tests that failed this
    way: no object per outcome, and the bookkeeping in C (string counts, sets, compress)."""
    # The strip in one C pass: an outcome the history does not know is a skip.
    strip = "".join(map(_LETTER_OF.get, outcomes, repeat("s")))
    js = strip.replace("s", "")  # the judged outcomes' letters, in order
    n, f = len(js), js.count("F")
    if not f:
        # Most tests never fail: answered without the seed, tree and runner bookkeeping.
        return score_without_failures(nodeid, strip, min_runs=min_runs)
    # "PF" and "FP" cannot overlap themselves: their counts are the changes between
    # consecutive judged outcomes.
    flips = js.count("PF") + js.count("FP")
    is_pass = [c == "P" for c in strip]
    is_fail = [c == "F" for c in strip]
    # Trees with both a pass and a fail (an unknown tree is no evidence).
    both = set(compress(trees, is_pass)) & set(compress(trees, is_fail))
    same_tree = len(both) - (None in both)
    # A pass and a fail under one seed: on one tree, or on unknown trees (a dirty checkout).
    seed_trees = list(zip(seeds, trees, strict=True))
    pairs = set(compress(seed_trees, is_pass)) & set(compress(seed_trees, is_fail))
    same_seed = sum(seed is not None for seed, _ in pairs)
    fail_seed_counts = Counter(compress(seeds, is_fail))
    failing_seeds = sorted(s for s in fail_seed_counts if s is not None)
    recurring = [s for s in failing_seeds if fail_seed_counts[s] >= 2]
    pass_seeds = set(compress(seeds, is_pass))
    mixed_seeds = [s for s in failing_seeds if s in pass_seeds]

    last_fail = js.rindex("F")
    streak = n - 1 - last_fail  # passes since the last failure
    tail_fails = n - len(js.rstrip("F"))
    last_failure_at = strip.rindex("F")

    def judged_commit(k: int) -> str | None:
        """The commit of the k-th judged outcome (0-based)."""
        i = k if "s" not in strip else [j for j, c in enumerate(strip) if c != "s"][k]
        return observation(i).commit

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
    judged_runners = list(compress(runners, [c != "s" for c in strip]))
    fail_runners = Counter(r for r in compress(runners, is_fail) if r)
    if f >= 2 and len(fail_runners) == 1 and len({r for r in judged_runners if r}) >= 2:
        (runner, k), *_ = fail_runners.items()
        there = judged_runners.count(runner)
        evidence.append(
            f"all {k} failures on runner {runner} ({k}/{there} there, 0/{n - there} elsewhere)"
        )

    def done(verdict: Verdict) -> Score:
        return Score(
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
            observation(last_failure_at),
        )

    if f == n:
        if n >= BROKEN_STREAK:
            return done(Verdict.BROKEN)
        evidence.append(f"only {n} run(s), all failed; {BROKEN_STREAK} needed to call it broken")
        return done(Verdict.INSUFFICIENT)

    if tail_fails >= BROKEN_STREAK:
        before = js[: n - tail_fails]
        rate = (before.count("F") + 1) / (len(before) + 2)
        if rate**tail_fails < BROKEN_CHANCE:
            evidence.append(
                f"failed the last {tail_fails} runs in a row, since commit "
                f"{(judged_commit(n - tail_fails) or '?')[:12]}"
            )
            return done(Verdict.BROKEN)

    if f == tail_fails and not same_tree:
        # Its only failures are the last run(s), on code it never passed on: a change that
        # broke it, or a flake. Calling it either now would be a guess.
        evidence.append(
            f"failed only the last {f} run(s), on a tree it never passed on: a change that "
            "broke it or a flake; the next runs tell"
        )
        return done(Verdict.INSUFFICIENT)

    # Failures in one block followed by passes only: it was broken, and a change fixed it.
    first = js.index("F")
    if streak and f == n - first - streak and f >= BROKEN_STREAK and not same_seed:
        evidence.append(
            f"failed {f} runs in a row, then passed {streak} since commit "
            f"{(judged_commit(n - streak) or '?')[:12]}"
        )
        if streak >= min_runs:
            return done(Verdict.HEALTHY)
        evidence.append(f"{min_runs} passing runs needed since the fix to call it healthy")
        return done(Verdict.INSUFFICIENT)

    if recurring and not mixed_seeds and not same_seed:
        return done(Verdict.SEED_DEPENDENT)

    if n < min_runs and not same_seed:
        evidence.append(f"only {n} runs; {min_runs} needed without a same-seed pass and fail")
        return done(Verdict.INSUFFICIENT)
    if not recurring and not mixed_seeds and failing_seeds:
        evidence.append(
            "no failing seed came back: the flake hunter (harness flaky TEST) tells a "
            "seed-dependent failure from a flake"
        )
    return done(Verdict.FLAKY)
