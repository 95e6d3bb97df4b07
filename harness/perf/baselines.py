"""Baselines: which commit a change is compared with, and the baseline a first run records.

:func:`merge_base` finds the base of a change (the merge-base of HEAD with the default
branch, HEAD's first parent on that branch itself); :func:`find_baseline` walks back from it to
the nearest commit with stored results. When none has any (a fresh clone, a new machine name),
the perf step keeps its own run as the baseline (:func:`record_baseline`) in
``.asv/baseline/<machine>/``, one per environment (``<machine>.json`` says which commit each
is), apart from asv's results, which the next run of the same commit overwrites;
:func:`stored_baseline` returns it while it is an ancestor of HEAD (or HEAD). A run in another
environment records its own beside it and never replaces it (:func:`other_baselines`).
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


_FIELDS = ("commit", "env", "machine", "recorded_at", "source")


def _result_file(machine: str, commit: str, env: str) -> str:
    """The name asv gives commit's result file in env (a long env name becomes its hash)."""
    from asv.results import get_filename

    return Path(get_filename(machine, commit, env)).name


def _read_manifest(project: Project, machine: str) -> dict[str, StoredBaseline]:
    """The machine's stored baselines, one per environment ({} when there is no manifest).

    The manifest is ``{"baselines": {env: {commit, env, machine, recorded_at, source}}}``;
    an older one holding a single baseline's fields at its top level is read as one entry.
    A manifest that cannot be read is a PerfError naming it and the fix: never "no baseline",
    which would pass the step and overwrite it with this run's results.
    """
    path = _manifest(project, machine)
    fix = f"delete it (and {_store(project) / machine}) so that the next run records a new one"
    try:
        data = json.loads(path.read_text())
        entries = data["baselines"] if isinstance(data, dict) and "baselines" in data else None
        if entries is None:
            entries = {str(data["env"]): data}  # the single-baseline manifest of before
        if not isinstance(entries, dict):
            raise TypeError(f"'baselines' is a {type(entries).__name__}, not an object")
        found = {}
        for key, entry in entries.items():
            baseline = StoredBaseline(
                **{k: str(entry[k]) for k in _FIELDS}, results_dir=_store(project)
            )
            if baseline.env != key or baseline.machine != machine:
                raise ValueError(
                    f"its entry {key!r} is for machine {baseline.machine!r}, environment "
                    f"{baseline.env!r}, not machine {machine!r}, environment {key!r}"
                )
            if not re.fullmatch(r"[0-9a-f]{40}", baseline.commit):
                # A hand-edited manifest: never hand git something that is not a hash.
                raise ValueError(f"it names commit {baseline.commit!r}, not a 40-digit hash")
            found[key] = baseline
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PerfError(
            f"the stored baseline's manifest {path} cannot be read ({type(exc).__name__}: "
            f"{exc}); {fix}"
        ) from None
    return found


def record_baseline(
    root: Path | str, commit: str, *, machine: str, env: str, source: str
) -> StoredBaseline:
    """Copy commit's results in env on machine into the baseline store, replacing the stored
    baseline of that machine and environment only: the baselines other environments keep
    there survive (a CI runner whose interpreter changed must not lose the old one, nor the
    old one's runner this one). A PerfError when the commit has no results."""
    project = Project.load(root)
    src = project.results_dir / machine
    if not load_results(project, machine, commit).get(env):
        raise PerfError(f"no results for {commit[:10]} in environment {env!r} to record")
    kept = {k: b for k, b in _read_manifest(project, machine).items() if k != env}
    store = _store(project)
    dest = store / machine
    tmp = store / f".{machine}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy2(src / "machine.json", tmp / "machine.json")
    for other in kept.values():
        name = _result_file(machine, other.commit, other.env)
        if (dest / name).is_file():
            shutil.copy2(dest / name, tmp / name)
    name = _result_file(machine, commit, env)
    shutil.copy2(src / name, tmp / name)
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
    entries = {b.env: {k: str(getattr(b, k)) for k in _FIELDS} for b in [*kept.values(), baseline]}
    manifest = {"baselines": dict(sorted(entries.items()))}
    atomic.write_text(_manifest(project, machine), json.dumps(manifest, indent=2) + "\n")
    return baseline


def other_baselines(root: Path | str, *, machine: str, env: str) -> list[StoredBaseline]:
    """The stored baselines of every other machine or environment (kept, never replaced by a
    run in this one): what the step names when this machine and environment have none."""
    project = Project.load(root)
    found = []
    for path in sorted(_store(project).glob("*.json")):
        try:
            entries = _read_manifest(project, path.stem)
        except PerfError:
            if path.stem == machine:
                raise  # this machine's own: the step must not go on as if it had none
            continue  # another machine's damage is that machine's step's to report
        found += [b for b in entries.values() if (b.machine, b.env) != (machine, env)]
    return found


def others_note(root: Path | str, *, machine: str, env: str) -> str:
    """What the step adds to "no baseline" when other machines or environments have one:
    which, and that they are kept ("" when there is none)."""
    others = other_baselines(root, machine=machine, env=env)
    if not others:
        return ""
    return (
        f"; this run is machine `{machine}`, environment `{env}`, and the stored baseline(s) "
        "are for "
        + "; ".join(
            f"machine `{b.machine}`, environment `{b.env}` (`{b.commit[:10]}`, {b.recorded_at})"
            for b in others
        )
        + ": kept as they are (each machine and environment keeps its own)"
    )


def stored_baseline(root: Path | str, *, machine: str, env: str) -> StoredBaseline | None:
    """The stored baseline of machine and env, when it has results and its commit is HEAD or an
    ancestor of HEAD (a baseline from another branch's history would compare unrelated code)."""
    project = Project.load(root)
    baseline = _read_manifest(project, machine).get(env)
    if baseline is None:
        return None
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
