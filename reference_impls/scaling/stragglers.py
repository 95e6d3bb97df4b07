"""Stragglers and homogeneity: which rank is slow, by how much, and whether the ranks' hardware
is alike enough for the comparison to mean anything.

Scores (both in (0, 1], 1 = not slow), from the per-step records of every rank:

- *relative*: the fastest rank's median busy time over this rank's (busy = everything but
  exposed communication: data, compute, other). A rank with 0.8 needs 25% longer than the
  fastest for the same work. Works on CPU and GPU alike, and counts the data wait, which a
  kernel-only score misses.
- *individual*: this rank's best busy time (the 10th percentile of its steps) over its median:
  how much it drifts from its own best (throttling, a noisy neighbour) independently of others.

A straggler is a rank whose relative score is below ``threshold`` and which makes the others
wait: it arrives last (the least exposed communication) in most steps, and the others' waiting
in those steps is at least ``min_wait_share`` of the step (a rank 2% slower on a noisy machine
is not news).

Homogeneity: :func:`host_facts` on every rank (CPU cores usable, ranks on the host, GPU model,
memory, SM count, driver and clocks where ``nvidia-smi`` answers), :func:`homogeneity_problems`
names differences and oversubscription: more ranks than cores on a host slows gloo jobs about
20x (measured on a 2-core machine), which no interconnect explains.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reference_impls.scaling.breakdown import StepRecord

__all__ = ["RankScore", "homogeneity_problems", "host_facts", "straggler_scores"]


@dataclasses.dataclass(frozen=True)
class RankScore:
    rank: int
    busy_ms: float
    """Median over steps of data + compute + other (the work, not the waiting)."""
    relative: float
    individual: float
    last_arrival_share: float
    """Share of steps in which this rank had the least exposed communication (arrived last)."""
    caused_wait_ms: float
    """Mean over all steps of the other ranks' mean waiting in steps where this rank was last."""
    straggler: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _busy(r: StepRecord) -> float:
    return r.wall - r.comm


def straggler_scores(
    records: Sequence[StepRecord], *, threshold: float = 0.8, min_wait_share: float = 0.05
) -> list[RankScore]:
    """Per-rank scores (module docstring) from every rank's records of the same steps."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    by_rank: dict[int, list[StepRecord]] = {}
    by_step: dict[int, list[StepRecord]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).append(r)
        by_step.setdefault(r.step, []).append(r)
    if not by_rank:
        raise ValueError("straggler_scores() needs records")
    world = len(by_rank)
    full = [s for s in by_step.values() if len(s) == world]
    last_counts = dict.fromkeys(by_rank, 0)
    caused = dict.fromkeys(by_rank, 0.0)
    for recs in full:
        last = min(recs, key=lambda r: r.comm)
        last_counts[last.rank] += 1
        if world > 1:
            caused[last.rank] += statistics.fmean(r.comm - last.comm for r in recs if r is not last)
    wall = statistics.median(r.wall for r in records)
    busy = {rank: statistics.median(_busy(r) for r in recs) for rank, recs in by_rank.items()}
    fastest = min(busy.values())
    out = []
    for rank in sorted(by_rank):
        values = sorted(_busy(r) for r in by_rank[rank])
        best = values[int(0.1 * (len(values) - 1))]
        relative = fastest / busy[rank] if busy[rank] > 0 else 1.0
        individual = best / busy[rank] if busy[rank] > 0 else 1.0
        share = last_counts[rank] / len(full) if full else 0.0
        wait = caused[rank] / len(full) if full else 0.0
        out.append(
            RankScore(
                rank=rank,
                busy_ms=1e3 * busy[rank],
                relative=relative,
                individual=individual,
                last_arrival_share=share,
                caused_wait_ms=1e3 * wait,
                straggler=world > 1
                and relative < threshold
                and share > 0.5
                and wall > 0
                and wait / wall >= min_wait_share,
            )
        )
    return out


def host_facts(rank: int, *, local_world_size: int, device: str = "cpu") -> dict[str, Any]:
    """What this rank runs on (JSON-ready). ``local_world_size``: ranks on this host."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    facts: dict[str, Any] = {
        "rank": rank,
        "host": socket.gethostname(),
        "cpu_cores": cores,
        "local_world_size": local_world_size,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
    }
    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        facts.update(
            gpu=props.name,
            gpu_memory_mib=props.total_memory // 2**20,
            gpu_sms=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
        smi = shutil.which("nvidia-smi")
        if smi:
            fields = "driver_version,clocks.max.sm,clocks.sm,power.limit,pci.bus_id"
            try:
                line = subprocess.run(
                    [smi, f"--query-gpu={fields}", "--format=csv,noheader", f"--id={index}"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=True,
                ).stdout.strip()
                facts.update(
                    dict(zip(fields.split(","), [v.strip() for v in line.split(",")], strict=False))
                )
            except (OSError, subprocess.SubprocessError) as exc:
                facts["nvidia_smi_error"] = str(exc)
    return facts


def homogeneity_problems(facts: Sequence[Mapping[str, Any]]) -> list[str]:
    """Differences between ranks that make a scaling comparison unfair, and oversubscription."""
    problems = []
    hosts: dict[str, list[Mapping[str, Any]]] = {}
    for f in facts:
        hosts.setdefault(str(f.get("host")), []).append(f)
    for host, fs in hosts.items():
        ranks = len(fs)
        cores = min(int(f.get("cpu_cores", 1)) for f in fs)
        if ranks > cores:
            problems.append(
                f"host {host}: {ranks} ranks on {cores} CPU cores; more ranks than cores slows "
                "gloo jobs about 20x (their communication threads starve), so these timings "
                "say nothing about the interconnect: use at most one rank per core"
            )
        loads = [f["load_average_1min"] for f in fs if f.get("load_average_1min") is not None]
        if loads and max(loads) > cores:
            problems.append(
                f"host {host}: load average {max(loads):.1f} on {cores} CPU cores when the ranks "
                "started: other work shares the CPUs, so times include its time slices; "
                "rerun on an idle host before trusting speedups"
            )
        threads = sum(int(f.get("torch_threads", 1)) for f in fs)
        if ranks <= cores < threads:
            problems.append(
                f"host {host}: {ranks} ranks x torch threads = {threads} threads on {cores} "
                "cores (set torch.set_num_threads or OMP_NUM_THREADS to cores // ranks)"
            )
    for key in ("gpu", "driver_version", "clocks.max.sm", "power.limit", "gpu_memory_mib", "torch"):
        values = {str(f.get(key)) for f in facts if key in f}
        if len(values) > 1:
            by = {
                str(f.get(key)): [g["rank"] for g in facts if str(g.get(key)) == str(f.get(key))]
                for f in facts
            }
            problems.append(
                f"ranks differ in {key}: "
                + "; ".join(f"{v!r} on ranks {r}" for v, r in sorted(by.items()))
            )
    return problems
