"""GPU A/B timing: base and head kernels in one process, CUDA-event timed, in interleaved pairs.

Why not the CPU A/B (ab.py): its samples are the worker's CPU time, and a CUDA kernel's CPU time
is its launch, not its run. Here one worker process (``_gpu_ab_worker.py``, run as a script)
imports the base commit's benchmark module from a ``git archive`` tree and the head's from the
working tree under distinct module names (each with its own tree's code, e.g. its own
``reference_impls``), sets both up, warms them up, and then takes pairs of samples: base then
head, head then base, ... Every call in a sample runs right after an L2 flush (a write of a
buffer at least 4x the L2, as ``triton.testing.do_bench`` does) and is timed alone with CUDA
events, so a sample is device time with a cold L2, not the host's clock and not the data the
other side left in the cache.

The verdict is the CPU A/B's (sequential.py, decision.compare_blocks): blocks of AB_BLOCK
consecutive pairs are the units (the median log-ratio of each block, their signed-rank
interval), and more pairs are taken while it is undecided, up to a pair count or a time budget.
Both sides in one process share the GPU's state sample by sample (clocks, temperature,
another tenant), which is what a pair is for; what one process cannot vary is how it set the
kernels up, so head's Triton autotuners take base's picks where the kernel and its configs are
the same on both sides (a second tuning of an unchanged kernel can pick another config a few
percent apart; _gpu_ab_worker.share_tuning).

``ncu_counters`` is the second, deterministic signal: one call of each side under Nsight
Compute, instructions executed and DRAM bytes summed over the call's kernels (docs/perf.md says
what it catches and what not).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.perf._common import Echo, PerfError, Project, check_factor, python_path
from harness.perf.ab import ABResult, _Worker
from harness.perf.sequential import (
    AB_BLOCK,
    GPU_UNIT,
    SamplerError,
    SamplingPlan,
    sample_until_decided,
)

DEFAULT_PAIRS = 60
MAX_PAIRS_FACTOR = 10
MAX_SECONDS_PER_BENCHMARK = 120.0
# Setting a benchmark up may autotune its kernels (AttentionGPU allows 600 s for that).
LOAD_TIMEOUT = 900.0
PAIR_TIMEOUT = 300.0
WORKER_SCRIPT = Path(__file__).with_name("_gpu_ab_worker.py")
# What ncu_counters reads per kernel: warp-level SASS instructions executed, and bytes read from
# and written to device memory.
DEFAULT_METRICS = ("sm__sass_inst_executed.sum", "dram__bytes.sum")
MARKER_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel, launched after each profiled call


class NoGpuError(PerfError):
    """No CUDA device where the GPU A/B timer ran (the message says what the worker saw)."""


@dataclasses.dataclass(frozen=True)
class Tree:
    """One side's code: its benchmark folder and the folder its code imports from (put first
    on sys.path while its benchmark module is imported)."""

    bench_dir: Path
    code_dir: Path

    def as_list(self) -> list[str]:
        return [str(self.bench_dir), str(self.code_dir)]


@dataclasses.dataclass
class GpuABResult(ABResult):
    """ABResult's pairs (seconds per call, CUDA events) and how they were taken."""

    number: int = 0  # calls per sample, each after an L2 flush
    first_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # one call after warm-up
    shared_tuning: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0  # wall time of load + sampling


def _worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def _plan(pairs: int, max_pairs: int | None, max_seconds: float) -> SamplingPlan:
    if pairs < 1:
        raise PerfError(f"pairs must be >= 1, got {pairs}")
    return SamplingPlan(
        first=pairs,
        max_pairs=max(pairs, max_pairs or MAX_PAIRS_FACTOR * pairs),
        budget_s=max_seconds,
    )


def measure_gpu_ab_trees(
    base: Tree,
    head: Tree,
    names: Sequence[str],
    *,
    factor: float,
    pairs: int = DEFAULT_PAIRS,
    max_pairs: int | None = None,
    max_seconds: float = MAX_SECONDS_PER_BENCHMARK,
    echo: Echo | None = None,
) -> dict[str, GpuABResult]:
    """Time each benchmark of names (``module.Class.time_x`` or with ``(params)``) on both trees
    in one worker process, in interleaved pairs, until its verdict at ``factor`` is decided or
    the plan runs out (sequential.py). Raises NoGpuError when the worker sees no CUDA device."""
    check_factor(factor)
    plan = _plan(pairs, max_pairs, max_seconds)
    results: dict[str, GpuABResult] = {}
    with tempfile.TemporaryDirectory(prefix="harness-gpu-ab-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "gpu_ab_worker.py"
        shutil.copyfile(WORKER_SCRIPT, script)
        worker = _Worker.start(script, head.bench_dir, _worker_env(), tmp)
        try:
            device = worker.ask({"op": "device"}, timeout=LOAD_TIMEOUT)
            if not device.get("ok"):
                raise NoGpuError(f"GPU A/B timing needs a CUDA device: {device.get('error')}")
            if echo:
                echo(
                    f"harness perf: GPU A/B on {device['name']} (L2 {device['l2_bytes'] >> 20} "
                    f"MiB, flushed before every call)"
                )
            for n, name in enumerate(names, 1):
                if echo:
                    echo(
                        f"harness perf: GPU A/B {n}/{len(names)} {name}: {plan.first} "
                        f"interleaved pairs in blocks of {AB_BLOCK}, more while undecided "
                        f"(up to {plan.max_pairs} or {plan.budget_s:g} s)"
                    )
                result = results[name] = _measure_one(worker, name, base, head, factor, plan)
                if echo and result.error:
                    echo(f"harness perf: GPU A/B of {name} failed: {result.error}")
                elif echo and result.comparison is not None:
                    c = result.comparison
                    echo(
                        f"harness perf: GPU A/B of {name}: {c.verdict} {c.estimate:.4f} "
                        f"[{c.low:.4f}, {c.high:.4f}] after {len(result.base)} pairs "
                        f"({result.stopped}, {result.seconds:.1f} s)"
                    )
        finally:
            worker.close()
    return results


def _measure_one(
    worker: _Worker, name: str, base: Tree, head: Tree, factor: float, plan: SamplingPlan
) -> GpuABResult:
    start = time.monotonic()
    result = GpuABResult(name, [], [])
    sides = {"base": base.as_list(), "head": head.as_list()}
    loaded = worker.ask({"op": "load", "name": name, "sides": sides}, timeout=LOAD_TIMEOUT)
    if not loaded.get("ok"):
        result.error, result.stopped = str(loaded.get("error")), "error"
        result.seconds = time.monotonic() - start
        return result
    result.number = int(loaded["number"])
    result.first_ms = dict(loaded["ms"])
    result.shared_tuning = list(loaded.get("shared_tuning", []))

    def sample_pair(i: int) -> tuple[float, float]:
        # The order alternates so that neither side always goes first.
        reply = worker.ask({"op": "pair", "first": "base" if i % 2 == 0 else "head"}, PAIR_TIMEOUT)
        if not reply.get("ok"):
            raise SamplerError(str(reply.get("error")))
        return float(reply["seconds"]["base"]), float(reply["seconds"]["head"])

    try:
        sampled = sample_until_decided(sample_pair, factor, plan, unit=GPU_UNIT)
    finally:
        worker.ask({"op": "teardown"}, timeout=60)
    result.base, result.head, result.error = sampled.base, sampled.head, sampled.error
    result.comparison, result.stopped = sampled.comparison, sampled.stopped
    result.seconds = time.monotonic() - start
    return result


def trees_for(root: Path | str, base_sha: str, tmp: Path) -> tuple[Tree, Tree]:
    """The base commit's tree (a ``git archive`` under tmp, as ``harness perf run --commit``
    makes it) and the working tree."""
    from harness.perf.runs import _archived_config

    project = Project.load(root)
    _, code_dir = _archived_config(project, base_sha, tmp)
    rel = project.benchmark_dir.relative_to(project.root)
    return Tree(code_dir / rel, code_dir), Tree(project.benchmark_dir, project.root)


def measure_gpu_ab(
    root: Path | str,
    base_sha: str,
    names: Sequence[str],
    *,
    factor: float,
    pairs: int = DEFAULT_PAIRS,
    max_seconds: float = MAX_SECONDS_PER_BENCHMARK,
    echo: Echo | None = None,
) -> dict[str, GpuABResult]:
    """measure_gpu_ab_trees for base_sha's code against the working tree of root."""
    with tempfile.TemporaryDirectory(prefix="harness-gpu-ab-tree-") as tmp_name:
        base, head = trees_for(root, base_sha, Path(tmp_name))
        return measure_gpu_ab_trees(
            base, head, names, factor=factor, pairs=pairs, max_seconds=max_seconds, echo=echo
        )


# --------------------------------------------------------------------------------------------
# The deterministic signal: Nsight Compute counters of one call per side.


@dataclasses.dataclass
class CounterResult:
    """Per metric: the sum over one call's kernels for base and head, and head / base."""

    name: str
    base: dict[str, float]
    head: dict[str, float]
    kernels: tuple[int, int]  # kernels in one call: base, head

    def ratios(self) -> dict[str, float]:
        return {
            m: (self.head[m] / self.base[m]) if self.base.get(m) else float("nan")
            for m in self.base
        }


def parse_ncu_csv(text: str, metrics: Sequence[str]) -> list[list[dict[str, float]]]:
    """ncu's --csv output (one row per kernel and metric, launch order) as chunks of kernels
    separated by MARKER_KERNEL launches: [[{metric: value} per kernel] per profiled call]."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        raise PerfError("ncu printed no CSV rows: did it profile anything? (its output above)")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    needed = {"ID", "Kernel Name", "Metric Name", "Metric Value"}
    if rows and not needed <= set(rows[0]):
        raise PerfError(f"ncu's CSV lacks columns {sorted(needed - set(rows[0]))}")
    kernels: dict[str, tuple[str, dict[str, float]]] = {}
    for row in rows:
        name, values = kernels.setdefault(row["ID"], (row["Kernel Name"], {}))
        if row["Metric Name"] in metrics:
            raw = row["Metric Value"].replace(",", "")
            try:
                values[row["Metric Name"]] = float(raw)
            except ValueError:
                raise PerfError(
                    f"ncu reported {row['Metric Name']} = {row['Metric Value']!r} for kernel "
                    f"{name!r}: not a number"
                ) from None
    chunks: list[list[dict[str, float]]] = [[]]
    for _, (name, values) in sorted(kernels.items(), key=lambda kv: int(kv[0])):
        if MARKER_KERNEL in name:
            chunks.append([])
        else:
            chunks[-1].append(values)
    if chunks[-1] == []:
        chunks.pop()
    return chunks


def counters_from_chunks(
    names: Sequence[str], chunks: list[list[dict[str, float]]], metrics: Sequence[str]
) -> dict[str, CounterResult]:
    """Pair the chunks (base, head per name, in order) with names and sum each metric."""
    if len(chunks) != 2 * len(names):
        raise PerfError(
            f"ncu listed {len(chunks)} profiled calls, expected {2 * len(names)} (base and head "
            f"of {len(names)} benchmark(s))"
        )
    out = {}
    for i, name in enumerate(names):
        sums = []
        for chunk in chunks[2 * i : 2 * i + 2]:
            missing = [m for m in metrics if any(m not in k for k in chunk)]
            if missing or not chunk:
                raise PerfError(f"ncu gave no {', '.join(missing) or 'kernels'} for {name}")
            sums.append({m: sum(k[m] for k in chunk) for m in metrics})
        out[name] = CounterResult(
            name, sums[0], sums[1], (len(chunks[2 * i]), len(chunks[2 * i + 1]))
        )
    return out


def ncu_counters(
    base: Tree,
    head: Tree,
    names: Sequence[str],
    *,
    metrics: Sequence[str] = DEFAULT_METRICS,
    ncu: str = "ncu",
    timeout: float = 900.0,
    echo: Echo | None = None,
) -> dict[str, CounterResult]:
    """One call of each side of each benchmark under ``ncu`` (clocks left alone: --clock-control
    none), the metrics summed over the call's kernels. Raises PerfError when ncu is missing or
    fails, naming what it printed."""
    exe = shutil.which(ncu)
    if exe is None:
        raise PerfError(f"{ncu!r} (Nsight Compute) is not on PATH: the counters need it")
    with tempfile.TemporaryDirectory(prefix="harness-gpu-ncu-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "gpu_ab_worker.py"
        shutil.copyfile(WORKER_SCRIPT, script)
        request = tmp / "request.json"
        request.write_text(
            json.dumps(
                {"names": list(names), "sides": {"base": base.as_list(), "head": head.as_list()}}
            )
        )
        cmd = [
            exe,
            "--profile-from-start",
            "off",
            "--clock-control",
            "none",
            "--metrics",
            ",".join(metrics),
            "--csv",
            "--print-units",
            "base",
            python_path(),
            str(script),
            "--profile",
            str(request),
        ]
        if echo:
            echo(
                f"harness perf: ncu counters of {len(names)} benchmark(s): {' '.join(cmd[:11])} ..."
            )
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=_worker_env(), cwd=tmp, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise PerfError(f"ncu did not finish in {timeout:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-3:]
        raise PerfError(f"ncu exited {proc.returncode}: {' | '.join(tail)}")
    return counters_from_chunks(names, parse_ncu_csv(proc.stdout, metrics), metrics)


def to_json(results: dict[str, GpuABResult]) -> dict[str, Any]:
    """The results as JSON: per benchmark, the verdict, ratio, interval, pairs and times."""
    out: dict[str, Any] = {}
    for name, r in results.items():
        c = r.comparison
        out[name] = {
            "verdict": str(c.verdict) if c else None,
            "ratio": c.estimate if c else None,
            "interval": [c.low, c.high] if c else None,
            "blocks": c.units if c else 0,
            "pairs": len(r.base),
            "stopped": r.stopped,
            "error": r.error,
            "number": r.number,
            "first_ms": r.first_ms,
            "shared_tuning": r.shared_tuning,
            "seconds": round(r.seconds, 2),
            "base_median_s": sorted(r.base)[len(r.base) // 2] if r.base else None,
            "head_median_s": sorted(r.head)[len(r.head) // 2] if r.head else None,
        }
    return out


def exit_code(results: dict[str, GpuABResult]) -> int:
    """1 if any benchmark regressed; else 2 if any is undecided or failed to measure (never a
    pass: the gate's rule); else 0 (all unchanged or improved)."""
    from harness.perf.decision import Verdict

    verdicts = [
        r.comparison.verdict if r.comparison and not r.error else None for r in results.values()
    ]
    if Verdict.REGRESSED in verdicts:
        return 1
    if not verdicts or any(v in (None, Verdict.UNDECIDED) for v in verdicts):
        return 2
    return 0


def markdown(
    results: dict[str, GpuABResult], counters: dict[str, CounterResult] | None = None
) -> str:
    """A table: verdict, ratio head/base, interval, pairs, base and head medians (ms)."""
    lines = [
        "| benchmark | verdict | ratio | interval | pairs | base ms | head ms | why stopped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        c = r.comparison
        if r.error or c is None:
            lines.append(f"| `{name}` | failed: {r.error} | | | {len(r.base)} | | | {r.stopped} |")
            continue
        b = sorted(r.base)[len(r.base) // 2] * 1e3
        h = sorted(r.head)[len(r.head) // 2] * 1e3
        lines.append(
            f"| `{name}` | {c.verdict} | {c.estimate:.4f} | [{c.low:.4f}, {c.high:.4f}] | "
            f"{len(r.base)} | {b:.4f} | {h:.4f} | {r.stopped} |"
        )
        if c.verdict == "undecided":
            lines.append(f"|  | would need {c.would_need()} | | | | | | |")
    for name, cr in (counters or {}).items():
        ratios = ", ".join(f"{m} {v:.4f}" for m, v in cr.ratios().items())
        lines.append(f"\nncu, one call each (head/base) `{name}`: {ratios}; kernels {cr.kernels}")
    return "\n".join(lines)
