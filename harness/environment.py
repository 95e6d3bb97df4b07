"""The environment: does what is installed match the lock file, and what machine is this?

Two questions every report has to answer before its numbers mean anything:

- :func:`check` compares the distributions installed for the running interpreter with a lock
  file (``requirements/cpu.lock``; ``requirements/gpu.lock`` on a GPU runner) and returns a
  :class:`Drift` that lists, package by package, what is missing, what is extra and what has
  the wrong version. Names are compared in their PEP 503 normalized form (``PyYAML`` and
  ``pyyaml``, ``ruamel.yaml`` and ``ruamel-yaml`` are one package) and versions with PEP 440
  semantics, so the pin ``torch==2.13.0`` accepts the installed build ``2.13.0+cpu``.
- :func:`fingerprint` describes the machine and the stack (python, torch, triton, CUDA, GPU,
  driver, git commit) as a flat dict of JSON values; every report is stamped with it.

Lock file format (what ``requirements/lock.sh`` writes): one requirement per line, either an
exact pin ``name==version`` or a specifier range ``torch>=2.11,<2.15``; environment markers
(``; sys_platform == "linux"``) are honoured; ``#`` starts a comment (at the start of a line or
after whitespace); blank lines are ignored. What other teams' lock files hold is read too:
pip-tools' and ``uv export``'s ``--hash`` options and backslash continuation lines (the hashes are
pip's to check at install time), index options (``--index-url`` and friends: where from, not
what), editable lines (``-e .``, ``-e git+...``: a source tree, whose version is not a pin), and
``pip freeze``'s direct references (``name @ file:///.../name-1.0-py3-none-any.whl`` is pinned
to the wheel's version; one whose URL names no version is checked for presence only).
Anything else, ``-r``/``-c`` includes among it, is an error naming ``file:line``. Editable
installs in the environment (the project itself, installed with ``pip install -e .``) are never
extra.

This module knows nothing of click or pytest; ``harness env`` (harness/cli/env.py) fronts it.
"""

from __future__ import annotations

import ast
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

__all__ = [
    "DEFAULT_LOCK",
    "FINGERPRINT_KEYS",
    "IGNORED_EXTRAS",
    "Drift",
    "LockEntry",
    "LockFileError",
    "PackageDrift",
    "check",
    "default_lock_path",
    "fingerprint",
    "installed_distributions",
    "read_lock",
]

#: The lock checked by default, relative to the project root.
DEFAULT_LOCK = Path("requirements") / "cpu.lock"

#: Installed but never reported as extra: the installer's own tools (a venv always has them and
#: ``lock.sh`` drops them from the lock) and this project, installed editable, not from the lock.
IGNORED_EXTRAS = frozenset({"pip", "setuptools", "wheel", "ml-harness"})

# pip's rule: '#' starts a comment at the start of a line or after whitespace ('pkg==1 # why').
_COMMENT = re.compile(r"(^|\s)#.*$")
# pip-tools and uv write one --hash option per artifact after the requirement.
_HASH = re.compile(r"\s--hash(=|\s+)\S+")
# Options that say where packages come from, not which: skipped.
_SOURCE_OPTIONS = (
    "-i",
    "--index-url",
    "--extra-index-url",
    "--find-links",
    "-f",
    "--trusted-host",
    "--no-index",
    "--pre",
    "--prefer-binary",
    "--only-binary",
    "--no-binary",
    "--require-hashes",
)


class LockFileError(ValueError):
    """The lock file is missing or has a line that is not a requirement.

    ``path`` is the lock file and ``line`` the 1-based line number (None when the whole file is
    the problem, e.g. it does not exist).
    """

    def __init__(self, message: str, *, path: Path, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


@dataclass(frozen=True)
class LockEntry:
    """One requirement of a lock file and the line it came from."""

    requirement: Requirement
    line: int

    @property
    def name(self) -> str:
        """The PEP 503 normalized name (``ruamel-yaml``)."""
        return canonicalize_name(self.requirement.name)

    @property
    def wanted(self) -> str:
        """What the lock asks for, as written: ``==2.3.1`` or ``<2.15,>=2.11``."""
        return str(self.requirement.specifier)


@dataclass(frozen=True)
class PackageDrift:
    """One package that differs from the lock.

    ``installed`` is None for a missing package, ``wanted`` is None for an extra one.
    """

    name: str
    installed: str | None = None
    wanted: str | None = None

    def __str__(self) -> str:
        if self.installed is None:
            return f"{self.name}: missing (lock wants {self.wanted})"
        if self.wanted is None:
            return f"{self.name}: extra ({self.installed} installed, not in the lock)"
        return f"{self.name}: installed {self.installed}, lock wants {self.wanted}"


@dataclass(frozen=True)
class Drift:
    """How the installed distributions differ from a lock file.

    Each list is sorted by normalized name. ``locked`` is the number of lock entries that
    apply to this interpreter (entries whose environment marker is false are not checked).
    """

    lock: Path
    locked: int
    missing: tuple[PackageDrift, ...] = ()
    extra: tuple[PackageDrift, ...] = ()
    wrong_version: tuple[PackageDrift, ...] = ()

    @property
    def clean(self) -> bool:
        """True when nothing is missing, extra or of the wrong version."""
        return not (self.missing or self.extra or self.wrong_version)

    def describe(self) -> list[str]:
        """One line per drifting package, missing first, then wrong versions, then extras."""
        return [str(p) for p in (*self.missing, *self.wrong_version, *self.extra)]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``lock``, ``locked``, ``clean``, and the three lists."""
        return {
            "lock": str(self.lock),
            "locked": self.locked,
            "clean": self.clean,
            "missing": [{"name": p.name, "wanted": p.wanted} for p in self.missing],
            "extra": [{"name": p.name, "installed": p.installed} for p in self.extra],
            "wrong_version": [
                {"name": p.name, "installed": p.installed, "wanted": p.wanted}
                for p in self.wrong_version
            ],
        }


def default_lock_path(start: str | os.PathLike[str] | None = None) -> Path:
    """``requirements/cpu.lock`` under the project root.

    The project root is the nearest directory at or above ``start`` (default: the current
    directory) that holds a ``pyproject.toml``; without one, ``start`` itself.
    """
    here = Path(start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / "pyproject.toml").is_file():
            return directory / DEFAULT_LOCK
    return here / DEFAULT_LOCK


def read_lock(path: str | os.PathLike[str]) -> list[LockEntry]:
    """Parse a lock file; raise :class:`LockFileError` naming ``file:line`` for a bad line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockFileError(
            f"lock file {path} does not exist: create it with `make lock` "
            "(requirements/lock.sh) or pass the lock to check with --lock PATH",
            path=path,
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LockFileError(f"cannot read lock file {path}: {exc}", path=path) from None

    entries: dict[str, LockEntry] = {}
    for number, raw in _logical_lines(text):
        line = _HASH.sub("", " " + _COMMENT.sub("", raw)).strip()
        if not line:
            continue
        option = line.split()[0].split("=")[0]
        if option in ("-e", "--editable") or option in _SOURCE_OPTIONS:
            continue

        def fail(problem: str, number: int = number, raw: str = raw) -> LockFileError:
            return LockFileError(
                f"{path}:{number}: {problem}: {raw.strip()!r}", path=path, line=number
            )

        if line.startswith("-"):
            raise fail("pip options are not supported in a lock file")
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise fail(
                f"not a requirement ({exc}); expected 'name==version' or a range such as "
                "'torch>=2.11,<2.15'"
            ) from None
        if requirement.url:
            version = _wheel_version(requirement.url)
            if version is not None:
                requirement = Requirement(f"{requirement.name}=={version}")
            else:
                requirement = Requirement(f"{requirement.name}>=0a0")  # presence only
        if not requirement.specifier:
            raise fail("no version: expected 'name==version' or a range like 'torch>=2.11,<2.15'")
        entry = LockEntry(requirement, number)
        if entry.name in entries:
            raise fail(f"{requirement.name} is already locked on line {entries[entry.name].line}")
        entries[entry.name] = entry
    return list(entries.values())


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each line, ``\\``-continued lines joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        start, joined = pending if pending else (number, "")
        joined += raw
        if joined.rstrip().endswith("\\"):
            pending = (start, joined.rstrip()[:-1] + " ")
            continue
        pending = None
        out.append((start, joined))
    if pending:
        out.append(pending)
    return out


def _wheel_version(url: str) -> str | None:
    """The version a direct reference's wheel file name carries (``pip freeze`` writes
    ``name @ file:///.../name-1.0-py3-none-any.whl``), else None."""
    filename = url.rsplit("/", 1)[-1].split("#")[0]
    if not filename.endswith(".whl"):
        return None
    try:
        return str(parse_wheel_filename(filename)[1])
    except InvalidWheelFilename:
        return None


def editable_distributions() -> set[str]:
    """Normalized names of the distributions installed editable (``pip install -e``): the
    project's own source tree, never an extra package."""
    names: set[str] = set()
    for dist in importlib.metadata.distributions():
        try:
            direct = json.loads(dist.read_text("direct_url.json") or "{}")
        except (OSError, ValueError):
            continue
        if isinstance(direct, dict) and (direct.get("dir_info") or {}).get("editable"):
            name = dist.metadata["Name"]
            if name:
                names.add(canonicalize_name(name))
    return names


def installed_distributions() -> dict[str, str]:
    """``{name: version}`` of the distributions the running interpreter can import.

    When a name is installed twice on ``sys.path`` the first one wins, as it does for import.
    """
    found: dict[str, tuple[str, str]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:  # a broken .dist-info without a name is not a distribution anyone imports
            found.setdefault(canonicalize_name(name), (name, dist.version))
    return dict(found.values())


def check(
    lock_path: str | os.PathLike[str], *, distributions: Mapping[str, str] | None = None
) -> Drift:
    """Compare installed distributions with the lock file at ``lock_path``.

    ``distributions`` (``{name: version}``) replaces what is installed, for tests and for
    checking another environment's ``pip freeze``; by default it is
    :func:`installed_distributions`. Raises :class:`LockFileError` for a missing or malformed
    lock.
    """
    lock_path = Path(lock_path)
    entries = read_lock(lock_path)
    editable: set[str] = set()
    if distributions is None:
        distributions = installed_distributions()
        editable = editable_distributions()
    installed: dict[str, tuple[str, str]] = {
        canonicalize_name(name): (name, ver) for name, ver in distributions.items()
    }

    missing, wrong = [], []
    applicable = 0
    for entry in entries:
        marker = entry.requirement.marker
        if marker is not None and not marker.evaluate():
            continue
        applicable += 1
        if entry.name not in installed:
            missing.append(PackageDrift(entry.requirement.name, wanted=entry.wanted))
            continue
        version = installed[entry.name][1]
        if not _satisfies(version, entry):
            name = entry.requirement.name
            wrong.append(PackageDrift(name, installed=version, wanted=entry.wanted))

    if applicable == 0:
        # With no pin to check, the only thing left to fail on is extras, and --allow-extra
        # (the GPU job's flag) turns that off: the check would pass whatever is installed.
        excluded = f" ({len(entries)} excluded by environment markers)" if entries else ""
        raise LockFileError(
            f"lock file {lock_path} pins no package for this interpreter{excluded}: nothing "
            "could drift from it; regenerate it with `make lock` or pass the right --lock",
            path=lock_path,
        )
    locked_names = {entry.name for entry in entries}
    extra = [
        PackageDrift(name, installed=version)
        for canonical, (name, version) in installed.items()
        if canonical not in locked_names
        and canonical not in IGNORED_EXTRAS
        and canonical not in editable
    ]

    def by_name(p: PackageDrift) -> str:
        return canonicalize_name(p.name)

    return Drift(
        lock=lock_path,
        locked=applicable,
        missing=tuple(sorted(missing, key=by_name)),
        extra=tuple(sorted(extra, key=by_name)),
        wrong_version=tuple(sorted(wrong, key=by_name)),
    )


def _satisfies(version: str, entry: LockEntry) -> bool:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False  # a legacy, non-PEP 440 version cannot be shown to match any lock entry
    # prereleases=True: an installed nightly is judged by its number, not refused for being one.
    return entry.requirement.specifier.contains(parsed, prereleases=True)


# --------------------------------------------------------------------------------------------
# Fingerprint

#: The keys of :func:`fingerprint`, in order. Reports store them: add keys, never rename.
FINGERPRINT_KEYS = (
    "fingerprint_version",  # int: 1; bumped only if a key's meaning changes
    "python",  # str: "3.11.7"
    "python_implementation",  # str: "CPython"
    "executable",  # str: sys.executable
    "os",  # str: platform.system(), "Linux"
    "platform",  # str: platform.platform(), "Linux-6.1.0-...-x86_64-with-glibc2.36"
    "machine",  # str: platform.machine(), "x86_64"
    "cpu_count",  # int | None: os.cpu_count()
    "hostname",  # str
    "torch",  # str | None: installed version ("2.13.0+cpu"), None when not installed
    "triton",  # str | None
    "numpy",  # str | None
    "cuda_available",  # bool: torch.cuda.is_available(); False without torch
    "cuda_version",  # str | None: the CUDA torch was built with (torch.version.cuda)
    "gpus",  # list[str]: GPU names, from torch when CUDA is usable, else from nvidia-smi
    "gpu_driver",  # str | None: NVIDIA driver version from nvidia-smi
    "git_commit",  # str | None: HEAD of the git repository at cwd
    "git_dirty",  # bool | None: tracked files modified; None outside a git repository
)


def fingerprint(*, cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Describe this machine and software stack; keys and types are :data:`FINGERPRINT_KEYS`.

    Never fails for a missing piece (no torch, no GPU, no nvidia-smi, no git): that key is None
    (or False / empty). torch is imported only when it is installed, to ask about CUDA.
    ``cwd`` is the directory whose git commit is reported (default: the current directory).
    """
    versions = {name: _version(name) for name in ("torch", "triton", "numpy")}
    cuda_available, cuda_version, torch_gpus = False, None, list[str]()
    if versions["torch"] is not None:
        cuda_available, cuda_version, torch_gpus = _torch_cuda()
    smi_names, driver = _nvidia_smi()
    commit, dirty = _git_state(Path(cwd) if cwd is not None else Path.cwd())
    return {
        "fingerprint_version": 1,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "os": platform.system(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "torch": versions["torch"],
        "triton": versions["triton"],
        "numpy": versions["numpy"],
        "cuda_available": cuda_available,
        "cuda_version": cuda_version,
        # torch's view honours CUDA_VISIBLE_DEVICES: the GPUs the tests actually get.
        "gpus": torch_gpus or smi_names,
        "gpu_driver": driver,
        "git_commit": commit,
        "git_dirty": dirty,
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


ACCELERATOR_DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")
"""Device files one of which a GPU torch can use needs on Linux: an NVIDIA GPU's, ROCm's
kernel driver's, WSL's GPU paravirtualisation. Without any, ``torch.cuda.is_available()`` is
False whatever torch was built for."""


def _accelerator_device_nodes() -> list[str]:
    return [p for pattern in ACCELERATOR_DEVICE_NODES for p in glob.glob(pattern)]


def _torch_version_module() -> dict[str, Any] | None:
    """The literal assignments of ``torch/version.py`` (``cuda``, ``hip``...), read without
    importing torch (importing it takes 1-3 s); None when that file cannot be read so."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    found: dict[str, Any] = {}
    for node in tree.body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return found


def _cuda_could_be_available() -> bool:
    """False only where ``torch.cuda.is_available()`` is surely False without asking torch:
    Linux with no GPU device file. Where torch is imported already, asking it costs nothing."""
    return "torch" in sys.modules or sys.platform != "linux" or bool(_accelerator_device_nodes())


def cuda_available() -> bool:
    """``torch.cuda.is_available()``; False without torch. torch is not imported where CUDA
    cannot be available (see :func:`_cuda_could_be_available`)."""
    if importlib.util.find_spec("torch") is None:
        return False
    return _torch_cuda()[0]


def _torch_cuda() -> tuple[bool, str | None, list[str]]:
    if not _cuda_could_be_available():
        # CUDA cannot be available, so torch need not be imported to say so (a report's
        # fingerprint is written at the end of every pytest run).
        version = _torch_version_module()
        if version is not None:
            cuda = version.get("cuda")
            return False, cuda if isinstance(cuda, str) else None, []
    try:
        import torch  # noqa: PLC0415 - slow (1-2 s): only when a fingerprint is asked for

        cuda_version = torch.version.cuda
        if not torch.cuda.is_available():
            return False, cuda_version, []
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return True, cuda_version, names
    except Exception:  # a broken torch or CUDA init must not take the report down with it
        return False, None, []


def _nvidia_smi() -> tuple[list[str], str | None]:
    """GPU names and the driver version; nothing when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    out = _run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"]) if exe else None
    names, driver = [], None
    for line in (out or "").splitlines():  # "NVIDIA H200, 580.159.04"
        name, _, version = (part.strip() for part in line.rpartition(","))
        if name:
            names.append(name)
            driver = driver or version or None
    return names, driver


def _git_state(cwd: Path) -> tuple[str | None, bool | None]:
    if shutil.which("git") is None:
        return None, None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=cwd)
    if not commit:
        return None, None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd)
    return commit.strip(), (bool(status.strip()) if status is not None else None)


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    """stdout of a short command, or None when it is absent, fails or hangs."""
    try:
        proc = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None
