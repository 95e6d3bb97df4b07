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
  reaches its ``__main__`` (``python -m pkg`` runs it). Every file also depends on the
  ``conftest.py`` files of its folder and the folders above it, as pytest loads them first.
- A changed non-Python file inside a package (``reference_impls/training/tiny.toml``) counts as
  a change to that package. A changed golden file (``suites/goldens/<tier>/<path>.json``)
  selects the test file it belongs to.
- Some changes reach every test, so they select everything: the harness itself (``harness/``:
  the plugin runs in every test), any ``conftest.py``, ``pyproject.toml``, the lock files and
  anything else under ``requirements/``, ``quarantine.toml``, and every file this module cannot
  place (the workflows, the Makefile, a new top-level folder). Only documentation (``docs/``,
  ``*.md``) and benchmark-only files are known to reach no test.

Nothing here imports pytest.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

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
    "harness/",
    "requirements/",
    "pyproject.toml",
    "quarantine.toml",
    "conftest.py",
)
"""Path prefixes (a bare file name matches in any folder) whose change runs every test."""

_NO_TESTS = ("docs/",)
_BENCH_DIR = "suites/benchmarks/"
_GOLDENS_DIR = "suites/goldens/"
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
    """asv benchmark files (``bench_collectives``, ...) the change reaches; all when
    ``everything``."""


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
        self.imports: dict[str, set[str]] = {
            name: self._imports_of(name, root / rel) for name, rel in self.files.items()
        }
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

    def _imports_of(self, name: str, path: Path) -> set[str]:
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except (SyntaxError, ValueError):
            return set()  # the test run reports the syntax error itself
        package = name if name in self.packages else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found |= self._project(alias.name) | self._sibling(package, alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                    found |= self._sibling(package, base)
                found |= self._project(base)
                for alias in node.names:  # ``from pkg import module``
                    if f"{base}.{alias.name}" in self.files:
                        found.add(f"{base}.{alias.name}")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in self.files
            ):
                found |= self._project(node.value)
                # ``python -m pkg`` (or runpy) runs pkg/__main__.py, which nothing imports.
                if f"{node.value}.__main__" in self.files:
                    found.add(f"{node.value}.__main__")
        found.discard(name)
        return found

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
        importers: dict[str, set[str]] = defaultdict(set)
        for module, deps in self.imports.items():
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


def _is_test_file(rel: str) -> bool:
    name = PurePosixPath(rel).name
    return (
        rel.startswith("suites/")
        and not rel.startswith(_BENCH_DIR)
        and name.endswith(".py")
        and (name.startswith("test_") or name.endswith("_test.py"))
    )


def _everything_reason(path: str) -> str | None:
    for prefix in ALWAYS_EVERYTHING:
        if (prefix.endswith("/") and path.startswith(prefix)) or (
            "/" not in prefix and PurePosixPath(path).name == prefix
        ):
            return f"{path} changed, and {prefix} reaches every test"
    return None


def select(root: Path, changed: Iterable[str], *, base: str = "") -> Selection:
    """The tests and benchmarks that ``changed`` (repository-relative paths) can affect."""
    changed = tuple(sorted(set(changed)))
    graph = ImportGraph(root)
    modules_by_path = {rel: name for name, rel in graph.files.items()}
    touched: set[str] = set()  # module names
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
        if path.startswith(_GOLDENS_DIR):
            owner = "suites/" + str(posix.relative_to(_GOLDENS_DIR).with_suffix(".py"))
            direct_tests.add(owner)
            continue
        if posix.suffix == ".py":
            name = modules_by_path.get(path) or _module_name(posix)
            if name.split(".")[0] in graph.tops:
                touched.add(name)
                continue
        else:
            # A data file inside a package: a change to that package.
            package = _module_name(posix.parent / "__init__.py")
            if package in graph.packages:
                touched.add(package)
                continue
            # A data file among the tests: the test files of its folder and below.
            if path.startswith("suites/") and not path.startswith(_BENCH_DIR):
                folder = str(posix.parent) + "/"
                direct_tests |= {
                    rel
                    for rel in graph.files.values()
                    if rel.startswith(folder) and _is_test_file(rel)
                }
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
    reached = graph.reverse_closure(touched)
    tests = {graph.files[m] for m in reached if m in graph.files and _is_test_file(graph.files[m])}
    tests |= {t for t in direct_tests if (root / t).is_file()}
    benches = sorted(
        m.split(".")[-1]
        for m in reached
        if m in graph.files
        and graph.files[m].startswith(_BENCH_DIR)
        and PurePosixPath(graph.files[m]).name.startswith("bench_")
    )
    what = f"{len(tests)} test file(s) and {len(benches)} benchmark file(s)"
    reason = (
        f"{what} reached by {len(changed)} changed file(s)"
        if changed
        else "no file changed since the base: nothing to test"
    )
    return Selection(
        base=base,
        changed=changed,
        everything=False,
        reason=reason,
        tests=tuple(sorted(tests)),
        benchmarks=tuple(benches),
    )


def bench_regex(benchmarks: Iterable[str]) -> str | None:
    """asv's ``--bench`` regex for these benchmark files (None: all of them)."""
    names = sorted(set(benchmarks))
    if not names or "*" in names:
        return None
    return "^(" + "|".join(names) + r")\."


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
