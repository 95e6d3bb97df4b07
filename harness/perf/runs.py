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
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.perf._common import (
    Echo,
    PerfError,
    Project,
    _asv_environ,
    _echo_stderr,
    _git,
    _load_json,
    _stream,
    check_regex,
    env_name,
    env_spec,
    python_path,
    resolve_commit,
    resolve_machine,
)
from harness.perf.results import PassTag, load_results, record_pass

# Benchmark groups, by class name (suites/benchmarks/README.md): a class whose name starts or
# ends with Gpu/GPU (GpuAssertClose, AttentionGPU) is in the GPU group, every other one in the
# CPU group. Matched before the parameters "(...)"; lookaheads, so that a user's --bench can be
# ANDed onto them.
_GPU_CLASS = r"[^(]*\.(?:(?:Gpu|GPU)\w*|\w*(?:Gpu|GPU))\."
GROUPS = {"cpu": f"(?!{_GPU_CLASS})", "gpu": f"(?={_GPU_CLASS})", "all": ""}

# --quick: one round per pass, at least 7 samples per benchmark over all passes and at least 5
# in each pass. Fewer than 7 per side can never reach p < 0.002 in asv's Mann-Whitney test
# (6 v 6 gives at best p = 0.0022), so asv's own --quick (1 sample) is useless for gating. The
# gate compares base and head pass by pass (stats.py): 5 v 5 in a pass leaves room for a
# sample or two that a load spike moved, where 2 v 2 did not (docs/perf.md, the noise table).
QUICK_MIN_SAMPLES = 7
QUICK_SAMPLES_PER_PASS = 5

# More alternating passes than this is a typo, not a measurement (each is one asv run per commit).
MAX_PASSES = 50

# asv's message when --bench selected nothing (it exits 1, as for any other error).
_NO_BENCHMARKS = "No benchmarks selected"


def quick_attributes(passes: int = 1) -> list[str]:
    """asv -a overrides for --quick when the samples are collected over `passes` runs."""
    repeat = max(QUICK_SAMPLES_PER_PASS, -(-QUICK_MIN_SAMPLES // passes))
    return ["rounds=1", f"repeat={repeat}", "warmup_time=0.05"]


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
            f"--machine={machine}",
            f"--config={project.config_path}",
        ],
        cwd=project.root,
        env=_asv_environ(project),
        echo=None,
        log=log,
    )
    if rc != 0:
        raise PerfError(f"asv machine --yes --machine={machine} exited {rc}:\n" + "\n".join(log))
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
    if bench is not None:
        check_regex(bench)
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
    pass_tag: PassTag | None = None,
    echo: Echo | None = _echo_stderr,
) -> RunOutcome:
    """Run the benchmarks of ``commit`` in this interpreter and record them under its hash.

    HEAD runs the working tree as it is. Any other commit runs that commit's benchmarks and
    code from a ``git archive`` extracted to a temporary folder, imported ahead of the
    installed package (``ASV_PYTHONPATH``) with this interpreter's dependencies: that is how
    a job measures a merge-base and its pull request on the same machine, minutes apart.
    ``python`` (default: this interpreter) must have ml-harness's dependencies and asv.
    ``append_samples`` adds to the commit's recorded samples instead of replacing them;
    ``passes`` is how many such runs a --quick measurement is spread over (see run_interleaved);
    ``pass_tag`` labels the samples this run adds (results.record_pass), so that the gate can
    pair them with the other commit's samples of the same pass.
    """
    python = python or python_path()
    if not (os.path.isabs(python) and os.path.isfile(python)):
        raise PerfError(f"python {python!r} is not an interpreter's absolute path")
    machine = resolve_machine(machine)
    regex = bench_regex(group, bench)
    project = Project.load(root)
    sha = resolve_commit(project.root, commit)
    head = resolve_commit(project.root, "HEAD")
    ensure_machine(project, machine, echo=echo)
    log: list[str] = []
    environment = env_name(python)
    before = load_results(project, machine, sha).get(environment, {})

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
            f"--config={config}",
            f"--environment={env_spec(python)}",
            f"--machine={machine}",
            f"--set-commit-hash={sha}",
            "--record-samples",
            "--show-stderr",
        ]
        if append_samples:
            cmd.append("--append-samples")
        if regex:
            cmd.append(f"--bench={regex}")
        if quick:
            cmd += [f"--attribute={attribute}" for attribute in quick_attributes(passes)]
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
    if rc != 0 and any(_NO_BENCHMARKS in line for line in log):
        what = f"no benchmark matched {bench!r}" if bench else "no benchmark"
        raise PerfError(
            f"{what} in group {group!r} (asv's --bench={regex or ''}) among the benchmarks of "
            f"{project.benchmark_dir.name}/ at {sha[:10]}: nothing was measured. Names look "
            "like bench_harness.AssertClose.time_close; `asv check` lists them"
        )
    record_pass(
        project,
        machine,
        sha,
        environment,
        before,
        load_results(project, machine, sha).get(environment, {}),
        pass_tag or (uuid.uuid4().hex, 0),
        appended=append_samples,
    )
    # asv run: 0 ok, 2 a benchmark failed, 1 usage or environment error.
    return RunOutcome(
        exit_code=0 if rc == 0 else 1,
        commit=sha,
        machine=machine,
        env_name=environment,
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
    append: bool = False,
    echo: Echo | None = _echo_stderr,
    **kwargs: Any,
) -> list[RunOutcome]:
    """Measure several commits in alternation: base, head, base, head, ... appending samples.

    A machine's speed drifts over minutes (other jobs, clocks, a noisy neighbour on a VM); runs
    that alternate spread the drift over both sides instead of handing it to one of them, as
    asv's own --interleave-rounds does for the environments it builds. kwargs go to
    run_benchmarks. Every run happens even when one reports failing benchmarks: their
    results are recorded all the same and the gate reports them. The first pass replaces the
    commits' samples unless ``append`` (a re-measure adds to what is there). Each pass's samples
    are tagged with this call's session and the pass's index (results.record_pass).
    """
    if not 1 <= passes <= MAX_PASSES:
        raise PerfError(f"passes must be between 1 and {MAX_PASSES}, got {passes}")
    session = uuid.uuid4().hex
    outcomes = []
    for n in range(passes):
        for commit in commits:
            if echo and len(commits) > 1:
                echo(f"harness perf: pass {n + 1} of {passes}, {commit}")
            outcome = run_benchmarks(
                root,
                commit=commit,
                append_samples=append or n > 0,
                passes=passes,
                pass_tag=(session, n),
                echo=echo,
                **kwargs,
            )
            outcomes.append(outcome)
    return outcomes
