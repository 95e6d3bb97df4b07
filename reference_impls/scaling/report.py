"""The investigation's files: ``scaling.json`` (every number), ``report.md`` (tables, verdict,
projection, assumptions) and PNG plots (matplotlib's Agg backend, no display needed):
``breakdown.png`` (stacked parts per world size and mode), ``efficiency.png`` (measured and
projected efficiency), ``step_times.png`` (per-rank step-time distribution)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reference_impls.scaling.breakdown import PARTS

__all__ = ["markdown", "write_report"]

_COLORS = {
    "data": "#4c72b0",
    "forward": "#55a868",
    "backward": "#8ccf8a",
    "optimizer": "#c4ad66",
    "comm_transfer": "#c44e52",
    "comm_wait": "#dd8452",
    "other": "#8c8c8c",
}


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    from reference_impls.scaling.analysis import dump_json

    dump_json(report, out / "scaling.json")
    files = [out / "scaling.json"]
    if report.get("rows"):
        files += _plots(report, out)
    (out / "report.md").write_text(markdown(report))
    files.append(out / "report.md")
    return files


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        "# Scaling investigation",
        "",
        f"{report['date_utc']} UTC; device {cfg['device']}; world sizes {cfg['world_sizes']}; "
        f"model MLP {cfg['in_features']} -> {' -> '.join(map(str, cfg['hidden']))} -> 1; "
        f"strong scaling global batch {cfg['global_batch']}, weak scaling "
        f"{cfg['per_rank_batch']} per rank; "
        f"{cfg['steps']} timed steps per case after {cfg['warmup']} warm-up.",
        "",
    ]
    if report.get("failures"):
        lines += ["## Failed world sizes", ""]
        for w, f in report["failures"].items():
            lines.append(f"- world {w}: {f['summary']}")
        lines.append("")
    verdict = report.get("verdict", {})
    if verdict.get("modes"):
        lines += ["## Verdict", ""]
        for v in verdict["modes"].values():
            lines.append(f"**{v['text']}.**")
            lines += [f"- {e}" for e in v["evidence"]]
            lines.append("")
        for w in verdict.get("warnings", []):
            lines.append(f"> warning: {w}")
        lines.append("")
    if report.get("scaling"):
        lines += [
            "## Speedup and efficiency",
            "",
            "| mode | ranks | per-rank batch | global batch | step ms | samples/s | speedup "
            "| efficiency | comm share | data share | loader alone, samples/s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in report["scaling"]:
            flag = (
                " (per-rank batch shrank)"
                if s["per_rank_batch_shrank"] and s["efficiency"] < 0.8
                else ""
            )
            lines.append(
                f"| {s['mode']} | {s['world']} | {s['per_rank_batch']}{flag} | "
                f"{s['global_batch']} | {s['step_ms']:.2f} | "
                f"{s['samples_per_s']:,.0f} | {s['speedup']:.2f} | {s['efficiency']:.0%} | "
                f"{s['comm_share']:.0%} | "
                f"{s['data_share']:.0%} | {s['loader_only_samples_per_s']:,.0f} |"
            )
        lines.append("")
    if report.get("rows"):
        lines += [
            "## Step breakdown (mean ms per step, all ranks; the parts add up to the step)",
            "",
            "Steps whose slowest rank took more than 1.5x the median step are left out of the "
            "means (a descheduled process on a shared machine); their count is in the last column.",
            "",
            "| ranks | case | "
            + " | ".join(str(p) for p in PARTS)
            + " | step | overlapped comm | breakdown / loop clock | profiler overhead | "
            "record bytes | outlier steps |",
            "|---|---|" + "---|" * (len(PARTS) + 6),
        ]
        for r in report["rows"]:
            o = r["overhead"]["relative_median"]
            lines.append(
                f"| {r['world']} | {r['case']} | "
                + " | ".join(f"{r['parts_ms'][str(p)]:.3f}" for p in PARTS)
                + f" | {r['step_ms']:.3f} | {r['comm_overlapped_ms']:.3f} | "
                f"{_f(r['breakdown_vs_loop_clock'], '.3f')} | "
                f"{_f(o, '+.1%')} | {r['record_bytes_max']} | "
                f"{len(r['outlier_steps'])} of {r['steps'] + len(r['outlier_steps'])} |"
            )
        lines += [
            "",
            "Per rank:",
            "",
            "| ranks | case | rank | " + " | ".join(str(p) for p in PARTS) + " | step |",
            "|---|---|---|" + "---|" * (len(PARTS) + 1),
        ]
        for r in report["rows"]:
            for rank, p in r["per_rank_parts_ms"].items():
                lines.append(
                    f"| {r['world']} | {r['case']} | {rank} | "
                    + " | ".join(f"{p[str(x)]:.3f}" for x in PARTS)
                    + f" | {p['wall']:.3f} |"
                )
        lines += [
            "",
            "Stragglers (relative score: fastest rank's busy time / this rank's; individual: "
            "its best / its median):",
            "",
        ]
        lines += [
            "| ranks | case | rank | busy ms | relative | individual | arrives last | straggler |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in report["rows"]:
            for s in r["stragglers"]:
                lines.append(
                    f"| {r['world']} | {r['case']} | {s['rank']} | {s['busy_ms']:.3f} | "
                    f"{s['relative']:.2f} | "
                    f"{s['individual']:.2f} | {s['last_arrival_share']:.0%} | "
                    f"{'yes' if s['straggler'] else ''} |"
                )
        lines.append("")
    comm = [(w, e) for w, e in report.get("worlds", {}).items() if e.get("solo_allreduce")]
    if comm:
        lines += ["## Interconnect: solo all-reduce vs the job's", ""]
        for w, e in comm:
            solo = ", ".join(
                f"{s['bytes']:,} B: {1e3 * s['seconds']:.3f} ms ({s['busbw_GBps']:.3g} GB/s busbw)"
                for s in e["solo_allreduce"]
            )
            job = [r for r in report["rows"] if str(r["world"]) == w and r["job_busbw_GBps"]]
            lines.append(f"- {w} ranks, solo (the collectives package's busbw benchmark): {solo}")
            for r in job:
                lines.append(
                    f"- {w} ranks, {r['case']}: the job's gradient all-reduces reached "
                    f"{r['job_busbw_GBps']:.2f} GB/s busbw"
                )
        lines.append("")
    if "transport" in report:
        t = report["transport"]
        lines += (
            ["## Transport (NCCL)", "", f"- {t['summary']}"]
            + [f"- warning: {w}" for w in t["warnings"]]
            + [""]
        )
    proj = report.get("projection", {})
    if proj.get("projections"):
        link = proj["link"]
        w = proj["workload"]
        lines += [
            "## Projection (cost model)",
            "",
            f"Link: alpha {1e6 * link['alpha_s']:.1f} us per ring step, beta "
            f"{link['beta_Bps'] / 1e9:.3f} GB/s ({link['source']}). "
            f"Compute: {1e3 * w['fixed_s']:.3f} ms fixed + {1e6 * w['per_sample_s']:.3f} us "
            f"per sample ({proj['compute_fit']}); "
            f"gradients {w['grad_bytes']:,} bytes in {w['buckets']} bucket(s); backward "
            f"{w['backward_fraction']:.0%} of compute.",
            "",
            "Check against the measured world sizes:",
            "",
            "| mode | ranks | measured step ms | predicted | error |",
            "|---|---|---|---|---|",
        ]
        for c in proj["check"]:
            lines.append(
                f"| {c['mode']} | {c['world']} | {c['measured_step_ms']:.3f} | "
                f"{c['predicted_step_ms']:.3f} | {c['relative_error']:+.0%} |"
            )
        lines += [
            "",
            "| variant | ranks | step ms | exposed comm share | speedup | efficiency |",
            "|---|---|---|---|---|---|",
        ]
        for key, preds in proj["projections"].items():
            for p in preds:
                lines.append(
                    f"| {key} | {p['world']} | {1e3 * p['step_s']:.3f} | "
                    f"{p['comm_share']:.0%} | {p['speedup']:.2f} | {p['efficiency']:.0%} |"
                )
        lines += ["", "Assumptions:", ""] + [f"- {a}" for a in proj["assumptions"]] + [""]
    elif proj.get("error"):
        lines += ["## Projection", "", f"Not made: {proj['error']}", ""]
    if report.get("rows"):
        lines += [
            "## Plots",
            "",
            "![breakdown](breakdown.png)",
            "",
            "![efficiency](efficiency.png)",
            "",
            "![step times](step_times.png)",
            "",
        ]
    return "\n".join(lines)


def _plots(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    paths = []
    # Stacked breakdown bars.
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows)), 4))
    labels = [f"{r['world']} x {r['case']}\n(batch {r['per_rank_batch']})" for r in rows]
    bottom = [0.0] * len(rows)
    for p in PARTS:
        vals = [r["parts_ms"][str(p)] for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=str(p), color=_COLORS[str(p)])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("ms per step (mean over ranks)")
    ax.set_title("Step breakdown per world size")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    paths.append(out / "breakdown.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    # Efficiency: measured and projected.
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in dict.fromkeys(s["mode"] for s in report["scaling"]):
        pts = [s for s in report["scaling"] if s["mode"] == mode]
        ax.plot(
            [s["world"] for s in pts],
            [s["efficiency"] for s in pts],
            "o-",
            label=f"{mode}, measured",
        )
    for key, preds in report.get("projection", {}).get("projections", {}).items():
        if "ddp buckets" in key:
            ax.plot(
                [p["world"] for p in preds],
                [p["efficiency"] for p in preds],
                "--",
                label=f"{key}, model",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("scaling efficiency (speedup / ranks)")
    ax.set_ylim(0, 1.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    paths.append(out / "efficiency.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    # Per-rank step-time distribution.
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * sum(r["world"] for r in rows)), 4))
    data, names = [], []
    for r in rows:
        for rank, times in r["per_rank_step_ms"].items():
            data.append(times)
            names.append(f"{r['world']}x{r['case'][0]}\nr{rank}")
    ax.boxplot(data)
    ax.set_xticks(range(1, len(names) + 1), names, fontsize=7)
    ax.set_ylabel("step ms")
    ax.set_title("Per-rank step time")
    fig.tight_layout()
    paths.append(out / "step_times.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
