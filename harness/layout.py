"""Where a project keeps its tests, goldens and benchmarks, read from the files pytest reads.

Every part of the harness that needs a folder (the plugin's tiers and goldens, the
pull-request selection of ``harness ci``, ``harness mutate``'s test-file rule, ``harness
init``) asks :func:`read`, so none of them assumes ``suites/`` (the default when nothing is
configured).

The values come from two places, and giving the same value in both with different contents is
an error naming both (a silent winner would test the wrong folder):

- the harness's own table, which pytest never reads, so teammates who run plain ``pytest``
  without the plugin get no "Unknown config option" warning: ``[tool.harness]`` in
  pyproject.toml, or a ``[harness]`` section in pytest.ini, tox.ini or setup.cfg (tiers in
  ``[harness.tiers.NAME]`` sections there)::

      [tool.harness]
      suites_dir = "tests"
      goldens_dir = "tests/goldens"       # default: <suites_dir>/goldens
      untiered_dirs = ["tests/benchmarks"]  # default: <suites_dir>/benchmarks

- pytest's own ini options ``harness_suites_dir``, ``harness_goldens_dir`` and
  ``harness_untiered_dirs`` in whichever file pytest takes as its configuration (pytest.ini,
  then pyproject.toml's ``[tool.pytest.ini_options]``, tox.ini's ``[pytest]``, setup.cfg's
  ``[tool:pytest]``, first found walking up from the start folder, as pytest does).

Nothing here imports pytest.
"""

from __future__ import annotations

import configparser
import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["CONFIG_FILES", "KEYS", "Layout", "LayoutError", "find_rootdir", "read", "read_at"]

DEFAULT_SUITES_DIR = "suites"

CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
"""The files pytest may read its configuration from, in the order it tries them per folder."""

KEYS = ("suites_dir", "goldens_dir", "untiered_dirs")


class LayoutError(ValueError):
    """A configuration file cannot be read, or it gives a layout value twice, differently."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    """A project's folders, relative to its rootdir, as POSIX paths without a trailing slash
    (``"."`` is the rootdir itself)."""

    rootdir: Path
    suites_dir: str = DEFAULT_SUITES_DIR
    goldens_dir: str = f"{DEFAULT_SUITES_DIR}/goldens"
    untiered_dirs: tuple[str, ...] = (f"{DEFAULT_SUITES_DIR}/benchmarks",)
    tiers: Mapping[str, Any] | None = None
    """The tier table (``[tool.harness.tiers]`` or ``[harness.tiers.NAME]`` sections), raw."""
    config_file: str | None = None
    """The file pytest takes its configuration from (rootdir-relative), if any."""
    source: str = "the defaults"
    """Where the harness values came from, for messages."""

    def under(self, rel: str, folder: str) -> bool:
        """Whether the rootdir-relative path ``rel`` lies in ``folder``."""
        if folder in ("", "."):
            return True
        return rel == folder or rel.startswith(folder.rstrip("/") + "/")

    def is_test_file(self, rel: str) -> bool:
        """Whether ``rel`` (rootdir-relative) is a test file: ``test_*.py`` or ``*_test.py``
        in the suites folder, outside the goldens and untiered (benchmark) folders."""
        name = PurePosixPath(rel).name
        return (
            name.endswith(".py")
            and (name.startswith("test_") or name.endswith("_test.py"))
            and self.under(rel, self.suites_dir)
            and not self.under(rel, self.goldens_dir)
            and not any(self.under(rel, d) for d in self.untiered_dirs)
        )

    def describe_test_files(self) -> str:
        """How :meth:`is_test_file` reads, for error messages."""
        where = "the project" if self.suites_dir in ("", ".") else f"{self.suites_dir}/"
        return f"test_*.py or *_test.py under {where} ({self.source})"


def _norm(value: str, what: str, source: str) -> str:
    text = str(value).strip().replace("\\", "/")
    if not text:
        raise LayoutError(f"{source}: {what} is empty; give a folder relative to the rootdir")
    if PurePosixPath(text).is_absolute() or ".." in PurePosixPath(text).parts:
        raise LayoutError(
            f"{source}: {what} = {value!r} leaves the project; give a folder relative to the "
            "rootdir, such as tests"
        )
    return str(PurePosixPath(text))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise LayoutError(f"{path}: {exc}") from None


def _read_ini(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        raise LayoutError(f"{path}: {exc}") from None
    return parser


_INI_SECTION = {"pytest.ini": "pytest", ".pytest.ini": "pytest", "tox.ini": "pytest"}


def _pytest_section(path: Path) -> dict[str, Any] | None:
    """pytest's ini options from ``path``, or None when pytest would not take this file."""
    if path.name == "pyproject.toml":
        section = _read_toml(path).get("tool", {}).get("pytest", {}).get("ini_options")
        return dict(section) if isinstance(section, Mapping) else None
    parser = _read_ini(path)
    name = _INI_SECTION.get(path.name, "tool:pytest")
    if parser.has_section(name):
        return dict(parser.items(name))
    # pytest.ini is its configuration even when empty.
    return {} if path.name in ("pytest.ini", ".pytest.ini") else None


def find_rootdir(start: Path) -> tuple[Path, Path | None]:
    """(rootdir, config file) as pytest finds them from ``start``: the first folder at or
    above it holding a file with a pytest section; else the nearest pyproject.toml's folder;
    else ``start``."""
    start = start.resolve()
    first_pyproject: Path | None = None
    for folder in (start, *start.parents):
        for name in CONFIG_FILES:
            path = folder / name
            if path.is_file():
                if _pytest_section(path) is not None:
                    return folder, path
                if name == "pyproject.toml" and first_pyproject is None:
                    first_pyproject = path
    if first_pyproject is not None:
        return first_pyproject.parent, first_pyproject
    return start, None


def _harness_table(rootdir: Path) -> tuple[dict[str, Any], str] | None:
    """The harness table of the project: ``[tool.harness]`` of pyproject.toml, else the
    ``[harness]`` sections of the ini files, with the file it came from."""
    found: list[tuple[dict[str, Any], str]] = []
    pyproject = rootdir / "pyproject.toml"
    if pyproject.is_file():
        tool = _read_toml(pyproject).get("tool", {}).get("harness")
        if isinstance(tool, Mapping):
            found.append((dict(tool), "[tool.harness] of pyproject.toml"))
    for name in ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg"):
        path = rootdir / name
        if not path.is_file():
            continue
        parser = _read_ini(path)
        sections = [s for s in parser.sections() if s == "harness" or s.startswith("harness.")]
        if not sections:
            continue
        table: dict[str, Any] = {}
        if parser.has_section("harness"):
            for key, value in parser.items("harness"):
                table[key] = value.split() if key == "untiered_dirs" else value
        tiers: dict[str, dict[str, Any]] = {}
        for section in sections:
            if section.startswith("harness.tiers."):
                tiers[section.removeprefix("harness.tiers.")] = _ini_tier(
                    dict(parser.items(section)), f"[{section}] of {name}"
                )
        if tiers:
            table["tiers"] = tiers
        found.append((table, f"[harness] of {name}"))
    if len(found) > 1:
        raise LayoutError(
            f"the harness is configured twice, in {found[0][1]} and {found[1][1]}; keep one"
        )
    return found[0] if found else None


def _ini_tier(values: dict[str, str], where: str) -> dict[str, Any]:
    """An ini tier section as the TOML table it stands for (lists split on whitespace)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("needs", "paths"):
            out[key] = value.split()
        elif key == "budget_s":
            try:
                out[key] = float(value)
            except ValueError:
                raise LayoutError(f"{where}: budget_s = {value!r} is not a number") from None
        elif key == "default":
            if value.strip().lower() not in ("true", "false", "yes", "no", "1", "0"):
                raise LayoutError(f"{where}: default = {value!r} is not true or false")
            out[key] = value.strip().lower() in ("true", "yes", "1")
        else:
            out[key] = value
    return out


def read(start: Path) -> Layout:
    """The layout of the project whose rootdir pytest would find from ``start``."""
    return read_at(*find_rootdir(start))


def read_at(rootdir: Path, config: Path | None, *, ini: Mapping[str, Any] | None = None) -> Layout:
    """The layout of the project at ``rootdir`` whose pytest configuration is ``config``
    (the plugin passes pytest's own ``rootpath`` and ``inipath``, and as ``ini`` the values
    pytest resolved, so ``-o harness_suites_dir=...`` counts too)."""
    if ini is None:
        section = _pytest_section(config) if config is not None and config.is_file() else None
        ini = section or {}
    ini = {k: v for k, v in ini.items() if v not in (None, "", [])}
    table_and_source = _harness_table(rootdir)
    table, source = table_and_source or ({}, "")
    unknown = set(table) - {*KEYS, "tiers"}
    if unknown:
        raise LayoutError(
            f"{source}: unknown key(s) {sorted(unknown)}; known keys are {sorted({*KEYS, 'tiers'})}"
        )
    values: dict[str, Any] = {}
    sources: list[str] = []
    for key in KEYS:
        from_table, from_ini = table.get(key), ini.get(f"harness_{key}")
        if isinstance(from_ini, str) and key == "untiered_dirs":
            from_ini = from_ini.split()
        if from_table is not None and from_ini is not None and from_table != from_ini:
            raise LayoutError(
                f"{key} is {from_table!r} in {source} but harness_{key} is {from_ini!r} in "
                f"{config.name if config else 'the pytest configuration'}; keep one"
            )
        value = from_table if from_table is not None else from_ini
        if value is None:
            continue
        where = source if from_table is not None else f"harness_{key} in {config}"
        sources.append(where)
        if key == "untiered_dirs":
            if isinstance(value, str) or not isinstance(value, list):
                raise LayoutError(f"{where}: untiered_dirs must be a list of folders")
            values[key] = tuple(_norm(v, key, where) for v in value)
        else:
            values[key] = _norm(value, key, where)
    suites = values.get("suites_dir", DEFAULT_SUITES_DIR)
    # Goldens and benchmarks sit next to the configured suites unless named.
    prefix = "" if suites == "." else f"{suites}/"
    tiers = table.get("tiers")
    if tiers is not None and not isinstance(tiers, Mapping):
        raise LayoutError(f"{source}: tiers must be a table of tables")
    return Layout(
        rootdir=rootdir,
        suites_dir=suites,
        goldens_dir=values.get("goldens_dir", f"{prefix}goldens"),
        untiered_dirs=values.get("untiered_dirs", (f"{prefix}benchmarks",)),
        tiers=tiers,
        config_file=config.name if config is not None else None,
        source=", ".join(dict.fromkeys(sources)) or "the defaults",
    )
