"""The pull-request mode of `harness ci`: the tests and benchmarks a change can reach, run in
parallel. The selection itself is :mod:`harness.selection`; the parallel scheduling is
:mod:`harness.xdist_groups`; this module turns both into what the ci steps run."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

from harness import impact as _impact
from harness import layout as _layout
from harness import selection as _selection

DEFAULT_BASE_REFS = ("origin/main", "origin/master", "main", "master")
"""Tried in order, after the remote's default branch (origin/HEAD), when --changed-since is
not given: a project's default branch is detected, not assumed to be main."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """What the ci steps run in pull-request mode."""

    selection: _selection.Selection | None
    """None: the full run (asked for, or no base could be found: ``note`` says which)."""
    pytest_args: tuple[str, ...] = ()
    bench: str | None = None
    """asv --bench regex; None runs every benchmark of the group."""
    skip_tests: str | None = None
    """Why the test step is skipped (no test file reachable), else None."""
    skip_perf: str | None = None
    note: str = ""
    """One line for the summary: the mode, the base, what was selected."""
    base_ref: str | None = None
    """The ref the change was measured from (--changed-since, or the detected default
    branch); the perf step takes its baseline from the same ref."""


def xdist_args(workers: str) -> tuple[str, ...]:
    """pytest arguments for ``workers`` xdist workers (``auto``: one per core; ``0``: none),
    scheduled by :mod:`harness.xdist_groups`. The full run uses them too: it is the same
    suite, only more of it."""
    if workers in ("0", ""):
        return ()
    return ("-p", "harness.xdist_groups", f"--numprocesses={workers}")


def _resolves(root: Path, ref: str) -> bool:
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        cwd=root,
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def default_base_refs(root: Path) -> list[str]:
    """The refs that may name the default branch, most specific first, that exist: the
    remote's HEAD (what ``git clone`` recorded), then DEFAULT_BASE_REFS."""
    proc = subprocess.run(
        ["git", "symbolic-ref", "--quiet", "refs/remotes/origin/HEAD"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    head = proc.stdout.strip().removeprefix("refs/remotes/") if proc.returncode == 0 else ""
    refs = [head] if head else []
    return [r for r in dict.fromkeys([*refs, *DEFAULT_BASE_REFS]) if _resolves(root, r)]


def git_top(path: Path) -> Path | None:
    """The top of the git work tree ``path`` is in (None: not in one)."""
    proc = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True
    )
    top = proc.stdout.strip() if proc.returncode == 0 else ""
    return Path(top) if top else None


def load_impact(root: Path, path: Path | None) -> _impact.ImpactMap | None:
    """The impact map at ``path``, else at the repository's default place if one is there
    (None: no map). Raises ImpactError for one that cannot be read, naming it."""
    if path is None:
        path = root / _impact.DEFAULT_MAP
        if not path.exists():
            return None
    return _impact.ImpactMap.load(path)


def plan(root: Path, *, base_ref: str | None, workers: str, impact_map: Path | None = None) -> Plan:
    """Select from the change since ``base_ref`` (default: the first of DEFAULT_BASE_REFS that
    exists); fall back to the full run, saying why, when there is no base to compare with.
    ``impact_map``: a recorded map (default: ``.harness/impact.json`` when there is one) that
    narrows changes inside function bodies (harness.impact)."""
    # git names changed files from the top of the work tree: the graph must start there too.
    root = git_top(root) or root
    refs = [base_ref] if base_ref else default_base_refs(root)
    if not refs:
        return Plan(
            selection=None,
            pytest_args=xdist_args(workers),
            note="pull-request mode fell back to the full run: no base branch to compare "
            f"with (neither origin/HEAD nor any of {', '.join(DEFAULT_BASE_REFS)} exists; "
            "pass --changed-since REF)",
        )
    try:
        base = _selection.merge_base(root, refs[0])
        changed = _selection.changed_files(root, base)
    except _selection.SelectionError as exc:
        if base_ref:  # the user named it: a typo must not silently run everything
            raise
        return Plan(
            selection=None,
            pytest_args=xdist_args(workers),
            note=f"pull-request mode fell back to the full run: {exc}",
            base_ref=refs[0],
        )
    if not changed:
        # Nothing differs from the base: this is the base itself (main, a fresh clone). A run
        # that selected nothing would pass without checking anything, so test everything.
        return Plan(
            selection=None,
            pytest_args=xdist_args(workers),
            note=f"pull-request mode fell back to the full run: nothing changed since "
            f"{refs[0]} ({base[:10]}), so there is no change to select from",
            base_ref=refs[0],
        )
    try:
        layout = _layout.read(root)
    except _layout.LayoutError as exc:
        raise _selection.SelectionError(str(exc)) from None
    impact = load_impact(root, impact_map)
    sel = _selection.select(root, changed, base=base, layout=layout, impact=impact)
    xdist = xdist_args(workers)
    note = f"pull-request mode: {len(changed)} file(s) changed since {refs[0]} ({base[:10]}); "
    if sel.everything:
        return Plan(
            selection=sel,
            pytest_args=xdist,
            note=note + sel.reason + ": every test",
            base_ref=refs[0],
        )
    if sel.impact:
        note += " [impact map: " + "; ".join(sel.impact) + "] "
    bench = _selection.bench_regex(sel.benchmarks, sel.benchmark_names)
    return Plan(
        selection=sel,
        pytest_args=(*xdist, *sel.tests),
        bench=bench,
        skip_tests=None if sel.tests else f"no test file reaches the change ({sel.reason})",
        skip_perf=_skip_perf(sel),
        note=note + sel.reason,
        base_ref=refs[0],
    )


def _skip_perf(sel: _selection.Selection) -> str | None:
    """Why the perf step (the CPU group: harness ci's) has nothing to time, else None."""
    if sel.benchmarks:
        return None
    if not sel.benchmark_names:
        return "no benchmark file reaches the change"
    from harness.perf.runs import GROUPS

    cpu = re.compile(GROUPS["cpu"])
    if any(cpu.match(name) for name in sel.benchmark_names):
        return None
    return (
        f"the {len(sel.benchmark_names)} benchmark(s) the change reaches are all in the GPU "
        "group, which the GPU runner times"
    )


def write(plan_: Plan, path: Path) -> None:
    """The selection as JSON (selection.json in the report dir), for reviewers and tools."""
    sel = plan_.selection
    data = {
        "note": plan_.note,
        "full_run": sel is None,
        "base": sel.base if sel else None,
        "changed": list(sel.changed) if sel else [],
        "everything": sel.everything if sel else True,
        "tests": list(sel.tests) if sel else [],
        "benchmarks": list(sel.benchmarks) if sel else [],
        "benchmark_names": list(sel.benchmark_names) if sel else [],
        "impact": list(sel.impact) if sel else [],
        "base_ref": plan_.base_ref,
        "bench_regex": plan_.bench,
        "pytest_args": list(plan_.pytest_args),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
