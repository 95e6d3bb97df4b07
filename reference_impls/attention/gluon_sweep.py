"""Every Gluon tiling against cuDNN, SDPA flash and the Triton forward, in one process, on one
GPU: the sweep behind the Gluon forward's defaults (docs/benchmarks/attention.md).

    python -m reference_impls.attention.gluon_sweep --parts correct,host,time --json sweep.json
    python -m reference_impls.attention.gluon_sweep --parts correct,time --dims 64 --levers \
        --triton --precompile-jobs 16 --lengths 4096,16384 --json levers.json
    python -m reference_impls.attention.gluon_sweep --parts correct,time --dims 64 --levers \
        --tilings 0,1,2,16,17,18,19 --triton --precompile-jobs 16 --json run12.json
    python -m reference_impls.attention.gluon_sweep --parts paths --dims 64 --rounds 6 \
        --causal no,yes --json run13.json

- ``correct``: each tiling (``gluon_fwd.CONFIGS``) against float64 on small shapes, including
  more tiles than SMs, grouped-query heads and Nq != Nk (output and base-2 log-sum-exp).
- ``host``: Python time per call on a tiny shape (1 x 1 x 256 x D), where the GPU work is
  negligible: each entry point's cost on the host.
- ``time``: the forward under ``torch.no_grad()``, TFLOP/s (``4 B H N^2 D``, halved when
  causal), ``do_bench`` medians with L2 flushed, each provider timed ``--rounds`` times in
  turn so the spread between rounds shows. Shapes as in ``bench.py``: H = 2048 / D,
  B * N = 32768.
- ``paths``: why ``bench.py`` and ``time`` read the Gluon forward differently (run 13): per
  shape (``--causal`` no, yes or both), bench.py's own ``measure`` in its order (triton,
  gluon, cudnn), then the default tiling reached each way the two tools reach it (through
  ``attention(forward="gluon")`` or ``gluon_fwd.attention_forward``, on bench.py's inputs or
  this tool's) beside bench.py's Triton and cuDNN, ``--rounds`` times in shuffled orders:
  per-call quantiles, the provider timed just before, NVML clocks during each timing.
- ``bwd-correct``: the Gluon backward (``gluon_bwd.py``; dQ by in-kernel reductions, by the
  Gluon dQ kernel and by kernel.py's, every tiling) against float64 autograd: dQ, dK, dV,
  with the Triton backward's errors on the same inputs beside them.
- ``bwd-kernels``: each backward kernel alone, per tiling (where the time goes).
- ``bwd-time``: the backward alone (``torch.autograd.grad`` on a kept graph, the forward's
  FLOPs times 2.5, as ``bench.py``): the Gluon backward each way, the Triton backward, cuDNN
  and flash, in turn, ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from reference_impls.attention import gluon_bwd, gluon_fwd, kernel

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _reference(q, k, v, causal):
    """(o, lse in base 2) in float64."""
    g = q.shape[1] // k.shape[1]
    kk, vv = (t.double().repeat_interleave(g, 1) for t in (k, v))
    s = q.double() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None]
        s = s.masked_fill(j > i + n_k - n_q, float("-inf"))
    return torch.softmax(s, -1) @ vv, torch.logsumexp(s, -1) / math.log(2)


CORRECT_SHAPES = [(2, 4, 2, 1024, 1024), (3, 5, 5, 1024, 1024), (1, 4, 4, 512, 2048)]
"""(B, H, Hkv, Nq, Nk): grouped-query heads, more tiles than SMs, Nq != Nk."""

# Relative error of the output against float64 that a correct kernel stays under: what the
# Triton and Gluon kernels give (bf16 ~2.3e-3, fp16 ~2.8e-4) plus a little; the suite's
# tolerances (attention_cases.FWD_TOL) are 1.6e-2 and 2e-3.
CORRECT_TOL = {torch.bfloat16: 3e-3, torch.float16: 5e-4}


def correctness(
    dims: Sequence[int],
    dtypes: Sequence[str] = ("bf16",),
    shapes: Sequence[tuple[int, int, int, int, int]] = tuple(CORRECT_SHAPES),
) -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for d in dims:
            for cfg in gluon_fwd.CONFIGS[d]:
                for b, h, hk, n_q, n_k in shapes:
                    for causal in (False, True):
                        q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype)
                        k, v = (torch.randn(b, hk, n_k, d, device="cuda").to(dtype) for _ in "kv")
                        if not gluon_fwd.supports(q, k, v, causal, cfg):
                            continue
                        o, lse = gluon_fwd.attention_forward(q, k, v, causal, 1 / math.sqrt(d), cfg)
                        ref, ref_lse = _reference(q, k, v, causal)
                        err = ((o.double() - ref).norm() / ref.norm()).item()
                        max_abs = (o.double() - ref).abs().max().item()
                        lse_err = (lse.double() - ref_lse).abs().max().item()
                        ok = err <= CORRECT_TOL[dtype] and lse_err <= 1e-4
                        rows.append(
                            {"dtype": dtype_name, "d": d, "config": str(cfg),
                             "shape": [b, h, hk, n_q, n_k], "causal": causal, "err": err,
                             "max_abs": max_abs, "lse_err": lse_err, "ok": ok}
                        )  # fmt: skip
                        print("correct", ok, dtype_name, d, cfg, (b, h, hk, n_q, n_k), causal,
                              f"{err:.3e} {max_abs:.3e} {lse_err:.2e}", flush=True)  # fmt: skip
    return rows


def _warm_gluon(
    d: int, dtype_name: str, cfg: gluon_fwd.GluonConfig, shapes: Sequence[tuple]
) -> str:
    """Compile the forward with ``cfg`` into Triton's disk cache for each shape's
    specialization (lengths, heads and group size divisible by 16 or equal to 1, or neither),
    causal and not, by running it once."""
    dtype = DTYPES[dtype_name]
    for b, h, hk, n_q, n_k in shapes:
        q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hk, n_k, d, device="cuda", dtype=dtype) for _ in "kv")
        for causal in (False, True):
            if gluon_fwd.supports(q, k, v, causal, cfg):
                gluon_fwd.attention_forward(q, k, v, causal, 1 / math.sqrt(d), cfg)
    torch.cuda.synchronize()
    return f"d={d} {dtype_name} {cfg}"


def precompile_gluon(
    dims: Sequence[int], dtypes: Sequence[str], shapes: Sequence[tuple], jobs: int
) -> None:
    """Every tiling of ``gluon_fwd.CONFIGS`` compiled in ``jobs`` worker processes (each
    compile takes seconds; one process would take minutes for a sweep), so that the sweep's
    first calls only load them. ``shapes`` should include one of each specialization the
    sweep will meet (see ``_warm_gluon``)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    todo = [(d, t, c, list(shapes)) for d in dims for t in dtypes for c in gluon_fwd.CONFIGS[d]]
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(todo)), mp_context=get_context("spawn")
    ) as pool:
        for done in pool.map(_warm_gluon, *zip(*todo, strict=True)):
            print("compiled", done, flush=True)


def _host_fns(q, k, v) -> dict[str, Callable[[], object]]:
    return {
        "gluon_fwd.attention_forward": lambda: gluon_fwd.attention_forward(q, k, v, False, 0.1),
        "attention(forward='gluon')": lambda: kernel.attention(q, k, v, forward="gluon"),
        "attention(forward='triton')": lambda: kernel.attention(q, k, v, forward="triton"),
        "cudnn (SDPA)": lambda: F.scaled_dot_product_attention(q, k, v),
    }


def host_cost(dims: Sequence[int], calls: int = 500) -> list[dict]:
    rows = []
    for d in dims:
        q, k, v = (torch.randn(1, 1, 256, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
        fns = _host_fns(q, k, v)
        for name, fn in fns.items():
            with torch.no_grad():
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                us = (time.perf_counter() - start) / calls * 1e6
                torch.cuda.synchronize()
            rows.append({"d": d, "fn": name, "us_per_call": round(us, 1)})
            print("host", rows[-1], flush=True)
    return rows


def _providers(q, k, v, causal: bool, with_triton: bool) -> dict[str, Callable[[], object]]:
    """What ``timing`` times on one shape: every Gluon tiling, both dispatch paths, cuDNN, flash."""
    d = q.shape[-1]

    def gluon(cfg: gluon_fwd.GluonConfig) -> Callable[[], object]:
        return lambda: gluon_fwd.attention_forward(q, k, v, causal, 1 / math.sqrt(d), cfg)

    def sdpa(backend: SDPBackend) -> Callable[[], object]:
        def run() -> object:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    providers = {str(cfg): gluon(cfg) for cfg in gluon_fwd.CONFIGS[d]}
    providers["attention(forward='auto')"] = lambda: kernel.attention(q, k, v, causal=causal)
    if with_triton:  # its autotuning compiles dozens of configs per shape on first call
        providers["attention(forward='triton')"] = lambda: kernel.attention(
            q, k, v, causal=causal, forward="triton"
        )
    providers["cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    providers["flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    return providers


def timing(
    dims: Sequence[int],
    dtypes: Sequence[str],
    lengths: Sequence[int],
    rounds: int,
    with_triton: bool,
) -> list[dict]:
    rows = []
    for dtype_name in dtypes:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        for d in dims:
            for n in lengths:
                for causal in (False, True):
                    h, b = 2048 // d, 32768 // n
                    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in "qkv")
                    flops = 4 * b * h * n * n * d / (2 if causal else 1)
                    providers = _providers(q, k, v, causal, with_triton)
                    row: dict = {"dtype": dtype_name, "d": d, "n": n, "causal": causal}
                    for _ in range(rounds):
                        for name, fn in providers.items():
                            with torch.no_grad():
                                ms = triton.testing.do_bench(fn, warmup=25, rep=100)
                            row.setdefault(name, []).append(round(flops / ms / 1e9, 1))
                    rows.append(row)
                    print("time", row, flush=True)
    return rows


def _clock_window(
    samples: Sequence[tuple[float, int, float, int, int]], t0: float, t1: float
) -> dict | None:
    """Mean and min SM clock (MHz), mean power (W), max temperature and the OR of the
    clock-event reasons (NVML bit mask) over the samples (``bench.GpuMonitor``'s) in [t0, t1]."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return None
    reasons = 0
    for s in inside:
        reasons |= s[4]
    return {
        "sm_mhz": round(sum(s[1] for s in inside) / len(inside)),
        "sm_mhz_min": min(s[1] for s in inside),
        "watts": round(sum(s[2] for s in inside) / len(inside)),
        "temp_c": max(s[3] for s in inside),
        "reasons": reasons,
    }


def _per_call(times: Sequence[float]) -> dict:
    """Quantiles (ms) of one ``do_bench(return_mode="all")``'s per-call times."""
    t = torch.tensor(list(times), dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.1, 0.2, 0.5, 0.8, 0.9], dtype=torch.float64)).tolist()
    return {
        "n": len(times),
        "min": round(t.min().item(), 4),
        "p10": round(q[0], 4),
        "p20": round(q[1], 4),
        "ms": round(q[2], 4),
        "p80": round(q[3], 4),
        "p90": round(q[4], 4),
        "max": round(t.max().item(), 4),
    }


def _paths_providers(case, inputs_a, inputs_b) -> dict[str, Callable[[], object]]:
    """The Gluon forward (default tiling) reached each way that bench.py and this sweep reach
    it, on bench.py's inputs (``inputs_a``: ``bench.make_inputs``, requires_grad, a seeded
    generator) and this sweep's (``inputs_b``: plain ``torch.randn``), with bench.py's Triton
    and cuDNN providers on bench.py's inputs."""
    from reference_impls.attention import bench

    qa, ka, va, _ = inputs_a
    qb, kb, vb = inputs_b
    causal, scale, cfg = case.causal, 1 / math.sqrt(case.d), gluon_fwd.CONFIGS[case.d][0]

    def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()

        return run

    return {
        "bench gluon": bench.step_fn("gluon", case, inputs_a),
        "direct, bench inputs": no_grad(
            lambda: gluon_fwd.attention_forward(qa, ka, va, causal, scale, cfg)
        ),
        "direct, sweep inputs": no_grad(
            lambda: gluon_fwd.attention_forward(qb, kb, vb, causal, scale, cfg)
        ),
        "attention(forward='gluon'), sweep inputs": no_grad(
            lambda: kernel.attention(qb, kb, vb, causal=causal, forward="gluon")
        ),
        "bench triton": bench.step_fn("triton", case, inputs_a),
        "bench cudnn": bench.step_fn("cudnn", case, inputs_a),
    }


def _paths_shape(case, rounds: int, clocks, rng) -> dict:
    """``paths`` on one shape (a ``bench.Case``)."""
    from reference_impls.attention import bench

    inputs_a = bench.make_inputs(case)
    shape = (case.batch, case.heads, case.n, case.d)
    inputs_b = tuple(torch.randn(shape, device="cuda", dtype=case.dtype) for _ in "qkv")
    row: dict = {
        "dtype": str(case.dtype).removeprefix("torch."),
        "d": case.d,
        "n": case.n,
        "b": case.batch,
        "h": case.heads,
        "causal": case.causal,
        "flops": case.flops(),
        "bench_order": [],
        "rounds": [],
    }
    for provider in ("triton", "gluon", "cudnn"):
        t0 = time.monotonic()
        r = bench.measure(case, provider, inputs_a)
        row["bench_order"].append(
            {"provider": provider, "ms": r.ms, "p20": r.ms_p20, "p80": r.ms_p80,
             "error": r.error, "clocks": _clock_window(clocks.samples, t0, time.monotonic())}
        )  # fmt: skip
    providers = _paths_providers(case, inputs_a, inputs_b)
    for fn in providers.values():
        fn()
    torch.cuda.synchronize()
    before = "bench cudnn"
    for _ in range(rounds):
        order = list(providers)
        rng.shuffle(order)
        for name in order:
            t0 = time.monotonic()
            times = triton.testing.do_bench(providers[name], warmup=25, rep=100, return_mode="all")
            row["rounds"].append(
                {"provider": name, "after": before, **_per_call(times),
                 "clocks": _clock_window(clocks.samples, t0, time.monotonic())}
            )  # fmt: skip
            before = name
    return row


def paths(
    dims: Sequence[int],
    dtypes: Sequence[str],
    lengths: Sequence[int],
    rounds: int,
    causals: Sequence[bool] = (False, True),
) -> list[dict]:
    """Why bench.py and this sweep disagree on the Gluon forward (run 13): per shape, first
    bench.py's own ``measure`` in bench.py's order (triton, gluon, cudnn: the Triton
    autotuning at a new length included), then every way of reaching the Gluon forward
    (``_paths_providers``) with bench.py's Triton and cuDNN, ``rounds`` times, each round in a
    new shuffled order (the provider timed just before is recorded). Each timing is one
    ``do_bench(warmup=25, rep=100)`` as both tools call it, with its per-call quantiles and
    the NVML clocks during it."""
    import random

    from reference_impls.attention import bench

    rng = random.Random(13)
    rows = []
    with bench.GpuMonitor(period_s=0.01) as clocks:  # NVML readings in a thread
        for dtype_name in dtypes:
            for d in dims:
                for n in lengths:
                    for causal in causals:
                        case = bench.Case.standard(d, n, causal, "fwd", DTYPES[dtype_name])
                        row = _paths_shape(case, rounds, clocks, rng)
                        rows.append(row)
                        medians: dict[str, list[float]] = {}
                        for x in row["rounds"]:
                            medians.setdefault(x["provider"], []).append(x["ms"])
                        bench_ms = {x["provider"]: x["ms"] for x in row["bench_order"]}
                        print("paths", dtype_name, d, n, causal, "bench order:", bench_ms,
                              "rounds:", medians, flush=True)  # fmt: skip
                        torch.cuda.empty_cache()
    return rows


BWD_SHAPES = [  # (B, H, Hkv, Nq, Nk, causal), D = 128
    (2, 4, 4, 1024, 1024, False),
    (2, 4, 4, 1024, 1024, True),
    (2, 8, 2, 1024, 1024, True),
    (1, 4, 4, 512, 2048, True),
    (1, 4, 4, 256, 1280, False),
    (3, 6, 2, 2048, 2048, True),
]


def _grads(q, k, v, do, causal, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = kernel.attention(q, k, v, causal=causal, **kw)
    return torch.autograd.grad(out, (q, k, v), do)


def _errors(grads, refs) -> list[float]:
    return [((g.double() - r).norm() / r.norm()).item() for g, r in zip(grads, refs, strict=True)]


def _bwd_providers(q, k, v, do, causal: bool) -> dict[str, Callable[[], object]]:
    """The backward alone, each from its own forward's kept graph."""

    def ours(backward: kernel.BackwardKernel, mode: str | None = None) -> Callable[[], object]:
        det = mode is not None and mode != "atomic"
        out = kernel.attention(q, k, v, causal=causal, backward=backward, deterministic=det)

        def run() -> object:
            if mode is not None:
                kernel.GLUON_DQ_MODE[det] = mode
            return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

        return run

    def sdpa(backend: SDPBackend) -> Callable[[], object]:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    return {
        "gluon (atomic dQ)": ours("gluon", "atomic"),
        "gluon (Gluon dQ pass)": ours("gluon", "gluon"),
        "gluon (Triton dQ pass)": ours("gluon", "triton"),
        "triton": ours("triton"),
        "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "flash": sdpa(SDPBackend.FLASH_ATTENTION),
    }


def _bwd_variants() -> list[tuple[str, gluon_bwd.BwdConfig, gluon_bwd.DqConfig]]:
    """(dQ mode, dK/dV tiling, dQ tiling): every tiling of each kernel at least once."""
    dkdv, dqs = gluon_bwd.CONFIGS[128], gluon_bwd.DQ_CONFIGS[128]
    out = [("atomic", c, dqs[0]) for c in dkdv] + [("triton", dkdv[0], dqs[0])]
    out += [("gluon", dkdv[0], c) for c in dqs] + [("gluon", c, dqs[0]) for c in dkdv[1:]]
    return out


def bwd_correctness(dtypes: Sequence[str]) -> list[dict]:
    """Every Gluon backward tiling, both dQ ways, against float64; the Triton backward beside."""
    torch.manual_seed(0)
    rows = []
    d = 128
    for dtype_name in dtypes:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        for b, h, hk, n_q, n_k, causal in BWD_SHAPES:
            q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(b, hk, n_k, d, device="cuda", dtype=dtype) for _ in "kv")
            do = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype)
            q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
            ref = kernel.reference_attention(q64, k64, v64, causal=causal)
            refs = torch.autograd.grad(ref, (q64, k64, v64), do.double())

            triton_errs = _errors(
                _grads(q, k, v, do, causal, backward="triton", deterministic=True), refs
            )
            for mode, cfg, dq_cfg in _bwd_variants():
                det = mode != "atomic"
                old = gluon_bwd.CONFIGS[d], gluon_bwd.DQ_CONFIGS[d], kernel.GLUON_DQ_MODE[det]
                try:
                    # The defaults the launchers take.
                    gluon_bwd.CONFIGS[d], gluon_bwd.DQ_CONFIGS[d] = (cfg,), (dq_cfg,)
                    kernel.GLUON_DQ_MODE[det] = mode
                    got = _errors(
                        _grads(q, k, v, do, causal, backward="gluon", deterministic=det), refs
                    )
                except Exception as exc:  # report and go on: one bad tiling is a result
                    got = [float("nan")] * 3
                    print("bwd-correct error", mode, cfg, dq_cfg, repr(exc)[:300], flush=True)
                finally:
                    gluon_bwd.CONFIGS[d], gluon_bwd.DQ_CONFIGS[d], kernel.GLUON_DQ_MODE[det] = old
                tol = 5e-3 if dtype == torch.float16 else 3e-2  # attention_cases.GRAD_TOL
                ok = all(e <= tol for e in got)
                row = {"dtype": dtype_name, "mode": mode, "config": str(cfg),
                       "dq_config": str(dq_cfg), "shape": [b, h, hk, n_q, n_k, d],
                       "causal": causal, "dq_dk_dv": got, "triton": triton_errs,
                       "ok": ok}  # fmt: skip
                rows.append(row)
                print("bwd-correct", row, flush=True)
    return rows


def bwd_timing(dtypes: Sequence[str], lengths: Sequence[int], rounds: int) -> list[dict]:
    rows = []
    d = 128
    for dtype_name in dtypes:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        for n in lengths:
            for causal in (False, True):
                h, b = 2048 // d, 32768 // n
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in "qkvo")
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)

                providers = _bwd_providers(q, k, v, do, causal)
                row: dict = {"dtype": dtype_name, "d": d, "n": n, "causal": causal}
                for fn in providers.values():
                    fn()  # autotuning (Triton) and compiles outside the timing
                torch.cuda.synchronize()
                for _ in range(rounds):
                    for name, fn in providers.items():
                        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
                        row.setdefault(name, []).append(round(flops / ms / 1e9, 1))
                rows.append(row)
                print("bwd-time", row, flush=True)
    return rows


def _kernel_fns(q, k, v, do, causal: bool) -> dict[str, tuple[int, Callable[[], object]]]:
    """name: (matmuls, call) for each backward kernel alone on these inputs."""
    b, h, n, d = q.shape
    scale = 1 / math.sqrt(d)
    o, lse = gluon_fwd.attention_forward(q, k, v, causal, scale)
    delta = (o.float() * do.float()).sum(-1)
    sizes, common = kernel._launch_args(q, k, causal)
    dq_t = torch.empty_like(q)
    dq32 = torch.zeros(q.shape, device="cuda", dtype=torch.float32)

    def triton_dq() -> None:
        grid = lambda meta: (b * h * triton.cdiv(n, meta["BLOCK_M"]),)  # noqa: E731
        kernel._bwd_dq[grid](
            kernel._desc(q), kernel._desc(k), kernel._desc(v), kernel._desc(o),
            kernel._desc(do), dq_t, lse, torch.empty_like(lse), scale, *sizes, **common,
        )  # fmt: skip

    def gluon_dq(c: gluon_bwd.DqConfig) -> Callable[[], object]:
        return lambda: gluon_bwd.attention_backward_dq(q, k, v, do, lse, delta, causal, scale, c)

    def dkdv(c: gluon_bwd.BwdConfig, dq: torch.Tensor | None) -> Callable[[], object]:
        return lambda: gluon_bwd.attention_backward_dkdv(
            q, k, v, do, lse, delta, dq, causal, scale, c
        )

    fns: dict[str, tuple[int, Callable[[], object]]] = {"triton dq": (3, triton_dq)}
    for c in gluon_bwd.DQ_CONFIGS[d]:
        fns[f"gluon dq {c}"] = (3, gluon_dq(c))
    for cb in gluon_bwd.CONFIGS[d]:
        fns[f"gluon dkdv {cb}"] = (4, dkdv(cb, None))
        fns[f"gluon dkdv+atomic dq {cb}"] = (5, dkdv(cb, dq32))
    return fns


def bwd_kernels(lengths: Sequence[int], rounds: int) -> list[dict]:
    """Each backward kernel alone (bf16, D=128): the Gluon dQ kernel and kernel.py's, the Gluon
    dK/dV kernel without and with the in-kernel dQ, per tiling. TFLOP/s over each kernel's
    own matmuls (dQ 3, dK/dV 4, dK/dV + dQ 5, of 2 B H N^2 D each, halved when causal)."""
    rows = []
    d = 128
    for n in lengths:
        for causal in (False, True):
            h, b = 2048 // d, 32768 // n
            q, k, v, do = (
                torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in "qkvo"
            )
            matmul = 2 * b * h * n * n * d / (2 if causal else 1)
            fns = _kernel_fns(q, k, v, do, causal)
            row: dict = {"n": n, "causal": causal}
            for _, fn in fns.values():
                fn()
            torch.cuda.synchronize()
            for _ in range(rounds):
                for name, (mm, fn) in fns.items():
                    ms = triton.testing.do_bench(fn, warmup=25, rep=100)
                    row.setdefault(name, []).append(
                        {"ms": round(ms, 3), "tflops": round(mm * matmul / ms / 1e9, 1)}
                    )
            rows.append(row)
            print("bwd-kernels", row, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impls.attention.gluon_sweep")
    parser.add_argument("--parts", default="correct,host,time")
    parser.add_argument("--dims", default="128,64")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--causal", default="no,yes", help="paths: no, yes or both (default: no,yes)"
    )
    parser.add_argument("--json", default="gluon_sweep.json")
    parser.add_argument("--triton", action="store_true", help="also time the Triton forward")
    parser.add_argument(
        "--levers",
        action="store_true",
        help="also check and time gluon_fwd.LEVER_CONFIGS (software exp2, conditional rescale)",
    )
    parser.add_argument(
        "--tilings",
        default="",
        help="indices into each head dim's tilings (CONFIGS, then LEVER_CONFIGS with --levers), "
        "e.g. 0,1,2,16: only these are compiled, checked and timed (default: all); the first "
        "becomes the default that forward='gluon' runs in this process",
    )
    parser.add_argument(
        "--precompile-jobs",
        type=int,
        default=0,
        help="compile every forward tiling in this many worker processes first (0: on first use)",
    )
    args = parser.parse_args(argv)
    dims = [int(x) for x in args.dims.split(",")]
    result: dict = {
        "env": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }
    }
    parts = args.parts.split(",")
    if args.levers:
        for d in dims:
            gluon_fwd.CONFIGS[d] = gluon_fwd.CONFIGS[d] + gluon_fwd.LEVER_CONFIGS.get(d, ())
    if args.tilings:
        picked = [int(x) for x in args.tilings.split(",")]
        for d in dims:
            gluon_fwd.CONFIGS[d] = tuple(gluon_fwd.CONFIGS[d][i] for i in picked)
        result["tilings"] = {d: [str(c) for c in gluon_fwd.CONFIGS[d]] for d in dims}
    if args.precompile_jobs > 0 and any(p in parts for p in ("correct", "time")):
        # One shape per specialization the sweep meets: the timing shapes (heads divisible
        # by 16) and CORRECT_SHAPES (neither; group size 1 or not).
        warm = [(1, 32, 32, 512, 512), (2, 4, 2, 512, 512), (1, 4, 4, 512, 512)]
        precompile_gluon(dims, args.dtypes.split(","), warm, args.precompile_jobs)
        if args.triton and "time" in parts:
            from reference_impls.attention import bench

            names = [{"bf16": "bfloat16", "fp16": "float16"}[t] for t in args.dtypes.split(",")]
            bench.precompile(dims, [False, True], names, jobs=args.precompile_jobs, fp8=False)

    def save() -> None:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    if "correct" in parts:
        result["correct"] = correctness(dims, args.dtypes.split(","))
        save()
    if "host" in parts:
        result["host"] = host_cost(dims)
        save()
    if "time" in parts:
        lengths = [int(x) for x in args.lengths.split(",")]
        result["time"] = timing(dims, args.dtypes.split(","), lengths, args.rounds, args.triton)
        save()
    if "paths" in parts:
        lengths = [int(x) for x in args.lengths.split(",")]
        causals = [{"no": False, "yes": True}[x] for x in args.causal.split(",")]
        result["paths"] = paths(dims, args.dtypes.split(","), lengths, args.rounds, causals)
        save()
    if any(p in parts for p in ("bwd-correct", "bwd-time", "bwd-kernels")):
        # The Triton backward's autotuning configs, compiled in parallel into the disk cache
        # (bench.py's warm-up), so that its first timed call only loads them.
        from reference_impls.attention import bench

        names = [{"bf16": "bfloat16", "fp16": "float16"}[t] for t in args.dtypes.split(",")]
        bench.precompile([128], [False, True], names, jobs=8, fp8=False)
    if "bwd-correct" in parts:
        result["bwd_correct"] = bwd_correctness(args.dtypes.split(","))
        save()
    if "bwd-kernels" in parts:
        lengths = [int(x) for x in args.lengths.split(",")]
        result["bwd_kernels"] = bwd_kernels(lengths, args.rounds)
        save()
    if "bwd-time" in parts:
        lengths = [int(x) for x in args.lengths.split(",")]
        result["bwd_time"] = bwd_timing(args.dtypes.split(","), lengths, args.rounds)
        save()
    checks = result.get("correct", []) + result.get("bwd_correct", [])
    return 0 if all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
