"""Data-parallel scaling of the training loop: throughput, scaling efficiency and the share of
step time that gradient communication adds, at 1..N GPUs of one machine.

    python -m reference_impls.scaling.ddp --out DIR [--gpus 1,2] [--precisions fp32,bf16]

(formerly ``python -m reference_impls.training.scaling``, which still works and runs this).

The command is a driver: it starts one worker per GPU count (a plain process for 1 GPU, as the
loop runs without ``torchrun``; ``torchrun --standalone --nproc-per-node N`` above that) and then
checks the loop's own entry point under ``torchrun`` on the same device. What each part does:

- **DDP step timing** (the numbers of the table). The model the loop builds
  (:func:`~reference_impls.training.model.build_model`, an MLP ``in -> hidden... -> 1``), the
  optimizer it builds (Adam, :func:`~reference_impls.training.model.build_optimizer`) and its
  loss (MSE), wrapped in ``DistributedDataParallel`` exactly as :class:`Trainer` wraps it
  (``device_ids=[local_rank]``, default buckets), on synthetic batches that already lie on the
  device. A step is ``zero_grad / forward / backward / step``; every step is timed between two
  device synchronizations and the median is reported; warm-up steps are not timed. Strong
  scaling keeps the global batch (``--global-batch``) and splits it over the GPUs; weak scaling
  keeps the per-GPU batch (``--per-gpu-batch``). ``bf16`` runs forward and backward under
  ``torch.autocast(bfloat16)`` (fp32 weights, gradients, all-reduce and Adam); ``fp32`` is
  plain float32 with torch's default matmul precision (no TF32).
- **Communication share.** The same step again inside ``DDP.no_sync()`` (no gradient
  all-reduce), interleaved with the normal one in blocks: ``1 - t(no_sync) / t(DDP)`` is the
  share of the step that communication adds (what overlap with the backward pass does not
  hide). Also timed alone: one NCCL all-reduce of all gradients as one flat float32 tensor (the
  communication a step issues, were none of it overlapped), and all-reduces of the bucket sizes
  that DDP's logging data reports, one after another. Those are DDP's construction-time buckets:
  with torch's defaults (no ``find_unused_parameters``) that is a single bucket of every
  gradient, which DDP rebuilds in gradient order after the first step; the rebuilt layout is
  not read here, so the second number is the first one again.
- **Trainer throughput.** :class:`Trainer` itself (fp32, the strong-scaling global batch) with a
  callback that synchronizes the device after every step: the loop's real step, which gathers
  each batch on the CPU, copies it to the device, all-reduces the logged loss and writes a
  metrics row. Validation and the checkpoint happen once, after the last step, outside the
  timing; the run directory is on ``/dev/shm`` when it has room.
- **Entry-point check** (``--cli-check``, on by default): ``torchrun ... -m
  reference_impls.training`` with ``device = "cuda"`` on a small MLP, 2 ranks over NCCL, stopped
  after 3 epochs and resumed to 5, against one process run straight to 5; it reports what the
  ranks returned and whether they agree.

Results: ``DIR/scaling.json`` (every number, every rank's medians) and a Markdown table on stdout.
``--device cpu`` runs the same on gloo processes (a plumbing check only). NVLink multicast stays
off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1`` are
set for every process this starts; ``OMP_NUM_THREADS`` is 1 unless set, as torchrun sets it for
N > 1). Nothing here imports pytest or ``harness``.

One module of ~730 lines on purpose: the driver launches this same module (``--worker``, under
torchrun above 1 GPU), so the driver, the worker and the argument parser they share stay
together.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impls.training.config import ModelConfig, OptimizerConfig, TrainConfig
from reference_impls.training.distributed import DistContext, init_from_env
from reference_impls.training.loop import Callback, Trainer
from reference_impls.training.model import build_model, build_optimizer

__all__ = ["main"]

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

CLI_CONFIG = """
seed = 7
max_epochs = 3
progress = false
device = "{device}"

[model]
in_features = 64
hidden = [256, 256]

[data]
num_train = 1024
num_val = 256
batch_size = 64

[optimizer]
name = "adam"
lr = 0.001
"""


def _log(*parts: object) -> None:
    print(*parts, flush=True)


# --------------------------------------------------------------------------- timing helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(fn: Callable[[], None], n: int, device: torch.device) -> list[float]:
    """Seconds of each of ``n`` calls, each ended by a device synchronization."""
    out = []
    _sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
        _sync(device)
        now = time.perf_counter()
        out.append(now - start)
        start = now
    return out


def _median_ms(seconds: Sequence[float]) -> float:
    return 1e3 * float(statistics.median(seconds))


def _linear_flops_per_sample(model: nn.Module) -> int:
    """Forward + backward matmul FLOPs per example: 6 x the weights of every Linear."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return sum(6 * m.in_features * m.out_features for m in linears)


class _StepClock(Callback):
    """Synchronizes the device at the end of every optimizer step and records the time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.times: list[float] = []
        self._last: float | None = None

    def on_step_end(self, trainer: Trainer) -> None:
        _sync(self.device)
        now = time.perf_counter()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now


# --------------------------------------------------------------------------- worker


def _worker(args: argparse.Namespace) -> int:
    init_from_env(args.device)
    ctx = DistContext.current()
    world = ctx.world_size
    if args.device == "cuda":
        device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    hidden = tuple(args.hidden)
    model_cfg = ModelConfig(in_features=args.in_features, hidden=hidden, out_features=1)
    torch.manual_seed(1234)
    with device:  # initialize on the device: seconds less than building 168M weights on the CPU
        model = build_model(model_cfg)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_sample = _linear_flops_per_sample(model)
    net: nn.Module = model
    ddp = world > 1
    if ddp:
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    optimizer = build_optimizer(OptimizerConfig(name="adam", lr=1e-5), model)

    info: dict[str, Any] = {
        "world_size": world,
        "device": str(device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "params": n_params,
        "grad_bytes_fp32": 4 * n_params,
        "flops_per_sample": flops_per_sample,
        "model": {"in_features": args.in_features, "hidden": list(hidden), "out_features": 1},
        "optimizer": "adam (torch.optim default: foreach)",
    }
    if device.type == "cuda":
        info.update(
            gpu=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
        )

    local_batches = (
        sorted({args.global_batch // w for w in args.gpus} | {args.per_gpu_batch})
        if world == 1
        else sorted({args.global_batch // world, args.per_gpu_batch})
    )
    gen = torch.Generator(device=device).manual_seed(1000 + ctx.rank)
    cases = []
    for precision in args.precisions:
        for local in local_batches:
            x = torch.randn(local, args.in_features, device=device, generator=gen)
            y = torch.randn(local, 1, device=device, generator=gen)

            def step(
                all_reduce: bool,
                x: torch.Tensor = x,
                y: torch.Tensor = y,
                precision: str = precision,
                net: Any = net,  # DDP (no_sync) or the bare module
                optimizer: torch.optim.Optimizer = optimizer,
            ) -> None:
                optimizer.zero_grad(set_to_none=True)
                skip = net.no_sync() if ddp and not all_reduce else contextlib.nullcontext()
                with skip:
                    with torch.autocast(
                        device.type, dtype=torch.bfloat16, enabled=precision == "bf16"
                    ):
                        out = net(x)
                    loss = F.mse_loss(out.float(), y)
                    loss.backward()
                optimizer.step()

            for _ in range(args.warmup):
                step(True)
            if ddp:
                for _ in range(max(2, args.warmup // 2)):
                    step(False)
            timed: dict[str, list[float]] = {"ddp": [], "no_sync": []}
            per_block = max(1, args.steps // args.blocks)
            for _ in range(args.blocks):  # interleaved: drift hits both the same
                timed["ddp"] += _time_steps(lambda: step(True), per_block, device)
                if ddp:
                    timed["no_sync"] += _time_steps(lambda: step(False), per_block, device)
            case = {
                "precision": precision,
                "local_batch": local,
                "global_batch": local * world,
                "ddp_ms": _median_ms(timed["ddp"]),
                "ddp_ms_min": 1e3 * min(timed["ddp"]),
                "ddp_ms_max": 1e3 * max(timed["ddp"]),
                "no_sync_ms": _median_ms(timed["no_sync"]) if ddp else None,
                "steps_timed": len(timed["ddp"]),
            }
            case["tflops_per_gpu"] = flops_per_sample * local / (case["ddp_ms"] * 1e-3) / 1e12
            cases.append(case)
            if ctx.is_main:
                _log(
                    f"[w{world}] {precision} local batch {local}: DDP {case['ddp_ms']:.3f} ms"
                    + (f", no_sync {case['no_sync_ms']:.3f} ms" if ddp else "")
                    + f", {case['tflops_per_gpu']:.1f} TFLOP/s per GPU"
                )
            del x, y

    comm: dict[str, Any] = {}
    if ddp:
        bucket_sizes: list[int] = []
        with contextlib.suppress(Exception):  # a private API: its absence only costs a number
            raw = net._get_ddp_logging_data().get("bucket_sizes", "")  # type: ignore[operator]
            bucket_sizes = [int(s) for s in str(raw).replace(" ", "").split(",") if s]
        flat = torch.randn(n_params, device=device)

        def flat_all_reduce() -> None:
            dist.all_reduce(flat)

        for _ in range(3):
            flat_all_reduce()
        t_flat = _time_steps(flat_all_reduce, args.comm_reps, device)
        comm["flat_all_reduce_ms"] = _median_ms(t_flat)
        comm["flat_bytes"] = 4 * n_params
        comm["flat_busbw_GBps"] = (
            4 * n_params * 2 * (world - 1) / world / (comm["flat_all_reduce_ms"] * 1e-3) / 1e9
        )
        del flat
        if bucket_sizes:
            buckets = [torch.randn(max(1, b // 4), device=device) for b in bucket_sizes]

            def bucket_all_reduces() -> None:
                for b in buckets:
                    dist.all_reduce(b)

            for _ in range(2):
                bucket_all_reduces()
            comm["bucket_sizes_bytes"] = bucket_sizes
            comm["buckets_all_reduce_ms"] = _median_ms(
                _time_steps(bucket_all_reduces, args.comm_reps, device)
            )
            del buckets
        if ctx.is_main:
            _log(f"[w{world}] all-reduce alone: {comm}")

    del net, model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()

    trainer_result: dict[str, Any] | None = None
    if args.trainer_steps > 0:
        n_steps = args.warmup + args.trainer_steps + 1
        config = TrainConfig.from_dict(
            {
                "seed": 0,
                "max_epochs": 10_000,
                "max_steps": n_steps,
                "val_every_steps": 10**9,  # only the last step is validated (and checkpointed)
                "progress": False,
                "device": args.device,
                "model": {
                    "in_features": args.in_features,
                    "hidden": list(hidden),
                    "out_features": 1,
                },
                "data": {
                    "num_train": 4 * args.global_batch,
                    "num_val": 256,
                    "batch_size": args.global_batch,
                },
                "optimizer": {"name": "adam", "lr": 1e-5},
                "early_stopping": {"patience": None},
            },
            source="scaling",
        )
        clock = _StepClock(device)
        run_dir = Path(args.scratch) / f"trainer-w{world}"
        started = time.perf_counter()
        result = Trainer(config, run_dir, callbacks=[clock], dist=ctx).run(resume="never")
        wall = time.perf_counter() - started
        times = clock.times[args.warmup :]  # clock.times[i]: step i+2 (step 1 has no start mark)
        trainer_result = {
            "steps": result.step,
            "steps_timed": len(times),
            "global_batch": args.global_batch,
            "step_ms": _median_ms(times),
            "samples_per_s": args.global_batch / statistics.median(times),
            "wall_s_including_setup_validation_checkpoint": wall,
            "last_val_loss": result.last_val_loss,
            "stop_reason": result.stop_reason,
        }
        if ctx.is_main:
            _log(f"[w{world}] Trainer: {trainer_result}")

    mine = {"rank": ctx.rank, "cases": cases, "comm": comm, "trainer": trainer_result}
    ranks = [mine]
    if world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        ranks = gathered
    if ctx.is_main:
        Path(args.worker_json).write_text(json.dumps({"info": info, "ranks": ranks}, indent=1))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- driver


def _run(
    command: list[str], *, timeout: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    _log("$ " + " ".join(command))
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=max(5.0, timeout), env=env
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            (exc.stdout or b"").decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "")
        )
        err = (
            (exc.stderr or b"").decode(errors="replace")
            if isinstance(exc.stderr, bytes)
            else (exc.stderr or "")
        )
        _log(out[-3000:], err[-3000:], f"TIMEOUT after {timeout:.0f} s")
        return subprocess.CompletedProcess(command, 124, out, err)
    _log(proc.stdout[-4000:].rstrip())
    if proc.stderr.strip():
        _log("--- stderr (tail) ---\n" + proc.stderr[-3000:].rstrip())
    _log(f"(exit {proc.returncode}, {time.perf_counter() - started:.1f} s)")
    return proc


def _launcher(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}"]  # fmt: skip


def _results(lines: str) -> list[dict[str, Any]]:
    out = []
    for line in lines.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return sorted(out, key=lambda r: r.get("rank", 0))


def _cli_check(
    args: argparse.Namespace, scratch: Path, env: dict[str, str], remaining: Callable[[], float]
) -> dict[str, Any]:
    """The entry point under torchrun on the device: 2 ranks, 3 epochs, resume to 5; 1 rank to 5."""
    config = scratch / "cli.toml"
    config.write_text(CLI_CONFIG.format(device=args.device))
    module = ["-m", "reference_impls.training", "--config", str(config), "--no-progress"]
    ranks = min(2, max(args.gpus))
    report: dict[str, Any] = {
        "config": CLI_CONFIG.format(device=args.device).strip(),
        "ranks": ranks,
    }
    steps = [
        ("distributed_3_epochs", ranks, scratch / "cli-dist", ["--resume", "never"]),
        (
            "distributed_resumed_to_5",
            ranks,
            scratch / "cli-dist",
            ["--resume", "require", "--set", "max_epochs=5"],
        ),
        ("single_5_epochs", 1, scratch / "cli-single", ["--set", "max_epochs=5"]),
    ]
    for name, nproc, run_dir, extra in steps:
        if remaining() < 30:
            report[name] = {"skipped": "time budget"}
            continue
        proc = _run(
            [*_launcher(nproc), *module, "--run-dir", str(run_dir), *extra],
            timeout=min(150.0, remaining() - 10),
            env=env,
        )
        report[name] = {
            "exit": proc.returncode,
            "results": _results(proc.stdout),
            "stderr_tail": proc.stderr[-1500:],
            "files": sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else [],
        }
    resumed = report.get("distributed_resumed_to_5", {}).get("results", [])
    single = report.get("single_5_epochs", {}).get("results", [])
    if len(resumed) == ranks and single:
        keys = ("stop_reason", "stop_epoch", "step", "best_step", "best_epoch")
        r0 = resumed[0]
        report["ranks_agree"] = all(
            {k: r[k] for k in keys} == {k: r0[k] for k in keys} for r in resumed
        )
        report["resumed_from"] = r0.get("resumed_from")
        report["same_schedule_as_single"] = {k: r0[k] for k in keys} == {
            k: single[0][k] for k in keys
        }
        a, b = r0.get("last_val_loss"), single[0].get("last_val_loss")
        if isinstance(a, float) and isinstance(b, float):
            report["last_val_loss"] = {
                "distributed_resumed": a,
                "single": b,
                "relative_difference": abs(a - b) / max(abs(b), 1e-30),
            }
    return report


def _table(workers: dict[int, dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per (precision, scaling mode, GPU count), with speedup and efficiency."""
    rows = []
    base = {(c["precision"], c["local_batch"]): c for c in workers[1]["ranks"][0]["cases"]}
    for world in sorted(workers):
        ranks = workers[world]["ranks"]
        comm = ranks[0]["comm"]
        for i, case in enumerate(ranks[0]["cases"]):
            prec, local = case["precision"], case["local_batch"]
            if world == 1:
                modes = [
                    " + ".join(
                        m
                        for m, b in (("strong", args.global_batch), ("weak", args.per_gpu_batch))
                        if local == b
                    )
                    or "reference"
                ]
            else:
                modes = [
                    m
                    for m, ok in (
                        ("strong", local * world == args.global_batch),
                        ("weak", local == args.per_gpu_batch),
                    )
                    if ok
                ]
            # The slowest rank's median (ranks are in lock-step under DDP anyway).
            ddp_ms = max(r["cases"][i]["ddp_ms"] for r in ranks)
            no_sync = [r["cases"][i]["no_sync_ms"] for r in ranks]
            no_sync_ms = max(no_sync) if world > 1 else None
            for mode in modes:
                samples = local * world / (ddp_ms * 1e-3)
                if world == 1:
                    speedup = efficiency = None if mode == "reference" else 1.0
                else:
                    ref = base.get((prec, args.global_batch if mode == "strong" else local))
                    # strong: same global batch, T1 / TW; weak: same per-GPU batch, TW vs T1
                    # per GPU. Both: speedup = throughput ratio, efficiency = speedup / GPUs.
                    ref_samples = (
                        None if ref is None else (ref["local_batch"] / (ref["ddp_ms"] * 1e-3))
                    )
                    speedup = None if ref_samples is None else samples / ref_samples
                    efficiency = None if speedup is None else speedup / world
                rows.append(
                    {
                        "precision": prec,
                        "scaling": mode,
                        "gpus": world,
                        "global_batch": local * world,
                        "per_gpu_batch": local,
                        "step_ms": ddp_ms,
                        "samples_per_s": samples,
                        "speedup": speedup,
                        "efficiency": efficiency,
                        "tflops_per_gpu": case["tflops_per_gpu"],
                        "no_sync_step_ms": no_sync_ms,
                        "comm_share": None if no_sync_ms is None else 1 - no_sync_ms / ddp_ms,
                        "flat_all_reduce_ms": comm.get("flat_all_reduce_ms"),
                        "buckets_all_reduce_ms": comm.get("buckets_all_reduce_ms"),
                    }
                )
    return rows


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| precision | scaling | GPUs | global batch | per-GPU batch | step ms (median) | "
        "samples/s | speedup | efficiency | TFLOP/s per GPU | step ms, no all-reduce | "
        "comm share |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r['precision']} | {r['scaling']} | {r['gpus']} | {r['global_batch']} | "
            f"{r['per_gpu_batch']} | {r['step_ms']:.2f} | {r['samples_per_s']:,.0f} | "
            f"{_fmt(r['speedup'], '.2f')} | {_fmt(r['efficiency'], '.0%')} | "
            f"{r['tflops_per_gpu']:.0f} | {_fmt(r['no_sync_step_ms'], '.2f')} | "
            f"{_fmt(r['comm_share'], '.0%')} |"
        )
    return "\n".join(lines)


def _driver(args: argparse.Namespace, argv: Sequence[str]) -> int:
    started = time.perf_counter()

    def remaining() -> float:
        return float(args.budget_s) - (time.perf_counter() - started)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # torchrun sets OMP_NUM_THREADS=1 for N > 1 processes; the 1-GPU worker gets the same, so
    # the Trainer's CPU-side batch gather costs the same at every GPU count.
    env = {"OMP_NUM_THREADS": "1", **os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
    shm = Path("/dev/shm")
    base = None
    with contextlib.suppress(OSError):
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 16 * 2**30:
            base = str(shm)
    scratch = Path(tempfile.mkdtemp(prefix="scaling-", dir=base))
    _log(f"scratch directory {scratch}; time budget {args.budget_s:.0f} s")
    if args.device == "cuda" and torch.cuda.is_available():
        available = torch.cuda.device_count()
        if max(args.gpus) > available:
            _log(f"only {available} GPU(s): measuring {[g for g in args.gpus if g <= available]}")
            args.gpus = [g for g in args.gpus if g <= available]
    # The worker gets the driver's own options (minus --out), plus where to write.
    passthrough = []
    skip_next = False
    for item in argv:
        if skip_next:
            skip_next = False
            continue
        if item == "--out":
            skip_next = True
            continue
        if item.startswith("--out="):
            continue
        passthrough.append(item)

    workers: dict[int, dict[str, Any]] = {}
    report: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "argv": list(argv),
        "env": NO_MULTICAST,
        "runs": {},
    }
    try:
        for world in args.gpus:
            if remaining() < 30:
                _log(f"skipping {world} GPU(s): time budget")
                continue
            path = scratch / f"worker-w{world}.json"
            command = [
                *_launcher(world),
                "-m",
                "reference_impls.scaling.ddp",
                "--worker",
                "--worker-json",
                str(path),
                "--scratch",
                str(scratch),
                *passthrough,
            ]
            proc = _run(command, timeout=remaining() - 10, env=env)
            report["runs"][f"w{world}"] = {
                "exit": proc.returncode,
                "stderr_tail": proc.stderr[-1500:],
            }
            if proc.returncode == 0 and path.exists():
                workers[world] = json.loads(path.read_text())
        report["workers"] = {str(k): v for k, v in workers.items()}
        if 1 in workers:
            rows = _table(workers, args)
            report["table"] = rows
            report["markdown"] = _markdown(rows)
            trainer = {w: v["ranks"][0]["trainer"] for w, v in workers.items()}
            report["trainer"] = trainer
        (out / "scaling.json").write_text(json.dumps(report, indent=1))
        if args.cli_check:
            report["cli_check"] = _cli_check(args, scratch, env, remaining)
        (out / "scaling.json").write_text(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    _log("\n==== summary ====")
    if workers:
        info = next(iter(workers.values()))["info"]
        _log(json.dumps(info))
    if "markdown" in report:
        _log(report["markdown"])
        for w, t in sorted(report["trainer"].items()):
            if t:
                _log(
                    f"Trainer, {w} GPU(s), global batch {t['global_batch']}: "
                    f"{t['step_ms']:.2f} ms/step, {t['samples_per_s']:,.0f} samples/s"
                )
        for w, v in sorted(workers.items()):
            if v["ranks"][0]["comm"]:
                _log(f"{w} GPUs, all-reduce alone: " + json.dumps(v["ranks"][0]["comm"]))
    if "cli_check" in report:
        c = report["cli_check"]
        _log(
            "entry-point check: "
            + json.dumps(
                {
                    k: c.get(k)
                    for k in (
                        "ranks_agree",
                        "resumed_from",
                        "same_schedule_as_single",
                        "last_val_loss",
                    )
                }
            )
        )
        for name in ("distributed_3_epochs", "distributed_resumed_to_5", "single_5_epochs"):
            part = c.get(name, {})
            _log(f"  {name}: exit {part.get('exit')}, files {part.get('files')}")
    ok = set(workers) == set(args.gpus)
    return 0 if ok else 1


# --------------------------------------------------------------------------- command line


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.update(NO_MULTICAST)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m reference_impls.scaling.ddp", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", default="scaling-out", help="scaling.json goes here")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpus", type=_ints, default=[1, 2], help="GPU counts, e.g. 1,2")
    parser.add_argument("--in-features", type=int, default=4096)
    parser.add_argument("--hidden", type=_ints, default=[8192, 8192, 8192])
    parser.add_argument("--global-batch", type=int, default=1024, help="strong scaling")
    parser.add_argument("--per-gpu-batch", type=int, default=1024, help="weak scaling")
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "bf16"])
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per case")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per case and mode")
    parser.add_argument("--blocks", type=int, default=3, help="interleaved DDP/no_sync blocks")
    parser.add_argument("--comm-reps", type=int, default=10)
    parser.add_argument(
        "--trainer-steps", type=int, default=15, help="timed Trainer steps per GPU count (0: skip)"
    )
    parser.add_argument("--no-cli-check", dest="cli_check", action="store_false")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="the driver skips what would start after this many seconds",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-json", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for p in args.precisions:
        if p not in ("fp32", "bf16"):
            parser.error(f"--precisions: fp32 or bf16, got {p!r}")
    if args.global_batch % max(args.gpus):
        parser.error("--global-batch must split evenly over the largest GPU count")
    if args.worker:
        return _worker(args)
    return _driver(args, argv)


if __name__ == "__main__":
    sys.exit(main())
