"""Which tests and benchmarks a change can affect: changed files + the import graph.

The pull-request mode of ``harness ci`` runs only the test files whose imports reach a changed
file, directly or through other project modules, and benchmarks only the asv files that do.
It is a static, conservative analysis (docs/harness.md, "Pull-request mode", compares it with
coverage-based selection such as pytest-testmon):

- Nodes are the project's Python files (``harness/``, ``reference_impls/``, ``suites/``, any
  other top-level package), named as modules (``reference_impls/collectives/ring.py`` is
  ``reference_impls.collectives.ring``). Edges are ``import`` and ``from ... import``
  statements anywhere in a file (functions included), relative ones resolved; importing
  ``a.b.c`` also depends on the packages ``a`` and ``a.b`` (their ``__init__`` runs). A
  string literal that spells a project module (``"reference_impls.training.run"``, handed to
  a subprocess or ``importlib``) counts as an import too, and one that spells a package also
  reaches its ``__main__`` (``python -m pkg`` runs it); except a one-word string used as data:
  a keyword argument's value (``source="harness"``: a tag, not an import), a dictionary key
  or value, or a comparison's operand (see :func:`_data_strings`). Every file also depends on the
  ``conftest.py`` files of its folder and the folders above it, as pytest loads them first.
- A changed non-Python file inside a package (``reference_impls/training/tiny.toml``) counts as
  a change to that package. A changed golden file (``suites/goldens/<tier>/<path>.json``)
  selects the test file it belongs to.
- Some changes reach every test, so they select everything (:data:`ALWAYS_EVERYTHING` says why
  for each): the plugin's entry module ``harness/plugin.py``, any ``conftest.py``,
  ``pyproject.toml``, the lock files and anything else under ``requirements/``,
  ``quarantine.toml``, and every file this module cannot place (the workflows, the Makefile, a
  new top-level folder). Only documentation (``docs/``, ``*.md``) and benchmark-only files are
  known to reach no test.
- The rest of ``harness/`` is selected module by module: a file that runs pytest itself (the
  ``pytester`` fixture, ``"pytest"`` in a string handed to a subprocess) depends on the
  plugin's entry module, and so on every module the plugin imports. A change to
  ``harness/quarantine.py`` thus runs the tests that import it and those that run the plugin
  on a project of their own, not every test merely run under the plugin: those still run it
  (a plugin that breaks fails them too), and the full tier jobs beside the pull-request job
  run every test.
- Benchmarks are selected on a finer graph, since what a change can move is the time of the
  code a benchmark calls, not whether its imports succeed (the tests see that): ``from pkg
  import name`` depends on the module that defines ``name``, followed through the
  ``from X import name`` re-exports of ``pkg/__init__.py`` (and of sub-packages), not on every
  module the package re-exports; a name the package defines itself depends on the package's
  own code and what that code uses; ``import pkg`` (or ``pkg`` in a string) depends on all of
  it; a parent package counts only by its ``__init__``'s top level (``from pkg.mod import
  f`` runs ``pkg/__init__.py``, not its functions nor what they import when called: the
  node ``pkg:init``); conftest files do not count (asv does not load them). So a change to
  ``reference_impls/collectives/simulation.py`` re-times ``bench_collectives`` (which calls
  ``simulate_ring_allreduce``) but not the benchmarks that only take ``launch`` from the same
  package. What this misses: a module-level side effect of a merely re-exported module (it
  sets a global that changes another module's speed); the full perf job on every push to main
  measures everything.

Nothing here imports pytest.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import os
import re
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from harness import layout as _layout
from harness.impact import ImpactMap, names_run_at_import

__all__ = [
    "ALWAYS_EVERYTHING",
    "ImportGraph",
    "Selection",
    "SelectionError",
    "bench_regex",
    "changed_files",
    "merge_base",
    "select",
]

ALWAYS_EVERYTHING = (
    # The plugin's entry module (pyproject's pytest11 entry point): pytest loads it into every
    # run, and its hooks seed, time, judge and report every test, so any test's outcome can
    # follow a change to it while no test imports it.
    "harness/plugin.py",
    # The lock files: a new version of any dependency can change any test.
    "requirements/",
    # pytest's configuration (addopts, markers, filterwarnings, strictness) and the harness's
    # (tiers, budgets) apply to every test, as do the installed dependencies it declares.
    "pyproject.toml",
    # Every test's verdict is looked up in it, and a stale entry is only found by running its
    # test; an entry may name any test.
    "quarantine.toml",
    # pytest loads a conftest.py into every test below it: its fixtures, hooks and module-level
    # code (suites/conftest.py switches on Triton's interpreter for everything).
    "conftest.py",
)
"""Paths whose change runs every test: a folder (ending in ``/``) covers what is under it, a
bare file name matches in any folder, any other path matches itself. The rest of ``harness/``
is selected module by module like any other code: the tests that import a module, or run the
plugin that imports it (:data:`PLUGIN_ENTRY`), are the ones it can reach."""

PLUGIN_ENTRY = "harness.plugin"
"""The plugin's entry module. Besides the tests that import it, every file that runs pytest
itself depends on it (:func:`_runs_pytest`): a pytester test, a ``python -m pytest`` child."""

_NO_TESTS = ("docs/", ".harness/")  # documentation; the harness's own state (impact map)
_SKIP_DIRS = {".git", ".venv", "venv", ".asv", "reports", "mutants", "node_modules", "build"}


class SelectionError(RuntimeError):
    """git could not say what changed (no such base ref, not a repository)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Selection:
    """What a change selects."""

    base: str
    """The commit the change is measured from (the merge-base with the base ref)."""
    changed: tuple[str, ...]
    """Repository-relative paths that differ from ``base`` (committed, staged, unstaged or
    untracked)."""
    everything: bool
    """True when some change reaches every test; ``tests`` is then empty (run them all)."""
    reason: str
    """One line for the report: why everything, or what was selected from what."""
    tests: tuple[str, ...] = ()
    """Test files to run (repository-relative), when not ``everything``."""
    benchmarks: tuple[str, ...] = ()
    """asv benchmark files the change reaches, every benchmark in them, named as asv names
    their modules (``bench_collectives``; ``sub.bench_x`` in a subfolder); all when
    ``everything``."""
    benchmark_names: tuple[str, ...] = ()
    """Single asv benchmarks (``bench_harness.AssertClose.time_assert_close``) to run besides
    those files: where the impact map narrowed a module, the benchmarks that ran its changed
    functions, and those of the files it reaches that the recording could not run."""
    impact: tuple[str, ...] = ()
    """Per changed module, what the impact map (harness.impact) said: the functions changed
    and the test files that ran them, or why the import graph selected for it instead."""


def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=False, timeout=60
    )
    if proc.returncode != 0:
        raise SelectionError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def merge_base(root: Path, base_ref: str) -> str:
    """The merge-base of ``base_ref`` and HEAD, with an error naming the ref and the fix."""
    if base_ref.startswith("-"):
        # git would read it as an option (``--fork-point`` picks a base of its own).
        raise SelectionError(
            f"the base ref {base_ref!r} cannot start with '-' (git would read it as an "
            "option); name a branch, tag or commit with --changed-since REF"
        )
    try:
        return _git(root, "merge-base", base_ref, "HEAD").strip()
    except SelectionError as exc:
        raise SelectionError(
            f"cannot find the merge-base of {base_ref!r} and HEAD ({exc}); fetch the base "
            "branch or name another with --changed-since REF"
        ) from None


def changed_files(root: Path, base: str) -> list[str]:
    """Paths that differ from commit ``base``: committed since, staged, unstaged, untracked.

    Renames are listed as a deletion and an addition, so the old module's importers count.
    """
    diff = _git(root, "diff", "--name-only", "--no-renames", base)
    untracked = _git(root, "ls-files", "--others", "--exclude-standard")
    return sorted({line for line in (diff + untracked).splitlines() if line.strip()})


def _module_name(rel: PurePosixPath) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_MODULE_KEYWORDS = frozenset({"module", "mod_name", "modname", "name", "package", "run_name"})
"""Keyword arguments whose string value may well be a module to import or run
(``importlib.import_module(name=...)``, ``runpy.run_module(mod_name=...)``)."""


def _data_strings(tree: ast.AST) -> set[int]:
    """``id()`` of the one-word string literals ``tree`` uses as data rather than as a module
    to import or run: a keyword argument's value (other than :data:`_MODULE_KEYWORDS`), a
    dictionary's key or value, a comparison's operand. ``RunRecord(source="harness")`` tags a
    record: reading it as ``import harness`` made a history benchmark depend on the whole
    package. A dotted string (``"harness.cli"``) always counts: it is hardly anything but a
    module's name, and a one-word one still counts everywhere else (an argument list's
    ``"-m", "pkg"``, ``MODULE = "pkg"``, ``import_module("pkg")``)."""
    out: set[int] = set()

    def one_word(node: ast.AST | None) -> bool:
        return (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and "." not in node.value
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword):
            if node.arg not in _MODULE_KEYWORDS and one_word(node.value):
                out.add(id(node.value))
        elif isinstance(node, ast.Dict):
            out.update(id(v) for v in (*node.keys, *node.values) if one_word(v))
        elif isinstance(node, ast.Compare):
            out.update(id(v) for v in (node.left, *node.comparators) if one_word(v))
    return out


class ImportGraph:
    """Project modules and the project modules each one imports (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, str] = {}  # module name -> repository-relative path
        self.packages: set[str] = set()
        for path in self._python_files(root):
            rel = PurePosixPath(path.relative_to(root).as_posix())
            name = _module_name(rel)
            if name:
                self.files[name] = str(rel)
                if rel.name == "__init__.py":
                    self.packages.add(name)
        self.tops = {name.split(".")[0] for name in self.files}
        self._trees: dict[str, ast.Module | None] = {
            name: self._parse(root / rel) for name, rel in self.files.items()
        }
        self.imports: dict[str, set[str]] = {name: self._imports_of(name) for name in self.files}
        self._reexport_cache: dict[str, dict[str, str]] = {}
        self._perf: dict[str, set[str]] | None = None
        # pytest loads every conftest.py from a test's folder up to the root before the test,
        # so a test reaches what those import (a server fixture's helper) with no import of
        # its own: each file depends on the conftest modules of its folder and above.
        conftests = {
            PurePosixPath(file).parent: module
            for module, file in self.files.items()
            if PurePosixPath(file).name == "conftest.py"
        }
        for module, file in self.files.items():
            for folder in PurePosixPath(file).parents:
                if conftests.get(folder, module) != module:
                    self.imports[module].add(conftests[folder])
        _plugin_edges(self, self.imports)

    @staticmethod
    def _python_files(root: Path) -> Iterable[Path]:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
            for filename in filenames:
                if filename.endswith(".py"):
                    yield Path(dirpath) / filename

    def _project(self, name: str) -> set[str]:
        """``name`` and its parent packages, kept when they are in the project's namespace
        (also when the file is gone: a deleted module still names what imported it)."""
        parts = name.split(".")
        if parts[0] not in self.tops:
            return set()
        return {".".join(parts[: i + 1]) for i in range(len(parts))}

    @staticmethod
    def _parse(path: Path) -> ast.Module | None:
        try:
            return ast.parse(path.read_bytes(), str(path))
        except (SyntaxError, ValueError):
            return None  # the test run reports the syntax error itself

    def _package_of(self, name: str) -> str:
        return name if name in self.packages else name.rpartition(".")[0]

    @staticmethod
    def _from_base(package: str, node: ast.ImportFrom) -> str:
        """The module a ``from X import ...`` names, relative imports resolved."""
        if node.level:
            parts = package.split(".")
            anchor = parts[: len(parts) - (node.level - 1)]
            return ".".join([*anchor, *([node.module] if node.module else [])])
        return node.module or ""

    def _imports_of(
        self, name: str, *, timing: bool = False, tree: ast.Module | None = None
    ) -> set[str]:
        """The project modules ``name`` depends on. With ``timing`` (the benchmarks' graph):
        a ``from pkg import name`` depends on the module that defines ``name`` (not on every
        module ``pkg/__init__.py`` re-exports), a package's pure re-exports are not its own
        dependencies, and ``import pkg`` or ``"pkg"`` in a string depends on all of it.
        (Conftest edges are added by ``__init__`` to the tests' graph only: asv does not
        load conftest files.) ``tree`` replaces the file's own (:meth:`_init_imports`)."""
        tree = self._trees[name] if tree is None else tree
        if tree is None:
            return set()
        package = self._package_of(name)
        reexported = self._reexports(name) if timing and name in self.packages else {}
        found: set[str] = set()
        data = _data_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found |= self._reach(alias.name, timing) | self._sibling(package, alias.name)
                    if timing and alias.name.split(".")[0] in self.tops:
                        found |= self._whole(alias.name)
            elif isinstance(node, ast.ImportFrom):
                if (
                    reexported
                    and node in tree.body
                    and all((a.asname or a.name) in reexported for a in node.names)
                ):
                    continue  # a pure re-export: who uses the name depends on its module
                base = self._from_base(package, node)
                if not node.level:
                    found |= self._sibling(package, base)
                reached = self._reach(base, timing)
                if timing and base in self.packages:
                    # What the names taken from it need is added below (:meth:`_defining`).
                    reached = (reached - {base}) | {base + INIT}
                found |= reached
                for alias in node.names:  # ``from pkg import module``
                    if f"{base}.{alias.name}" in self.files:
                        found.add(f"{base}.{alias.name}")
                    elif timing and base.split(".")[0] in self.tops:
                        found |= self._defining(base, alias.name)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in self.files
                and id(node) not in data
            ):
                found |= self._reach(node.value, timing)
                if timing:
                    found |= self._whole(node.value)
                # ``python -m pkg`` (or runpy) runs pkg/__main__.py, which nothing imports.
                if f"{node.value}.__main__" in self.files:
                    found.add(f"{node.value}.__main__")
        found.discard(name)
        return found

    # -- the benchmarks' graph: names followed through package re-exports ------------------

    def _reach(self, name: str, timing: bool) -> set[str]:
        """:meth:`_project`; for timing, a parent package only with its import-time code
        (``pkg:init``): importing ``pkg.mod`` runs ``pkg/__init__.py``'s top level, not the
        functions defined there, nor what those import when called."""
        reached = self._project(name)
        if not timing:
            return reached
        return {m if m == name or m not in self.packages else m + INIT for m in reached}

    def _init_imports(self, package: str) -> set[str]:
        """The timing edges of ``package:init``: what the package's ``__init__`` imports at
        its top level (class bodies and decorators included, function bodies not), less its
        pure re-exports, as for the package itself."""
        tree = self._trees.get(package)
        if tree is None:
            return set()
        return self._imports_of(package, timing=True, tree=_without_function_bodies(tree))

    def _reexports(self, package: str) -> dict[str, str]:
        """``{name: module}`` for each name the package's ``__init__`` only re-exports: bound
        by a top-level ``from X import name`` of a project module and never used by the
        ``__init__``'s own code (``__all__`` lists names as strings, not uses)."""
        if package in self._reexport_cache:
            return self._reexport_cache[package]
        out: dict[str, str] = {}
        tree = self._trees.get(package) if package in self.packages else None
        if tree is not None:
            used = {
                n.id
                for n in ast.walk(tree)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            }
            for node in tree.body:
                if not isinstance(node, ast.ImportFrom):
                    continue
                base = self._from_base(package, node)
                if base.split(".")[0] not in self.tops:
                    continue
                for alias in node.names:
                    bound, sub = alias.asname or alias.name, f"{base}.{alias.name}"
                    if alias.name == "*" or bound in used:
                        continue
                    if sub in self.files:
                        out[bound] = sub
                    elif base != package:  # ``from . import x`` names a submodule or fails
                        out[bound] = base
        self._reexport_cache[package] = out
        return out

    def _defining(self, module: str, attr: str, depth: int = 0) -> set[str]:
        """The modules that ``from module import attr`` runs the code of, for timing: the
        module a re-exported name comes from (followed through packages), else all of
        ``module`` (the name is its own, or unknown: every name it re-exports too)."""
        target = self._reexports(module).get(attr)
        if target is None or depth > 20:
            return {module} if attr in self._own_names(module) else self._whole(module)
        if target in self.packages and target != module:
            return {target} | self._defining(target, attr, depth + 1)
        return {target}

    def _own_names(self, module: str) -> set[str]:
        """Names a module binds at its top level by its own code (def, class, assignment)."""
        tree = self._trees.get(module)
        names: set[str] = set()
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
        return names

    def _whole(self, module: str) -> set[str]:
        """``module`` with everything it re-exports (``import pkg`` gives all of it)."""
        seen, stack = {module}, [module]
        while stack:
            for target in self._reexports(stack.pop()).values():
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return seen

    def perf_reverse_closure(self, changed: Iterable[str]) -> set[str]:
        """Every module whose timing a change to ``changed`` can move: the reverse closure
        of the benchmarks' graph (:meth:`_imports_of` with ``timing``)."""
        if self._perf is None:
            self._perf = {name: self._imports_of(name, timing=True) for name in self.files}
            _plugin_edges(self, self._perf)  # a benchmark that times pytest with the plugin
            for package in self.packages:
                self._perf[package + INIT] = self._init_imports(package)
        changed = set(changed)
        return _reverse_closure(
            self._perf, changed | {m + INIT for m in changed if m in self.packages}
        )

    def _sibling(self, folder: str, name: str) -> set[str]:
        """A bare ``import helpers`` of a file beside the importer: pytest's rootdir-relative
        import modes put a test file's folder on sys.path, so that resolves there."""
        if not folder or not name:
            return set()
        # Kept whether or not the file exists: a deleted or renamed helper must still select
        # the tests that import it (they now fail to import). An edge to a module that does
        # not exist (``import os`` -> ``suites.unit.os``) only matters if such a file appears,
        # and then it does shadow the other module for that test.
        return {f"{folder}.{name.split('.')[0]}"}

    def closure(self, name: str) -> set[str]:
        """Every project module ``name`` reaches, itself included."""
        seen, stack = {name}, [name]
        while stack:
            for dep in self.imports.get(stack.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    stack.append(dep)
        return seen

    def reverse_closure(self, changed: Iterable[str]) -> set[str]:
        """Every module that reaches one of ``changed``."""
        return _reverse_closure(self.imports, changed)

    def trees(self) -> list[ast.Module]:
        """The parsed modules (those that parse)."""
        return [tree for _, tree in self.parsed()]

    def parsed(self) -> list[tuple[str, ast.Module]]:
        """(module name, syntax tree) of the modules that parse."""
        return [(name, tree) for name, tree in self._trees.items() if tree is not None]

    def declares_runs_pytest(self, module: str) -> bool:
        """Whether the module says ``RUNS_PYTEST = True`` (see :func:`_runs_pytest`)."""
        return _declares_runs_pytest(self._trees.get(module))


INIT = ":init"
"""Suffix of a package's import-time node in the benchmarks' graph (:meth:`ImportGraph._reach`;
no module name contains a colon)."""


class _FunctionBodies(ast.NodeTransformer):
    """Empties every function body: what is left runs when the module is imported."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.body = [ast.Pass()]
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AsyncFunctionDef:
        node.body = [ast.Pass()]
        return node


def _without_function_bodies(tree: ast.Module) -> ast.Module:
    stripped = _FunctionBodies().visit(copy.deepcopy(tree))
    assert isinstance(stripped, ast.Module)
    return stripped


def _reverse_closure(imports: Mapping[str, set[str]], changed: Iterable[str]) -> set[str]:
    importers: dict[str, set[str]] = defaultdict(set)
    for module, deps in imports.items():
        for dep in deps:
            importers[dep].add(module)
    seen = set(changed)
    stack = list(seen)
    while stack:
        for importer in importers.get(stack.pop(), ()):
            if importer not in seen:
                seen.add(importer)
                stack.append(importer)
    return seen


def _is_test_file(rel: str, layout: _layout.Layout | None = None) -> bool:
    """Whether ``rel`` is a test file of the project's configured suites folder (the
    built-in layout, ``suites/``, when none is given)."""
    return (layout or _DEFAULT_LAYOUT).is_test_file(rel)


_DEFAULT_LAYOUT = _layout.Layout(rootdir=Path("."))


def _everything_reason(path: str) -> str | None:
    for prefix in ALWAYS_EVERYTHING:
        if (
            (prefix.endswith("/") and path.startswith(prefix))
            or ("/" not in prefix and PurePosixPath(path).name == prefix)
            or path == prefix
        ):
            return f"{path} changed, and {prefix} reaches every test"
    return None


def _declares_runs_pytest(tree: ast.Module | None) -> bool:
    """Whether a file says ``RUNS_PYTEST = True`` at module level: it runs the harness in a
    way no import shows (a workflow under act, on a copy of the repository), which neither
    the import graph nor a coverage recording (harness.impact) can follow."""
    return tree is not None and any(
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "RUNS_PYTEST" for t in stmt.targets)
        and isinstance(stmt.value, ast.Constant)
        and stmt.value.value is True
        for stmt in tree.body
    )


def _runs_pytest(tree: ast.Module | None, fixtures: set[str]) -> bool:
    """Whether a file runs pytest itself, and so the plugin, which no import of it names: it
    takes one of ``fixtures`` (``pytester``, or a conftest fixture built on it) as a parameter,
    names ``pytester`` in a string (``request.getfixturevalue("pytester")``), or names the
    ``pytest`` module in a command, an element of a list or tuple (``[sys.executable, "-m",
    "pytest", ...]``). A conftest fixture's name in a string is not enough: ``"project"`` is
    more often a word than a fixture. Nor is ``"pytest"`` elsewhere: a configuration section
    (``toml["tool"].get("pytest")``, ``{"pytest.ini": "pytest"}`` in harness/layout.py) runs
    nothing. A file that runs pytest in a way none of these shows (it runs a workflow whose
    steps run ``harness``) says so with a module-level ``RUNS_PYTEST = True``."""
    if tree is None:
        return False
    if _declares_runs_pytest(tree):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple) and any(
            isinstance(e, ast.Constant) and e.value == "pytest" for e in node.elts
        ):
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # Only a test or a fixture requests fixtures: a helper's ``project`` parameter is
            # its own (``pytester`` is unambiguous anywhere).
            requests = node.name.startswith("test") or any(
                "fixture" in ast.unparse(d) for d in node.decorator_list
            )
            if _params(node) & (fixtures if requests else {"pytester"}):
                return True
        if isinstance(node, ast.Constant) and node.value == "pytester":
            return True
    return False


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}


def _pytest_fixtures(graph: ImportGraph, conftests: set[str]) -> dict[PurePosixPath, set[str]]:
    """Per conftest folder, the fixtures it defines that run pytest: those that take
    ``pytester``, directly or through another such fixture (``project(pytester, ...)`` in
    suites/conftest.py)."""
    known = {"pytester"}
    functions: list[tuple[PurePosixPath, ast.FunctionDef | ast.AsyncFunctionDef]] = [
        (PurePosixPath(graph.files[module]).parent, node)
        for module in sorted(conftests)
        if (tree := graph._trees.get(module)) is not None
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    out: dict[PurePosixPath, set[str]] = defaultdict(set)
    grew = True
    while grew:
        grew = False
        for folder, fn in functions:
            if fn.name not in out[folder] and _params(fn) & (known | out[folder]):
                out[folder].add(fn.name)
                known.add(fn.name)
                grew = True
    return out


def _plugin_edges(graph: ImportGraph, imports: Mapping[str, set[str]]) -> None:
    """Add an edge to :data:`PLUGIN_ENTRY` from every module that runs pytest itself.

    A conftest file gets none of its own: every file below it depends on it, so its edge would
    select every test. Its fixtures that run pytest count in the files below it that request
    them (a parameter of the same name elsewhere, ``project`` in a library, is not one)."""
    if PLUGIN_ENTRY not in graph.files:
        return  # the project under test is not the harness (it is installed, not changed)
    conftests = {m for m, f in graph.files.items() if PurePosixPath(f).name == "conftest.py"}
    by_folder = _pytest_fixtures(graph, conftests)
    for module, tree in graph._trees.items():
        if module == PLUGIN_ENTRY or module in conftests:
            continue
        fixtures = {"pytester"}
        for folder in PurePosixPath(graph.files[module]).parents:
            fixtures |= by_folder.get(folder, set())
        if _runs_pytest(tree, fixtures):
            imports[module].add(PLUGIN_ENTRY)


def _base_source(root: Path, base: str, rel: str) -> str | None:
    """``rel`` as it is in commit ``base`` (None: not there)."""
    proc = subprocess.run(
        ["git", "show", f"{base}:{rel}"], cwd=root, capture_output=True, check=False, timeout=60
    )
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


def _head_source(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def select(
    root: Path,
    changed: Iterable[str],
    *,
    base: str = "",
    layout: _layout.Layout | None = None,
    impact: ImpactMap | None = None,
) -> Selection:
    """The tests and benchmarks that ``changed`` (repository-relative paths) can affect.

    ``layout``: where the tests, goldens and benchmarks are (default: read from the
    configuration files under ``root``, harness.layout). A changed Python module that no
    test file reaches selects everything, saying so: an empty selection would pass a change
    that nothing checked (benchmark files and documentation excepted).

    ``impact``: a recorded impact map (harness.impact). Where it was recorded at ``base``
    and a module's change lies inside function bodies that recorded tests ran, that
    module's tests are the test files that ran them (plus those declaring ``RUNS_PYTEST``
    that reach it) instead of every test file its importers reach.
    """
    changed = tuple(sorted(set(changed)))
    layout = layout or _layout.read(root)
    goldens_dir = layout.goldens_dir.rstrip("/") + "/"
    suites_prefix = "" if layout.suites_dir in ("", ".") else layout.suites_dir + "/"
    bench_dirs = layout.untiered_dirs

    def is_bench(rel: str) -> bool:
        return any(layout.under(rel, d) for d in bench_dirs)

    graph = ImportGraph(root)
    modules_by_path = {rel: name for name, rel in graph.files.items()}
    touched: set[str] = set()  # module names
    code_touched: dict[str, str] = {}  # module name -> path, for a changed .py file
    data_touched: set[str] = set()  # modules of a package whose data file changed
    direct_tests: set[str] = set()
    unplaced: list[str] = []
    for path in changed:
        reason = _everything_reason(path)
        if reason:
            return Selection(
                base=base, changed=changed, everything=True, reason=reason, benchmarks=("*",)
            )
        posix = PurePosixPath(path)
        if path.startswith(_NO_TESTS) or posix.suffix in (".md", ".rst"):
            continue
        if layout.under(path, layout.goldens_dir) and posix.suffix == ".json":
            owner = suites_prefix + str(posix.relative_to(goldens_dir).with_suffix(".py"))
            direct_tests.add(owner)
            continue
        if posix.suffix == ".py":
            name = modules_by_path.get(path) or _module_name(posix)
            if name.split(".")[0] in graph.tops:
                touched.add(name)
                code_touched[name] = path
                continue
        else:
            # A data file inside a package: a change to that package.
            package = _module_name(posix.parent / "__init__.py")
            if package in graph.packages:
                touched.add(package)
                # Any module of the package may read it: for the benchmarks, all of them.
                folder = str(posix.parent) + "/"
                data_touched |= {m for m, f in graph.files.items() if f.startswith(folder)}
                continue
            # A data file among the tests: the test files of its folder and below, else of
            # the nearest folder above that has some (tests/data/x.json feeds tests/test_*.py).
            if layout.under(path, layout.suites_dir) and not is_bench(path):
                found: set[str] = set()
                for parent in posix.parents:
                    folder = "" if str(parent) == "." else f"{parent}/"
                    found = {
                        rel
                        for rel in graph.files.values()
                        if rel.startswith(folder) and layout.is_test_file(rel)
                    }
                    if found or not layout.under(str(parent), layout.suites_dir):
                        break
                if found:
                    direct_tests |= found
                    continue
        unplaced.append(path)
    if unplaced:
        return Selection(
            base=base,
            changed=changed,
            everything=True,
            reason=f"{unplaced[0]} changed, and no import reaches it: every test may depend on it",
            benchmarks=("*",),
        )
    narrowed: dict[str, frozenset[str]] = {}
    bench_narrowed: dict[str, frozenset[str]] = {}  # module -> benchmarks that ran its change
    notes: list[str] = []
    if impact is not None and code_touched:
        unusable = impact.usable_for(base)
        if unusable:
            notes.append(f"{unusable}: the import graph selects")
        at_import = names_run_at_import(graph.trees(), graph.tops) if not unusable else set()
        for module, rel in sorted(code_touched.items()) if not unusable else ():
            if layout.is_test_file(rel) or module in data_touched:
                continue
            hit = impact.module(
                rel, _base_source(root, base, rel), _head_source(root, rel), at_import
            )
            missing = sorted(t for t in hit.tests or () if not (root / t).is_file())
            if hit.tests is not None and missing:
                hit = type(hit)(None, f"{rel}: the recorded test file {missing[0]} is not here")
            if hit.tests is None:
                notes.append(f"{hit.reason}: the import graph selects")
                continue
            narrowed[module] = hit.tests
            shown = f"{hit.reason}: run by {len(hit.tests)} test file(s)"
            if hit.benchmarks is not None:
                bench_narrowed[module] = hit.benchmarks
                shown += f" and {len(hit.benchmarks)} benchmark(s)"
            notes.append(shown)
    reached = graph.reverse_closure(touched - narrowed.keys())
    tests = {
        graph.files[m] for m in reached if m in graph.files and layout.is_test_file(graph.files[m])
    }
    for module, ran in narrowed.items():
        tests |= ran
        # What the recording cannot see into: act runs a copy of the repository; and test
        # files it did not see run (not collected, skipped, deselected, or added since).
        assert impact is not None
        tests |= {
            graph.files[m]
            for m in graph.reverse_closure({module})
            if m in graph.files
            and layout.is_test_file(graph.files[m])
            and (graph.declares_runs_pytest(m) or not impact.ran(graph.files[m]))
        }
    # A changed module that reaches no test file is tested by nothing the selection runs:
    # selecting nothing for it would pass whatever it does, so everything runs instead.
    for module in sorted(touched - narrowed.keys()):
        rel = graph.files.get(module, "")
        if rel and is_bench(rel):
            continue  # benchmark code: the perf step times it, no test imports it
        if not any(
            m in graph.files and layout.is_test_file(graph.files[m])
            for m in graph.reverse_closure({module})
        ):
            shown = rel or module
            return Selection(
                base=base,
                changed=changed,
                everything=True,
                reason=f"{shown} changed, and no test file imports it (directly or through "
                "other modules): every test runs, since a selection would check nothing of it",
                benchmarks=("*",),
            )
    tests |= {t for t in direct_tests if (root / t).is_file()}

    # Benchmarks follow names, not packages: a benchmark that imports ``launch`` from
    # ``pkg`` is not re-timed when ``pkg/simulation.py`` changes (ImportGraph docstring).
    def bench_files(modules: set[str]) -> set[str]:
        return {
            m
            for m in graph.perf_reverse_closure(modules)
            if m in graph.files
            and is_bench(graph.files[m])
            and PurePosixPath(graph.files[m]).name.startswith("bench_")
        }

    whole = bench_files((touched - bench_narrowed.keys()) | data_touched)
    names: set[str] = set()
    for module, ran in bench_narrowed.items():
        # The benchmarks that ran the changed functions (whatever the graph says: a benchmark
        # may reach them through a process it starts), and of the benchmark files the graph
        # reaches, what the recording could not see into: a file it found no benchmark in
        # (added since, or failed to import) runs whole, a benchmark it did not run (skipped
        # itself on this machine, raised) runs by name.
        assert impact is not None
        names |= ran
        for m in bench_files({module}):
            rel = graph.files[m]
            if impact.benchmark_file_seen(rel):
                names |= impact.benchmarks_not_run(rel)
            else:
                whole.add(m)
    benches = sorted({_asv_module(graph.files[m], bench_dirs) for m in whole})
    singles = sorted(n for n in names if not any(n.startswith(f"{b}.") for b in benches))
    what = f"{len(tests)} test file(s) and {len(benches)} benchmark file(s)"
    if singles:
        what = (
            f"{len(tests)} test file(s), {len(benches)} benchmark file(s) and "
            f"{len(singles)} single benchmark(s)"
        )
    reason = (
        f"{what} reached by {len(changed)} changed file(s)"
        if changed
        else "no file changed since the base: nothing to test"
    )
    if narrowed:
        reason += f" ({len(narrowed)} module(s) narrowed by the impact map)"
    return Selection(
        base=base,
        changed=changed,
        everything=False,
        reason=reason,
        tests=tuple(sorted(tests)),
        benchmarks=tuple(benches),
        benchmark_names=tuple(singles),
        impact=tuple(notes),
    )


def _asv_module(rel: str, bench_dirs: Iterable[str]) -> str:
    """How asv names a benchmark file's module: dotted from the benchmark folder
    (``suites/benchmarks/sub/bench_s.py`` is ``sub.bench_s``)."""
    path = PurePosixPath(rel).with_suffix("")
    for folder in sorted(bench_dirs, key=len, reverse=True):
        try:
            return ".".join(path.relative_to(folder.rstrip("/")).parts)
        except ValueError:
            continue
    return path.name


def bench_regex(benchmarks: Iterable[str], single: Iterable[str] = ()) -> str | None:
    """asv's ``--bench`` regex for these benchmark files and single benchmarks (None: all of
    them). asv matches a parameterized benchmark as ``name(params)``, so a single name is
    followed by ``(`` or the end."""
    files = sorted(set(benchmarks))
    names = sorted(set(single))
    if "*" in files or not (files or names):
        return None
    files = [re.escape(f) for f in files]
    if not names:
        return "^(" + "|".join(files) + r")\."
    parts = ["(?:" + "|".join(re.escape(n) for n in names) + r")(?:\(|$)"]
    if files:
        parts.insert(0, "(?:" + "|".join(files) + r")\.")
    return "^(?:" + "|".join(parts) + ")"


def counts_by_tier(
    tests: Iterable[str], tiers: Mapping[str, object] | None = None
) -> dict[str, int]:
    """``{tier: number of test files}`` of a selection, for the report."""
    out: dict[str, int] = defaultdict(int)
    for test in tests:
        parts = PurePosixPath(test).parts
        tier = parts[1] if len(parts) > 2 else "-"
        if tiers is None or tier in tiers:
            out[tier] += 1
    return dict(out)
