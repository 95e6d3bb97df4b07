"""Test-impact selection: which test files ran which functions, recorded from per-test coverage.

Pull-request mode selects test files on the import graph (:mod:`harness.selection`): a change
to a module runs every test file whose imports reach it. For a module that the plugin or the
CLI imports (``harness/tolerances.py``, ``harness/quarantine.py``) that is most of the suite,
because every test that runs pytest on a project of its own reaches it. An **impact map**
narrows such a change to the test files that actually ran the changed code:

- ``harness impact record`` runs the suite once with coverage.py in every Python process the
  tests start (the pytest workers and their subprocesses, through coverage's own start-up
  hook, ``COVERAGE_PROCESS_START``), each line labelled with the test that ran it
  (:mod:`harness.impact.recorder` switches coverage's context per test and hands the test's
  id to subprocesses in :data:`CONTEXT_ENV`). The lines are folded into **units**: the
  functions and methods defined at module or class level (a nested function belongs to the
  unit around it). The map says, per project file and unit, which test files ran it, and
  whether code outside any test ran it (collection, a session-wide fixture, teardown:
  *ambient*).
- A change then selects on the map only where that is sound (:func:`changed_units`): every
  difference between the base and the head is inside the bodies of existing units (the
  module's other code, signatures, decorators, the set of units all equal, compared on the
  syntax tree, so comments and blank lines count for nothing), each changed unit was run by
  at least one test, none of them ambiently, and none may run at import
  (:func:`names_run_at_import`: import-time code runs in whichever test imported the module
  first, so the recording credits one test with what all its importers depend on). The
  module's selected test files are then
  the files that ran a changed unit, plus the files the import graph reaches that the
  recording cannot see into (those declaring ``RUNS_PYTEST``: act runs a copy of the
  repository). Anything else falls back to the import graph for that module, saying why.
- The map is used only when it was recorded at the base commit of the change, from a clean
  tree: otherwise a test whose path to the changed code appeared after the recording would
  be missed. CI records it on the main branch's full run and hands it to pull requests
  (docs/harness.md, "Test-impact selection").

What it cannot see, and why the full tiers still run on every push: code run by a process
that coverage does not measure (killed before it saved its data, started with a cleared
environment, or running a copy of the project outside the repository), and background
threads that outlive their test (their lines go to the test running then).

Nothing here imports pytest; coverage.py is imported only to record and to build a map.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "BENCH_CACHE_PREFIX",
    "BENCH_PREFIX",
    "CONTEXT_ENV",
    "DEFAULT_MAP",
    "ImpactError",
    "ImpactMap",
    "build",
    "changed_units",
    "rcfile_text",
    "units",
]

CONTEXT_ENV = "HARNESS_IMPACT_TEST"
"""The running test's node id, for the subprocesses it starts (their coverage context)."""

BENCH_PREFIX = "asv:"
"""The coverage context of one asv benchmark's setup, call and teardown
(``asv:bench_x.Class.time_y``), and of the processes it starts (harness.impact.bench_recorder)."""

BENCH_CACHE_PREFIX = "asv-cache:"
"""The coverage context of one ``setup_cache`` run, shared by the benchmarks the recorder's
output names for it."""

DEFAULT_MAP = Path(".harness") / "impact.json"
"""Where ``harness impact record`` writes the map and ``harness ci`` looks for it."""

MAP_VERSION = 1

_SKIP_DIRS = (".venv", "venv", ".git", ".asv", ".harness", "reports", "mutants", "build")


class ImpactError(RuntimeError):
    """A map that cannot be read or built (the message names the file and the reason)."""


# --------------------------------------------------------------------------- units


def _unit_defs(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(unit name, def) for each function or method at module or class level, in source
    order. A name defined twice in one scope (a property's getter and setter) gets ``#2``."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    seen: dict[str, int] = defaultdict(int)

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + stmt.name
                seen[name] += 1
                found.append((name if seen[name] == 1 else f"{name}#{seen[name]}", stmt))
            elif isinstance(stmt, ast.ClassDef):
                walk(stmt.body, f"{prefix}{stmt.name}.")

    walk(tree.body, "")
    return found


def units(source: str) -> dict[str, tuple[int, int]]:
    """Each unit's body lines ``(first, last)`` in ``source`` (the ``def`` line, decorators
    and defaults run at import time, so they are the module's, not the unit's)."""
    tree = ast.parse(source)
    spans: dict[str, tuple[int, int]] = {}
    for name, fn in _unit_defs(tree):
        last = fn.end_lineno or fn.body[-1].lineno
        spans[name] = (fn.body[0].lineno, last)
    return spans


def _split(source: str) -> tuple[str, dict[str, str]]:
    """The module with every unit's body emptied, and each unit's body, as syntax-tree dumps
    (no line numbers: code that only moved compares equal)."""
    tree = ast.parse(source)
    bodies = {
        name: ast.dump(ast.Module(body=fn.body, type_ignores=[])) for name, fn in _unit_defs(tree)
    }
    return ast.dump(_emptied(tree)), bodies


def _emptied(tree: ast.Module) -> ast.Module:
    """A copy of the module with every unit's body replaced by ``pass``: the code that runs
    at import (plus the defs' signatures, decorators and defaults, which do too). A unit's
    docstring stays (``__doc__``, click's ``--help``, read without calling it), and so does
    whether it is a generator or coroutine (``yield``/``await`` change what a call returns
    before any line of the body runs)."""
    skeleton = copy.deepcopy(tree)
    for _, fn in _unit_defs(skeleton):
        kept: list[ast.stmt] = []
        if ast.get_docstring(fn, clean=False) is not None:
            kept.append(fn.body[0])
        if _suspends(fn):
            kept.append(ast.Expr(value=ast.Constant(value="generator or coroutine")))
        fn.body = [*kept, ast.Pass()]
    return skeleton


def _suspends(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function's own body (not a nested function's) yields or awaits."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Yield | ast.YieldFrom | ast.Await):
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return False


def changed_units(old: str, new: str) -> set[str] | None:
    """The units whose bodies differ between two versions of a module; None when anything
    else differs (module-level code, a signature, a decorator, a unit added or removed) or a
    version does not parse: such a change can reach whoever imports the module."""
    try:
        old_skeleton, old_bodies = _split(old)
        new_skeleton, new_bodies = _split(new)
    except (SyntaxError, ValueError):
        return None
    if old_skeleton != new_skeleton:
        return None
    return {name for name, body in old_bodies.items() if new_bodies.get(name) != body}


_CLASS_CREATION = frozenset({"__init_subclass__", "__set_name__", "__class_getitem__"})
"""Methods Python calls while it creates a class (at import, for a class statement)."""


def _aliases(tree: ast.Module, tops: frozenset[str]) -> set[str]:
    """Names a module binds to project modules and their members by import (``from harness
    import quarantine``, ``import harness.tolerances as t``), plus its own classes: the
    bases of attribute calls (``quarantine.load()``) that can reach a project function."""
    found = {stmt.name for stmt in tree.body if isinstance(stmt, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in tops:
                    found.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").split(".")[0] in tops
        ):
            found |= {alias.asname or alias.name for alias in node.names}
    return found


def _called(
    roots: Iterable[ast.AST], aliases: set[str], decorators: Iterable[ast.expr] = ()
) -> set[str]:
    """The names code may call: a called name (``f()``, ``C()``), a method called on a
    project name (``quarantine.load()``, ``Entry.parse()``), a decorator, and any name handed
    to a call (``map(f, xs)``, ``field(default_factory=f)``), which the callee may call."""
    found: set[str] = set()

    def callee(expr: ast.AST) -> None:
        if isinstance(expr, ast.Name):
            found.add(expr.id)
        elif isinstance(expr, ast.Attribute):
            base = expr.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                found.add(expr.attr)
        elif isinstance(expr, ast.Call):
            callee(expr.func)

    for decorator in decorators:
        callee(decorator)
    for root in roots:
        for current in ast.walk(root):
            if isinstance(current, ast.Call):
                callee(current.func)
                for arg in [*current.args, *(k.value for k in current.keywords)]:
                    for sub in ast.walk(arg):
                        callee(sub)
            elif isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                for decorator in current.decorator_list:
                    callee(decorator)
    return found


def _at_import_code(body: list[ast.stmt]) -> tuple[list[ast.AST], list[ast.expr]]:
    """What of a module (or class) body runs at import: every statement but the bodies of its
    units (their decorators and defaults do run), and the decorators, apart."""
    roots: list[ast.AST] = []
    decorators: list[ast.expr] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            decorators += stmt.decorator_list
            roots += [*stmt.decorator_list, stmt.args]
        elif isinstance(stmt, ast.ClassDef):
            decorators += stmt.decorator_list
            roots += [*stmt.decorator_list, *stmt.bases, *stmt.keywords]
            inner_roots, inner_decorators = _at_import_code(stmt.body)
            roots += inner_roots
            decorators += inner_decorators
        else:
            roots.append(stmt)
    return roots, decorators


def names_run_at_import(trees: Iterable[ast.Module], tops: Iterable[str] = ()) -> set[str]:
    """The functions that may run while a module is imported, by name: those the code
    outside function bodies of any module may call (:func:`_called`: ``X = f()``, a
    decorator, ``C()`` (then every method of ``C``), ``map(f, ...)``, a default), the
    methods Python calls when it creates a class, and, within each module, what the bodies of
    the functions already found may call. ``tops``: the project's top-level package names
    (attribute calls count on names imported from them). Conservative: by name.

    Also counted, with what their bodies may call: functions whose work is kept for the
    process (:func:`_once_per_process`: cached, or setting globals).

    Why it matters: a module's import-time code runs once per process, in whichever test
    imported it first, so the recording credits that one test with work every importer
    depends on; a cached function likewise. A change to such a function is not narrowed."""
    trees, tops = list(trees), frozenset(tops)
    seeds: set[str] = set(_CLASS_CREATION)
    for tree in trees:
        aliases = _aliases(tree, tops)
        roots, decorators = _at_import_code(tree.body)
        seeds |= _called(roots, aliases, decorators)
        for name, fn in _unit_defs(tree):
            if _once_per_process(fn):
                seeds.add(name.split("#", 1)[0].rsplit(".", 1)[-1])
                seeds |= _called(fn.body, aliases)
    reached = set(seeds)
    for tree in trees:
        units = _unit_defs(tree)
        aliases = _aliases(tree, tops)
        local = {part for name, _ in units for part in name.split("#", 1)[0].split(".")}
        found = {part for part in local if part in seeds}
        done: set[str] = set()
        grew = True
        while grew:
            grew = False
            for name, fn in units:
                if name in done or not _at_import(name, found):
                    continue
                done.add(name)
                more = (_called(fn.body, aliases) & local) - found
                if more:
                    found |= more
                    grew = True
        reached |= found
    return reached


def _once_per_process(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a function's work is kept for the rest of the process: cached
    (``functools.cache``, ``lru_cache``, ``cached_property``: the first test to call it runs
    it, the later ones reuse the result) or setting a module's globals (``global``)."""
    if any("cache" in ast.unparse(d) for d in fn.decorator_list):
        return True
    return any(isinstance(node, ast.Global) for node in ast.walk(fn))


def _at_import(unit: str, reached: set[str]) -> bool:
    """Whether a unit (``f``, ``C.m``, ``C.m#2``) may run at import: its own name, or a class
    around it, is among the names import-time code uses."""
    parts = unit.split("#", 1)[0].split(".")
    return any(part in reached for part in parts)


# --------------------------------------------------------------------------- recording


def rcfile_text(root: Path, data_file: Path) -> str:
    """coverage.py's configuration for a recording run: every Python file under ``root``
    except the virtual environment, each process's data in its own file beside
    ``data_file``, the static context taken from :data:`CONTEXT_ENV` (empty in the pytest
    workers, which switch it per test; the test's id in the subprocesses a test starts), and
    the data saved by processes that leave through ``os._exit`` or ``exec`` or fork."""
    omit = ",\n    ".join(f"{root / d}/*" for d in _SKIP_DIRS)
    return (
        "[run]\n"
        f"data_file = {data_file}\n"
        "parallel = True\n"
        f"source = {root}\n"
        f"omit =\n    {omit}\n    */site-packages/*\n"
        f"context = ${{{CONTEXT_ENV}}}\n"
        "patch =\n    _exit\n    execv\n    fork\n"
        "disable_warnings =\n    no-data-collected\n    module-not-measured\n"
        "    couldnt-parse\n    no-ctracer\n"
    )


def _test_file(context: str) -> str:
    """The test file of a context label (a node id; ``static|dynamic`` when a pytest worker
    under coverage was itself started by a test, which recording does not do)."""
    return context.split("::", 1)[0].rsplit("|", 1)[-1]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def build(
    root: Path, data_dir: Path, benchmarks: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Combine a recording's coverage data files (``data_dir/cov.*``) into a map:
    ``{"files": {rel: {"sha256": ..., "units": {unit: {"tests": [...], "ambient": bool}}}}}``
    plus the commit, whether the tree was clean, and every test file that ran code.

    ``benchmarks``: what the benchmark side of the recording wrote
    (harness.impact.bench_recorder), when it ran: a unit a benchmark ran gets
    ``"benchmarks": [names]``, and the map a ``"benchmarks"`` table (per benchmark, its file
    and whether it ran). Without it the map has no table, and pull-request mode selects
    benchmark files on the import graph."""
    caches: Mapping[str, list[str]] = (benchmarks or {}).get("caches", {})
    from coverage import Coverage
    from coverage.exceptions import CoverageException

    root = root.resolve()
    data_file = data_dir / "cov"
    cov = Coverage(data_file=str(data_file), config_file=False)
    try:
        cov.combine([str(data_dir)], keep=False)
    except CoverageException as exc:
        raise ImpactError(f"{data_dir}: no coverage data to combine ({exc})") from None
    data = cov.get_data()
    files: dict[str, Any] = {}
    seen_tests: set[str] = set()
    for measured in sorted(data.measured_files()):
        path = Path(measured)
        try:
            rel = path.resolve().relative_to(root).as_posix()
        except ValueError:
            continue  # a project a test wrote under /tmp: not this repository's code
        if path.suffix != ".py" or not path.is_file():
            continue
        try:
            source = path.read_text(encoding="utf-8", errors="replace")
            spans = units(source)
        except (OSError, SyntaxError, ValueError, RecursionError):
            continue  # not in the map: a change to it selects on the import graph
        by_line = data.contexts_by_lineno(measured)
        entry: dict[str, Any] = {}
        for name, (first, last) in spans.items():
            tests: set[str] = set()
            benches: set[str] = set()
            ambient = False
            for line in range(first, last + 1):
                for context in by_line.get(line, ()):
                    label = context.rsplit("|", 1)[-1]  # a subprocess's: static|dynamic
                    if label.startswith(BENCH_CACHE_PREFIX):
                        benches |= set(caches.get(label, ()))
                    elif label.startswith(BENCH_PREFIX):
                        benches.add(label.removeprefix(BENCH_PREFIX))
                    elif context:
                        tests.add(_test_file(context))
                    else:
                        ambient = True
            if tests or ambient or benches:
                entry[name] = {"tests": sorted(tests), "ambient": ambient}
                if benches:
                    entry[name]["benchmarks"] = sorted(benches)
            seen_tests |= tests
        files[rel] = {"sha256": _sha256(source), "units": entry}
    # Clean: no tracked file changed (a pytest option in pyproject.toml changes what ran) and
    # no untracked Python file (a local conftest.py).
    status = _git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    dirty = [line for line in status if not line.startswith("??") or line.rstrip().endswith(".py")]
    payload: dict[str, Any] = {
        "version": MAP_VERSION,
        "commit": _git(root, "rev-parse", "HEAD"),
        "clean": not dirty,
        "recorded": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "test_files": sorted(seen_tests),
        "files": files,
    }
    if benchmarks is not None:
        payload["benchmarks"] = {
            name: {"file": str(b["file"]), "ran": bool(b["ran"])}
            for name, b in sorted(benchmarks.get("benchmarks", {}).items())
        }
    return payload


# --------------------------------------------------------------------------- using a map


@dataclasses.dataclass(frozen=True)
class ModuleImpact:
    """What the map says about one changed module: the test files to run, or why not."""

    tests: frozenset[str] | None
    """None: the map cannot narrow this change (``reason`` says why)."""
    reason: str
    benchmarks: frozenset[str] | None = None
    """The asv benchmarks (by name) that ran a changed unit; None when the map has no
    benchmark recording or cannot narrow the change (benchmark files are then selected on
    the import graph)."""


@dataclasses.dataclass(frozen=True)
class ImpactMap:
    """A recorded map (see :func:`build` for its shape)."""

    path: Path
    commit: str
    clean: bool
    recorded: str
    test_files: frozenset[str]
    files: Mapping[str, Any]
    benchmarks: Mapping[str, Mapping[str, Any]] | None = None
    """Per asv benchmark the recording discovered: ``{"file": rel, "ran": bool}``; None when
    the recording ran no benchmarks."""

    @classmethod
    def load(cls, path: Path) -> ImpactMap:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ImpactError(f"{path}: cannot read the impact map ({exc.strerror})") from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ImpactError(f"{path}: not an impact map (invalid JSON: {exc})") from None
        if not isinstance(raw, dict) or raw.get("version") != MAP_VERSION:
            found = raw.get("version") if isinstance(raw, dict) else type(raw).__name__
            raise ImpactError(
                f"{path}: not an impact map of version {MAP_VERSION} (found {found!r}); "
                "record it again with `harness impact record`"
            )
        try:
            files = raw["files"]
            for rel, entry in files.items():
                if not isinstance(entry["sha256"], str) or not isinstance(entry["units"], dict):
                    raise TypeError(rel)
                for name, unit in entry["units"].items():
                    tests = unit["tests"]
                    benches = unit.get("benchmarks", [])
                    if (
                        not isinstance(tests, list)
                        or not all(isinstance(t, str) for t in tests)
                        or not isinstance(benches, list)
                        or not all(isinstance(b, str) for b in benches)
                        or not isinstance(unit["ambient"], bool)
                    ):
                        raise TypeError(f"{rel}: {name}")
            benchmarks = raw.get("benchmarks")
            if benchmarks is not None:
                if not isinstance(benchmarks, dict):
                    raise TypeError("benchmarks")
                for name, bench in benchmarks.items():
                    if not isinstance(bench["file"], str) or not isinstance(bench["ran"], bool):
                        raise TypeError(f"benchmarks: {name}")
            return cls(
                path=path,
                commit=str(raw["commit"]),
                clean=bool(raw["clean"]),
                recorded=str(raw["recorded"]),
                test_files=frozenset(map(str, raw["test_files"])),
                files=files,
                benchmarks=benchmarks,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ImpactError(f"{path}: a damaged impact map (at {exc})") from None

    def ran(self, test_file: str) -> bool:
        """Whether the recording saw this test file run (a file it did not collect, skipped
        or deselected, or one added since, is judged by the import graph)."""
        return test_file in self.test_files

    def benchmark_file_seen(self, rel: str) -> bool:
        """Whether the benchmark side of the recording discovered benchmarks in ``rel``."""
        return any(b["file"] == rel for b in (self.benchmarks or {}).values())

    def benchmarks_not_run(self, rel: str) -> set[str]:
        """The benchmarks of file ``rel`` the recording discovered but did not run (skipped
        themselves, raised): what they run is unknown, so a change they may reach selects them."""
        return {n for n, b in (self.benchmarks or {}).items() if b["file"] == rel and not b["ran"]}

    def usable_for(self, base: str) -> str | None:
        """None when the map may select for a change from ``base``; else why not."""
        if not self.clean:
            return f"the impact map {self.path} was recorded from a tree with uncommitted changes"
        if not self.commit or self.commit != base:
            return (
                f"the impact map {self.path} was recorded at {self.commit[:10] or 'no commit'}, "
                f"not at the base {base[:10]}"
            )
        return None

    def module(
        self,
        rel: str,
        old: str | None,
        new: str | None,
        at_import: set[str] | None = None,
    ) -> ModuleImpact:
        """The test files that ran the code ``rel`` changes from ``old`` to ``new``.
        ``at_import``: :func:`names_run_at_import` of the project (a changed function that may
        run once per process is not narrowed)."""
        entry = self.files.get(rel)
        if entry is None or old is None or new is None:
            what = "added or deleted" if entry is not None else "not run by any recorded test"
            return ModuleImpact(None, f"{rel}: {what}")
        if _sha256(old) != entry["sha256"]:
            return ModuleImpact(None, f"{rel}: the base version is not the one recorded")
        changed = changed_units(old, new)
        if changed is None:
            return ModuleImpact(None, f"{rel}: code outside function bodies changed")
        tests: set[str] = set()
        benches: set[str] = set()
        for name in sorted(changed):
            if at_import is not None and _at_import(name, at_import):
                return ModuleImpact(
                    None,
                    f"{rel}: {name} may run once per process (at import, cached, or setting "
                    "globals), in whichever test came first",
                )
            unit = entry["units"].get(name)
            if not unit or not unit["tests"]:
                if unit and unit["ambient"]:
                    return ModuleImpact(None, f"{rel}: {name} runs outside tests only")
                return ModuleImpact(None, f"{rel}: no recorded test runs {name}")
            if unit["ambient"]:
                return ModuleImpact(
                    None, f"{rel}: {name} also runs outside tests (collection or a fixture)"
                )
            tests |= set(unit["tests"])
            benches |= set(unit.get("benchmarks", ()))
        shown = ", ".join(sorted(changed)) or "nothing but comments or formatting"
        return ModuleImpact(
            frozenset(tests),
            f"{rel}: changed {shown}",
            None if self.benchmarks is None else frozenset(benches),
        )


def write(payload: Mapping[str, Any], path: Path) -> None:
    """Write a map atomically (a half-written map must not be read as a short one)."""
    from harness.atomic import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")


def environment(rcfile: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a recording run: coverage starts in every Python process."""
    env = dict(os.environ if base is None else base)
    env["COVERAGE_PROCESS_START"] = str(rcfile)
    env.pop("COVERAGE_PROCESS_CONFIG", None)
    env[CONTEXT_ENV] = ""
    return env
