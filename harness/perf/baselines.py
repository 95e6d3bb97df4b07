"""Baselines: which commit a change is compared with, and the baseline a first run records.

:func:`merge_base` finds the base of a change (the merge-base of HEAD with the default
branch, HEAD's first parent on that branch itself); :func:`find_baseline` walks back from it to
the nearest commit with stored results. When none has any (a fresh clone, a new machine name),
the perf step keeps its own run as the baseline (:func:`record_baseline`) in
``.asv/baseline/<machine>/``, apart from asv's results, which the next run of the same commit
overwrites; :func:`stored_baseline` returns it while it is an ancestor of HEAD (or HEAD).
docs/perf.md, "Baseline policy", is the user's side of this.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from harness import atomic
from harness.perf._common import PerfError, Project, _git, check_ref, resolve_commit
from harness.perf.results import load_results

# How far back along the default branch's first-parent history a missing baseline is looked
# for (a merge-base whose perf job was skipped or failed still leaves its parents).
BASELINE_SEARCH_DEPTH = 20


def default_branch_refs(root: Path) -> list[str]:
    """Refs that may name the default branch, most specific first."""
    refs = []
    for var in ("HARNESS_PERF_BASE_REF", "GITHUB_BASE_REF"):
        value = os.environ.get(var)
        if value:
            check_ref(value, source=f"${var}")
            refs += [f"origin/{value}", value] if var == "GITHUB_BASE_REF" else [value]
    origin_head = _git(root, "symbolic-ref", "--quiet", "refs/remotes/origin/HEAD", check=False)
    if origin_head:
        refs.append(origin_head.removeprefix("refs/remotes/"))
    refs += ["origin/main", "main", "origin/master", "master"]
    return list(dict.fromkeys(refs))


def merge_base(root: Path | str, *, base_ref: str | None = None) -> tuple[str, str] | None:
    """(sha, description) of the commit a change is compared with, or None.

    The merge-base of HEAD with the default branch; on the default branch itself (the
    merge-base is HEAD), HEAD's first parent.
    """
    root = Path(root)
    head = resolve_commit(root, "HEAD")
    if base_ref is not None:
        check_ref(base_ref, source="--base-ref")
    for ref in [base_ref] if base_ref else default_branch_refs(root):
        if not _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False):
            continue
        mb = _git(root, "merge-base", "HEAD", ref, check=False)
        if not mb:
            continue
        if mb != head:
            return mb, f"merge-base of HEAD and {ref}"
        parent = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^1^{commit}", check=False)
        if parent:
            return parent, f"HEAD's first parent (HEAD is on {ref})"
        return None
    return None


def find_baseline(
    root: Path | str, start: str, *, machine: str, env: str, depth: int = BASELINE_SEARCH_DEPTH
) -> str | None:
    """The nearest first-parent ancestor of start (itself included) with results in env."""
    root = Path(root)
    project = Project.load(root)
    shas = _git(
        root, "rev-list", "--first-parent", f"--max-count={depth}", start, check=False
    ).split()
    for sha in shas:
        if load_results(project, machine, sha).get(env):
            return sha
    return None


# --------------------------------------------------------------------------------------------
# The baseline a first run records


@dataclasses.dataclass(frozen=True)
class StoredBaseline:
    """A run kept as the baseline: its commit's result files, copied out of asv's results."""

    commit: str
    env: str
    machine: str
    recorded_at: str  # ISO 8601, UTC
    source: str  # "working tree" or "working tree (uncommitted changes)"
    results_dir: Path  # laid out like asv's: <results_dir>/<machine>/{machine.json, results}

    def describe(self) -> str:
        return (
            f"the baseline recorded on {self.recorded_at} from `{self.commit[:10]}` "
            f"({self.source}) in {self.results_dir}"
        )


def _store(project: Project) -> Path:
    return project.state_dir / "baseline"


def _manifest(project: Project, machine: str) -> Path:
    return _store(project) / f"{machine}.json"


def record_baseline(
    root: Path | str, commit: str, *, machine: str, env: str, source: str
) -> StoredBaseline:
    """Copy commit's results on machine (all environments) into the baseline store, replacing
    the machine's previous stored baseline. A PerfError when the commit has no results."""
    project = Project.load(root)
    src = project.results_dir / machine
    if not load_results(project, machine, commit).get(env):
        raise PerfError(f"no results for {commit[:10]} in environment {env!r} to record")
    store = _store(project)
    dest = store / machine
    tmp = store / f".{machine}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy2(src / "machine.json", tmp / "machine.json")
    for path in src.glob("*.json"):
        if path.name not in ("machine.json", "benchmarks.json") and commit.startswith(
            path.name.split("-", 1)[0]
        ):
            shutil.copy2(path, tmp / path.name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    baseline = StoredBaseline(
        commit=commit,
        env=env,
        machine=machine,
        recorded_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        source=source,
        results_dir=store,
    )
    manifest = {k: str(v) for k, v in dataclasses.asdict(baseline).items()}
    atomic.write_text(_manifest(project, machine), json.dumps(manifest, indent=2) + "\n")
    return baseline


def stored_baseline(root: Path | str, *, machine: str, env: str) -> StoredBaseline | None:
    """The machine's stored baseline, when it has results in env and its commit is HEAD or an
    ancestor of HEAD (a baseline from another branch's history would compare unrelated code)."""
    project = Project.load(root)
    path = _manifest(project, machine)
    fix = f"delete it (and {_store(project) / machine}) so that the next run records a new one"
    try:
        data = json.loads(path.read_text())
        baseline = StoredBaseline(
            commit=str(data["commit"]),
            env=str(data["env"]),
            machine=str(data["machine"]),
            recorded_at=str(data["recorded_at"]),
            source=str(data["source"]),
            results_dir=_store(project),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # Not "no baseline": that would pass the step and overwrite it with this run's results.
        raise PerfError(
            f"the stored baseline's manifest {path} cannot be read ({type(exc).__name__}: "
            f"{exc}); {fix}"
        ) from None
    if baseline.machine != machine or baseline.env != env:
        return None
    if not re.fullmatch(r"[0-9a-f]{40}", baseline.commit):
        # A hand-edited manifest: never hand git something that is not a hash.
        raise PerfError(
            f"the stored baseline's manifest {path} names commit {baseline.commit!r}, not a "
            f"40-digit hash; {fix}"
        )
    is_ancestor = subprocess.run(
        ["git", "merge-base", "--is-ancestor", baseline.commit, "HEAD"],
        cwd=project.root,
        capture_output=True,
    )
    if is_ancestor.returncode != 0:
        return None
    if not load_results(project, machine, baseline.commit, results_dir=baseline.results_dir).get(
        env
    ):
        return None
    return baseline
