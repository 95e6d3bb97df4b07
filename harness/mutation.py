"""Mutation testing of one module at a time with mutmut, against the tests that cover it.

A mutant is the module with one small change (``<`` for ``<=``, ``+`` for ``-``, a constant
changed); the tests *kill* it when at least one of them fails. The mutation score is the share
of mutants killed: what fraction of small wrong versions of the code the suites would notice.
docs/harness.md ("Mutation testing") says why mutmut and how to read the table.

For each module (a ``.py`` file of the project) :func:`run_module`:

1. finds the test files that import it, directly or through other project modules (the same
   import graph as the pull-request selection, :mod:`harness.selection`);
2. copies the project (in a git checkout: every file git tracks or would track, as tests read
   files such as ``requirements/*.lock`` or ``docs/``; elsewhere: the module's package, the
   configured suites folder, ``pyproject.toml`` and ``quarantine.toml``) into a scratch folder
   (mutmut rewrites files under ``mutants/`` of its working folder, and the repository must
   never see that), with a ``[tool.mutmut]`` table naming the module alone as the one to
   mutate and those test files as the ones to run;
3. runs ``mutmut run`` there, then reads every mutant's status (``mutmut results --all``) and,
   for the ones not killed, the change (``mutmut show``: file, line, before and after).

Nothing here imports pytest or mutmut: mutmut runs in its own process, as on the command line.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import glob
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
from harness import layout as _layout
from harness import selection as _selection
from harness import tiers as _tiers
from harness.processes import end_session

__all__ = [
    "CORE_MODULES",
    "CORE_MODULE_TESTS",
    "MutationError",
    "ModuleResult",
    "Status",
    "RunStopped",
    "UnreadableOutput",
    "Survivor",
    "covering_tests",
    "function_patterns",
    "named_tests",
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

CORE_MODULE_TESTS: dict[str, tuple[str, ...]] = {
    # About 950 test files reach the tolerances through other modules (the attention
    # property tests under the Triton interpreter among them): hours of mutants. Its own
    # tests are what the score is about (docs/benchmarks/mutation.md).
    "harness/tolerances.py": ("suites/*/harness/test_tolerances*.py",),
}
"""The test files (globs, as ``--tests``) a core module is measured against when
``harness mutate`` runs with no PATH; the others use the import graph's selection."""

_COPIED_FILES = ("pyproject.toml", "quarantine.toml", "setup.cfg", "tox.ini", "pytest.ini")


class MutationError(RuntimeError):
    """The module cannot be mutation-tested as given (not a module, no covering test, mutmut
    failed before mutating: the message says which and what to do)."""


class Status(enum.StrEnum):
    """A mutant's fate, exactly as mutmut 3.8.1 names it (``mutmut/stats.py``,
    ``status_by_exit_code``); a status not listed here is an error, never filed away.
    docs/harness.md ("Mutation testing") says which count as killed and why."""

    KILLED = "killed"
    """A selected test failed (pytest exit 1, or 3: an internal error)."""
    TIMEOUT = "timeout"
    """The tests ran past mutmut's CPU-time limit (a hang or a loop made much longer): CI's
    per-test deadline would fail them too."""
    SEGFAULT = "segfault"
    """The test process died by signal (SIGSEGV, or SIGKILL: mutmut's hard stop one second
    after the CPU-time limit): a CI run would crash on it."""
    TYPE_CHECK = "caught by type check"
    """mutmut's type checker (``type_check_command``) rejected the mutant: CI's mypy would."""
    SURVIVED = "survived"
    NO_TESTS = "no tests"
    """No test that was run executes the mutated function: a gap in coverage."""
    SUSPICIOUS = "suspicious"
    """The tests exited with a code mutmut does not know: neither a pass nor a failure."""
    SKIPPED = "skipped"
    """Excluded from mutation (``# pragma: no mutate``): not counted either way."""
    NOT_CHECKED = "not checked"
    INTERRUPTED = "check was interrupted by user"


_COUNTS_AS_KILLED = (Status.KILLED, Status.TIMEOUT, Status.SEGFAULT, Status.TYPE_CHECK)
_REPORTED = (Status.SURVIVED, Status.NO_TESTS, Status.SUSPICIOUS)
_UNFINISHED = (Status.NOT_CHECKED, Status.INTERRUPTED)


def mutmut_version() -> str:
    """The installed mutmut's version (named in every error about reading its output)."""
    from importlib import metadata

    try:
        return metadata.version("mutmut")
    except metadata.PackageNotFoundError:
        return "(not installed)"


class RunStopped(MutationError):
    """``mutmut run`` was stopped at its time limit or killed by a signal: whatever statuses it
    left are not a finished run, so they never yield a score."""


class UnreadableOutput(MutationError):
    """mutmut printed something this module cannot read (a mutmut version whose output
    changed): a score from it would be made up, so the module is not measured."""

    def __init__(self, command: str, line: str, why: str) -> None:
        super().__init__(
            f"cannot read the output of `{command}` of mutmut {mutmut_version()} "
            f"(this harness reads mutmut 3.8.1's): {why}: {line!r}"
        )


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
    functions: list[str] = dataclasses.field(default_factory=list)
    """The functions whose mutants alone were run (``--function``); empty: the whole module."""

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
    """The test files of ``tiers`` (empty: all) that import ``path``'s module, directly or
    through other modules. Test files and tiers are the project's configured ones
    (harness.layout, harness.tiers), not a fixed suites/ folder."""
    layout, table = _layout_and_tiers(root)
    graph = _selection.ImportGraph(root)
    module = _module_name(path)
    if module not in graph.files:
        raise MutationError(f"{path}: not a Python module of the project under {root}")
    reached = graph.reverse_closure({module})
    return sorted(
        graph.files[m]
        for m in reached
        if m in graph.files
        and layout.is_test_file(graph.files[m])
        and (not tiers or _tiers.tier_of(table, layout.suites_dir, graph.files[m]) in tiers)
    )


def is_test_file(root: Path, rel: str) -> bool:
    """Whether ``rel`` (relative to ``root``) is one of the project's test files."""
    return _layout_and_tiers(root)[0].is_test_file(rel)


def _layout_and_tiers(root: Path) -> tuple[_layout.Layout, dict[str, _tiers.Tier]]:
    try:
        return _layout.read(root), _tiers.project_tiers(root)
    except (_layout.LayoutError, _tiers.TierConfigError) as exc:
        raise MutationError(str(exc)) from None


def named_tests(root: Path, patterns: Sequence[str]) -> list[str]:
    """The test files named by ``patterns`` (paths or globs such as
    ``suites/unit/harness/test_tolerances*.py``, relative to ``root``), instead of the import
    graph's selection. Each must match an existing test file (``suites/.../test_*.py``) inside
    the project; the first that does not is a MutationError naming it.

    A pattern may end in a pytest node id's tail (``suites/unit/x/test_y.py::test_z``): the
    file part is checked as above and the tail kept, so only that test runs against the
    mutants (the one test whose bound is being judged, say, not its whole file)."""
    top = root.resolve()
    layout = _layout_and_tiers(root)[0]
    found: list[str] = []
    for given_pattern in patterns:
        pattern, sep, tail = given_pattern.partition("::")
        if sep and not tail.strip():
            raise MutationError(f"--tests {given_pattern}: nothing after '::'; name a test")
        if not pattern.strip():
            raise MutationError(
                "--tests: an empty path; give a test file such as suites/unit/x/test_y.py"
            )
        given = Path(pattern)
        if given.is_absolute():
            matches = (
                [given] if not glob.has_magic(pattern) else [Path(m) for m in glob.glob(pattern)]
            )
        else:
            matches = [Path(m) for m in glob.glob(pattern, root_dir=root)] or [given]
            matches = [root / m for m in matches]
        if glob.has_magic(pattern) and not any(m.exists() for m in matches):
            raise MutationError(
                f"--tests {given_pattern}: the pattern matches no file under {root}"
            )
        for match in sorted(matches):
            resolved = match.resolve()
            if not resolved.is_relative_to(top):
                raise MutationError(
                    f"--tests {given_pattern}: {match} is outside the project {top}; "
                    "name a test file of this project"
                )
            if not resolved.is_file():
                raise MutationError(f"--tests {given_pattern}: no such file under {root}")
            rel = resolved.relative_to(top).as_posix()
            if not layout.is_test_file(rel):
                raise MutationError(
                    f"--tests {given_pattern}: {rel} is not a test file "
                    f"(test files are {layout.describe_test_files()})"
                )
            found.append(f"{rel}{sep}{tail}")
    return list(dict.fromkeys(found))


def function_patterns(root: Path, path: str, functions: Sequence[str]) -> list[str]:
    """mutmut's names for the mutants of ``functions`` of the module ``path`` (each a function
    defined at the module's top level, ``name``, or a method, ``Class.name``), as the patterns
    ``mutmut run`` takes: only those functions' mutants are then run and counted (the
    functions a numeric check exercises, say, out of a module of hundreds of mutants). A name
    the module does not define is a MutationError naming the ones it does."""
    import ast

    posix = PurePosixPath(Path(path).as_posix())
    try:
        tree = ast.parse((root / posix).read_text())
    except (OSError, SyntaxError) as exc:
        raise MutationError(f"{path}: cannot be read for --function ({exc})") from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.ClassDef):
            defined.update(
                f"{node.name}.{n.name}"
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    module = _module_name(str(posix))
    patterns = []
    for name in functions:
        if name not in defined:
            known = sorted(defined)
            raise MutationError(
                f"--function {name}: {path} defines no such function or method (it has: "
                f"{', '.join(known[:12])}{', ...' if len(known) > 12 else ''})"
            )
        cls, dot, func = name.rpartition(".")
        mangled = f"xǁ{cls}ǁ{func}" if dot else f"x_{func}"
        patterns.append(f"{module}.{mangled}__mutmut_*")
    return patterns


def _selected(statuses: dict[str, Status], patterns: Sequence[str]) -> dict[str, Status]:
    """The statuses of the mutants ``patterns`` select (all of them when there is none):
    ``mutmut results`` lists every mutant of the module, those not run as ``not checked``."""
    if not patterns:
        return statuses
    import fnmatch

    return {n: s for n, s in statuses.items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}


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
        suites = _layout_and_tiers(root)[0].suites_dir.split("/")[0]
        for folder in dict.fromkeys((top, suites if suites != "." else top)):
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


_MUTMUT: list[str] = [sys.executable, "-m", "mutmut"]
"""How mutmut is started: in its own process, with this interpreter (tests point it at a
stand-in that misbehaves on purpose: a hang, output in a format this module cannot read)."""


def _mutmut(work: Path, *args: str, stream: bool = False, timeout: float | None = None) -> str:
    """mutmut's standard output. Its standard error is kept apart (a warning printed there must
    not be read as a result) and quoted when it fails. On ``timeout`` the whole process group
    is ended (mutmut's workers too, not only the parent) and the run is a MutationError."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    # mutmut forks each mutant's worker from a process that has already run the tests: an
    # OpenMP pool started there (torch's, on its first op) does not survive the fork, and every
    # mutant of a module the tests reach through torch then hangs to mutmut's CPU limit and is
    # counted "timeout", killed (seen on reference_impls/attention). One thread per worker;
    # --jobs workers run side by side anyway.
    env.setdefault("OMP_NUM_THREADS", "1")
    command = " ".join(("mutmut", *args))
    proc = subprocess.Popen(
        [*_MUTMUT, *args],
        cwd=work,
        env=env,
        stdout=None if stream else subprocess.PIPE,
        stderr=None if stream else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_session(proc)
        raise RunStopped(
            f"`{command}` in {work} was stopped at its time limit of {timeout:g} s "
            "(raise it with --timeout, or name fewer tests with --tests)"
        ) from None
    except BaseException:  # Ctrl-C: leave no mutmut worker running
        end_session(proc)
        raise
    if proc.returncode != 0:
        output = ((stdout or "") + (stderr or ""))[-3000:]
        raise (RunStopped if proc.returncode < 0 else MutationError)(
            f"`{command}` in {work} exited {proc.returncode}"
            + (f":\n{output}" if output else " (its output is above)")
        )
    return stdout or ""


_RESULT_LINE = re.compile(r"^\s+(\S+): (.+)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


def _parse_show(text: str) -> tuple[int | None, str, str]:
    """(line, before, after) of the first changed line in ``mutmut show``'s diff. The line is
    counted from the start of the mutated function (mutmut diffs the function alone):
    :func:`_file_line` turns it into the file's line. A diff with no changed line in it is
    :class:`UnreadableOutput`."""
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
    if current is None or not (before or after):
        first = next((r for r in text.splitlines() if r.strip()), "")
        raise UnreadableOutput("mutmut show", first, "no `@@` hunk with a changed line in it")
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
    """Each mutant's status from ``mutmut results --all true`` (``    NAME: STATUS`` rows).
    A row of another shape, or a status not in :class:`Status`, is :class:`UnreadableOutput`:
    never a quiet "other" that would lower or raise the score unseen."""
    statuses: dict[str, Status] = {}
    for row in text.splitlines():
        if not row.strip():
            continue
        match = _RESULT_LINE.match(row)
        if not match:
            raise UnreadableOutput("mutmut results --all true", row, "not a `NAME: STATUS` row")
        raw = match.group(2).strip()
        if raw not in Status._value2member_map_:
            raise UnreadableOutput("mutmut results --all true", row, f"unknown status {raw!r}")
        statuses[match.group(1)] = Status(raw)
    return statuses


def _use_results_despite(error: MutationError, statuses: dict[str, Status]) -> None:
    """Raise ``error`` (``mutmut run`` exited non-zero) unless it checked every mutant.

    mutmut 3.8 can exit 1 with no message after the last mutant, its statuses all recorded
    (seen on this project's ``harness/seeding.py``); those statuses are what a clean exit
    would have reported. A run that stopped early (a failing clean test run, a crash, the
    time limit) leaves mutants ``not checked``, or none at all, and must not yield a score.
    """
    unfinished = [n for n, s in statuses.items() if s in _UNFINISHED]
    if not statuses or unfinished:
        raise MutationError(
            f"{error}\n{len(unfinished)} of {len(statuses)} mutant(s) not checked"
            + (f" (first: {unfinished[0]})" if unfinished else "")
        ) from None


def _check_complete(path: str, statuses: dict[str, Status]) -> None:
    """Refuse a score made of nothing: no mutant at all (mutmut found nothing to change in the
    module, or its output listed none) or mutants left unchecked after a clean exit."""
    if not statuses:
        raise MutationError(
            f"{path}: mutmut {mutmut_version()} reported no mutant of it: nothing was measured "
            "(a module with no function to mutate, or mutmut's results listed none)"
        )
    counted = [n for n, s in statuses.items() if s is not Status.SKIPPED]
    if not counted:
        raise MutationError(f"{path}: all {len(statuses)} mutant(s) skipped: nothing measured")
    unfinished = [n for n, s in statuses.items() if s in _UNFINISHED]
    if unfinished:
        raise MutationError(
            f"{path}: {len(unfinished)} of {len(statuses)} mutant(s) not checked although "
            f"`mutmut run` exited 0 (first: {unfinished[0]}: {statuses[unfinished[0]]})"
        )


def run_module(
    root: Path,
    path: str,
    work: Path,
    *,
    jobs: int = 2,
    tiers: Sequence[str] = DEFAULT_TIERS,
    tests: Sequence[str] | None = None,
    timeout_s: float = 3600,
    progress: Callable[[str], None] | None = None,
    functions: Sequence[str] = (),
) -> ModuleResult:
    """Mutation-test ``path`` (repository-relative) in the scratch folder ``work``, against
    ``tests`` (repository-relative test files, or node ids; None: those of ``tiers`` that
    import it); with ``functions``, only the mutants of those functions of it
    (:func:`function_patterns`)."""
    posix = PurePosixPath(Path(path).as_posix())
    if posix.suffix != ".py" or not (root / posix).is_file():
        raise MutationError(f"{path}: no such Python file under {root}; give a module's path")
    if _layout_and_tiers(root)[0].is_test_file(str(posix)):
        raise MutationError(f"{path}: a test file; give the module it tests")
    say = progress or (lambda _msg: None)
    selection = function_patterns(root, str(posix), functions) if functions else []
    if tests is None:
        tests = covering_tests(root, str(posix), tiers)
        if not tests:
            raise MutationError(
                f"{path}: no test file imports it, so every mutant would survive; "
                "write a test that imports it first"
            )
        say(f"{path}: {len(tests)} test file(s) cover it: {', '.join(tests[:6])}")
    else:
        tests = list(tests)
        say(f"{path}: {len(tests)} test file(s) named with --tests: {', '.join(tests[:6])}")
    started = time.monotonic()
    _prepare(root, str(posix), tests, work)
    try:
        _mutmut(
            work, "run", "--max-children", str(jobs), *selection, stream=True, timeout=timeout_s
        )
        run_error = None
    except RunStopped:
        raise
    except MutationError as exc:
        run_error = exc
    try:
        statuses = _parse_results(_mutmut(work, "results", "--all", "true"))
        statuses = _selected(statuses, selection)
    except MutationError:
        if run_error is not None:
            raise run_error from None
        raise
    if selection and not statuses:
        raise MutationError(
            f"{path}: mutmut made no mutant of {', '.join(functions)} (it leaves functions "
            "with a decorator other than @staticmethod/@classmethod unmutated)"
            + (f"\n{run_error}" if run_error is not None else "")
        )
    if run_error is not None:
        _use_results_despite(run_error, statuses)
        say(
            f"{path}: warning: {' '.join(str(run_error).split())[:300]}; every one of its "
            f"{len(statuses)} mutants was checked, so their statuses are reported"
        )
    _check_complete(path, statuses)
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
        functions=list(functions),
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
                "functions": r.functions,
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


def _cell_text(message: str) -> str:
    """A message on one table row: whitespace folded, pipes escaped, at most 400 characters."""
    return " ".join(message.split())[:400].replace("|", "\\|")


def render_markdown(results: Sequence[ModuleResult], errors: dict[str, str]) -> str:
    """A table of scores per module, then every surviving mutant: file:line, the change."""
    lines = [
        "## Mutation testing (mutmut)",
        "",
        "| module | score | killed | survived | no tests | suspicious | mutants | tests | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        score = "-" if r.score is None else f"{100 * r.score:.1f}%"
        # How the killed ones died, when not all by a failing test: "12 (2 timeout)".
        how = ", ".join(f"{r.counts[s]} {s}" for s in _COUNTS_AS_KILLED[1:] if r.counts.get(s, 0))
        only = f" ({', '.join(r.functions)} only)" if r.functions else ""
        lines.append(
            f"| `{r.path}`{only} | {score} | {r.killed}{f' ({how})' if how else ''} | "
            f"{r.counts.get(Status.SURVIVED, 0)} | {r.counts.get(Status.NO_TESTS, 0)} | "
            f"{r.counts.get(Status.SUSPICIOUS, 0)} | {r.total} | {len(r.tests)} | "
            f"{r.seconds:.0f} s |"
        )
    for path, message in errors.items():
        lines.append(f"| `{path}` | **error**: {_cell_text(message)} |||||||| ")
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
