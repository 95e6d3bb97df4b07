"""Mutation testing of one module at a time with mutmut, against the tests that cover it.

A mutant is the module with one small change (``<`` for ``<=``, ``+`` for ``-``, a constant
changed); the tests *kill* it when at least one of them fails. The mutation score is the share
of mutants killed: what fraction of small wrong versions of the code the suites would notice.
docs/harness.md ("Mutation testing") says why mutmut and how to read the table.

For each module (a ``.py`` file of the project) :func:`run_module`:

1. finds the test files that import it, directly or through other project modules (the same
   import graph as the pull-request selection, :mod:`harness.selection`);
2. copies the project (in a git checkout: every file git tracks or would track, as tests read
   files such as ``requirements/*.lock`` or ``docs/``; elsewhere: the module's package,
   ``suites/``, ``pyproject.toml`` and ``quarantine.toml``) into a scratch folder (mutmut
   rewrites files under ``mutants/`` of its working folder, and the repository must never see
   that), with a ``[tool.mutmut]`` table naming the module alone as the one to mutate and those
   test files as the ones to run;
3. runs ``mutmut run`` there, then reads every mutant's status (``mutmut results --all``) and,
   for the ones not killed, the change (``mutmut show``: file, line, before and after).

Nothing here imports pytest or mutmut: mutmut runs in its own process, as on the command line.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import tomlkit

from harness import atomic
from harness import selection as _selection

__all__ = [
    "CORE_MODULES",
    "MutationError",
    "ModuleResult",
    "Status",
    "Survivor",
    "covering_tests",
    "render_markdown",
    "run_module",
    "to_json",
]

CORE_MODULES = (
    "harness/tolerances.py",
    "harness/quarantine.py",
    "harness/seeding.py",
    "reference_impls/collectives/simulation.py",
    "reference_impls/collectives/schedule.py",
    "reference_impls/training/early_stopping.py",
    "reference_impls/data/assignment.py",
    "reference_impls/training/checkpoint.py",
)
"""What ``harness mutate`` with no PATH runs (the nightly job): the modules whose mistakes the
suites most need to catch. A path missing from this checkout is reported, not skipped."""

_COPIED_FILES = ("pyproject.toml", "quarantine.toml", "setup.cfg")


class MutationError(RuntimeError):
    """The module cannot be mutation-tested as given (not a module, no covering test, mutmut
    failed before mutating: the message says which and what to do)."""


class Status(enum.StrEnum):
    """A mutant's fate, as mutmut reports it. Every mutant starts ``not checked`` and ends in
    one of the others; only ``killed`` (and ``timeout``, a mutant that made the tests hang,
    which a test run with a deadline would notice) counts towards the score."""

    KILLED = "killed"
    SURVIVED = "survived"
    NO_TESTS = "no tests"
    """No test that was run executes the mutated function: a gap in coverage."""
    TIMEOUT = "timeout"
    SUSPICIOUS = "suspicious"
    SKIPPED = "skipped"
    NOT_CHECKED = "not checked"
    OTHER = "other"


_COUNTS_AS_KILLED = (Status.KILLED, Status.TIMEOUT)
_REPORTED = (Status.SURVIVED, Status.NO_TESTS, Status.SUSPICIOUS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Survivor:
    """A mutant the tests did not kill."""

    name: str
    """mutmut's name for it (``pkg.mod.x_func__mutmut_3``): ``mutmut show NAME`` in the
    scratch folder prints it again."""
    status: Status
    path: str
    line: int | None
    before: str
    after: str


@dataclasses.dataclass(kw_only=True)
class ModuleResult:
    """The mutation test of one module."""

    path: str
    tests: list[str]
    counts: dict[str, int]
    survivors: list[Survivor]
    seconds: float
    work_dir: str

    @property
    def total(self) -> int:
        return sum(n for s, n in self.counts.items() if s not in (Status.SKIPPED,))

    @property
    def killed(self) -> int:
        return sum(self.counts.get(s, 0) for s in _COUNTS_AS_KILLED)

    @property
    def score(self) -> float | None:
        """Killed / all mutants (skipped ones aside); None when mutmut made none."""
        return self.killed / self.total if self.total else None


def _module_name(path: str) -> str:
    return ".".join(PurePosixPath(path).with_suffix("").parts).removesuffix(".__init__")


DEFAULT_TIERS = ("unit", "property")
"""The tiers whose tests run against each mutant by default: each mutant is checked by the tests
that execute the mutated function, so the fast tiers are where mutants should die."""


def covering_tests(root: Path, path: str, tiers: Sequence[str] = DEFAULT_TIERS) -> list[str]:
    """The test files of ``tiers`` (folders under ``suites/``; empty: all) that import
    ``path``'s module, directly or through other modules."""
    graph = _selection.ImportGraph(root)
    module = _module_name(path)
    if module not in graph.files:
        raise MutationError(f"{path}: not a Python module of the project under {root}")
    reached = graph.reverse_closure({module})
    return sorted(
        graph.files[m]
        for m in reached
        if m in graph.files
        and _selection._is_test_file(graph.files[m])
        and (not tiers or PurePosixPath(graph.files[m]).parts[1] in tiers)
    )


def _project_files(root: Path) -> list[str] | None:
    """The files of the project at ``root`` as git sees them (tracked, plus untracked ones not
    ignored, so a test not yet committed is there too); None when ``root`` is not the top of a
    git checkout."""
    git = shutil.which("git")
    if git is None:
        return None
    top = subprocess.run(
        [git, "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True
    )
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return None
    listed = subprocess.run(
        [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    )
    names = (n.decode() for n in listed.stdout.split(b"\0") if n)
    # A file deleted in the work tree but not yet in the index is listed and absent: skip it.
    return sorted(n for n in names if n.split("/")[0] != "mutants" and (root / n).is_file())


def _prepare(root: Path, path: str, tests: Sequence[str], work: Path) -> list[str]:
    """Fill ``work`` for mutmut; returns the top-level names copied besides the module's
    package (mutmut copies them again into ``mutants/``, where the tests run)."""
    top = PurePosixPath(path).parts[0]
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    files = _project_files(root)
    if files is not None:
        for name in files:
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, target)
    else:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "mutants")
        for folder in dict.fromkeys((top, "suites")):
            if (root / folder).is_dir():
                shutil.copytree(root / folder, work / folder, ignore=ignore)
        for name in _COPIED_FILES:
            if (root / name).is_file():
                shutil.copy2(root / name, work / name)
    also_copy = sorted({p.name for p in work.iterdir()} - {top})
    pyproject = work / "pyproject.toml"
    doc = tomlkit.parse(pyproject.read_text()) if pyproject.exists() else tomlkit.document()
    tool = doc.setdefault("tool", tomlkit.table())
    # The whole package is copied under mutants/ (mutmut puts that first on sys.path, so a
    # partial copy would hide the package's other modules); only the one file is mutated.
    tool["mutmut"] = {
        "source_paths": [top],
        "only_mutate": [path],
        "also_copy": also_copy,
        "pytest_add_cli_args_test_selection": list(tests),
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q"],
    }
    pyproject.write_text(tomlkit.dumps(doc))
    return also_copy


def _mutmut(work: Path, *args: str, stream: bool = False, timeout: float | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=work,
        env=env,
        stdout=None if stream else subprocess.PIPE,
        stderr=None if stream else subprocess.STDOUT,
        text=True,
        check=False,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise MutationError(
            f"`mutmut {' '.join(args)}` in {work} exited {proc.returncode}"
            + (f":\n{proc.stdout[-3000:]}" if proc.stdout else " (its output is above)")
        )
    return proc.stdout or ""


_RESULT_LINE = re.compile(r"^\s+(\S+): (.+)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


def _parse_show(text: str) -> tuple[int | None, str, str]:
    """(line, before, after) of the first changed line in ``mutmut show``'s diff. The line is
    counted from the start of the mutated function (mutmut diffs the function alone):
    :func:`_file_line` turns it into the file's line."""
    line: int | None = None
    before = after = ""
    current = None
    for row in text.splitlines():
        hunk = _HUNK.match(row)
        if hunk:
            current = int(hunk.group(1))
            continue
        if current is None or row.startswith(("---", "+++")):
            continue
        if row.startswith("-") and not before:
            line, before = current, row[1:].strip()
        elif row.startswith("+") and before and not after:
            after = row[1:].strip()
        if not row.startswith("+"):
            current += 1
    return line, before, after


def _file_line(
    source: str, name: str, module: str, relative: int | None, before: str
) -> int | None:
    """The line in the file of a mutant's change, from mutmut's name for the mutant
    (``pkg.mod.x_func__mutmut_3``, ``pkg.mod.xǁClassǁmethod__mutmut_3``), the line counted
    from the function's start and the changed line's text."""
    import ast

    qual = name[len(module) + 1 :].rsplit("__mutmut_", 1)[0]
    qual = qual[2:] if qual.startswith(("x_", "xǁ")) else qual
    parts = [p for p in qual.split("ǁ") if p]
    lines = source.splitlines()
    body: list[ast.stmt] = ast.parse(source).body
    node: ast.AST | None = None
    for part in parts:
        found = [
            n
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.name == part
        ]
        if not found:
            node = None
            break
        node = found[0]
        body = found[0].body
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        end = node.end_lineno or len(lines)
    else:
        start, end = 1, len(lines)
    guess = start + (relative or 1) - 1
    matches = [i for i in range(start, end + 1) if lines[i - 1].strip() == before]
    if matches:
        return min(matches, key=lambda i: abs(i - guess))
    return guess if relative is not None else None


def _parse_results(text: str) -> dict[str, Status]:
    """Each mutant's status from ``mutmut results --all true`` (``    NAME: STATUS`` rows)."""
    statuses: dict[str, Status] = {}
    for row in text.splitlines():
        match = _RESULT_LINE.match(row)
        if match:
            raw = match.group(2).strip()
            statuses[match.group(1)] = (
                Status(raw) if raw in Status._value2member_map_ else Status.OTHER
            )
    return statuses


def _use_results_despite(error: MutationError, statuses: dict[str, Status]) -> None:
    """Raise ``error`` (``mutmut run`` exited non-zero) unless it checked every mutant.

    mutmut 3.8 can exit 1 with no message after the last mutant, its statuses all recorded
    (seen on this project's ``harness/seeding.py``); those statuses are what a clean exit
    would have reported. A run that stopped early (a failing clean test run, a crash, the
    time limit) leaves mutants ``not checked``, or none at all, and must not yield a score.
    """
    unfinished = [n for n, s in statuses.items() if s in (Status.NOT_CHECKED, Status.OTHER)]
    if not statuses or unfinished:
        raise MutationError(
            f"{error}\n{len(unfinished)} of {len(statuses)} mutant(s) not checked"
            + (f" (first: {unfinished[0]})" if unfinished else "")
        ) from None


def run_module(
    root: Path,
    path: str,
    work: Path,
    *,
    jobs: int = 2,
    tiers: Sequence[str] = DEFAULT_TIERS,
    timeout_s: float = 3600,
    progress: Callable[[str], None] | None = None,
) -> ModuleResult:
    """Mutation-test ``path`` (repository-relative) in the scratch folder ``work``."""
    posix = PurePosixPath(Path(path).as_posix())
    if posix.suffix != ".py" or not (root / posix).is_file():
        raise MutationError(f"{path}: no such Python file under {root}; give a module's path")
    if posix.parts[0] in ("suites",):
        raise MutationError(f"{path}: a test file; give the module it tests")
    tests = covering_tests(root, str(posix), tiers)
    if not tests:
        raise MutationError(
            f"{path}: no test file imports it, so every mutant would survive; "
            "write a test that imports it first"
        )
    say = progress or (lambda _msg: None)
    say(f"{path}: {len(tests)} test file(s) cover it: {', '.join(tests[:6])}")
    started = time.monotonic()
    _prepare(root, str(posix), tests, work)
    try:
        _mutmut(work, "run", "--max-children", str(jobs), stream=True, timeout=timeout_s)
        run_error = None
    except MutationError as exc:
        run_error = exc
    try:
        statuses = _parse_results(_mutmut(work, "results", "--all", "true"))
    except MutationError:
        if run_error is not None:
            raise run_error from None
        raise
    if run_error is not None:
        _use_results_despite(run_error, statuses)
        say(
            f"{path}: warning: {' '.join(str(run_error).split())[:300]}; every one of its "
            f"{len(statuses)} mutants was checked, so their statuses are reported"
        )
    survivors = []
    # The copy that was mutated: the working tree may have changed during the run.
    source = (work / posix).read_text()
    module = _module_name(str(posix))
    for name, status in statuses.items():
        if status in _REPORTED:
            relative, before, after = _parse_show(_mutmut(work, "show", name))
            line = _file_line(source, name, module, relative, before)
            survivors.append(
                Survivor(
                    name=name, status=status, path=str(posix), line=line, before=before, after=after
                )
            )
    survivors.sort(key=lambda s: (s.line or 0, s.name))
    return ModuleResult(
        path=str(posix),
        tests=tests,
        counts=dict(Counter(str(s) for s in statuses.values())),
        survivors=survivors,
        seconds=round(time.monotonic() - started, 1),
        work_dir=str(work),
    )


def to_json(results: Sequence[ModuleResult], errors: dict[str, str]) -> dict[str, Any]:
    """The JSON report: one entry per module, kept per run so scores can be tracked."""
    return {
        "version": 1,
        "tool": "mutmut",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "modules": [
            {
                "path": r.path,
                "score": None if r.score is None else round(r.score, 4),
                "total": r.total,
                "killed": r.killed,
                "counts": r.counts,
                "tests": r.tests,
                "seconds": r.seconds,
                "survivors": [
                    {**dataclasses.asdict(s), "status": str(s.status)} for s in r.survivors
                ],
            }
            for r in results
        ],
        "errors": errors,
    }


def _cell(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`" if text else "-"


def render_markdown(results: Sequence[ModuleResult], errors: dict[str, str]) -> str:
    """A table of scores per module, then every surviving mutant: file:line, the change."""
    lines = [
        "## Mutation testing (mutmut)",
        "",
        "| module | score | killed | survived | no tests | other | mutants | tests | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        other = r.total - r.killed - r.counts.get("survived", 0) - r.counts.get("no tests", 0)
        score = "-" if r.score is None else f"{100 * r.score:.1f}%"
        lines.append(
            f"| `{r.path}` | {score} | {r.killed} | {r.counts.get('survived', 0)} | "
            f"{r.counts.get('no tests', 0)} | {other} | {r.total} | {len(r.tests)} | "
            f"{r.seconds:.0f} s |"
        )
    for path, message in errors.items():
        lines.append(f"| `{path}` | not measured: {' '.join(message.split())[:200]} |||||||| ")
    lines.append("")
    for r in results:
        if not r.survivors:
            continue
        lines += [
            f"### Not killed in `{r.path}`",
            "",
            "| where | status | change |",
            "|---|---|---|",
        ]
        for s in r.survivors:
            lines.append(
                f"| {s.path}:{s.line if s.line is not None else '?'} | {s.status} | "
                f"{_cell(s.before)} → {_cell(s.after)} |"
            )
        lines.append("")
    return "\n".join(lines)


def write_reports(out: Path, results: Sequence[ModuleResult], errors: dict[str, str]) -> list[Path]:
    """mutation.json and mutation.md in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        out / "mutation.json": json.dumps(to_json(results, errors), indent=2) + "\n",
        out / "mutation.md": render_markdown(results, errors) + "\n",
    }
    for target, text in files.items():
        atomic.write_text(target, text)
    return list(files)
