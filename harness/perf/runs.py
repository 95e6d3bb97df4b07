"""Running the benchmarks: ``asv run`` of one commit, or of several in alternation.

:func:`run_benchmarks` measures one commit in this interpreter (HEAD from the working tree,
others from a ``git archive``) and records the samples under its hash; :func:`run_interleaved`
alternates several commits (base, head, base, head) so that a drifting machine's speed is
spread over both sides. :data:`GROUPS` splits the benchmarks into the CPU and GPU groups.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness.perf._common import (
    Echo,
    PerfError,
    Project,
    _asv_environ,
    _echo_stderr,
    _git,
    _load_json,
    _stream,
    default_machine,
    env_name,
    env_spec,
    python_path,
    resolve_commit,
)

# Benchmark groups, by class name (suites/benchmarks/README.md): a class whose name starts or
# ends with Gpu/GPU (GpuAssertClose, AttentionGPU) is in the GPU group, every other one in the
# CPU group. Matched before the parameters "(...)"; lookaheads, so that a user's --bench can be
# ANDed onto them.
_GPU_CLASS = r"[^(]*\.(?:(?:Gpu|GPU)\w*|\w*(?:Gpu|GPU))\."
GROUPS = {"cpu": f"(?!{_GPU_CLASS})", "gpu": f"(?={_GPU_CLASS})", "all": ""}

# --quick: one round per pass and at least 7 samples per benchmark over all passes. Fewer
# than 7 per side can never reach p < 0.002 in asv's Mann-Whitney test (6 v 6 gives at best
# p = 0.0022), so a quicker run could never show a significant change: asv's own --quick
# (1 sample) is useless for gating.
QUICK_MIN_SAMPLES = 7


def quick_attributes(passes: int = 1) -> list[str]:
    """asv -a overrides for --quick when the samples are collected over `passes` runs."""
    return ["rounds=1", f"repeat={-(-QUICK_MIN_SAMPLES // passes)}", "warmup_time=0.05"]


def ensure_machine(project: Project, machine: str, *, echo: Echo | None = None) -> None:
    """Register ``machine`` in the project's own asv HOME (non-interactive, idempotent)."""
    machine_file = project.home / ".asv-machine.json"
    if machine_file.is_file():
        try:
            if machine in json.loads(machine_file.read_text()):
                return
        except (OSError, ValueError):
            pass  # an unreadable file is rewritten by asv below
    log: list[str] = []
    rc = _stream(
        [
            sys.executable,
            "-m",
            "asv",
            "machine",
            "--yes",
            "--machine",
            machine,
            "--config",
            str(project.config_path),
        ],
        cwd=project.root,
        env=_asv_environ(project),
        echo=None,
        log=log,
    )
    if rc != 0:
        raise PerfError(f"asv machine --yes --machine {machine} exited {rc}:\n" + "\n".join(log))
    if echo:
        echo(f"harness perf: registered asv machine {machine!r} in {machine_file}")


# --------------------------------------------------------------------------------------------
# Running benchmarks


@dataclasses.dataclass
class RunOutcome:
    """What one ``asv run`` did. exit_code: 0 all ran, 1 asv error or a benchmark failed."""

    exit_code: int
    commit: str
    machine: str
    env_name: str
    source: str  # "working tree", "working tree (uncommitted changes)" or "git archive of <sha>"
    log: list[str]


def bench_regex(group: str = "all", bench: str | None = None) -> str | None:
    """The --bench regex for a group ANDed with a user regex (asv applies re.search)."""
    if group not in GROUPS:
        raise PerfError(f"unknown benchmark group {group!r}: expected one of {sorted(GROUPS)}")
    lookaheads = GROUPS[group] + (f"(?=.*(?:{bench}))" if bench else "")
    return f"^{lookaheads}" if lookaheads else None


def run_benchmarks(
    root: Path | str,
    *,
    commit: str = "HEAD",
    bench: str | None = None,
    group: str = "all",
    quick: bool = False,
    machine: str | None = None,
    python: str | None = None,
    append_samples: bool = False,
    passes: int = 1,
    echo: Echo | None = _echo_stderr,
) -> RunOutcome:
    """Run the benchmarks of ``commit`` in this interpreter and record them under its hash.

    HEAD runs the working tree as it is. Any other commit runs that commit's benchmarks and
    code from a ``git archive`` extracted to a temporary folder, imported ahead of the
    installed package (``ASV_PYTHONPATH``) with this interpreter's dependencies: that is how
    a job measures a merge-base and its pull request on the same machine, minutes apart.
    ``python`` (default: this interpreter) must have ml-harness's dependencies and asv.
    ``append_samples`` adds to the commit's recorded samples instead of replacing them;
    ``passes`` is how many such runs a --quick measurement is spread over (see run_interleaved).
    """
    python = python or python_path()
    project = Project.load(root)
    machine = machine or default_machine()
    sha = resolve_commit(project.root, commit)
    head = resolve_commit(project.root, "HEAD")
    ensure_machine(project, machine, echo=echo)
    regex = bench_regex(group, bench)
    log: list[str] = []

    with tempfile.TemporaryDirectory(prefix="harness-perf-") as tmp:
        extra_env: dict[str, str] = {}
        if sha == head:
            config = project.config_path
            dirty = _git(project.root, "status", "--porcelain", "--untracked-files=no")
            source = "working tree (uncommitted changes)" if dirty else "working tree"
        else:
            config, code_dir = _archived_config(project, sha, Path(tmp))
            pythonpath = [str(code_dir)] + (
                [os.environ["ASV_PYTHONPATH"]] if os.environ.get("ASV_PYTHONPATH") else []
            )
            extra_env["ASV_PYTHONPATH"] = os.pathsep.join(pythonpath)
            source = f"git archive of {sha[:10]}"

        cmd = [
            sys.executable,
            "-m",
            "asv",
            "run",
            "--config",
            str(config),
            "-E",
            env_spec(python),
            "--machine",
            machine,
            "--set-commit-hash",
            sha,
            "--record-samples",
            "--show-stderr",
        ]
        if append_samples:
            cmd.append("--append-samples")
        if regex:
            cmd += ["--bench", regex]
        if quick:
            for attribute in quick_attributes(passes):
                cmd += ["-a", attribute]
        if echo:
            label = sha[:10] if sha.startswith(commit) else f"{commit} ({sha[:10]})"
            echo(
                f"harness perf: benchmarking {label}, {source}, on machine "
                f"{machine!r}, env {env_name(python)!r}{', quick' if quick else ''}"
                f"{', appending samples' if append_samples else ''}"
            )
        rc = _stream(
            cmd, cwd=project.root, env=_asv_environ(project, extra_env), echo=echo, log=log
        )
    # asv run: 0 ok, 2 a benchmark failed, 1 usage or environment error.
    return RunOutcome(
        exit_code=0 if rc == 0 else 1,
        commit=sha,
        machine=machine,
        env_name=env_name(python),
        source=source,
        log=log,
    )


def _archived_config(project: Project, sha: str, tmp: Path) -> tuple[Path, Path]:
    """Extract commit sha to tmp/code and write a config that benchmarks it into our results."""
    code_dir = tmp / "code"
    code_dir.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha],
        cwd=project.root,
        capture_output=True,
    )
    if archive.returncode != 0:
        raise PerfError(f"git archive {sha} failed: {archive.stderr.decode(errors='replace')}")
    archive_path = tmp / "code.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(code_dir, filter="data")
    archived_config = code_dir / "asv.conf.json"
    if not archived_config.is_file():
        raise PerfError(f"commit {sha[:10]} has no asv.conf.json: it has no benchmarks to run")
    conf = _load_json(archived_config)
    conf.update(
        repo=str(project.root),  # hashes and dates come from this repository
        benchmark_dir=str(code_dir / conf.get("benchmark_dir", "benchmarks")),
        results_dir=str(project.results_dir),  # ... and the results land next to HEAD's
        html_dir=str(project.html_dir),
        env_dir=str(tmp / "env"),
    )
    config = tmp / "asv.conf.json"
    config.write_text(json.dumps(conf, indent=2))
    return config, code_dir


def run_interleaved(
    root: Path | str,
    commits: Sequence[str],
    *,
    passes: int = 2,
    echo: Echo | None = _echo_stderr,
    **kwargs,
) -> list[RunOutcome]:
    """Measure several commits in alternation: base, head, base, head, ... appending samples.

    A machine's speed drifts over minutes (other jobs, clocks, a noisy neighbour on a VM); runs
    that alternate spread the drift over both sides instead of handing it to one of them, as
    asv's own --interleave-rounds does for the environments it builds. kwargs go to
    run_benchmarks. Every run happens even when one reports failing benchmarks: their
    results are recorded all the same and the gate reports them.
    """
    if passes < 1:
        raise PerfError(f"passes must be >= 1, got {passes}")
    outcomes = []
    for n in range(passes):
        for commit in commits:
            outcome = run_benchmarks(
                root, commit=commit, append_samples=n > 0, passes=passes, echo=echo, **kwargs
            )
            outcomes.append(outcome)
    return outcomes
