"""Tiers: one folder per tier under ``suites/``, each declaring what it needs in one table.

A test's tier is the folder directly under the suites directory that holds it
(``suites/unit/harness/test_x.py`` is in ``unit``). The table below is the single place where
a tier says what it needs to run and how long each of its tests may take; a project can
override or extend it in ``pyproject.toml``::

    [tool.harness.tiers.integration]
    needs = ["exe:weed"]          # every integration test needs the SeaweedFS binary
    budget_s = 60.0

When a need is missing, every test of the tier is skipped *with the reason shown*; a tier is
never dropped silently. The same need strings work per test with ``@pytest.mark.needs(...)``.

Need strings:

``cuda``            torch sees at least one CUDA device
``cuda:N``          torch sees at least N CUDA devices
``module:NAME``     the Python module NAME can be imported
``exe:NAME``        the executable NAME is on PATH or next to the running Python (a
                    venv's ``bin/``, where pip puts the binaries packages ship)
``env:NAME``        the environment variable NAME is set and non-empty
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.util
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness import layout as _layout

__all__ = [
    "DEFAULT_TIERS",
    "Tier",
    "TierConfigError",
    "check_need",
    "default_selection",
    "load_tiers",
    "missing_needs",
    "project_tiers",
    "tier_by_paths",
    "tier_of",
]


class TierConfigError(ValueError):
    """A tier table (built in or from pyproject.toml) is malformed."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tier:
    """One tier of the suites."""

    name: str
    """The folder name under ``suites/`` and the value given to ``--tier``."""
    description: str
    """One line shown in reports and ``harness run --help``."""
    needs: tuple[str, ...] = ()
    """Need strings (module docstring); any missing one skips the whole tier with its reason."""
    budget_s: float | None = None
    """Per-test wall-clock budget of the call phase (set-up and tear-down are left out: they
    carry shared fixtures, whose cost lands on whichever test comes first or last); tests over
    it are listed in the summary. None: no budget. It is reported, never enforced: a slow test
    is information."""
    paths: tuple[str, ...] = ()
    """Folders or globs (rootdir-relative, e.g. ``tests/models`` or ``tests/test_*_slow.py``)
    whose test files are in this tier, for a project whose tiers are not folders under the
    suites folder (``harness init`` writes them; no file is moved). A file in a folder named
    after a tier directly under the suites folder is in that tier; otherwise the tier whose
    path matches it most specifically (the longest path) holds it."""
    default: bool = True
    """Whether ``harness ci``'s test step selects this tier when no ``--tier`` is given
    (``harness run`` without ``--tier`` runs every tier). The gpu tier is not a default: it
    has its own step, run when CUDA is present."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise TierConfigError(f"tier name must be a plain identifier, got {self.name!r}")
        for need in self.needs:
            _parse_need(need)  # raises on a malformed need
        if self.budget_s is not None and not self.budget_s > 0:
            raise TierConfigError(
                f"tier {self.name!r}: budget_s must be > 0, got {self.budget_s!r}"
            )


def load_tiers(overrides: Mapping[str, Any] | None) -> dict[str, Tier]:
    """The built-in tiers updated with ``[tool.harness.tiers]`` from pyproject.toml.

    Unknown keys are errors (a typo such as ``budget = 5`` must not be ignored silently).
    """
    tiers = dict(DEFAULT_TIERS)
    if not overrides:
        return tiers
    if not isinstance(overrides, Mapping):
        raise TierConfigError("[tool.harness.tiers] must be a table of tables")
    fields = {f.name for f in dataclasses.fields(Tier)} - {"name"}
    for name, table in overrides.items():
        if not isinstance(table, Mapping):
            raise TierConfigError(f"[tool.harness.tiers.{name}] must be a table")
        unknown = set(table) - fields
        if unknown:
            raise TierConfigError(
                f"[tool.harness.tiers.{name}]: unknown key(s) {sorted(unknown)}; "
                f"known keys are {sorted(fields)}"
            )
        values: dict[str, Any] = {}
        base = tiers.get(name)
        if base is not None:
            values = {f: getattr(base, f) for f in fields}
        else:
            values = {"description": f"{name} tier"}
        values.update(table)
        if "needs" in table:
            needs = table["needs"]
            if isinstance(needs, str) or not isinstance(needs, Iterable):
                raise TierConfigError(
                    f"[tool.harness.tiers.{name}] needs must be a list of strings"
                )
            values["needs"] = tuple(needs)
        if "paths" in table:
            paths = table["paths"]
            if isinstance(paths, str) or not isinstance(paths, Iterable):
                raise TierConfigError(
                    f"[tool.harness.tiers.{name}] paths must be a list of folders or globs"
                )
            values["paths"] = tuple(str(p).strip().rstrip("/") for p in paths)
            if not all(values["paths"]):
                raise TierConfigError(f"[tool.harness.tiers.{name}] paths has an empty entry")
        tiers[name] = Tier(name=name, **values)
    return tiers


def project_tiers(rootpath: Path, config_file: Path | None = None) -> dict[str, Tier]:
    """The tier table of the project at ``rootpath``: the built-in tiers updated with its
    ``[tool.harness.tiers]`` (or the ``[harness.tiers.NAME]`` sections of an ini file pytest
    reads: :mod:`harness.layout`). ``config_file``: pytest's configuration file, when known.

    Raises :class:`TierConfigError` naming the file for an unreadable configuration file, an
    unknown key under ``[tool.harness]`` or a malformed tier.
    """
    try:
        if config_file is None:
            found = _layout.read(Path(rootpath))
        else:
            found = _layout.read_at(Path(rootpath), config_file)
    except _layout.LayoutError as exc:
        raise TierConfigError(str(exc)) from None
    try:
        return load_tiers(found.tiers)
    except TierConfigError as exc:
        raise TierConfigError(f"{found.source}: {exc}") from None


def tier_by_paths(tiers: Mapping[str, Tier], rel: str) -> str | None:
    """The tier whose ``paths`` match the rootdir-relative POSIX path ``rel`` most
    specifically (the longest matching entry), or None. An entry is a folder (it holds
    ``rel``) or a glob (``fnmatch`` on the whole path)."""
    best: tuple[int, str] | None = None
    for name, tier in tiers.items():
        for entry in tier.paths:
            folder = entry in (".", "") or rel.startswith(entry + "/")
            if folder or fnmatch.fnmatchcase(rel, entry):
                score = len(entry) if entry != "." else 0
                if best is None or score > best[0]:
                    best = (score, name)
    return best[1] if best else None


def tier_of(tiers: Mapping[str, Tier], suites_dir: str, rel: str) -> str | None:
    """The tier of the rootdir-relative POSIX path ``rel``: the folder named after a tier
    directly under ``suites_dir``, else :func:`tier_by_paths`."""
    inner = rel if suites_dir in ("", ".") else rel.removeprefix(suites_dir.rstrip("/") + "/")
    if inner != rel or suites_dir in ("", "."):
        first = inner.split("/")[0]
        if "/" in inner and first in tiers:
            return first
    return tier_by_paths(tiers, rel)


def default_selection(tiers: Mapping[str, Tier]) -> list[str]:
    """Tier names selected when none are given, in table order."""
    return [name for name, tier in tiers.items() if tier.default]


def _parse_need(need: str) -> tuple[str, str]:
    kind, _, arg = need.partition(":")
    if kind == "cuda":
        if arg and not (arg.isdigit() and int(arg) >= 1):
            raise TierConfigError(f"need {need!r}: the GPU count after 'cuda:' must be >= 1")
        return kind, arg or "1"
    if kind in ("module", "exe", "env") and arg:
        return kind, arg
    raise TierConfigError(
        f"unknown need {need!r}; expected cuda, cuda:N, module:NAME, exe:NAME or env:NAME"
    )


@functools.cache
def _cuda_device_count() -> tuple[int, str]:
    """(device count, why it is zero). Imports torch, so only called when a need asks."""
    if importlib.util.find_spec("torch") is None:
        return 0, "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return (
            0,
            f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)",
        )
    return torch.cuda.device_count(), ""


def check_need(need: str) -> str | None:
    """None when the need is met, else the reason it is not (shown as the skip reason)."""
    kind, arg = _parse_need(need)
    if kind == "cuda":
        count, why = _cuda_device_count()
        wanted = int(arg)
        if count >= wanted:
            return None
        if count == 0:
            return f"needs {need}: {why}"
        return f"needs {need}: only {count} CUDA device(s) visible"
    if kind == "module":
        try:
            found = importlib.util.find_spec(arg) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        return (
            None if found else f"needs {need}: module {arg!r} is not importable by {sys.executable}"
        )
    if kind == "exe":
        beside_python = Path(sys.executable).parent
        exe = shutil.which(arg) or shutil.which(arg, path=str(beside_python))
        return None if exe else f"needs {need}: {arg!r} is not on PATH nor in {beside_python}"
    # env
    return None if os.environ.get(arg) else f"needs {need}: environment variable {arg} is not set"


def missing_needs(needs: Iterable[str]) -> list[str]:
    """The reasons for every unmet need, in order."""
    return [reason for need in needs if (reason := check_need(need)) is not None]


# The built-in table. Budgets: unit tests are meant to be fast enough to run on every save
# (2 s each, the test body alone); the other tiers do real work (servers, processes, training
# runs) and are bounded by the CI job's own timeout instead.
DEFAULT_TIERS: Mapping[str, Tier] = {
    tier.name: tier
    for tier in (
        Tier(name="unit", description="fast, isolated checks of one unit", budget_s=2.0),
        Tier(name="property", description="hypothesis properties over generated inputs"),
        Tier(
            name="integration",
            description="components together: real servers, real files, short training runs",
        ),
        Tier(
            name="distributed",
            description="real multi-process torch.distributed (gloo on CPU)",
            needs=("module:torch.distributed",),
        ),
        Tier(
            name="gpu",
            description="CUDA kernels and NCCL on a GPU runner",
            needs=("cuda",),
            default=False,
        ),
    )
}
