"""Performance: asv runs, the regression gate, the offline dashboard and the ``harness ci`` step.

Library code, no click: ``harness.cli.perf`` is its command line. docs/perf.md is the user
guide (baseline policy, exit codes, the factor); the asv pitfalls this module works around are
recorded in PLATFORM.md ("asv (0.6.6) and pytest-benchmark"):

- Benchmarks always run in the current interpreter (``-E existing:PY``) and ``PY`` is always
  spelled ``os.path.abspath(sys.executable)``: asv derives the environment name from that literal
  path, and results recorded under two spellings never line up.
- ``asv run -E existing`` saves nothing without ``--set-commit-hash``; ``asv continuous``
  refuses existing environments; ``asv compare`` exits 0 whatever it finds. So :func:`gate`
  reads the result files itself and applies asv's own statistical test
  (``asv.commands.compare._is_result_better``: Mann-Whitney U at p < 0.002 on the recorded
  samples, confidence intervals otherwise, then the factor) and turns "nothing comparable"
  into exit code 2 instead of a silent pass.
- The published page loads its JavaScript from CDNs; :func:`publish` fetches the same
  libraries at pinned versions with ``npm pack`` and points the page at local copies.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_OK = 0
EXIT_REGRESSION = 1  # a benchmark significantly slower than the factor allows, or failing
EXIT_NOT_COMPARABLE = 2  # nothing could be compared: missing results, env or code mismatch

# Ratios seen for identical code on a quiet 2-core CI machine: 0.90-1.06 (PLATFORM.md), so 1.2
# is the floor there. With the machine shared by other jobs (load 2-5 on 2 cores), unchanged
# code measured base/head alternately still reached 1.21-1.26 in about 1 pair of 20, and asv's
# test called those significant: 1.3 is the factor that noise allows (docs/perf.md). A 2x
# slowdown read 1.46-3.1 under the same load. Quiet dedicated runners (the GPU machine) can
# pass --factor 1.2.
DEFAULT_FACTOR = 1.3
DEFAULT_MACHINE = "ci-cpu"
MACHINE_ENV_VAR = "HARNESS_PERF_MACHINE"
VENDOR_DIR_ENV_VAR = "HARNESS_PERF_VENDOR_DIR"

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


# How far back along the default branch's first-parent history a missing baseline is looked
# for (a merge-base whose perf job was skipped or failed still leaves its parents).
BASELINE_SEARCH_DEPTH = 20


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


def _load_json(path: Path) -> dict:
    from asv import util as asv_util

    return asv_util.load_json(str(path), js_comments=True)


def python_path() -> str:
    """The interpreter spelled the one way every run uses (symlinks kept: a venv is a symlink)."""
    return os.path.abspath(sys.executable)


def env_spec(python: str | None = None) -> str:
    return f"existing:{python or python_path()}"


def env_name(python: str | None = None) -> str:
    """The environment name asv records for ``-E existing:PYTHON``."""
    from asv.environment import get_env_name

    return get_env_name("existing", (python or python_path()).replace(os.path.sep, "_"), {}, {})


def default_machine() -> str:
    return os.environ.get(MACHINE_ENV_VAR) or DEFAULT_MACHINE


def _git(root: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise PerfError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip()}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def resolve_commit(root: Path, ref: str) -> str:
    """Full hash of ``ref``; a clear error when the commit is not in this clone."""
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


def _stream(cmd: Sequence[str], *, cwd: Path, env: dict[str, str], echo: Echo | None,
            log: list[str]) -> int:
    """Run cmd, echo its output line by line as it comes (progress), keep it in log."""
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        log.append(line)
        if echo:
            echo(line)
    return proc.wait()


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
        [sys.executable, "-m", "asv", "machine", "--yes", "--machine", machine,
         "--config", str(project.config_path)],
        cwd=project.root, env=_asv_environ(project), echo=None, log=log,
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
            pythonpath = [str(code_dir)] + ([os.environ["ASV_PYTHONPATH"]]
                                            if os.environ.get("ASV_PYTHONPATH") else [])
            extra_env["ASV_PYTHONPATH"] = os.pathsep.join(pythonpath)
            source = f"git archive of {sha[:10]}"

        cmd = [
            sys.executable, "-m", "asv", "run", "--config", str(config),
            "-E", env_spec(python), "--machine", machine, "--set-commit-hash", sha,
            "--record-samples", "--show-stderr",
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
            echo(f"harness perf: benchmarking {label}, {source}, on machine "
                 f"{machine!r}, env {env_name(python)!r}{', quick' if quick else ''}"
                 f"{', appending samples' if append_samples else ''}")
        rc = _stream(cmd, cwd=project.root, env=_asv_environ(project, extra_env), echo=echo,
                     log=log)
    # asv run: 0 ok, 2 a benchmark failed, 1 usage or environment error.
    return RunOutcome(
        exit_code=0 if rc == 0 else 1, commit=sha, machine=machine, env_name=env_name(python),
        source=source, log=log,
    )


def _archived_config(project: Project, sha: str, tmp: Path) -> tuple[Path, Path]:
    """Extract commit sha to tmp/code and write a config that benchmarks it into our results."""
    code_dir = tmp / "code"
    code_dir.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha], cwd=project.root, capture_output=True,
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
            outcome = run_benchmarks(root, commit=commit, append_samples=n > 0, passes=passes,
                                     echo=echo, **kwargs)
            outcomes.append(outcome)
    return outcomes


# --------------------------------------------------------------------------------------------
# The gate


@dataclasses.dataclass
class Row:
    """One benchmark (with its parameters) in one environment, base against head."""

    name: str
    env_name: str
    status: str  # the keys of STATUS_MARK, or a "not comparable" reason
    base: float | None
    head: float | None
    unit: str | None
    n_base: int | None
    n_head: int | None
    ratio: float | None = None

    @property
    def comparable(self) -> bool:
        return self.status in ("regressed", "improved", "unchanged", "slower, not significant",
                               "faster, not significant")


# Benchmarks named track_info_* are shown with their ratio but never decide the exit code: they
# track a noisy derived number with no samples for the significance test (README.md there).
INFORMATIONAL = re.compile(r"\.track_info_")

STATUS_MARK = {
    "informational": "i",
    "regressed": "❌",
    "failed in head": "❌",
    "improved": "✅",
    "unchanged": "",
    "slower, not significant": "~",
    "faster, not significant": "~",
}


@dataclasses.dataclass
class GateReport:
    exit_code: int
    base: str
    head: str
    machine: str
    factor: float
    rows: list[Row]
    problems: list[str]  # why something was not comparable (shown above the table)

    @property
    def verdict(self) -> str:
        if self.exit_code == EXIT_REGRESSION:
            bad = [r for r in self.rows if r.status in ("regressed", "failed in head")]
            return f"REGRESSION: {len(bad)} benchmark(s) significantly slower or failing"
        if self.exit_code == EXIT_NOT_COMPARABLE:
            return "NOT COMPARABLE: nothing could be compared (see above)"
        n = sum(r.comparable for r in self.rows)
        return f"OK: no significant regression in {n} comparable benchmark(s)"

    def table(self) -> str:
        """The ratio table as GitHub markdown."""
        lines = [
            f"| | benchmark | base `{self.base[:10]}` | head `{self.head[:10]}` | ratio | "
            f"samples | status |",
            "|---|---|---|---|---|---|---|",
        ]
        envs = {r.env_name for r in self.rows}
        for r in self.rows:
            name = r.name if len(envs) == 1 else f"{r.name} [{r.env_name}]"
            ratio = f"{r.ratio:.2f}" if r.ratio is not None else "n/a"
            samples = f"{_n(r.n_base)}/{_n(r.n_head)}"
            base = "-" if r.status.startswith("new in head") else _human(r.base, r.unit)
            head = "-" if r.status == "missing in head" else _human(r.head, r.unit)
            lines.append(
                f"| {STATUS_MARK.get(r.status, '?')} | `{name}` | {base} | {head} | {ratio} | "
                f"{samples} | {r.status} |"
            )
        return "\n".join(lines)

    def markdown(self) -> str:
        head = (f"Gate: base `{self.base[:10]}` vs head `{self.head[:10]}` on machine "
                f"`{self.machine}`, factor {self.factor:g} with asv's significance test.")
        parts = [head]
        parts += [f"- {p}" for p in self.problems]
        if self.rows:
            parts.append(self.table())
        parts.append(f"**{self.verdict}** (exit {self.exit_code})")
        return "\n\n".join(parts)

    def to_json(self) -> dict:
        return {
            "exit_code": self.exit_code, "base": self.base, "head": self.head,
            "machine": self.machine, "factor": self.factor, "problems": self.problems,
            "verdict": self.verdict,
            # NaN (a skipped benchmark) is not JSON: it becomes null, like a missing value.
            "rows": [{k: None if isinstance(v, float) and math.isnan(v) else v
                      for k, v in dataclasses.asdict(r).items()} for r in self.rows],
        }


def _n(n: int | None) -> str:
    return "-" if n is None else str(n)


def _human(value: float | None, unit: str | None) -> str:
    from asv.util import human_value

    if value is None:
        return "failed"
    if isinstance(value, float) and math.isnan(value):
        return "skipped"
    if unit in ("seconds", "bytes"):
        return human_value(value, unit)
    return f"{value:.4g}" + (f" {unit}" if unit and unit != "unit" else "")


@dataclasses.dataclass
class _Measurement:
    value: float | None
    stats: dict | None
    samples: list[float] | None
    version: str | None


def _load_results(project: Project, machine: str, sha: str) -> dict[str, dict[str, _Measurement]]:
    """{env name: {benchmark name with params: measurement}} for one commit on one machine."""
    from asv.commands.compare import unroll_result
    from asv.results import iter_results_for_machine_and_hash

    by_env: dict[str, dict[str, _Measurement]] = {}
    if not (project.results_dir / machine).is_dir():
        return by_env
    for result in iter_results_for_machine_and_hash(str(project.results_dir), machine, sha):
        rows = by_env.setdefault(result.env_name, {})
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            version = result.benchmark_version.get(key)
            for name, value, stats, samples in unroll_result(
                key, params,
                result.get_result_value(key, params),
                result.get_result_stats(key, params),
                result.get_result_samples(key, params),
            ):
                rows[name] = _Measurement(value, stats, samples, version)
    return by_env


def _units(project: Project) -> dict[str, str]:
    path = project.results_dir / "benchmarks.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v.get("unit", "") for k, v in data.items() if isinstance(v, dict)}


def has_results(root: Path | str, commit: str, *, machine: str | None = None,
                env: str | None = None) -> bool:
    """Whether results for commit exist on machine (and in env, when given)."""
    project = Project.load(root)
    by_env = _load_results(project, machine or default_machine(), resolve_commit(project.root,
                                                                                    commit))
    return bool(by_env.get(env)) if env else any(by_env.values())


def gate(
    root: Path | str,
    base: str,
    head: str,
    *,
    factor: float = DEFAULT_FACTOR,
    machine: str | None = None,
) -> GateReport:
    """Compare the results of two commits: exit 0 nothing regressed, 1 regression, 2 nothing
    comparable. Never passes silently: every benchmark appears in the rows with its status."""
    from asv.commands.compare import _is_result_better

    if not factor >= 1.0:
        raise PerfError(f"--factor must be >= 1.0 (a ratio head/base), got {factor}")
    project = Project.load(root)
    machine = machine or default_machine()
    base_sha = resolve_commit(project.root, base)
    head_sha = resolve_commit(project.root, head)

    def report(code: int, rows: list[Row], problems: list[str]) -> GateReport:
        return GateReport(code, base_sha, head_sha, machine, factor, rows, problems)

    machines = sorted(p.parent.name for p in project.results_dir.glob("*/machine.json"))
    if machine not in machines:
        return report(EXIT_NOT_COMPARABLE, [], [
            f"no results for machine `{machine}` in {project.results_dir} "
            f"(machines with results: {', '.join(machines) or 'none'})"])
    base_results = _load_results(project, machine, base_sha)
    head_results = _load_results(project, machine, head_sha)
    problems = []
    for label, sha, found in (("base", base_sha, base_results), ("head", head_sha, head_results)):
        if not any(found.values()):
            problems.append(f"missing results: no results for {label} {sha[:10]} on machine "
                            f"`{machine}` (run `harness perf run --commit {sha[:10]}`)")
    if problems:
        return report(EXIT_NOT_COMPARABLE, [], problems)

    common_envs = sorted(set(base_results) & set(head_results))
    if not common_envs:
        return report(EXIT_NOT_COMPARABLE, [], [
            "environment-name mismatch: base ran in "
            f"{', '.join(f'`{e}`' for e in sorted(base_results))}, head in "
            f"{', '.join(f'`{e}`' for e in sorted(head_results))}. asv names an existing "
            "environment after the literal python path: run both with the same interpreter "
            f"path (this one is `{env_name()}`)"])
    for label, found in (("base", base_results), ("head", head_results)):
        for other in sorted(set(found) - set(common_envs)):
            problems.append(f"{label} also has results in environment `{other}`, which the "
                            "other side lacks: not compared")

    units = _units(project)
    rows: list[Row] = []
    for env in common_envs:
        b_all, h_all = base_results[env], head_results[env]
        for name in sorted(set(b_all) | set(h_all)):
            unit = units.get(name.split("(", 1)[0])
            b, h = b_all.get(name), h_all.get(name)
            row = Row(name, env, "", b.value if b else None, h.value if h else None, unit,
                      _count(b), _count(h))
            if b is None:
                row.status = "new in head, no baseline"
            elif h is None:
                row.status = "missing in head"
            elif b.version != h.version:
                row.status = "benchmark code changed, not comparable"
            elif INFORMATIONAL.search(name) and not (h.value is None or b.value is None):
                row.status = "informational"
                if not (_isnan(b.value) or _isnan(h.value)) and b.value:
                    row.ratio = h.value / b.value
            elif h.value is None:
                row.status = "failed in head"
            elif b.value is None:
                row.status = "failed in base, not comparable"
            elif _isnan(b.value) or _isnan(h.value):
                row.status = "skipped, not comparable"
            else:
                row.ratio = h.value / b.value if b.value else math.inf
                ss_b, ss_h = (b.stats, b.samples), (h.stats, h.samples)
                if _is_result_better(b.value, h.value, ss_b, ss_h, factor):
                    row.status = "regressed"
                elif _is_result_better(h.value, b.value, ss_h, ss_b, factor):
                    row.status = "improved"
                elif row.ratio > factor:
                    row.status = "slower, not significant"
                elif row.ratio < 1 / factor:
                    row.status = "faster, not significant"
                else:
                    row.status = "unchanged"
            rows.append(row)

    if any(r.status in ("regressed", "failed in head") for r in rows):
        code = EXIT_REGRESSION
    elif not any(r.comparable for r in rows):
        code = EXIT_NOT_COMPARABLE
        changed = sum(r.status.startswith("benchmark code changed") for r in rows)
        problems.append(
            f"nothing comparable: {len(rows)} benchmark(s), {changed} with changed code, the "
            "rest skipped, failed, new or missing on one side")
    else:
        code = EXIT_OK
    return report(code, rows, problems)


def _count(m: _Measurement | None) -> int | None:
    if m is None:
        return None
    if m.samples is not None:
        return len(m.samples)
    if m.stats and isinstance(m.stats, dict) and "repeat" in m.stats:
        return int(m.stats["repeat"])
    return None


def _isnan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)


# --------------------------------------------------------------------------------------------
# Baselines: which commit a change is compared with


def default_branch_refs(root: Path) -> list[str]:
    """Refs that may name the default branch, most specific first."""
    refs = []
    for var in ("HARNESS_PERF_BASE_REF", "GITHUB_BASE_REF"):
        value = os.environ.get(var)
        if value:
            refs += [f"origin/{value}", value] if var == "GITHUB_BASE_REF" else [value]
    origin_head = _git(root, "symbolic-ref", "--quiet", "refs/remotes/origin/HEAD", check=False)
    if origin_head:
        refs.append(origin_head.removeprefix("refs/remotes/"))
    refs += ["origin/main", "main", "origin/master", "master"]
    return list(dict.fromkeys(refs))


def merge_base(root: Path | str, *, base_ref: str | None = None) -> tuple[str, str] | None:
    """(sha, description) of the commit a change is compared with, or None.

    The merge-base of HEAD with the default branch; on the default branch itself (the
    merge-base is HEAD), HEAD's first parent.
    """
    root = Path(root)
    head = resolve_commit(root, "HEAD")
    for ref in [base_ref] if base_ref else default_branch_refs(root):
        if not _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False):
            continue
        mb = _git(root, "merge-base", "HEAD", ref, check=False)
        if not mb:
            continue
        if mb != head:
            return mb, f"merge-base of HEAD and {ref}"
        parent = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^1^{commit}", check=False)
        if parent:
            return parent, f"HEAD's first parent (HEAD is on {ref})"
        return None
    return None


def find_baseline(root: Path | str, start: str, *, machine: str, env: str,
                  depth: int = BASELINE_SEARCH_DEPTH) -> str | None:
    """The nearest first-parent ancestor of start (itself included) with results in env."""
    root = Path(root)
    project = Project.load(root)
    shas = _git(root, "rev-list", "--first-parent", f"--max-count={depth}", start,
                check=False).split()
    for sha in shas:
        if _load_results(project, machine, sha).get(env):
            return sha
    return None


# --------------------------------------------------------------------------------------------
# The `harness ci` step


@dataclasses.dataclass
class PerfStepResult:
    """What the perf step of ``harness ci`` found.

    exit_code: 0 passed (or skipped without a baseline, unless a baseline is required), 1 a
    significant regression or a failing benchmark, 2 nothing comparable (or no baseline when
    ``require_baseline``). markdown: the summary for the report. skipped_reason: why the gate
    did not compare anything, shown in the report; None when it did.
    """

    exit_code: int
    markdown: str
    skipped_reason: str | None


def ci_step(
    repo_root: Path,
    report_dir: Path,
    *,
    quick: bool = True,
    require_baseline: bool = False,
    measure_base: str = "never",
    passes: int = 2,
    group: str = "cpu",
    bench: str | None = None,
    machine: str | None = None,
    factor: float = DEFAULT_FACTOR,
    base_ref: str | None = None,
    echo: Echo | None = _echo_stderr,
) -> PerfStepResult:
    """Run the CPU benchmarks (or ``group``) for HEAD and gate them against the baseline.

    docs/perf.md describes the policy.

    The base is the merge-base of HEAD with the default branch (HEAD's first parent on the
    default branch itself). measure_base says where its results come from:

    - "never" (``harness ci`` locally, the GPU runner): stored results of the nearest
      first-parent ancestor of the base that has results on this machine and environment.
    - "always" (the CPU pull-request job): the base is measured in this run, interleaved with
      HEAD; results stored by other machines of the same name are not trusted.
    - "missing": stored results when there are some, else measure as "always".

    When the base is measured here, base and HEAD alternate over ``passes`` runs each: more
    passes spread a drifting machine's speed more evenly over both sides, at one asv start-up
    per pass. ``bench`` narrows the group with a regex (as ``harness perf run --bench``).
    Without a baseline the step says so (skipped_reason) and exits 0, or 2 under
    ``require_baseline``. Writes perf.md, perf-gate.json and perf-run.log into report_dir.
    """
    if measure_base not in ("never", "missing", "always"):
        raise ValueError(f"measure_base must be never, missing or always, got {measure_base!r}")
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _ci_step(Path(repo_root), report_dir, quick=quick,
                        require_baseline=require_baseline, measure_base=measure_base,
                        passes=passes, group=group, bench=bench,
                        machine=machine or default_machine(),
                        factor=factor, base_ref=base_ref, echo=echo)
    except PerfError as exc:  # no asv.conf.json, not a git checkout, unknown base ref...
        reason = f"perf step could not run: {exc}"
        markdown = f"### Performance\n\n**{reason}** (exit {EXIT_NOT_COMPARABLE})"
        (report_dir / "perf.md").write_text(markdown + "\n")
        return PerfStepResult(EXIT_NOT_COMPARABLE, markdown, reason)


def _ci_step(repo_root: Path, report_dir: Path, *, quick: bool, require_baseline: bool,
             measure_base: str, passes: int, group: str, bench: str | None, machine: str,
             factor: float, base_ref: str | None, echo: Echo | None) -> PerfStepResult:
    Project.load(repo_root)  # fails first, and clearly, where there is no asv project
    env = env_name()
    head = resolve_commit(Path(repo_root), "HEAD")
    title = (f"### Performance (asv, machine `{machine}`, "
             f"{'quick' if quick else 'full'} run, {group.upper()} group)")
    log: list[str] = []
    run_kwargs = dict(group=group, bench=bench, quick=quick, machine=machine, echo=echo)

    def finish(code: int, body: list[str], skipped: str | None, gate_report=None):
        markdown = "\n\n".join([title, *body])
        (report_dir / "perf.md").write_text(markdown + "\n")
        (report_dir / "perf-run.log").write_text("\n".join(log) + "\n")
        if gate_report is not None:
            (report_dir / "perf-gate.json").write_text(
                json.dumps(gate_report.to_json(), indent=2) + "\n")
        return PerfStepResult(code, markdown, skipped)

    found = merge_base(repo_root, base_ref=base_ref)
    baseline, base_note, base_problem = None, "", ""
    outcomes: list[RunOutcome] = []
    if found:
        start, how = found
        if measure_base != "always":
            baseline = find_baseline(repo_root, start, machine=machine, env=env)
        if baseline is None and measure_base != "never":
            try:
                outcomes = run_interleaved(repo_root, [start, "HEAD"], passes=passes,
                                           **run_kwargs)
            except PerfError as exc:  # e.g. the base predates the benchmarks
                base_problem = f" (measuring it failed: {exc})"
            else:
                if has_results(repo_root, start, machine=machine, env=env):
                    baseline = start
        if baseline is not None:
            if baseline == start:
                origin = "measured in this run" if outcomes else "stored results"
                base_note = f"Baseline: `{baseline[:10]}` ({how}; {origin})."
            else:
                base_note = (f"Baseline: `{baseline[:10]}`, the nearest first-parent ancestor "
                             f"with stored results of the {how} ({start[:10]}).")
    if not outcomes:
        outcomes = [run_benchmarks(repo_root, commit="HEAD", **run_kwargs)]
    for outcome in outcomes:
        log += outcome.log
    head_outcome = outcomes[-1]
    run_note = f"Head: `{head[:10]}` ({head_outcome.source}), environment `{env}`."
    failed_run = any(o.exit_code != 0 for o in outcomes)
    run_failure = ("**asv run reported failing benchmarks or an error** (exit 1): see "
                   f"{report_dir / 'perf-run.log'}.")

    if baseline is None:
        if found is None:
            reason = ("no baseline: HEAD has no merge-base with the default branch "
                      f"(tried {', '.join(default_branch_refs(Path(repo_root)))})")
        elif measure_base == "never":
            reason = (f"no baseline: no stored results for the {found[1]} ({found[0][:10]}) or "
                      f"its {BASELINE_SEARCH_DEPTH - 1} first-parent ancestors on machine "
                      f"`{machine}` in environment `{env}`")
        else:
            reason = (f"no baseline: the {found[1]} ({found[0][:10]}) has no results in "
                      f"environment `{env}`{base_problem}")
        code = (EXIT_REGRESSION if failed_run else
                EXIT_NOT_COMPARABLE if require_baseline else EXIT_OK)
        consequence = ("this fails the step (a baseline is required here)" if require_baseline
                       else "HEAD's results are recorded and can serve as a baseline later")
        body = [run_note, f"**Perf gate skipped: {reason}**; {consequence}."]
        if failed_run:
            body.append(run_failure)
        return finish(code, body, reason)

    report = gate(repo_root, baseline, head, factor=factor, machine=machine)
    code = report.exit_code
    if failed_run and code == EXIT_OK:
        code = EXIT_REGRESSION
    body = [base_note, run_note, report.markdown()]
    if failed_run:
        body.append(run_failure)
    skipped = None
    if report.exit_code == EXIT_NOT_COMPARABLE:
        skipped = "nothing comparable: " + "; ".join(report.problems)
    return finish(code, body, skipped, report)


# --------------------------------------------------------------------------------------------
# The dashboard, offline


@dataclasses.dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    integrity: str  # the registry's dist.integrity of that exact tarball


# The libraries asv 0.6.6's index.html loads from CDNs, at the versions it asks for. The npm
# registry has no stupidtable 1.0.1 (cdnjs' name for it); stupid-table-plugin 1.1.3 is the only
# published version and keeps the same $.fn.stupidtable API.
NPM_PACKAGES = {
    "jquery": NpmPackage("jquery", "3.3.1", "sha512-Ubldcmxp5np52/ENotGxlLe6aGMvmF4R8S6tZjsP6Knsaxd/xp3Zrh50cG93lR6nPXyUFwzN3ZSOQI0wRJNdGg=="),  # noqa: E501
    "flot": NpmPackage("flot", "0.8.3", "sha512-xg2otcTJDvS+ERK+my4wxG/ASq90QURXtoM4LhacCq0jQW2jbyjdttbRNqU2cPykrpMvJ6b2uSp6SAgYAzj9tQ=="),  # noqa: E501
    "flot-orderbars": NpmPackage("flot-orderbars", "1.0.0", "sha512-Jv51fvzevUjNXEeozpwEKfPjhiZhfiJddv0WHjduUTCmSF+7T5K7C9c9Y1wIVmUhDBv5fLMjgbwKecT0GIKPZA=="),  # noqa: E501
    "stupid-table-plugin": NpmPackage("stupid-table-plugin", "1.1.3", "sha512-2Vk7XouQPxUQPRe9w0Fu7ZZ8kHLK7rDoLMsCgtKxRNJ7f4dSOGvW9CkHsq5wD6QsaEnWoyLBYH3xOEsrK3yWBg=="),  # noqa: E501,
    "blueimp-md5": NpmPackage("blueimp-md5", "2.19.0", "sha512-DRQrD6gJyy8FbiE4s+bDoXS9hiW3Vbx5uCdwvcCf3zLHL+Iv7LtGHLpr+GZV8rHG8tK766FGYBwRbu8pELTt+w=="),  # noqa: E501
    "bootstrap": NpmPackage("bootstrap", "3.1.1", "sha512-TAzqS8E/ISpVHP29gYhy+1NSV+FJwApDVQhDfgLYsIuUDJiqJzH2DfORN5tiu+Ie2iBLrzEG34t4Rf465cigqg=="),  # noqa: E501
}

# CDN URL in asv's index.html -> (npm package, file inside the package). A URL not listed here
# makes publish fail rather than ship a page that needs the network.
CDN_ASSETS = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js":
        ("flot", "jquery.flot.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js":
        ("flot", "jquery.flot.time.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js":
        ("flot", "jquery.flot.selection.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js":
        ("flot", "jquery.flot.categories.js"),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js":
        ("flot-orderbars", "js/jquery.flot.orderBars.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js":
        ("stupid-table-plugin", "stupidtable.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js":
        ("blueimp-md5", "js/md5.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js":
        ("bootstrap", "dist/js/bootstrap.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css":
        ("bootstrap", "dist/css/bootstrap.min.css"),
}
# Files a vendored file refers to by relative path (bootstrap's css loads ../fonts/*).
_COMPANIONS = {"bootstrap": ["dist/fonts"]}

_RESOURCE_TAG = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
_EXTERNAL_ATTR = re.compile(r"""\b(src|href)\s*=\s*(["'])(https?:)?//[^"']*\2""", re.IGNORECASE)
_SRI_ATTRS = re.compile(r"""\s+(integrity|crossorigin|referrerpolicy)\s*=\s*(["'])[^"']*\2""",
                        re.IGNORECASE)


def _package_dir(project: Project, pkg: NpmPackage) -> Path:
    return project.vendor_dir / f"{pkg.name}-{pkg.version}" / "package"


def fetch_npm_packages(root: Path | str, *, echo: Echo | None = _echo_stderr) -> dict[str, Path]:
    """Fetch each pinned package once with ``npm pack`` into .asv/vendor (never committed)."""
    project = Project.load(root)
    dirs = {}
    for key, pkg in NPM_PACKAGES.items():
        target = _package_dir(project, pkg)
        if not (target / "package.json").is_file():
            _npm_pack(project, pkg, target, echo)
        meta = json.loads((target / "package.json").read_text())
        if meta.get("version") != pkg.version:
            raise PerfError(f"{target} holds {pkg.name} {meta.get('version')}, expected "
                            f"{pkg.version}: delete {target.parent} and publish again")
        dirs[key] = target
    return dirs


def _npm_pack(project: Project, pkg: NpmPackage, target: Path, echo: Echo | None) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise PerfError("npm not found: the dashboard fetches its JavaScript libraries with "
                        "`npm pack` at build time; install Node.js (apt-get install -y npm)")
    spec = f"{pkg.name}@{pkg.version}"
    if echo:
        echo(f"harness perf: npm pack {spec}")
    with tempfile.TemporaryDirectory(prefix="harness-npm-") as tmp:
        env = dict(os.environ, npm_config_cache=str(project.vendor_dir / "npm-cache"),
                   npm_config_update_notifier="false", npm_config_fund="false")
        proc = subprocess.run([npm, "pack", spec, "--json", "--pack-destination", tmp],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise PerfError(f"npm pack {spec} failed (exit {proc.returncode}): "
                            f"{proc.stderr.strip()[-1500:]}")
        info = json.loads(proc.stdout)[0]
        if pkg.integrity and info.get("integrity") != pkg.integrity:
            raise PerfError(f"npm pack {spec}: integrity {info.get('integrity')} differs from "
                            f"the pinned {pkg.integrity}; refusing to vendor it")
        with tarfile.open(Path(tmp) / info["filename"]) as tar:
            staging = Path(tmp) / "x"
            tar.extractall(staging, filter="data")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(staging / "package"), str(target))


def make_offline(html_dir: Path, packages: dict[str, Path]) -> list[str]:
    """Copy the vendored files into html_dir/vendor and point index.html at them.

    Drops the SRI integrity (and crossorigin, referrerpolicy) attributes: the local copies
    are npm's files, not byte-identical to the CDN's minified builds. Returns the local paths.
    Raises PerfError when a script or stylesheet would still load from the network.
    """
    index = html_dir / "index.html"
    text = index.read_text()
    used = []

    def rewrite(match: re.Match) -> str:
        tag = match.group(0)
        ext = _EXTERNAL_ATTR.search(tag)
        if not ext:
            return tag
        if tag.lower().startswith("<link") and "stylesheet" not in tag.lower():
            return tag  # e.g. a feed link: not loaded by the page
        url = ext.group(0).split("=", 1)[1].strip().strip("\"'")
        if url not in CDN_ASSETS:
            raise PerfError(f"{index} loads {url} from the network and no local copy is known: "
                            "add it to harness.perf.CDN_ASSETS")
        key, path = CDN_ASSETS[url]
        pkg = NPM_PACKAGES[key]
        local = f"vendor/{pkg.name}-{pkg.version}/{path}"
        for rel in [path, *_COMPANIONS.get(key, [])]:
            src, dst = packages[key] / rel, html_dir / "vendor" / f"{pkg.name}-{pkg.version}" / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        used.append(local)
        tag = tag.replace(ext.group(0), f'{ext.group(1)}="{local}"')
        return _SRI_ATTRS.sub("", tag)

    text = _RESOURCE_TAG.sub(rewrite, text)
    index.write_text(text)
    return used


def publish(root: Path | str, *, echo: Echo | None = _echo_stderr) -> Path:
    """``asv publish`` into the html dir (which asv deletes first), then make it offline."""
    project = Project.load(root)
    packages = fetch_npm_packages(project.root, echo=echo)  # before asv deletes anything
    if not any(project.results_dir.glob("*/machine.json")):
        raise PerfError(f"no results in {project.results_dir}: run `harness perf run` first")
    log: list[str] = []
    rc = _stream([sys.executable, "-m", "asv", "publish", "--config", str(project.config_path)],
                 cwd=project.root, env=_asv_environ(project), echo=echo, log=log)
    if rc != 0:
        raise PerfError(f"asv publish exited {rc}:\n" + "\n".join(log[-30:]))
    used = make_offline(project.html_dir, packages)
    if echo:
        echo(f"harness perf: dashboard in {project.html_dir} (offline: {len(used)} local "
             "scripts and stylesheets)")
    return project.html_dir


class _Handler(http.server.SimpleHTTPRequestHandler):
    on_request: Callable[[str], None] | None = None

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        if self.on_request is not None:
            self.on_request(self.path)


def dashboard_server(
    html_dir: Path | str,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    on_request: Callable[[str], None] | None = None,
) -> http.server.ThreadingHTTPServer:
    """An HTTP server for the published dashboard, bound to loopback (unlike `asv preview`,
    which listens on 0.0.0.0). The page needs HTTP: it loads its JSON by XHR. on_request is
    called with the path of every request served (tests use it to see what the page loaded)."""
    html_dir = Path(html_dir)
    if not (html_dir / "index.html").is_file():
        raise PerfError(f"{html_dir}/index.html not found: run `harness perf publish` first")
    handler_class = type("Handler", (_Handler,), {"on_request": staticmethod(on_request)}
                         if on_request else {})
    handler = functools.partial(handler_class, directory=str(html_dir))
    return http.server.ThreadingHTTPServer((host, port), handler)
