"""Shared by the other ``harness.perf`` modules: the asv project, errors, interpreter and git.

:class:`Project` is a repository's asv project (its config and the folders asv writes under
.asv/); :class:`PerfError` is a problem the user has to fix. The interpreter helpers spell the
one ``-E existing:PY`` path every run uses (see the package docstring), the git helpers resolve
commits, and :func:`_stream` runs asv with the project's own HOME (:func:`_asv_environ`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.processes import end_session

DEFAULT_MACHINE = "ci-cpu"
MACHINE_ENV_VAR = "HARNESS_PERF_MACHINE"
VENDOR_DIR_ENV_VAR = "HARNESS_PERF_VENDOR_DIR"


class PerfError(Exception):
    """A problem the user has to fix; the message says what and how."""


Echo = Callable[[str], None]


def _echo_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Project layout, interpreter and git helpers


@dataclasses.dataclass(frozen=True)
class Project:
    """The asv project of a repository: its config and the folders asv writes (under .asv/)."""

    root: Path
    config_path: Path
    results_dir: Path
    html_dir: Path
    benchmark_dir: Path

    @classmethod
    def load(cls, root: Path | str) -> Project:
        root = Path(root).resolve()
        config_path = root / "asv.conf.json"
        if not config_path.is_file():
            raise PerfError(f"{config_path} not found: run harness perf from the repository root")
        conf = _load_json(config_path)
        return cls(
            root=root,
            config_path=config_path,
            results_dir=root / conf.get("results_dir", "results"),
            html_dir=root / conf.get("html_dir", "html"),
            benchmark_dir=root / conf.get("benchmark_dir", "benchmarks"),
        )

    @property
    def state_dir(self) -> Path:
        return self.root / ".asv"

    @property
    def home(self) -> Path:
        """A writable HOME for asv: `asv machine` writes ~/.asv-machine.json there."""
        return self.state_dir / "home"

    @property
    def vendor_dir(self) -> Path:
        """Where npm packages for the dashboard are cached (HARNESS_PERF_VENDOR_DIR overrides:
        a CI cache or several checkouts can share one)."""
        override = os.environ.get(VENDOR_DIR_ENV_VAR)
        return Path(override) if override else self.state_dir / "vendor"


def _load_json(path: Path) -> dict[str, Any]:
    from asv import util as asv_util

    data: dict[str, Any] = asv_util.load_json(str(path), js_comments=True)
    return data


def python_path() -> str:
    """The interpreter spelled the one way every run uses (symlinks kept: a venv is a symlink)."""
    return os.path.abspath(sys.executable)


def env_spec(python: str | None = None) -> str:
    return f"existing:{python or python_path()}"


def env_name(python: str | None = None) -> str:
    """The environment name asv records for ``-E existing:PYTHON``."""
    from asv.environment import get_env_name

    name: str = get_env_name(
        "existing", (python or python_path()).replace(os.path.sep, "_"), {}, {}
    )
    return name


# --------------------------------------------------------------------------------------------
# Validation of what reaches asv and git: a machine name becomes a folder under the results
# directory, a ref and a regex become arguments. Nothing the user types may name a path outside
# the project or be read as an option.

# A machine name is one path component that cannot climb (no "/", no leading "."), at most 64
# characters: asv writes <results_dir>/<machine>/machine.json.
_MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

# The factor is a ratio head/base: at or below 1 every noise wobble would fail; inf or nan can
# never fail. Above 10 the gate would only see order-of-magnitude regressions.
MAX_FACTOR = 10.0


def check_machine(name: str, *, source: str = "--machine") -> str:
    """name, when it is a plain machine name; a PerfError naming it (and where it came from)."""
    if not _MACHINE_NAME.fullmatch(name):
        raise PerfError(
            f"{source} {name!r} is not a machine name: use 1-64 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit (e.g. {DEFAULT_MACHINE}, gpu-h200); asv keeps a "
            "machine's results in a folder of that name under the results directory"
        )
    return name


def default_machine() -> str:
    """$HARNESS_PERF_MACHINE (checked like --machine) or ci-cpu."""
    value = os.environ.get(MACHINE_ENV_VAR)
    if value is None or value == "":
        return DEFAULT_MACHINE
    return check_machine(value, source=f"${MACHINE_ENV_VAR}")


def resolve_machine(machine: str | None) -> str:
    """The machine a command uses: the one given (checked), else :func:`default_machine`."""
    return default_machine() if machine is None else check_machine(machine)


def check_factor(factor: float, *, source: str = "--factor") -> float:
    """factor, when a gate with it can fail: finite, > 1 and <= MAX_FACTOR."""
    if not (isinstance(factor, (int, float)) and math.isfinite(factor)) or not (
        1.0 < factor <= MAX_FACTOR
    ):
        raise PerfError(
            f"{source} {factor!r} cannot gate: it is the ratio head/base above which a "
            f"significant slowdown fails, so it must be a finite number > 1 and <= {MAX_FACTOR:g} "
            "(1.2 by default; `harness perf calibrate` measures what each benchmark supports; "
            "docs/perf.md)"
        )
    return float(factor)


def check_ref(ref: str, *, source: str = "commit") -> str:
    """ref, when it can only be read as a revision: git must never see it as an option."""
    if (
        not ref
        or ref.startswith("-")
        or len(ref) > 256
        or any(c.isspace() or not c.isprintable() for c in ref)
    ):
        raise PerfError(
            f"{source} {ref!r} is not a commit reference: give a branch, tag or hash "
            "(e.g. HEAD, origin/main, 1a2b3c4d), without spaces and not starting with '-'"
        )
    return ref


def check_regex(pattern: str, *, source: str = "--bench") -> str:
    """pattern, when it compiles as a Python regular expression (asv applies re.search)."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PerfError(
            f"{source} {pattern!r} is not a valid regular expression ({exc}); it is matched "
            "with re.search against names like bench_harness.AssertClose.time_close"
        ) from None
    return pattern


def _git(root: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise PerfError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip()}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def resolve_commit(root: Path, ref: str) -> str:
    """Full hash of ``ref``; a clear error when the commit is not in this clone."""
    check_ref(ref)
    sha = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if not sha:
        raise PerfError(
            f"unknown commit {ref!r} in {root}: a shallow clone must fetch it first "
            f"(git fetch origin {ref}, or actions/checkout with fetch-depth: 0)"
        )
    return sha


def _asv_environ(project: Project, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    project.home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(project.home)
    env.update(extra or {})
    return env


def _stream(
    cmd: Sequence[str], *, cwd: Path, env: dict[str, str], echo: Echo | None, log: list[str]
) -> int:
    """Run cmd, echo its output line by line as it comes (progress), keep it in log.

    cmd runs in a session of its own, which is ended (harness.processes.end_session: SIGINT
    to cmd, then SIGTERM and SIGKILL to what is left of the session) when this is interrupted:
    Ctrl-C, or a SIGTERM that ``harness`` turns into the same (a cancelled CI job,
    ``timeout``). asv's benchmark processes (each in a process group of its own) would
    otherwise run on, orphaned, loading the machine after the job that started them is gone."""
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            log.append(line)
            if echo:
                echo(line)
        return proc.wait()
    except BaseException:
        end_session(proc)
        raise
