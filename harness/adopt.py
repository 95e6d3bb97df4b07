"""``harness init``: set the harness up over a project's existing test layout, moving nothing.

It finds the test folder (``tests/``, ``test/`` or ``suites/``) and the configuration file the
project already has, and writes:

- the layout and the tiers in the harness's own table (``[tool.harness]`` in pyproject.toml,
  else a ``[harness]`` section in the ini file pytest reads, else in setup.cfg), which pytest
  never reads, so teammates without the plugin see no "Unknown config option" warning.
  Subfolders named after a built-in tier (``tests/unit/``, ``tests/integration/``) are those
  tiers; every other test file of the folder is in one tier named after the folder, declared
  with ``paths`` (so no file has to move, and none is outside a tier);
- ``quarantine.toml``, empty, when there is none;
- with ``--workflow OWNER/REPO@REF``, ``.github/workflows/harness.yml``: a caller of the
  reusable ``harness-tiers.yml`` of that repository and commit (the installed package cannot
  know where the team takes ml-harness from, so it is asked, never guessed).

Nothing is overwritten: a project already configured for the harness is refused, naming the
file. Nothing here imports pytest.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import tomlkit

from harness import layout as _layout
from harness import tiers as _tiers

__all__ = ["InitError", "Plan", "apply", "caller_workflow", "plan", "write_workflow"]

TEST_FOLDERS = ("tests", "test", "suites")
"""Where a project's tests are looked for, in this order."""

QUARANTINE_TEMPLATE = """\
# Flaky-test quarantine, reviewed like code. Edit it with `harness quarantine add/remove`,
# read it with `harness quarantine list`. A quarantined test still runs on every CI run: its
# failures are reported, but do not fail the gate. Each entry:
#   [[quarantine]]
#   test = "{example}"
#   reason = "fails about 1 in 50 on the GPU runner"
#   issue = "https://github.com/ORG/REPO/issues/123"
#   added = 2026-11-30
#   expires = 2026-12-31
"""


class InitError(ValueError):
    """The project cannot be set up as it is (no test folder, already configured)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``harness init`` found and will write."""

    root: Path
    suites_dir: str
    folder_tiers: tuple[str, ...]
    """Built-in tiers that are subfolders of the suites folder."""
    catch_all: str | None
    """The tier holding the other test files (named after the folder), or None."""
    config_file: str
    """The file the harness table goes into (root-relative)."""
    test_files: int
    quarantine: bool
    """Whether quarantine.toml is created."""

    def table(self) -> dict[str, object]:
        """The harness table, as ``[tool.harness]`` holds it."""
        out: dict[str, object] = {"suites_dir": self.suites_dir}
        tiers: dict[str, dict[str, object]] = {}
        if self.catch_all:
            tiers[self.catch_all] = {
                "description": f"the tests in {self.suites_dir}/ outside the tier folders",
                "paths": [self.suites_dir],
            }
        if tiers:
            out["tiers"] = tiers
        return out


def _test_files(folder: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
        for name in filenames:
            if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
                found.append(Path(dirpath) / name)
    return found


def plan(root: Path) -> Plan:
    """What to write for the project at ``root`` (its repository's top)."""
    root = root.resolve()
    try:
        current = _layout.read_at(root, _config_file(root))
    except _layout.LayoutError as exc:
        raise InitError(str(exc)) from None
    if current.source != "the defaults":
        raise InitError(
            f"the harness is already configured here ({current.source}); edit it there "
            "(docs/adopting.md)"
        )
    folder = next(
        (name for name in TEST_FOLDERS if (root / name).is_dir() and _test_files(root / name)),
        None,
    )
    if folder is None:
        raise InitError(
            f"no test folder with test files (test_*.py, *_test.py) in {root}: looked for "
            f"{', '.join(f'{n}/' for n in TEST_FOLDERS)}; run harness init at the top of the "
            "repository"
        )
    files = _test_files(root / folder)
    builtin = set(_tiers.DEFAULT_TIERS)
    folder_tiers = sorted(
        {
            f.relative_to(root / folder).parts[0]
            for f in files
            if len(f.relative_to(root / folder).parts) > 1
            and f.relative_to(root / folder).parts[0] in builtin
        }
    )
    rest = [f for f in files if f.relative_to(root / folder).parts[0] not in folder_tiers]
    catch_all = None
    if rest:
        catch_all = re.sub(r"\W", "_", folder)
        if catch_all in builtin:  # suites/ with loose files: a name of its own
            catch_all = f"{catch_all}_other"
    config = _config_file(root)
    target = config.name if config is not None and config.name != "pytest.ini" else None
    if (root / "pyproject.toml").is_file():
        target = "pyproject.toml"
    return Plan(
        root=root,
        suites_dir=folder,
        folder_tiers=tuple(folder_tiers),
        catch_all=catch_all,
        config_file=target or (config.name if config is not None else "setup.cfg"),
        test_files=len(files),
        quarantine=not (root / "quarantine.toml").exists(),
    )


def _config_file(root: Path) -> Path | None:
    """pytest's configuration file in ``root`` itself (init runs at the top)."""
    for name in _layout.CONFIG_FILES:
        path = root / name
        if path.is_file() and _layout._pytest_section(path) is not None:
            return path
    return None


def _ini_text(table: dict[str, object]) -> str:
    lines = ["", "[harness]", f"suites_dir = {table['suites_dir']}"]
    tiers = table.get("tiers", {})
    assert isinstance(tiers, dict)
    for name, tier in tiers.items():
        lines += ["", f"[harness.tiers.{name}]"]
        for key, value in tier.items():
            lines.append(f"{key} = {' '.join(value) if isinstance(value, list) else value}")
    return "\n".join(lines) + "\n"


def apply(p: Plan) -> list[str]:
    """Write what ``p`` says; returns what was written, one line each."""
    done: list[str] = []
    path = p.root / p.config_file
    table = p.table()
    if p.config_file == "pyproject.toml":
        doc = tomlkit.parse(path.read_text(encoding="utf-8"))
        tool = doc.setdefault("tool", tomlkit.table(is_super_table=True))
        harness = tomlkit.table()
        harness["suites_dir"] = table["suites_dir"]
        tiers = table.get("tiers")
        if isinstance(tiers, dict):
            tiers_table = tomlkit.table(is_super_table=True)
            for name, tier in tiers.items():
                t = tomlkit.table()
                for key, value in tier.items():
                    t[key] = value
                tiers_table[name] = t
            harness["tiers"] = tiers_table
        tool["harness"] = harness
        path.write_text(tomlkit.dumps(doc), encoding="utf-8")
        done.append(f"{p.config_file}: [tool.harness] (suites_dir = {p.suites_dir!r})")
    else:
        existing = path.read_text(encoding="utf-8") if path.is_file() else ""
        sep = "" if not existing or existing.endswith("\n") else "\n"
        path.write_text(existing + sep + _ini_text(table), encoding="utf-8")
        done.append(f"{p.config_file}: [harness] (suites_dir = {p.suites_dir})")
    if p.catch_all:
        done.append(
            f"{p.config_file}: tier {p.catch_all!r} = the test files of {p.suites_dir}/ "
            "outside the tier folders (paths; no file moved)"
        )
    if p.quarantine:
        example = f"{p.suites_dir}/test_x.py::test_y"
        (p.root / "quarantine.toml").write_text(QUARANTINE_TEMPLATE.format(example=example))
        done.append("quarantine.toml: empty quarantine")
    # Read back as the plugin will: a file this wrote must load.
    try:
        layout = _layout.read_at(p.root, _config_file(p.root))
        _tiers.load_tiers(layout.tiers)
    except (_layout.LayoutError, _tiers.TierConfigError) as exc:  # pragma: no cover - a bug
        raise InitError(f"the configuration written does not load back: {exc}") from None
    return done


WORKFLOW_PATH = ".github/workflows/harness.yml"
"""Where ``harness init --workflow`` writes the caller workflow (root-relative)."""

_SOURCE = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+@[\w./-]+")

CALLER_TEMPLATE = """\
# Calls ml-harness's reusable workflow (docs/adopting.md, section 5). Written by harness init;
# edit the install command to the one your project uses.
name: harness
on: [push, pull_request]
permissions:
  contents: read
jobs:
  tests:
    uses: {repo}/.github/workflows/harness-tiers.yml@{ref}
    with:
      install: pip install -e . 'ml-harness[ci,history]'
      tiers: {tiers}
"""


def caller_workflow(p: Plan, source: str) -> str:
    """The caller workflow for ``p``'s tiers, calling harness-tiers.yml at ``source``
    (``OWNER/REPO@REF``, as a ``uses:`` line names it)."""
    if not _SOURCE.fullmatch(source):
        raise InitError(
            f"--workflow {source!r}: give the repository and commit the reusable workflow is "
            "taken from, as OWNER/REPO@COMMIT_SHA"
        )
    repo, ref = source.split("@", 1)
    tiers = ",".join([*p.folder_tiers, *([p.catch_all] if p.catch_all else [])])
    return CALLER_TEMPLATE.format(repo=repo, ref=ref, tiers=tiers)


def write_workflow(p: Plan, text: str) -> str:
    """Write the caller workflow; an existing file is never overwritten."""
    path = p.root / WORKFLOW_PATH
    if path.exists():
        raise InitError(f"{WORKFLOW_PATH} exists already; not overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return f"{WORKFLOW_PATH}: calls harness-tiers.yml (edit its install command)"
