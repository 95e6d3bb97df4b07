"""Retention decisions on hand-made stores: which tier each run falls in, what goes, and how
many bytes that frees when other runs share the same content."""

from __future__ import annotations

import pytest

from reference_impls.tracking.metadata import ArtifactRef
from reference_impls.tracking.retention import RetentionPolicy, plan_retention

DAY = 86_400.0
NOW = 1_000 * DAY


def run(rid: str, age_days: float, project: str = "p"):
    return (rid, project, NOW - age_days * DAY, None)


def art(
    rid: str,
    name: str,
    sha: str,
    size: int = 100,
    kind: str = "checkpoint",
    t: float = 0.0,
    promoted: bool = False,
):
    return ArtifactRef(rid, name, sha * 64 if len(sha) == 1 else sha, size, "u", kind, promoted, t)


POLICY = RetentionPolicy(keep_all_days=30, keep_last_runs=1, delete_after_days=365)


def test_tiers_keep_thin_and_delete_by_age():
    runs = [run("new", 1), run("mid", 100), run("old", 500)]
    arts = [
        art("mid", "a.pt", "a", t=1),
        art("mid", "b.pt", "b", t=2),
        art("mid", "log.txt", "l", kind="file"),
        art("old", "c.pt", "c"),
        art("old", "log.txt", "m", kind="file"),
        art("new", "d.pt", "d"),
        art("new", "e.pt", "e"),
    ]
    plan = plan_retention(runs, arts, POLICY, now=NOW)
    assert plan.tiers == {"keep": 1, "final_checkpoint": 1, "delete": 1}
    assert plan.runs == ["old"]
    assert plan.artifacts == [("mid", "a.pt"), ("old", "c.pt"), ("old", "log.txt")]
    assert plan.bytes_freed == 300 and plan.objects_freed == 3


def test_the_newest_runs_of_each_project_are_kept_whatever_their_age():
    runs = [run("p1-old", 900, "p1"), run("p1-older", 950, "p1"), run("p2-old", 800, "p2")]
    arts = [art(r[0], "x.pt", str(i)) for i, r in enumerate(runs)]
    plan = plan_retention(runs, arts, POLICY, now=NOW)
    assert plan.runs == ["p1-older"]


def test_promoted_artifacts_and_their_runs_stay():
    runs = [run("keep", 1), run("old", 500)]
    arts = [art("old", "model.pt", "a", promoted=True), art("old", "ckpt.pt", "b")]
    plan = plan_retention(runs, arts, POLICY, now=NOW)
    assert plan.runs == [] and plan.artifacts == [("old", "ckpt.pt")]


def test_bytes_shared_with_a_kept_run_are_not_counted_as_freed():
    runs = [run("keep", 1), run("old", 500)]
    arts = [
        art("keep", "w.pt", "s", size=1000),
        art("old", "w.pt", "s", size=1000),
        art("old", "u.pt", "u", size=7),
    ]
    plan = plan_retention(runs, arts, POLICY, now=NOW)
    assert plan.artifacts == [("old", "u.pt"), ("old", "w.pt")]
    assert plan.bytes_freed == 7
    # A reference outside the planned project also keeps the bytes.
    alone = RetentionPolicy(keep_all_days=30, keep_last_runs=0, delete_after_days=365)
    counts = {"u" * 64: 2, "s" * 64: 1}
    plan = plan_retention(runs[1:], arts[1:], alone, now=NOW, ref_counts=counts)
    assert plan.artifacts == [("old", "u.pt"), ("old", "w.pt")]
    assert plan.bytes_freed == 1000


def test_the_final_checkpoint_is_the_newest_with_ties_broken_by_name():
    runs = [run("keep", 1), run("mid", 100)]
    arts = [
        art("mid", "step9.pt", "a", t=5),
        art("mid", "step10.pt", "b", t=5),
        art("mid", "step1.pt", "c", t=1),
    ]
    plan = plan_retention(runs, arts, POLICY, now=NOW)
    assert plan.artifacts == [("mid", "step1.pt"), ("mid", "step10.pt")]  # step9.pt > step10.pt


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"keep_all_days": -1}, "keep_all_days must be >= 0"),
        ({"keep_last_runs": -2}, "keep_last_runs must be an integer >= 0"),
        ({"keep_all_days": 10, "delete_after_days": 5}, "must be >= keep_all_days"),
        ({"checkpoint_kinds": ()}, "at least one artifact kind"),
        ({"keep_all_days": float("nan")}, "keep_all_days must be >= 0"),
    ],
)
def test_bad_policies_are_refused(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        RetentionPolicy(**kw)
