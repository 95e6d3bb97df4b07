"""A throwaway asv project in a temporary git repository, benchmarked for real by the perf tests.

One benchmark, ``bench_tiny.Loop.time_work``, times a pure-Python loop whose length ``N`` lives
in the project's code (``benchmarks/tinylib.py``), so a commit can make it slower without
touching the benchmark (a changed benchmark body is "not comparable" to the gate).

Used by the perf gate and dashboard tests beside it and by ``docs/tools/perf_gate_noise.py``:
the noise experiment behind the tests' sample counts (docs/perf.md) measures this very
project. It lives with the tests, not in ``harness.perf``: it is scaffolding for checking the
gate, of no use to a project that has its own benchmarks. The experiment puts this folder on
``sys.path`` to import it, as pytest does for the tests here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ASV_CONF = {
    "version": 1,
    "project": "tiny",
    "repo": ".",
    "dvcs": "git",
    "environment_type": "existing",
    "branches": ["HEAD"],
    "benchmark_dir": "benchmarks",
    "env_dir": ".asv/env",
    "results_dir": ".asv/results",
    "html_dir": ".asv/html",
}

# ~1 ms per call at N = 20,000 on a 2-core CI machine: long enough to time, short enough that a
# quick run of one benchmark takes a few seconds (a gate run of ~30 s).
BASE_N = 20_000
TINYLIB = '''"""The code under benchmark."""

N = {n}


def work(n):
    total = 0
    for i in range(n):
        total += i % 7
    return total
'''

_SAMPLING = """    rounds = 1
    repeat = {repeat}  # per pass; 4 passes of 5 give 20 samples per side
    warmup_time = 0.05

"""


def bench_source(arg: str = "tinylib.N", *, repeat: int | None = None, extra: str = "") -> str:
    """The text of ``benchmarks/bench_tiny.py``: ``Loop.time_work`` calls ``tinylib.work(arg)``.

    repeat: samples per benchmark per pass (with one round and a short warm-up; ``--quick``
    overrides it); None leaves asv's defaults. extra: more benchmark code appended (classes).
    """
    sampling = "" if repeat is None else _SAMPLING.format(repeat=repeat)
    return (
        "from . import tinylib\n\n\nclass Loop:\n"
        f"{sampling}    def time_work(self):\n        tinylib.work({arg})\n" + extra
    )


def git(repo: Path, *args: str) -> str:
    """``git ARGS`` in repo with a fixed identity (CI machines have none); returns stdout."""
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit(
    repo: Path,
    message: str,
    *,
    n: int | None = None,
    bench: str | None = None,
    readme: str | None = None,
) -> str:
    """Write what is given (the loop length n, the benchmark module's text, the README), commit
    everything on the current branch and return the new commit's hash."""
    if n is not None:
        (repo / "benchmarks" / "tinylib.py").write_text(TINYLIB.format(n=n))
    if bench is not None:
        (repo / "benchmarks" / "bench_tiny.py").write_text(bench)
    if readme is not None:
        (repo / "README.md").write_text(readme)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_repo(
    path: Path, *, bench: str | None = None, n: int = BASE_N, message: str = "base"
) -> tuple[Path, str]:
    """``path/tiny``: a git repository on branch main whose first commit holds the project
    (``bench``: the benchmark module, default :func:`bench_source`'s); returns (repo, its hash).
    """
    repo = path / "tiny"
    (repo / "benchmarks").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "asv.conf.json").write_text(json.dumps(ASV_CONF, indent=2))
    (repo / ".gitignore").write_text(".asv/\n")
    (repo / "benchmarks" / "__init__.py").write_text("")
    sha = commit(repo, message, n=n, bench=bench or bench_source(), readme="tiny\n")
    return repo, sha
