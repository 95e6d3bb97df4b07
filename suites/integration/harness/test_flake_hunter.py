"""`harness flaky` from the outside: real pytest processes, real classification.

The flaky tests below are built so the hunt's verdict is certain, not probable: the
nondeterministic one alternates on a counter kept in a file (state the seed cannot reach),
and for the seed-dependent one the outer test picks seeds it knows fail and pass.
"""

from __future__ import annotations

import json
import random
import sys

import pytest

from harness import flaky, seeding

FLAKES = {
    "suites/unit/test_flakes.py": """
        import os, random
        from pathlib import Path

        def test_stable():
            assert sum(range(10)) == 45

        def test_broken():
            assert 0.1 + 0.2 == 0.3, "floating point"

        def test_unseeded():
            # State the seed cannot reach: a counter that flips on every run.
            counter = Path(os.environ["FLAKE_COUNTER"])
            n = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(n + 1))
            assert n % 2 == 0, f"odd run {n}"

        def test_edge_case():
            x = random.random()
            assert x > 0.5, f"drew {x}"
    """,
}

EDGE = "suites/unit/test_flakes.py::test_edge_case"


def _edge_fails(base_seed: int) -> bool:
    return random.Random(seeding.node_seed(base_seed, EDGE)).random() <= 0.5


@pytest.fixture
def flakes(project, pytester, monkeypatch):
    monkeypatch.setenv("FLAKE_COUNTER", str(pytester.path / "counter.txt"))
    return project(FLAKES)


def _hunt(pytester, *args):
    result = pytester.run(
        sys.executable, "-m", "harness.cli", "flaky", *args, "--json", timeout=300
    )
    out = result.stdout.str()
    return result.ret, json.loads(out[out.index("{") :])


def test_a_stable_test_is_classified_stable(flakes, pytester):
    code, hunt = _hunt(pytester, "suites/unit/test_flakes.py::test_stable", "--runs", "3")
    assert (code, hunt["verdict"]) == (0, "stable")
    assert len(hunt["runs"]) == 6 and hunt["failing_seeds"] == []


def test_a_plain_bug_is_a_deterministic_failure(flakes, pytester):
    code, hunt = _hunt(pytester, "suites/unit/test_flakes.py::test_broken", "--runs", "2")
    assert (code, hunt["verdict"]) == (1, "deterministic failure")
    assert "floating point" in hunt["detail"]


def test_unseeded_nondeterminism_is_classified_nondeterministic(flakes, pytester):
    code, hunt = _hunt(
        pytester, "suites/unit/test_flakes.py::test_unseeded", "--runs", "3", "--seed", "7"
    )
    assert (code, hunt["verdict"]) == (4, "nondeterministic")
    assert "under the same seed 7" in hunt["detail"]


def test_a_seed_dependent_failure_lists_its_failing_seeds(flakes, pytester):
    candidates = range(1, 200)
    passing = [s for s in candidates if not _edge_fails(s)]
    failing = [s for s in candidates if _edge_fails(s)]
    base, seeds = passing[0], [failing[0], passing[1], failing[1]]
    code, hunt = _hunt(
        pytester, EDGE, "--runs", "3", "--seed", str(base), "--seeds", ",".join(map(str, seeds))
    )
    assert (code, hunt["verdict"]) == (3, "seed-dependent")
    assert hunt["failing_seeds"] == sorted([failing[0], failing[1]])
    confirmations = [r for r in hunt["runs"] if r["phase"] == "confirm"]
    assert sorted(r["seed"] for r in confirmations) == hunt["failing_seeds"]  # each confirmed
    assert all(r["outcome"] == "failed" for r in confirmations)


def test_a_test_that_does_not_exist_could_not_run(flakes, pytester):
    code, hunt = _hunt(pytester, "suites/unit/test_flakes.py::test_nope", "--runs", "2")
    assert (code, hunt["verdict"]) == (5, "could not run")


def test_the_quarantine_hunt_writes_a_report_for_every_entry(flakes, pytester, quarantine_entry):
    (pytester.path / "quarantine.toml").write_text(
        quarantine_entry("suites/unit/test_flakes.py::test_broken")
        + "\n"
        + quarantine_entry("suites/unit/test_flakes.py::test_stable")
    )
    result = pytester.run(
        sys.executable,
        "-m",
        "harness.cli",
        "flaky",
        "--quarantined",
        "--runs",
        "2",
        "--report-dir",
        "flaky",
        timeout=300,
    )
    assert result.ret == 0
    hunts = {
        h["test"].split("::")[1]: h["verdict"]
        for h in json.loads((pytester.path / "flaky/flaky.json").read_text())
    }
    assert hunts == {"test_broken": "deterministic failure", "test_stable": "stable"}
    assert (
        "| `suites/unit/test_flakes.py::test_broken` | deterministic failure |"
        in (pytester.path / "flaky/flaky.md").read_text()
    )


@pytest.mark.parametrize(
    ("same", "new", "confirm", "verdict"),
    [
        (["passed"] * 3, ["passed"] * 3, [], "stable"),
        (["failed"] * 3, ["failed"] * 3, ["failed"] * 3, "deterministic failure"),
        (["passed", "failed", "passed"], ["passed"] * 3, [], "nondeterministic"),
        (["passed"] * 3, ["failed", "passed", "passed"], ["passed"], "nondeterministic"),
        (["passed"] * 3, ["failed", "passed", "passed"], ["failed"], "seed-dependent"),
        (["failed"] * 3, ["passed"] * 3, [], "seed-dependent"),
        (["quarantined"] * 3, ["passed"] * 3, [], "seed-dependent"),
        (["timeout"] * 3, ["timeout"] * 3, ["timeout"] * 3, "deterministic failure"),
        (["not run"] * 3, ["not run"] * 3, [], "could not run"),
    ],
)
def test_classification_of_outcome_patterns(same, new, confirm, verdict):
    same_runs = [flaky.RunResult(1, o) for o in same]
    new_runs = [flaky.RunResult(10 + i, o) for i, o in enumerate(new)]
    failing_new = [r for r in new_runs if r.failed]
    confirm_runs = [flaky.RunResult(r.seed, o) for r, o in zip(failing_new, confirm, strict=True)]
    assert flaky.classify(same_runs, new_runs, confirm_runs)[0] == verdict


def test_fewer_than_two_runs_cannot_tell_a_flake_from_a_failure():
    with pytest.raises(ValueError, match="runs must be >= 2"):
        flaky.hunt("x.py::t", runs=1)
