"""Interleaved A/B timing: base and head sampled alternately, one sample each, milliseconds apart.

Why: on a shared runner the load changes within seconds (another job starts; two busy loops on
2 cores slow a sample 2-30x). asv measures one commit per run, so base and head samples are at
least one asv start-up (seconds) apart even when the runs alternate, and a load swing between
them reads as a change. Here two long-lived worker processes, one with the base commit's code
(a ``git archive``, imported ahead of the installed package, as ``harness perf run --commit``
does) and one with the working tree, each set up the same benchmark with asv's own discovery
and then take one sample at a time on request: base, head, head, base, base, head ... (the order
alternates so that neither side is always first), timed in the worker's CPU time
(``time.process_time``): under load a sample's wall time is mostly how long the scheduler
kept it waiting, and that depends on the sample's length (one shorter than a time slice often
runs undisturbed), so even pairs milliseconds apart read a 2x slowdown as 1x or 12x in wall
time at load average 15; in CPU time they read 2.0 (docs/perf.md).

Every block of AB_BLOCK consecutive pairs is measured by a fresh pair of workers, both pinned
to the same CPU (the CPUs taken in turn, block by block): two long-lived processes running
identical code differ by a few percent for as long as they live (their memory layouts; the
core each was scheduled on, and what else ran on its sibling), and one pair of workers read
identical code as 1.13x and 1.20x, "significantly", over 20 pairs (docs/perf.md). Across fresh
pairs that difference is random, so the gate treats blocks, not pairs, as the independent
units (decision.compare_blocks). Pairs are taken sequentially (sequential.py): ``pairs``
first, more while the verdict is undecided, within a pair count and a time budget per
benchmark. Both workers get the same PYTHONHASHSEED, so that hashing is not one more
difference between them.

The worker (``_ab_worker.py``) runs as a script copied to a temporary folder, so that the base
side never imports this version of ``harness``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.perf._common import Echo, PerfError, Project, _asv_environ, check_factor, python_path
from harness.perf.decision import Comparison
from harness.perf.runs import _archived_config
from harness.perf.sequential import (
    AB_BLOCK,
    SamplerError,
    SamplingPlan,
    sample_until_decided,
)

# The pairs of the first look: 12 blocks of 5, each block one fresh process pair; 10 blocks are
# the fewest that can decide anything (sequential.MIN_BLOCKS). An undecided verdict takes more.
DEFAULT_PAIRS = 60
# More pairs than this is a typo, not a measurement.
MAX_AB_PAIRS = 1000
# An undecided benchmark takes at most this many times its first pairs.
MAX_PAIRS_FACTOR = 10
# A benchmark's A/B stops after this many seconds even with fewer pairs (then the gate says
# "undecided", or "too few samples" below 10 blocks, and exits 2).
MAX_SECONDS_PER_BENCHMARK = 120.0
# A worker that does not answer a request (load with setup, or one sample) in this long is
# killed and its benchmark reported as failed to measure.
REQUEST_TIMEOUT = 300.0


@dataclasses.dataclass
class ABResult:
    """Paired samples of one benchmark: base[i] and head[i] were taken one right after the
    other. error: why it could not be measured (then the lists may be empty)."""

    name: str
    base: list[float]
    head: list[float]
    error: str | None = None
    comparison: Comparison | None = None  # the last look's (sequential.py)
    stopped: str = ""  # why sampling stopped: decided, max_pairs, budget, error


class _Worker:
    def __init__(self, script: Path, bench_root: Path, env: dict[str, str], cwd: Path) -> None:
        # The worker's stderr (and whatever its benchmarks print) goes to a file: a pipe could
        # fill up and block it; its tail explains a worker that died.
        self.stderr_path = cwd / f"worker-{id(self)}.err"
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            [python_path(), str(script), str(bench_root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            env=env,
            cwd=cwd,
        )

    def ask(self, request: dict[str, Any], timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is not None:
            return {"ok": False, "error": self._died()}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.proc.kill()
                return {"ok": False, "error": f"no answer in {timeout:g} s (killed)"}
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            return {"ok": False, "error": self._died()}
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _died(self) -> str:
        self._stderr.flush()
        tail = self.stderr_path.read_text(errors="replace").strip().splitlines()[-3:]
        return f"worker exited {self.proc.returncode}" + (f": {' | '.join(tail)}" if tail else "")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


def measure_ab(
    root: Path | str,
    base_sha: str,
    names: Sequence[str],
    *,
    factor: float,
    pairs: int = DEFAULT_PAIRS,
    max_pairs: int | None = None,
    max_seconds: float = MAX_SECONDS_PER_BENCHMARK,
    extra: float = 0.0,
    echo: Echo | None = None,
) -> dict[str, ABResult]:
    """Time each benchmark in names (``module.Class.method`` or with ``(params)``) for base_sha
    and the working tree, alternately: ``pairs`` pairs, then more while the verdict at
    ``factor`` is undecided, up to ``max_pairs`` (default MAX_PAIRS_FACTOR * pairs, at most
    MAX_AB_PAIRS) or ``max_seconds`` per benchmark (sequential.py). ``extra``: the head side
    does that fraction more work per sample (an injected slowdown: ``harness perf calibrate``).
    """
    if pairs < 1:
        raise PerfError(f"pairs must be >= 1, got {pairs}")
    if not 0 <= extra <= 10:
        raise PerfError(f"extra work must be a fraction between 0 and 10, got {extra!r}")
    check_factor(factor)
    plan = SamplingPlan(
        first=pairs,
        max_pairs=max(pairs, max_pairs or min(MAX_AB_PAIRS, MAX_PAIRS_FACTOR * pairs)),
        budget_s=max_seconds,
    )
    project = Project.load(root)
    results: dict[str, ABResult] = {}
    with tempfile.TemporaryDirectory(prefix="harness-perf-ab-") as tmp_name:
        tmp = Path(tmp_name)
        _, code_dir = _archived_config(project, base_sha, tmp)
        script = tmp / "ab_worker.py"
        shutil.copyfile(Path(__file__).with_name("_ab_worker.py"), script)
        rel = project.benchmark_dir.relative_to(project.root)
        same_seed = {"PYTHONHASHSEED": "0"}
        base_env = _asv_environ(project, same_seed)
        base_env["PYTHONPATH"] = os.pathsep.join(
            [str(code_dir)] + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else [])
        )
        head_env = _asv_environ(project, same_seed)
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

        def spawn(block: int) -> dict[str, _Worker]:
            pair = {
                "base": _Worker(script, code_dir / rel, base_env, tmp),
                "head": _Worker(script, project.benchmark_dir, head_env, tmp),
            }
            if cpus:  # both on one CPU: they never run at once, and share its conditions
                for worker in pair.values():
                    # A worker that exited already: its first request reports why.
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(worker.proc.pid, {cpus[block % len(cpus)]})
            return pair

        for n, name in enumerate(names, 1):
            if echo:
                echo(
                    f"harness perf: A/B {n}/{len(names)} {name}: {pairs} interleaved pairs in "
                    f"blocks of {AB_BLOCK}, more while undecided (up to {plan.max_pairs} or "
                    f"{plan.budget_s:g} s)"
                )
            result = results[name] = _measure_one(spawn, name, factor, plan, extra=extra)
            if echo and result.error:
                echo(f"harness perf: A/B of {name} failed: {result.error}")
            elif echo and result.comparison is not None:
                echo(
                    f"harness perf: A/B of {name}: {result.comparison.verdict} after "
                    f"{len(result.base)} pairs ({result.stopped})"
                )
    return results


def _measure_one(
    spawn: Callable[[int], dict[str, _Worker]],
    name: str,
    factor: float,
    plan: SamplingPlan,
    *,
    extra: float = 0.0,
) -> ABResult:
    """Sample name sequentially, a fresh worker pair for every block of AB_BLOCK pairs.
    extra: the head side adds this fraction of its sample's CPU time as more work (calibrate)."""
    result = ABResult(name, [], [])
    workers: dict[str, _Worker] = {}

    def close() -> None:
        for worker in workers.values():
            worker.ask({"op": "teardown"}, timeout=60)
            worker.close()
        workers.clear()

    def sample_pair(i: int) -> tuple[float, float]:
        if i % AB_BLOCK == 0:
            close()
            workers.update(spawn(i // AB_BLOCK))
            for side, worker in workers.items():
                reply = worker.ask({"op": "load", "name": name})
                if not reply.get("ok"):
                    raise SamplerError(f"{side}: {reply.get('error')}")
        # The order alternates so that neither side always goes first.
        got: dict[str, float] = {}
        for side in ("base", "head") if i % 2 == 0 else ("head", "base"):
            request: dict[str, Any] = {"op": "sample"}
            if side == "head" and extra:
                request["extra"] = extra
            reply = workers[side].ask(request)
            if not reply.get("ok"):
                raise SamplerError(f"{side}: {reply.get('error')}")
            got[side] = float(reply["seconds"])
        return got["base"], got["head"]

    try:
        sampled = sample_until_decided(sample_pair, factor, plan)
    finally:
        close()
    result.base, result.head, result.error = sampled.base, sampled.head, sampled.error
    result.comparison, result.stopped = sampled.comparison, sampled.stopped
    return result


def list_timing_benchmarks(root: Path | str) -> list[str]:
    """Every timing benchmark of the working tree (one name per parameter combination), found
    by asv's discovery in a worker process: this process never imports the benchmarks."""
    project = Project.load(root)
    with tempfile.TemporaryDirectory(prefix="harness-perf-list-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "ab_worker.py"
        shutil.copyfile(Path(__file__).with_name("_ab_worker.py"), script)
        worker = _Worker(script, project.benchmark_dir, _asv_environ(project), tmp)
        try:
            reply = worker.ask({"op": "list"})
        finally:
            worker.close()
    if not reply.get("ok"):
        raise PerfError(f"listing the benchmarks in {project.benchmark_dir} failed: {reply}")
    return [str(n) for n in reply["names"]]


if __name__ == "__main__":  # pragma: no cover - a manual check: python -m harness.perf.ab BASE NAME
    out = measure_ab(Path.cwd(), sys.argv[1], sys.argv[2:], factor=1.2, echo=print)
    for r in out.values():
        print(r)
