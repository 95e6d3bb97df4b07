"""The scaling investigation: the same training at each world size, broken down per rank, with
a verdict naming what costs the efficiency, and a projection past this machine.

    python -m reference_impls.scaling investigate --world-sizes 1,2 --out DIR

For each world size one group of processes (:func:`reference_impls.collectives.launch`: gloo on
CPU, NCCL on CUDA) runs :func:`~reference_impls.scaling.workload.run_rank` for strong scaling
(the global batch fixed, split over the ranks) and weak scaling (the per-rank batch fixed).
From every rank's step records: the attributed breakdown, speedup and efficiency against one
rank, the communication share, straggler scores, the loader's own throughput, the
interconnect's solo all-reduce; then the cost model fitted to what was measured, checked
against the measured world sizes, projected to 8, 64 and 512.

The verdict compares each world size with the ideal built from one rank (strong: every part
divided by N; weak: every part unchanged; no communication) and names the part whose excess
is largest: data wait, compute that does not shrink, communication transfer, waiting for a
straggler, or other; with the numbers that show it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reference_impls import atomic
from reference_impls.collectives import LaunchConfig, LaunchError, launch
from reference_impls.collectives.schedule import bus_bandwidth_factor
from reference_impls.scaling import costmodel
from reference_impls.scaling.breakdown import (
    PARTS,
    AttributedStep,
    Part,
    StepRecord,
    attribute_steps,
    mean_parts,
)
from reference_impls.scaling.stragglers import homogeneity_problems, straggler_scores
from reference_impls.scaling.transport import parse_nccl_log
from reference_impls.scaling.workload import RankConfig, run_rank

__all__ = ["InvestigateConfig", "InvestigationError", "analyse", "investigate"]

DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb


class InvestigationError(ValueError):
    """Bad input to an investigation (the message names the value and the fix)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class InvestigateConfig:
    """What to run. Every field has a command-line option of the same name."""

    world_sizes: tuple[int, ...] = (1, 2)
    device: str = "cpu"
    modes: tuple[str, ...] = ("strong", "weak")
    global_batch: int = 64
    """Strong scaling: the global batch, split evenly over the ranks."""
    per_rank_batch: int = 64
    """Weak scaling: each rank's batch."""
    in_features: int = 64
    hidden: tuple[int, ...] = (256, 256)
    steps: int = 20
    warmup: int = 3
    overhead_blocks: int = 1
    loader_sleep_ms: float = 0.0
    loader_fail_at: int | None = None
    slow_rank: int | None = None
    slow_ms: float = 0.0
    hang_at_step: int | None = None
    timeout_s: float = 180.0
    """Per world size: a launch that has not finished by then is killed and reported."""
    project_worlds: tuple[int, ...] = (8, 64, 512)
    link_alpha_s: float | None = None
    link_beta_Bps: float | None = None
    """Given link numbers for the projection (else fitted from the solo all-reduces)."""
    gpus_per_node: int = 8
    inter_alpha_s: float | None = None
    inter_beta_Bps: float | None = None
    nccl_debug: bool = True
    """CUDA: run with NCCL_DEBUG=INFO into files and report the transports NCCL picked."""
    seed: int = 0

    def __post_init__(self) -> None:
        ws = self.world_sizes
        if not ws or any(not isinstance(w, int) or w < 1 for w in ws):
            raise InvestigationError(
                f"world sizes must be integers >= 1, got {list(ws)} (e.g. --world-sizes 1,2)"
            )
        if len(set(ws)) != len(ws):
            raise InvestigationError(f"world sizes repeat: {list(ws)}")
        if 1 not in ws:
            raise InvestigationError(
                f"world sizes {list(ws)} lack 1: speedup and efficiency are measured against "
                "one rank; add 1"
            )
        if self.device not in ("cpu", "cuda"):
            raise InvestigationError(f"device must be cpu or cuda, got {self.device!r}")
        bad = [m for m in self.modes if m not in ("strong", "weak")]
        if bad or not self.modes:
            raise InvestigationError(f"modes are strong and/or weak, got {list(self.modes)}")
        if "strong" in self.modes:
            uneven = [w for w in ws if self.global_batch % w]
            if uneven:
                raise InvestigationError(
                    f"global batch {self.global_batch} does not split evenly over world sizes "
                    f"{uneven}; pick a multiple of {math.lcm(*ws)}"
                )
        for name in ("global_batch", "per_rank_batch", "in_features", "steps"):
            if getattr(self, name) < 1:
                raise InvestigationError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps < 3:
            raise InvestigationError(
                f"steps must be >= 3 for medians to mean anything, got {self.steps}"
            )
        if self.slow_rank is not None and not 0 <= self.slow_rank < max(ws):
            raise InvestigationError(
                f"slow_rank {self.slow_rank} does not exist at world sizes {list(ws)}: pick a "
                f"rank in [0, {max(ws) - 1}]"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise InvestigationError(f"timeout_s must be a finite number > 0, got {self.timeout_s}")
        self._check_rest()

    def _check_rest(self) -> None:
        """Every other number, before any rank starts: a bad one would otherwise surface only
        as a rank's traceback (or a NaN in the report) a world size later."""
        if not self.hidden or any(not isinstance(h, int) or h < 1 for h in self.hidden):
            raise InvestigationError(
                f"hidden widths must be integers >= 1, got {list(self.hidden)} (e.g. 256,256)"
            )
        for name in ("warmup", "overhead_blocks", "seed", "loader_fail_at", "hang_at_step"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvestigationError(f"{name} must be >= 0, got {value}")
        for name in ("loader_sleep_ms", "slow_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvestigationError(
                    f"{name.replace('_', '-')} must be a finite number of ms >= 0, got {value}"
                )
        if self.slow_ms > 0 and self.slow_rank is None:
            raise InvestigationError(f"slow-ms {self.slow_ms} needs --slow-rank (which rank)")
        if not self.project_worlds or any(w < 1 for w in self.project_worlds):
            raise InvestigationError(
                f"project worlds must be integers >= 1, got {list(self.project_worlds)} "
                "(e.g. 8,64,512)"
            )
        if self.gpus_per_node < 1:
            raise InvestigationError(f"gpus-per-node must be >= 1, got {self.gpus_per_node}")
        for alpha, beta, flags in (
            (self.link_alpha_s, self.link_beta_Bps, "--link-alpha-us and --link-beta-GBps"),
            (self.inter_alpha_s, self.inter_beta_Bps, "--inter-alpha-us and --inter-beta-GBps"),
        ):
            if (alpha is None) != (beta is None):
                raise InvestigationError(f"give both {flags}, or neither")
            if alpha is not None and beta is not None:
                if not (math.isfinite(alpha) and alpha >= 0):
                    raise InvestigationError(
                        f"{flags}: latency must be finite and >= 0, got {alpha * 1e6} us"
                    )
                if not (math.isfinite(beta) and beta > 0):
                    raise InvestigationError(
                        f"{flags}: bandwidth must be finite and > 0, got {beta / 1e9} GB/s"
                    )

    def cases(self, world: int) -> list[tuple[str, int]]:
        """(case, per-rank batch) to run at ``world``; one rank runs each distinct batch once."""
        out: list[tuple[str, int]] = []
        for mode in self.modes:
            batch = self.global_batch // world if mode == "strong" else self.per_rank_batch
            if world == 1 and any(b == batch for _, b in out):
                continue
            out.append((mode, batch))
        return out

    def base_case(self, mode: str) -> str:
        """The world-1 case a mode's speedup is measured against."""
        batch = self.global_batch if mode == "strong" else self.per_rank_batch
        return next(name for name, b in self.cases(1) if b == batch)


CPU_RANKS_PER_CORE = 4
"""On CPU more ranks than cores is allowed (and flagged in the report: gloo slows ~20x), but
past this many per core a world size is a typo, not an experiment: refused before it forks."""


def check_devices(cfg: InvestigateConfig) -> None:
    """More ranks than devices is an error on CUDA (ranks would share GPUs); on CPU, more than
    ``CPU_RANKS_PER_CORE`` ranks per usable core is refused before any process starts."""
    if cfg.device != "cuda":
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
        limit = CPU_RANKS_PER_CORE * cores
        if max(cfg.world_sizes) > limit:
            raise InvestigationError(
                f"world size {max(cfg.world_sizes)} would start {max(cfg.world_sizes)} gloo "
                f"processes on {cores} CPU cores (limit {limit}, {CPU_RANKS_PER_CORE} per core); "
                "drop the larger sizes or run them on a machine with more cores"
            )
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if max(cfg.world_sizes) > count:
        raise InvestigationError(
            f"world size {max(cfg.world_sizes)} needs {max(cfg.world_sizes)} CUDA devices, this "
            f"machine has {count}; drop the larger sizes or use --device cpu"
        )


def _log(msg: str) -> None:
    print(msg, flush=True)


def investigate(
    cfg: InvestigateConfig, out: Path, *, log: Callable[[str], None] = _log
) -> dict[str, Any]:
    """Run every world size, analyse, write ``out/scaling.json``, ``out/report.md`` and plots.

    A world size that fails (a rank raised, or it ran past ``timeout_s``) is reported with
    where each rank stopped; the others are still analysed. Returns the report (``ok`` False
    when any world size failed).
    """
    check_devices(cfg)
    records_dir = out / "records"
    try:
        records_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # OUT is a file, under a file, or not writable
        raise InvestigationError(
            f"cannot use --out {out} as the output directory ({exc.strerror}): pass a new or "
            "existing directory you can write to"
        ) from None
    runs: dict[int, list[dict[str, Any]]] = {}
    failures: dict[int, dict[str, Any]] = {}
    for world in cfg.world_sizes:
        cases = cfg.cases(world)
        rank_cfg = RankConfig(
            device=cfg.device,
            in_features=cfg.in_features,
            hidden=cfg.hidden,
            batches=tuple(cases),
            steps=cfg.steps,
            warmup=cfg.warmup,
            overhead_blocks=cfg.overhead_blocks,
            loader_steps=cfg.steps,
            loader_sleep_ms=cfg.loader_sleep_ms,
            loader_fail_at=cfg.loader_fail_at,
            slow_rank=cfg.slow_rank,
            slow_ms=cfg.slow_ms,
            hang_at_step=cfg.hang_at_step,
            records_dir=str(records_dir),
            stack_dump_every_s=min(10.0, max(1.0, cfg.timeout_s / 6)),
            seed=cfg.seed,
        )
        env = {"LOCAL_WORLD_SIZE": str(world)}
        if cfg.device == "cuda" and cfg.nccl_debug:
            env.update(
                NCCL_DEBUG="INFO",
                NCCL_DEBUG_SUBSYS="INIT,GRAPH,NET",
                NCCL_DEBUG_FILE=str(records_dir / f"nccl-w{world}.%h.%p.log"),
            )
        backend = "nccl" if cfg.device == "cuda" else "gloo"
        log(
            f"[world {world}] {', '.join(f'{c} (batch {b}/rank)' for c, b in cases)}: "
            f"launching {world} {backend} rank(s)"
        )
        started = time.perf_counter()
        try:
            runs[world] = launch(
                run_rank,
                rank_cfg,
                config=LaunchConfig(
                    world_size=world,
                    backend=backend,
                    timeout_s=cfg.timeout_s,
                    pg_timeout_s=max(5.0, cfg.timeout_s - 5.0),
                    env=env,
                ),
            )
            log(f"[world {world}] done in {time.perf_counter() - started:.1f} s")
        except LaunchError as exc:
            failures[world] = _where_it_stopped(exc, world, records_dir, cases)
            log(
                f"[world {world}] FAILED after {time.perf_counter() - started:.1f} s: "
                f"{failures[world]['summary']}"
            )
    report = analyse(cfg, runs)
    report["failures"] = {str(w): f for w, f in failures.items()}
    report["ok"] = not failures and bool(runs)
    if cfg.device == "cuda" and cfg.nccl_debug:
        lines: list[str] = []
        for path in sorted(records_dir.glob("nccl-w*.log")):
            lines += path.read_text(errors="replace").splitlines()
        report["transport"] = parse_nccl_log(lines, expect_nvlink=True).to_dict()
    from reference_impls.scaling.report import write_report  # matplotlib only when writing

    write_report(report, out)
    log(f"wrote {out / 'report.md'}, {out / 'scaling.json'} and plots")
    return report


def _where_it_stopped(
    exc: LaunchError, world: int, records_dir: Path, cases: list[tuple[str, int]]
) -> dict[str, Any]:
    """Per rank: the failure, the last step recorded, and the top of the stack dump."""
    ranks: dict[str, Any] = {}
    for rank, failure in exc.failures.items():
        last = None
        for case, _ in cases:
            path = records_dir / f"w{world}-{case}-rank{rank}.jsonl"
            if path.exists():
                lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
                if lines:
                    last = {"case": case, "last_step": json.loads(lines[-1])["step"]}
                elif last is None:
                    last = {"case": case, "last_step": None}
        stack_path = records_dir / f"stack-w{world}-rank{rank}.txt"
        stack = stack_path.read_text(errors="replace") if stack_path.exists() else ""
        main = _main_thread_frames(stack)
        ranks[str(rank)] = {
            "kind": failure.kind,
            "error": f"{failure.error_type}: {failure.message}",
            "last_recorded": last,
            "stack_top": main[:6],
            "traceback_tail": failure.traceback.strip().splitlines()[-3:]
            if failure.traceback
            else [],
        }
    parts = []
    for rank_name, r in ranks.items():
        where = (
            r["stack_top"][0]
            if r["stack_top"]
            else (r["traceback_tail"][-1] if r["traceback_tail"] else "?")
        )
        step = r["last_recorded"]
        parts.append(
            f"rank {rank_name} {r['kind']} after step {step['last_step'] if step else None} "
            f"of {step['case'] if step else '?'} at {where}"
        )
    return {"ranks": ranks, "summary": "; ".join(parts)}


def _main_thread_frames(dump: str) -> list[str]:
    """From faulthandler's last dump, the frames of the thread running the rank's steps
    (innermost first), else of the first thread."""
    last = dump.split("Timeout (")[-1]
    threads = [t for t in last.split("\n\n") if "File " in t]
    frames = [
        [ln.strip() for ln in t.splitlines() if ln.strip().startswith("File")] for t in threads
    ]
    for f in frames:
        if any("workload.py" in line for line in f):
            return f
    return frames[0] if frames else []


# ----------------------------------------------------------------------------- analysis


def _records(rank_results: Sequence[dict[str, Any]], case: str) -> list[StepRecord]:
    return [StepRecord(**r) for res in rank_results for r in res["cases"][case]["records"]]


def analyse(cfg: InvestigateConfig, runs: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Everything the report says, from the ranks' results (JSON-ready)."""
    rows: list[dict[str, Any]] = []
    per_world: dict[str, Any] = {}
    base: dict[str, dict[str, Any]] = {}
    for world in sorted(runs):
        results = runs[world]
        facts = [r["facts"] for r in results]
        entry: dict[str, Any] = {
            "facts": facts,
            "homogeneity": homogeneity_problems(facts),
            "cases": {},
        }
        for case, batch in cfg.cases(world):
            recs = _records(results, case)
            attributed, outliers = steady_steps(attribute_steps(recs))
            parts = mean_parts(attributed)
            per_rank = {
                str(r): mean_parts([a for a in attributed if a.rank == r]) for r in range(world)
            }
            # Per step: the record's wall time over the loop's own clock around the same step
            # (the profiler's bookkeeping after the step is the difference).
            ratios = [
                rec["wall"] / t
                for res in results
                for rec, t in zip(
                    res["cases"][case]["records"], res["cases"][case]["outer_step_s"], strict=True
                )
                if t > 0
            ]
            loader = [res["cases"][case]["loader"]["samples_per_s"] for res in results]
            overhead = [
                res["cases"][case]["overhead"] for res in results if res["cases"][case]["overhead"]
            ]
            grad_bytes = results[0]["grad_bytes"]
            comm_time = parts[str(Part.COMM_TRANSFER)] + parts["comm_overlapped"]
            row = {
                "world": world,
                "case": case,
                "per_rank_batch": batch,
                "global_batch": batch * world,
                "step_ms": 1e3 * parts["wall"],
                "samples_per_s": batch * world / parts["wall"],
                "parts_ms": {str(p): 1e3 * parts[str(p)] for p in PARTS},
                "comm_overlapped_ms": 1e3 * parts["comm_overlapped"],
                "comm_share": (parts[str(Part.COMM_TRANSFER)] + parts[str(Part.COMM_WAIT)])
                / parts["wall"],
                "per_rank_parts_ms": {
                    r: {k: 1e3 * v for k, v in p.items()} for r, p in per_rank.items()
                },
                "per_rank_step_ms": {
                    str(r): [1e3 * x.wall for x in recs if x.rank == r] for r in range(world)
                },
                "breakdown_vs_loop_clock": statistics.median(ratios) if ratios else None,
                "loader_only_samples_per_s": sum(loader),
                "stragglers": [s.to_dict() for s in straggler_scores(recs)],
                "overhead": {
                    "relative_median": statistics.median(o["relative"] for o in overhead)
                    if overhead
                    else None,
                    "per_rank": overhead,
                },
                "record_bytes_max": max(len(r.to_json()) + 1 for r in recs),
                "steps": len({a.step for a in attributed}),
                "outlier_steps": outliers,
                "grad_bytes": grad_bytes,
                "job_busbw_GBps": (
                    bus_bandwidth_factor(world) * grad_bytes / comm_time / 1e9
                    if world > 1 and comm_time > 0
                    else None
                ),
            }
            rows.append(row)
            entry["cases"][case] = row
            if world == 1:
                base[case] = row
        if "solo_allreduce" in results[0]:
            solo = results[0]["solo_allreduce"]["sizes"]
            entry["solo_allreduce"] = [
                {**s, "busbw_GBps": bus_bandwidth_factor(world) * s["bytes"] / s["seconds"] / 1e9}
                for s in solo
            ]
        per_world[str(world)] = entry
    scaling = []
    for mode in cfg.modes:
        if 1 not in runs:
            break
        ref = base[cfg.base_case(mode)]
        for world in sorted(runs):
            case = cfg.base_case(mode) if world == 1 else mode
            row = per_world[str(world)]["cases"][case]
            speedup = row["samples_per_s"] / ref["samples_per_s"]
            scaling.append(
                {
                    "mode": mode,
                    "world": world,
                    "per_rank_batch": row["per_rank_batch"],
                    "global_batch": row["global_batch"],
                    "step_ms": row["step_ms"],
                    "samples_per_s": row["samples_per_s"],
                    "speedup": speedup,
                    "efficiency": speedup / world,
                    "comm_share": row["comm_share"],
                    "data_share": row["parts_ms"]["data"] / row["step_ms"],
                    "loader_only_samples_per_s": row["loader_only_samples_per_s"],
                    "excess_ms": _excess(ref, row, mode, world),
                    "per_rank_batch_shrank": mode == "strong" and world > 1,
                }
            )
    report: dict[str, Any] = {
        "config": dataclasses.asdict(cfg),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "rows": rows,
        "worlds": per_world,
        "scaling": scaling,
    }
    report["verdict"] = verdict(scaling, per_world)
    report["projection"] = _projection(cfg, runs, per_world, scaling)
    return report


OUTLIER_FACTOR = 1.5
"""A step slower than this many times the median step is an outlier (left out of the means)."""


def steady_steps(attributed: list[AttributedStep]) -> tuple[list[AttributedStep], list[int]]:
    """The steps whose slowest rank took at most :data:`OUTLIER_FACTOR` x the median step, and
    the numbers of the others. On a shared machine a descheduled process makes single steps
    10-100x slower; a mean over them would be theirs. A straggler that is slow at every step
    moves the median too, so it is never left out."""
    walls: dict[int, float] = {}
    for a in attributed:
        walls[a.step] = max(walls.get(a.step, 0.0), a.wall)
    if not walls:
        return attributed, []
    limit = OUTLIER_FACTOR * statistics.median(walls.values())
    out = sorted(step for step, wall in walls.items() if wall > limit)
    drop = set(out)
    return [a for a in attributed if a.step not in drop], out


_CAUSES = {
    "data": "data wait",
    "compute": "compute that does not shrink",
    str(Part.COMM_TRANSFER): "communication transfer",
    str(Part.COMM_WAIT): "waiting for a straggler",
    str(Part.OTHER): "other host work",
}


def _excess(ref: dict[str, Any], row: dict[str, Any], mode: str, world: int) -> dict[str, float]:
    """Milliseconds each cause adds over the ideal step built from one rank."""
    scale = 1 / world if mode == "strong" else 1.0
    p, r = row["parts_ms"], ref["parts_ms"]
    compute = sum(p[k] for k in ("forward", "backward", "optimizer"))
    compute_ref = sum(r[k] for k in ("forward", "backward", "optimizer"))
    return {
        "data": p["data"] - r["data"] * scale,
        "compute": compute - compute_ref * scale,
        str(Part.COMM_TRANSFER): p[str(Part.COMM_TRANSFER)],
        str(Part.COMM_WAIT): p[str(Part.COMM_WAIT)],
        str(Part.OTHER): p[str(Part.OTHER)] - r[str(Part.OTHER)] * scale,
    }


def verdict(scaling: list[dict[str, Any]], per_world: dict[str, Any]) -> dict[str, Any]:
    """The dominant part of the step at the largest world size, the largest cause of lost
    efficiency, and the evidence for both (per mode)."""
    out: dict[str, Any] = {"modes": {}, "warnings": []}
    for w, entry in per_world.items():
        out["warnings"] += [f"world {w}: {p}" for p in entry["homogeneity"]]
    for mode in dict.fromkeys(s["mode"] for s in scaling):
        rows = [s for s in scaling if s["mode"] == mode]
        top = max(rows, key=lambda s: s["world"])
        world = top["world"]
        case = mode if world > 1 else next(iter(per_world["1"]["cases"]))
        row = per_world[str(world)]["cases"][case]
        parts = row["parts_ms"]
        groups = {
            "data": parts["data"],
            "compute": parts["forward"] + parts["backward"] + parts["optimizer"],
            str(Part.COMM_TRANSFER): parts[str(Part.COMM_TRANSFER)],
            str(Part.COMM_WAIT): parts[str(Part.COMM_WAIT)],
            str(Part.OTHER): parts[str(Part.OTHER)],
        }
        dominant = max(groups, key=lambda k: groups[k])
        excess = top["excess_ms"]
        lost = max(excess, key=lambda k: excess[k]) if world > 1 else None
        evidence = [
            f"at {world} rank(s), {mode} scaling: step {row['step_ms']:.2f} ms = "
            + ", ".join(
                f"{_CAUSES.get(k, k)} {v:.2f} ms ({v / row['step_ms']:.0%})"
                for k, v in groups.items()
            ),
            f"speedup {top['speedup']:.2f}x over 1 rank, efficiency {top['efficiency']:.0%}",
        ]
        if world > 1:
            evidence.append(
                "over the ideal step from 1 rank: "
                + ", ".join(
                    f"{_CAUSES[k]} {v:+.2f} ms"
                    for k, v in sorted(excess.items(), key=lambda kv: -kv[1])
                )
            )
        demand = top["samples_per_s"]
        supply = top["loader_only_samples_per_s"]
        if dominant == "data" or (lost == "data"):
            evidence.append(
                f"the loader alone delivers {supply:,.0f} samples/s over all ranks; training "
                f"consumed {demand:,.0f}"
            )
        stragglers = [s for s in row["stragglers"] if s["straggler"]]
        for s in stragglers:
            evidence.append(
                f"rank {s['rank']} is a straggler: busy {s['busy_ms']:.2f} ms per step, "
                "relative score "
                f"{s['relative']:.2f}, arrives last in {s['last_arrival_share']:.0%} of steps"
            )
        if lost == str(Part.COMM_TRANSFER) and row.get("job_busbw_GBps"):
            evidence.append(
                f"the job's all-reduces reached {row['job_busbw_GBps']:.2f} GB/s bus bandwidth"
            )
        if mode == "strong" and world > 1 and lost == "compute":
            evidence.append(
                f"per-rank batch shrank to {row['per_rank_batch']}: compute per rank did not "
                "shrink with it (fixed per-step cost, or small batches run inefficiently)"
            )
        text = f"{mode} scaling to {world} rank(s): the step is dominated by {_CAUSES[dominant]}"
        if lost:
            text += (
                f"; the efficiency is lost mostly to {_CAUSES[lost]} "
                f"({excess[lost]:+.2f} ms per step)"
            )
        if stragglers:
            text += f"; straggler: rank {', '.join(str(s['rank']) for s in stragglers)}"
        out["modes"][mode] = {
            "dominant": dominant,
            "dominant_cause": _CAUSES[dominant],
            "lost_to": lost,
            "stragglers": [s["rank"] for s in stragglers],
            "text": text,
            "evidence": evidence,
        }
    if out["warnings"]:
        for m in out["modes"].values():
            m["text"] += " (caution: " + out["warnings"][0] + ")"
    return out


def _projection(
    cfg: InvestigateConfig,
    runs: dict[int, list[dict[str, Any]]],
    per_world: dict[str, Any],
    scaling: list[dict[str, Any]],
) -> dict[str, Any]:
    """Fit the cost model to the measurements, check it on the measured sizes, project."""
    if 1 not in runs:
        return {"error": "no 1-rank run to fit compute from"}
    points = []  # (per-rank batch, compute s, backward s)
    for entry in per_world.values():
        for row in entry["cases"].values():
            p = row["parts_ms"]
            points.append(
                (
                    row["per_rank_batch"],
                    (p["forward"] + p["backward"] + p["optimizer"]) / 1e3,
                    p["backward"] / 1e3,
                )
            )
    batches = [b for b, _, _ in points]
    if len(set(batches)) >= 2:
        fixed, per = costmodel.fit_compute(batches, [c for _, c, _ in points])
        compute_fit = "least squares over the measured (per-rank batch, compute) points"
    else:
        fixed, per = 0.0, points[0][1] / points[0][0]
        compute_fit = "one batch size measured: all compute taken as per-sample (fixed = 0)"
    backward_fraction = min(1.0, statistics.fmean(b / c for _, c, b in points if c > 0))
    grad_bytes = runs[1][0]["grad_bytes"]
    buckets = max(1, math.ceil(grad_bytes / DDP_BUCKET_BYTES))
    out: dict[str, Any] = {"assumptions": list(costmodel.ASSUMPTIONS), "compute_fit": compute_fit}
    out["workload"] = {
        "fixed_s": fixed,
        "per_sample_s": per,
        "grad_bytes": grad_bytes,
        "buckets": buckets,
        "backward_fraction": backward_fraction,
    }
    if cfg.link_alpha_s is not None and cfg.link_beta_Bps is not None:
        alpha, beta, source = cfg.link_alpha_s, cfg.link_beta_Bps, "given"
    else:
        multi = [int(w) for w, e in per_world.items() if "solo_allreduce" in e]
        if not multi:
            out["error"] = (
                "no multi-rank run: no all-reduce measured to fit the link; give "
                "--link-alpha-s/--link-beta-Bps"
            )
            return out
        w = max(multi)
        solo = per_world[str(w)]["solo_allreduce"]
        try:
            alpha, beta = costmodel.fit_alpha_beta(
                w, [s["bytes"] for s in solo], [s["seconds"] for s in solo]
            )
            source = (
                f"fitted from solo all-reduces at {w} ranks "
                f"({', '.join(str(s['bytes']) for s in solo)} bytes)"
            )
        except ValueError as exc:
            s = max(solo, key=lambda s: s["bytes"])
            alpha, beta = 0.0, bus_bandwidth_factor(w) * s["bytes"] / s["seconds"]
            source = f"fit failed ({exc}); bandwidth from the largest solo all-reduce, alpha 0"
    link = costmodel.Interconnect(
        name="measured" if source != "given" else "given",
        alpha_s=alpha,
        beta_Bps=beta,
        gpus_per_node=cfg.gpus_per_node,
        inter_alpha_s=cfg.inter_alpha_s,
        inter_beta_Bps=cfg.inter_beta_Bps,
    )
    out["link"] = {**dataclasses.asdict(link), "source": source}
    checks = []
    for s in scaling:
        work = costmodel.Workload(
            fixed_s=fixed,
            per_sample_s=per,
            grad_bytes=grad_bytes,
            buckets=buckets,
            backward_fraction=backward_fraction,
            scaling="strong" if s["mode"] == "strong" else "weak",
            batch=cfg.global_batch if s["mode"] == "strong" else cfg.per_rank_batch,
        )
        (pred,) = costmodel.project(work, link, (s["world"],), overlap=True)
        checks.append(
            {
                "mode": s["mode"],
                "world": s["world"],
                "measured_step_ms": s["step_ms"],
                "predicted_step_ms": 1e3 * pred.step_s,
                "relative_error": pred.step_s * 1e3 / s["step_ms"] - 1,
            }
        )
    out["check"] = checks
    worlds = sorted({1, *cfg.world_sizes, *cfg.project_worlds})
    proj: dict[str, Any] = {}
    for mode in cfg.modes:
        for overlap in (True, False):
            variants = [("ddp buckets", buckets)] + ([("one bucket", 1)] if buckets > 1 else [])
            for label, k in variants:
                work = costmodel.Workload(
                    fixed_s=fixed,
                    per_sample_s=per,
                    grad_bytes=grad_bytes,
                    buckets=k,
                    backward_fraction=backward_fraction,
                    scaling="strong" if mode == "strong" else "weak",
                    batch=cfg.global_batch if mode == "strong" else cfg.per_rank_batch,
                )
                key = f"{mode}, {'overlap' if overlap else 'no overlap'}, {label} ({k})"
                proj[key] = [
                    p.to_dict() for p in costmodel.project(work, link, worlds, overlap=overlap)
                ]
    out["projections"] = proj
    return out


def dump_json(report: dict[str, Any], path: Path) -> None:
    # Not durable: the report is rewritten by the next investigation.
    atomic.write_text(path, json.dumps(report, indent=1, default=str) + "\n", durable=False)
