"""The scaling investigation's analysis: from every rank's step records to the report.

:func:`analyse` turns the results :func:`~reference_impls.scaling.investigate.investigate`
gathered (one list of rank results per world size) into what the report says: the attributed
breakdown, speedup and efficiency against one rank, the communication share, straggler
scores, the :func:`verdict` naming the part whose excess over the ideal is largest, and the
cost model's projection past this machine. Nothing here starts a process or touches a device:
it works on the results alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reference_impls import atomic
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

if TYPE_CHECKING:
    from reference_impls.scaling.investigate import InvestigateConfig

__all__ = ["DDP_BUCKET_BYTES", "analyse", "dump_json", "steady_steps", "verdict"]

DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb


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
