"""Benchmark: this kernel against PyTorch SDPA's flash, cuDNN and efficient backends.

    python -m reference_impls.attention.bench                 # the full table (CUDA only)
    python -m reference_impls.attention.bench --dims 128 --lengths 4096 --modes fwd,bwd
    python -m reference_impls.attention.bench --dtypes bf16,fp16 --show-configs --json out.json

FLOPs (the convention of FlashAttention's and Triton's benchmarks): the forward pass does two
matmuls of 2*B*H*N*N*D each, ``4 * B * H * N^2 * D``, halved when causal (half the scores
are masked and skipped); the backward counts 2.5 times that (five matmuls of the same size)
and forward+backward 3.5 times. TFLOP/s = FLOPs / median time. Times are
medians (with the 20th and 80th percentiles) of ``triton.testing.do_bench``, which times with
CUDA events and flushes the L2 cache between runs.

Shapes follow docs/platform.md's H200 anchors: bf16, H = 2048 / D heads (32 at D=64, 16 at
D=128), and B * N = 32768 tokens per batch (B = 32, 8, 2 at N = 1024, 4096, 16384). Before timing,
every
autotuning config of the kernel is compiled in parallel worker processes (``--jobs``) into
Triton's on-disk cache, so the autotuner in the timed process only loads and times them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# "triton": kernel.py's Triton kernels, forward and backward (``forward="triton"``,
# ``backward="triton"``).
# "triton-det": this kernel's deterministic backward (two passes, no atomics); forward modes
# skip it (the forward is the same kernel).
# "gluon": the warp-specialized Gluon kernels (sm_90 only): gluon_fwd.py's forward and
# gluon_bwd.py's dK/dV with kernel.GLUON_DQ_MODE's dQ (``forward="gluon"``,
# ``backward="gluon"``); a shape they do not cover reports an error. ``attention()``'s default
# picks per call between these and "triton" (kernel.GLUON_FORWARD_HEAD_DIMS,
# kernel.GLUON_BACKWARD_HEAD_DIMS).
# "fp8" / "fp8-quant": attention_fp8 (inference, e4m3 operands, bf16 output), timed on inputs
# quantized beforehand (an fp8 KV cache) / with the quantization of q, k and v inside the timed
# call; the "fwd" mode only (no autograd).
PROVIDERS = ("triton", "triton-det", "gluon", "flash", "cudnn", "efficient", "fp8", "fp8-quant")
FP8_PROVIDERS = ("fp8", "fp8-quant")
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
# fwd: forward under torch.no_grad() (inference); fwd-grad: forward with inputs that require
# grad (a training step's forward: the log-sum-exp / softmax stats are saved); bwd: the backward
# alone, from a forward run outside the timing; fwd+bwd: both.
MODES = ("fwd", "fwd-grad", "bwd", "fwd+bwd")
FLOP_FACTOR = {"fwd": 1.0, "fwd-grad": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOKENS_PER_BATCH = 32768  # B * N, as in docs/platform.md's anchor table
MODEL_WIDTH = 2048  # H * D


@dataclasses.dataclass(frozen=True)
class Case:
    """One timed problem: (B, H, N, D) inputs for q, k and v."""

    d: int
    n: int
    causal: bool
    mode: str  # one of MODES
    batch: int
    heads: int
    dtype: torch.dtype = torch.bfloat16

    @classmethod
    def standard(
        cls, d: int, n: int, causal: bool, mode: str, dtype: torch.dtype = torch.bfloat16
    ) -> Case:
        """The table's shapes: H = 2048 / D, B = 32768 / N."""
        return cls(
            d,
            n,
            causal,
            mode,
            batch=max(1, TOKENS_PER_BATCH // n),
            heads=MODEL_WIDTH // d,
            dtype=dtype,
        )

    def flops(self) -> float:
        fwd = 4.0 * self.batch * self.heads * self.n * self.n * self.d
        if self.causal:
            fwd *= 0.5
        return fwd * FLOP_FACTOR[self.mode]


@dataclasses.dataclass
class Result:
    case: Case
    provider: str
    ms: float | None  # median
    ms_p20: float | None = None
    ms_p80: float | None = None
    error: str | None = None
    # --nvml: SM clock / power / temperature over the timing (GpuMonitor.summary); None without.
    nvml: dict | None = None
    # --interleave R: the per-round medians (ms), in round order; ms is their median.
    rounds: list[float] | None = None
    # --interleave R: the provider's place (0-based) in each round's shuffled order.
    order: list[int] | None = None

    @property
    def tflops(self) -> float | None:
        return None if self.ms is None else self.case.flops() / (self.ms * 1e-3) / 1e12


def make_inputs(case: Case, seed: int = 0):
    """(q, k, v, do): (B, H, N, D) tensors on the GPU; q, k, v require grad."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (case.batch, case.heads, case.n, case.d)
    q, k, v, do = (
        torch.randn(shape, device="cuda", dtype=case.dtype, generator=g) for _ in range(4)
    )
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def attention_fn(provider: str) -> Callable:
    """(q, k, v, causal) -> output, for one provider."""
    if provider in ("triton", "triton-det", "gluon"):
        from reference_impls.attention import attention
        from reference_impls.attention.kernel import BackwardKernel, ForwardKernel

        det = provider == "triton-det"
        fwd: ForwardKernel = "gluon" if provider == "gluon" else "triton"
        bwd: BackwardKernel = "gluon" if provider == "gluon" else "triton"
        return lambda q, k, v, causal: attention(
            q, k, v, causal=causal, deterministic=det, forward=fwd, backward=bwd
        )
    backend = SDPA_BACKENDS[provider]

    def sdpa(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return sdpa


def step_fn(provider: str, case: Case, inputs) -> Callable[[], object]:
    """The timed callable for ``case.mode`` (see MODES). Grads are returned, not accumulated
    into .grad, so no extra add kernels are timed."""
    q, k, v, do = inputs
    if provider in FP8_PROVIDERS:
        return _fp8_step(provider, case, q, k, v)
    fn = attention_fn(provider)
    if case.mode == "fwd":

        def fwd():
            with torch.no_grad():
                return fn(q, k, v, case.causal)

        return fwd
    if case.mode == "fwd-grad":
        return lambda: fn(q, k, v, case.causal)
    if case.mode == "bwd":
        out = fn(q, k, v, case.causal)  # once, untimed; its graph is kept for every call
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    return lambda: torch.autograd.grad(fn(q, k, v, case.causal), (q, k, v), do)


def _fp8_step(provider: str, case: Case, q, k, v) -> Callable[[], object]:
    from reference_impls.attention import attention_fp8, quantize_fp8

    if case.mode != "fwd":
        raise RuntimeError(f"{provider} is a forward for inference: mode fwd only")
    if provider == "fp8-quant":
        return lambda: attention_fp8(q.detach(), k.detach(), v.detach(), causal=case.causal)
    qq, kk, vv = (
        quantize_fp8(q.detach()),
        quantize_fp8(k.detach()),
        quantize_fp8(v.detach(), transpose=True),
    )
    return lambda: attention_fp8(qq, kk, vv, causal=case.causal)


def time_ms(
    fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100
) -> tuple[float, float, float]:
    """(median, p20, p80) milliseconds of one call, CUDA-event timed."""
    import triton.testing

    med, p20, p80 = triton.testing.do_bench(
        fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8]
    )
    return med, p20, p80


class GpuMonitor:
    """NVML readings around one timing (``--nvml``): a synchronous reading right before and right
    after it, and a thread reading every ``period_s`` in between. ``summary()`` gives min/max SM
    clock (MHz), power (W) and temperature (C) over them, the OR of the clock-event reasons (NVML
    bit mask: 0x4 software power cap, 0x20 software thermal, 0x40 hardware thermal, 0x8 hardware
    slowdown) and the readings taken right before and after. Without NVML (nvidia-ml-py) it warns
    once and records nothing."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.samples: list[tuple[float, int, float, int, int]] = []
        self.before: tuple[float, int, float, int, int] | None = None
        self.after: tuple[float, int, float, int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = None
        try:
            pynvml = importlib.import_module("pynvml")  # nvidia-ml-py, where installed
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self._nv = pynvml
        except Exception as exc:  # no NVML: timings without readings
            print(f"bench: --nvml: no NVML ({exc!r:.200})", file=sys.stderr, flush=True)

    @property
    def available(self) -> bool:
        return self._nv is not None

    def read(self) -> tuple[float, int, float, int, int] | None:
        nv = self._nv
        if nv is None:
            return None
        h = self._handle
        reasons = getattr(
            nv,
            "nvmlDeviceGetCurrentClocksEventReasons",
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda _: 0),
        )
        return (
            time.monotonic(),
            nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            nv.nvmlDeviceGetPowerUsage(h) / 1000,
            nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            int(reasons(h)),
        )

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                s = self.read()
            except Exception:  # stop sampling, keep timing
                return
            if s is not None:
                self.samples.append(s)

    def __enter__(self) -> GpuMonitor:
        self.samples, self.after = [], None
        self._stop.clear()
        self.before = self.read()
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.after = self.read()

    def summary(self) -> dict | None:
        if self.before is None or self.after is None:
            return None
        every = [self.before, *self.samples, self.after]
        reasons = 0
        for s in every:
            reasons |= s[4]
        return {
            "samples": len(every),
            "sm_mhz_min": min(s[1] for s in every),
            "sm_mhz_max": max(s[1] for s in every),
            "sm_mhz_mean": round(statistics.fmean(s[1] for s in every)),
            "watts_min": round(min(s[2] for s in every)),
            "watts_max": round(max(s[2] for s in every)),
            "watts_mean": round(statistics.fmean(s[2] for s in every)),
            "temp_c_min": min(s[3] for s in every),
            "temp_c_max": max(s[3] for s in every),
            "reasons": reasons,
            "before": {"sm_mhz": self.before[1], "watts": round(self.before[2])},
            "after": {"sm_mhz": self.after[1], "watts": round(self.after[2])},
        }


_WARM_BUFFERS: list[torch.Tensor] = []


def warm_gpu(seconds: float) -> None:
    """Keep the GPU busy for ``seconds`` with back-to-back 8192^3 bf16 matmuls (``--warm-gpu``),
    so that the timing after it starts from a loaded card, as in a long run of timings."""
    if seconds <= 0:
        return
    if not _WARM_BUFFERS:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        _WARM_BUFFERS[:] = [a, torch.randn_like(a), torch.empty_like(a)]
    a, b, c = _WARM_BUFFERS
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):  # ~1.5 ms each on an H200
            torch.mm(a, b, out=c)
        torch.cuda.synchronize()


def measure(
    case: Case,
    provider: str,
    inputs=None,
    monitor: GpuMonitor | None = None,
    warm_s: float = 0.0,
) -> Result:
    """Time one provider on one case; a provider that cannot run it gets an error, not a crash.
    ``monitor``: NVML readings over the timing (``Result.nvml``); ``warm_s``: seconds of
    ``warm_gpu`` right before it."""
    inputs = make_inputs(case) if inputs is None else inputs
    try:
        fn = step_fn(provider, case, inputs)
        fn()  # autotunes (this kernel) or selects (SDPA) outside the timed region
        torch.cuda.synchronize()
        warm_gpu(warm_s)
        if monitor is None:
            med, p20, p80 = time_ms(fn)
        else:
            with monitor:
                med, p20, p80 = time_ms(fn)
    except (RuntimeError, ValueError) as exc:  # e.g. a backend that does not support the shape
        torch.cuda.synchronize()
        return Result(case, provider, None, error=str(exc).splitlines()[0][:200])
    return Result(
        case, provider, med, p20, p80, nvml=None if monitor is None else monitor.summary()
    )


def measure_interleaved(
    case: Case,
    providers: Sequence[str],
    inputs,
    rounds: int,
    monitor: GpuMonitor | None = None,
    warm_s: float = 0.0,
    seed: int = 0,
) -> list[Result]:
    """``--interleave R``: every provider once untimed (autotuning), then R rounds, each timing
    every provider in a new shuffled order (seeded). Each Result's ms is the median of its R
    round medians (p20/p80 their min and max); ``rounds``/``order`` keep them; ``nvml`` spans
    all of its timings (min/max over rounds)."""
    rng = random.Random(seed)
    runs: dict[str, list[Result]] = {p: [] for p in providers}
    places: dict[str, list[int]] = {p: [] for p in providers}
    failed: dict[str, Result] = {}
    for p in providers:  # autotune / select outside every round
        try:
            step_fn(p, case, inputs)()
            torch.cuda.synchronize()
        except (RuntimeError, ValueError) as exc:
            torch.cuda.synchronize()
            failed[p] = Result(case, p, None, error=str(exc).splitlines()[0][:200])
    for _ in range(rounds):
        order = [p for p in providers if p not in failed]
        rng.shuffle(order)
        for place, p in enumerate(order):
            r = measure(case, p, inputs, monitor, warm_s)
            if r.error:
                failed[p] = r
                continue
            runs[p].append(r)
            places[p].append(place)
    out = []
    for p in providers:
        if p in failed:
            out.append(failed[p])
            continue
        ms = [r.ms for r in runs[p] if r.ms is not None]
        readings = [r.nvml for r in runs[p] if r.nvml]
        nvml = None
        if readings:
            nvml = {
                "samples": sum(x["samples"] for x in readings),
                "sm_mhz_min": min(x["sm_mhz_min"] for x in readings),
                "sm_mhz_max": max(x["sm_mhz_max"] for x in readings),
                "sm_mhz_mean": round(statistics.fmean(x["sm_mhz_mean"] for x in readings)),
                "watts_min": min(x["watts_min"] for x in readings),
                "watts_max": max(x["watts_max"] for x in readings),
                "watts_mean": round(statistics.fmean(x["watts_mean"] for x in readings)),
                "temp_c_min": min(x["temp_c_min"] for x in readings),
                "temp_c_max": max(x["temp_c_max"] for x in readings),
                "reasons": _or(x["reasons"] for x in readings),
                "per_round": readings,
            }
        out.append(
            Result(
                case,
                p,
                statistics.median(ms),
                min(ms),
                max(ms),
                nvml=nvml,
                rounds=ms,
                order=places[p],
            )
        )
    return out


def _or(values) -> int:
    acc = 0
    for v in values:
        acc |= v
    return acc


def _nvml_note(r: Result) -> str:
    n = r.nvml
    if not n:
        return ""
    return (
        f"  sm {n['sm_mhz_min']}-{n['sm_mhz_max']} MHz (mean {n['sm_mhz_mean']})"
        f" {n['watts_min']}-{n['watts_max']} W {n['temp_c_min']}-{n['temp_c_max']} C"
        f" reasons {n['reasons']:#x}"
    )


def cases(
    dims: Sequence[int],
    lengths: Sequence[int],
    causals: Sequence[bool],
    modes: Sequence[str],
    dtypes: Sequence[torch.dtype] = (torch.bfloat16,),
) -> list[Case]:
    return [
        Case.standard(d, n, c, m, t)
        for t in dtypes
        for d in dims
        for n in lengths
        for c in causals
        for m in modes
    ]


def tuned_configs() -> dict[str, dict[str, str]]:
    """The autotuner's pick per kernel and key (LEN_KEY, HEAD_DIM, CAUSAL, ..., dtypes)."""
    from reference_impls.attention import fp8, kernel

    tuners = {
        "fwd": kernel._fwd,
        "bwd_dq": kernel._bwd_dq,
        "bwd_dkdv": kernel._bwd_dkdv,
        "bwd_fused": kernel._bwd_fused,
        "fwd_fp8": fp8._fwd_fp8,
    }
    out: dict[str, dict[str, str]] = {}
    for name, tuner in tuners.items():
        out[name] = {
            str(key): f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}/{c.num_warps}w/{c.num_stages}s"
            for key, c in tuner.cache.items()
        }
    return out


# --------------------------------------------------------------------------- precompiling


def _warm(d: int, causal: bool, dtype_name: str, bf16: bool = True, fp8: bool = True) -> str:
    """Compile every autotuning config of the kernels for (d, causal, dtype) into Triton's
    on-disk cache by autotuning on a small problem with the same specialization (lengths
    divisible by 16): ``bf16`` the forward and both backwards, ``fp8`` the fp8 forward."""
    from reference_impls.attention import attention, attention_fp8

    dtype = getattr(torch, dtype_name)
    q, k, v = (
        torch.randn(1, 1, 256, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3)
    )
    for deterministic in (False, True) if bf16 else ():  # the one-pass and two-pass backward
        # The Triton forward explicitly: "auto" may pick the Gluon one (compiled on first use).
        out = attention(q, k, v, causal=causal, deterministic=deterministic, forward="triton")
        out.backward(torch.randn_like(out))
    if fp8:  # (the fp8 kernel's specialization does not depend on the input dtype)
        attention_fp8(q, k, v, causal=causal)
    torch.cuda.synchronize()
    return f"d={d} causal={causal} {dtype_name}"


def precompile(
    dims: Sequence[int],
    causals: Sequence[bool],
    dtypes: Sequence[str],
    jobs: int,
    bf16: bool = True,
    fp8: bool = True,
) -> None:
    todo = [(d, c, t, bf16, fp8) for d in dims for c in causals for t in dtypes]
    if jobs <= 1:
        for args in todo:
            _warm(*args)
        return
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(todo)), mp_context=get_context("spawn")
    ) as pool:
        for done in pool.map(_warm, *zip(*todo, strict=True)):
            print(f"  compiled {done}", file=sys.stderr)


# --------------------------------------------------------------------------- output


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown_table(results: Sequence[Result]) -> str:
    """One row per (D, N, causal, mode): TFLOP/s per provider and the ratio to flash."""
    by_case: dict[Case, dict[str, Result]] = {}
    for r in results:
        by_case.setdefault(r.case, {})[r.provider] = r
    providers = [p for p in PROVIDERS if any(p in row for row in by_case.values())]
    head = ["dtype", "D", "N", "B", "H", "causal", "mode"] + [f"{p} TFLOP/s" for p in providers]
    ratios = [
        (ours, other)
        for ours in ("triton", "gluon")
        for other in ("flash", "cudnn")
        if ours in providers and other in providers
    ]
    head += [f"{ours} / {'cuDNN' if other == 'cudnn' else other}" for ours, other in ratios]
    if "fp8" in providers and "cudnn" in providers:
        head += ["fp8 / cuDNN"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case, row in by_case.items():
        cells = [
            str(case.dtype).removeprefix("torch."),
            str(case.d),
            str(case.n),
            str(case.batch),
            str(case.heads),
            "yes" if case.causal else "no",
            case.mode,
        ]
        cells += [_fmt(row[p].tflops) if p in row else "" for p in providers]
        for ours, other in ratios:
            t, o = row.get(ours), row.get(other)
            ratio = t.tflops / o.tflops if t and o and t.tflops and o.tflops else None
            cells.append(_fmt(ratio, ".2f"))
        if "fp8 / cuDNN" in head:
            t, o = row.get("fp8"), row.get("cudnn")
            ratio = t.tflops / o.tflops if t and o and t.tflops and o.tflops else None
            cells.append(_fmt(ratio, ".2f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment() -> dict[str, str]:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "date": dt.date.today().isoformat(),
    }


def _print_result(r: Result) -> None:
    """One line per measurement, unbuffered (with --interleave its rounds, with --nvml the
    readings)."""
    case = r.case
    note = (
        f"  ({r.error})" if r.error else f"  [{_fmt(r.ms_p20, '.3f')}, {_fmt(r.ms_p80, '.3f')}] ms"
    )
    if r.rounds:
        note += " rounds " + "/".join(f"{x:.3f}" for x in r.rounds)
        note += " places " + "".join(str(x) for x in r.order or ())
    note += _nvml_note(r)
    print(
        f"{str(case.dtype).removeprefix('torch.'):<8} D={case.d:<4} N={case.n:<6} "
        f"causal={case.causal!s:<5} {case.mode:<8} {r.provider:<10}"
        f" {_fmt(r.ms, '.3f'):>9} ms {_fmt(r.tflops, '.1f'):>7} TFLOP/s{note}",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impls.attention.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dims", default="64,128", help="head dims (default: 64,128)")
    parser.add_argument(
        "--lengths", default="1024,4096,16384", help="sequence lengths (default: 1024,4096,16384)"
    )
    parser.add_argument("--causal", default="no,yes", help="no, yes or both (default: no,yes)")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"subset of {','.join(MODES)} (default: all; see MODES in this file)",
    )
    parser.add_argument(
        "--dtypes", default="bf16", help=f"subset of {','.join(DTYPES)} (default: bf16)"
    )
    parser.add_argument(
        "--show-configs", action="store_true", help="print the autotuner's pick per kernel and key"
    )
    parser.add_argument(
        "--providers", default=",".join(PROVIDERS), help=f"subset of {','.join(PROVIDERS)}"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="processes compiling the kernel's configs before timing (default: min(8, cores))",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every measurement as JSON")
    parser.add_argument(
        "--nvml",
        action="store_true",
        help="read SM clock, power and temperature (NVML) around and during each timing: "
        "printed per row and written to the JSON rows (off by default)",
    )
    parser.add_argument(
        "--warm-gpu",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep the GPU busy (bf16 matmuls) for SECONDS right before each timing (default: 0)",
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="R",
        help="time each row's providers in R rounds, each in a new shuffled order; a row's "
        "time is the median of its round medians (default: 0, each provider once, in order)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    dims = [int(x) for x in args.dims.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    causals = [{"no": False, "yes": True}[x] for x in args.causal.split(",")]
    modes = args.modes.split(",")
    providers = args.providers.split(",")
    dtype_names = args.dtypes.split(",")
    unknown = (
        set(providers) - set(PROVIDERS) or set(modes) - set(MODES) or set(dtype_names) - set(DTYPES)
    )
    if unknown:
        parser.error(f"unknown provider, mode or dtype: {sorted(unknown)}")
    dtypes = [DTYPES[x] for x in dtype_names]

    env = environment()
    print("# " + ", ".join(f"{k} {v}" for k, v in env.items()), flush=True)
    bf16, fp8 = (
        bool({"triton", "triton-det", "gluon"} & set(providers)),
        bool(set(FP8_PROVIDERS) & set(providers) and "fwd" in modes),
    )
    if bf16 or fp8:
        names = [str(t).removeprefix("torch.") for t in dtypes]
        precompile(dims, causals, names, args.jobs, bf16=bf16, fp8=fp8)
    monitor = GpuMonitor() if args.nvml else None
    results = []
    for case in cases(dims, lengths, causals, modes, dtypes):
        inputs = make_inputs(case)
        row_providers = [
            p
            for p in providers
            # triton-det in forward modes: the same forward kernel as "triton"; fp8: inference only
            if not (p == "triton-det" and case.mode.startswith("fwd") and case.mode != "fwd+bwd")
            and not (p in FP8_PROVIDERS and case.mode != "fwd")
        ]
        if args.interleave > 0:
            for r in measure_interleaved(
                case, row_providers, inputs, args.interleave, monitor, args.warm_gpu
            ):
                results.append(r)
                _print_result(r)
        else:
            for provider in row_providers:
                r = measure(case, provider, inputs, monitor, args.warm_gpu)
                results.append(r)
                _print_result(r)
        del inputs
        torch.cuda.empty_cache()
    print()
    print(markdown_table(results))
    pairs = (("triton", "flash"), ("triton", "cudnn"), ("gluon", "flash"), ("gluon", "cudnn"))
    for ours, other in (*pairs, ("fp8", "cudnn"), ("gluon", "triton")):
        for mode in modes:
            ratios = [
                t.tflops / f.tflops
                for t in results
                if t.provider == ours and t.tflops and t.case.mode == mode
                for f in results
                if f.provider == other and f.case == t.case and f.tflops
            ]
            if ratios:
                print(
                    f"{ours} / {other} {mode}: min {min(ratios):.2f}, "
                    f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f} "
                    f"over {len(ratios)} rows"
                )
    configs = tuned_configs()
    if args.show_configs:
        for name, picks in configs.items():
            for key, pick in picks.items():
                print(f"config {name} {key}: {pick}")
    if args.json:
        options = {"nvml": args.nvml, "warm_gpu_s": args.warm_gpu, "interleave": args.interleave}
        with open(args.json, "w") as f:
            json.dump(
                {
                    "environment": env,
                    **(
                        {"options": options}
                        if args.nvml or args.warm_gpu or args.interleave
                        else {}
                    ),
                    "configs": configs,
                    "results": [
                        {
                            **dataclasses.asdict(r.case),
                            "dtype": str(r.case.dtype),
                            "provider": r.provider,
                            "ms": r.ms,
                            "ms_p20": r.ms_p20,
                            "ms_p80": r.ms_p80,
                            "tflops": r.tflops,
                            "flops": r.case.flops(),
                            "error": r.error,
                            **({"nvml": r.nvml} if r.nvml is not None else {}),
                            **({"rounds": r.rounds, "order": r.order} if r.rounds else {}),
                        }
                        for r in results
                    ],
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
