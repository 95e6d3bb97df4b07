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
straggler, or other; with the numbers that show it. That analysis is analysis.py; this module
runs the processes and gathers what they measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference_impls.collectives import LaunchConfig, LaunchError, launch
from reference_impls.scaling.analysis import analyse  # the report, from the ranks' results
from reference_impls.scaling.costmodel import MAX_WORLD
from reference_impls.scaling.transport import parse_nccl_log
from reference_impls.scaling.workload import RankConfig, run_rank

__all__ = ["InvestigateConfig", "InvestigationError", "analyse", "investigate"]


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
        if not self.project_worlds or any(
            isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WORLD
            for w in self.project_worlds
        ):
            raise InvestigationError(
                f"project worlds must be integers >= 1, got {list(self.project_worlds)} "
                "(at most 2**53; e.g. 8,64,512)"
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


def cpu_bytes_needed(cfg: InvestigateConfig) -> int:
    """A floor on the memory the largest world size's ranks need together: per rank the float32
    weights, gradients, DDP's bucket copies and the optimizer's state (4 copies), and the
    activations of the largest batch kept for backward (2 copies per layer)."""
    widths = [cfg.in_features, *cfg.hidden, 1]
    params = sum(a * b + b for a, b in zip(widths, widths[1:], strict=False))
    batch = max(cfg.global_batch, cfg.per_rank_batch)
    activations = batch * sum(widths)
    return max(cfg.world_sizes) * 4 * (4 * params + 2 * activations)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on Linux: no check
        return 0


def check_devices(cfg: InvestigateConfig) -> None:
    """More ranks than devices is an error on CUDA (ranks would share GPUs); on CPU, more than
    ``CPU_RANKS_PER_CORE`` ranks per usable core, or a model and batch whose floor of
    :func:`cpu_bytes_needed` exceeds the machine's memory, is refused before any process
    starts."""
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
        need, have = cpu_bytes_needed(cfg), _physical_memory()
        if have and need > have:
            raise InvestigationError(
                f"--in-features {cfg.in_features}, --hidden {','.join(map(str, cfg.hidden))} and "
                f"the batches need about {need / 2**30:.1f} GiB at world size "
                f"{max(cfg.world_sizes)}; this machine has {have / 2**30:.1f} GiB: shrink the "
                "model or the batch (a rank would otherwise die of MemoryError mid-run)"
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
