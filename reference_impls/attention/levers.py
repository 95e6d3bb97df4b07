"""Speed levers for the attention kernels, each timed kernel by kernel in one run (CUDA only).

    python -m reference_impls.attention.levers --json levers.json [--jobs 16] [--only dkdv,fwd]

What it times (every kernel launched directly with one explicit config, CUDA-event medians of
``triton.testing.do_bench``, the same inputs for all variants; bf16, the benchmark table's
shapes ``H = 2048 / D``, ``B * N = 32768``), causal and not:

- ``dkdv`` / ``dq``: the two-pass backward's kernels at D=128 over a sweep of tilings
  (BLOCK_M x BLOCK_N / warps / stages), each as written (``base``) and with Triton's warp
  specialization on its inner loop over blocks (``ws``: ``tl.range(..., warp_specialize=True)``).
- ``fused``: the one-pass backward's kernel (dQ by bulk reduction) at D=64, base and ``ws``.
- ``fwd``: the forward at D=128, as written and persistent (one program per SM looping over
  query blocks; plain, with the outer loop flattened into the inner one, and warp-specialized).
- ``cudnn``: SDPA cuDNN's forward and backward on the same inputs, for the ratios.

The variants are built from ``kernel.py``'s own source: the ``ws`` module is that source with
the inner loops' ``tl.range`` calls given ``warp_specialize=True``, written to a temporary
directory and imported under another name, so nothing in the package changes. All kernels are
first compiled in worker processes (``--jobs``) into Triton's on-disk cache. Results:
docs/benchmarks/attention.md ("The levers, measured").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from types import ModuleType

import torch
import triton
import triton.language as tl

from reference_impls.attention import kernel as base_kernel

HERE = Path(__file__).resolve().parent
VARIANT_DIR = Path(tempfile.gettempdir()) / "attention_levers"

DKDV_128 = [
    (32, 128, 8, 3), (32, 128, 8, 2), (32, 128, 8, 4), (16, 128, 8, 3), (16, 128, 8, 4),
    (64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3),
    (128, 64, 8, 3), (32, 256, 16, 2), (64, 256, 16, 2),
]  # fmt: skip
DQ_128 = [
    (128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 4), (128, 32, 8, 3),
    (128, 32, 8, 4), (64, 128, 8, 2), (128, 128, 8, 2),
]  # fmt: skip
FUSED_64 = [(64, 64, 4, 3), (64, 128, 8, 3), (64, 64, 8, 3), (64, 64, 4, 4)]
# The second run's sweeps, around the first run's winners and at D=64 for both backwards.
DKDV_128_MORE = [(64, 128, 8, 4), (64, 128, 8, 2), (32, 128, 8, 5), (64, 128, 8, 5)]
DQ_128_MORE = [(128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 2)]
FUSED_64_MORE = [(32, 64, 4, 3), (64, 64, 4, 2), (32, 128, 8, 3), (128, 64, 8, 3), (32, 64, 4, 4)]
DKDV_64 = [(64, 128, 8, 3), (64, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 3), (32, 128, 8, 3),
           (64, 128, 8, 4), (128, 128, 8, 3)]  # fmt: skip
DQ_64 = [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 4),
         (128, 128, 8, 3)]  # fmt: skip
FP8 = {
    64: [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3), (64, 128, 4, 3),
         (64, 64, 4, 4), (64, 32, 4, 3)],
    128: [(64, 128, 4, 3), (64, 128, 4, 4), (64, 128, 4, 2), (128, 128, 8, 3), (128, 64, 8, 3),
          (64, 64, 4, 3), (128, 128, 8, 4)],
}  # fmt: skip
FWD_128 = [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 4)]
PERSISTENT = ("persistent", "persistent-flat", "persistent-ws")
FWD_NREG = [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 128, 4, 3)]
NREG = (128, 168, 200)
LENGTHS = {128: (1024, 4096, 16384), 64: (4096,)}


# --------------------------------------------------------------------------- variants


def _ws_source() -> str:
    src = (HERE / "kernel.py").read_text()
    dkdv = "    for start_m in tl.range(lo, hi, BLOCK_M):\n"
    assert src.count(dkdv) == 1, "kernel.py's dK/dV loop moved: update levers.py"
    src = src.replace(dkdv, dkdv.replace("BLOCK_M)", "BLOCK_M, warp_specialize=True)"))
    head = src.index("def _attn_bwd_dq_inner(")
    loop = "    for start_n in tl.range(lo, hi, BLOCK_N):\n"
    at = src.index(loop, head)
    src = (
        src[:at]
        + loop.replace("BLOCK_N)", "BLOCK_N, warp_specialize=True)")
        + src[at + len(loop) :]
    )
    return src


def variant(name: str) -> ModuleType:
    """``base``: reference_impls.attention.kernel; ``ws``: its warp-specialized copy."""
    if name == "base":
        return base_kernel
    mod_name = f"_attention_lever_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    VARIANT_DIR.mkdir(parents=True, exist_ok=True)
    path = VARIANT_DIR / f"{mod_name}.py"
    src = _ws_source()
    if not path.exists() or path.read_text() != src:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, path)  # atomic: worker processes may import it meanwhile
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod  # triton reads the source through the module
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- persistent forward


@triton.jit(do_not_specialize=base_kernel._NOT_SPECIALIZED)
def _attn_fwd_persistent(
    desc_q,
    desc_k,
    desc_v,
    OUT,
    LSE,
    sm_scale,
    n_q,
    n_k,
    head_dim,
    num_heads,
    group_size,
    num_bh,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr,
    WS: tl.constexpr,
):
    """kernel._attn_fwd's body in a loop over (query block, batch x head) tiles, NUM_PROGRAMS
    programs striding through them (causal: the longest query blocks first)."""
    num_m = tl.cdiv(n_q, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = sm_scale * base_kernel.LOG2E
    for tile in tl.range(
        tl.program_id(0), num_m * num_bh, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WS
    ):
        bh = tile % num_bh
        block_m = tile // num_bh
        if CAUSAL:
            block_m = num_m - 1 - block_m  # the longest query blocks first
        b = bh // num_heads
        h = bh % num_heads
        hkv = h // group_size
        start_m = block_m * BLOCK_M
        q_row0 = bh * n_q
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        causal_shift, full, hi = base_kernel._key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
        acc, l_i, m_i = base_kernel._attn_fwd_inner(
            acc, l_i, m_i, q, desc_k, desc_v, b, hkv, 0, full, offs_m, n_k, causal_shift,
            qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, False, "tf32",
        )  # fmt: skip
        acc, l_i, m_i = base_kernel._attn_fwd_inner(
            acc, l_i, m_i, q, desc_k, desc_v, b, hkv, full, hi, offs_m, n_k, causal_shift,
            qk_scale, BLOCK_N, HEAD_DIM, True, CAUSAL, False, "tf32",
        )  # fmt: skip
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        acc = acc / l_safe[:, None]
        lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
        row_ok = offs_m < n_q
        tl.store(LSE + q_row0 + offs_m, lse, mask=row_ok)
        o_ptrs = OUT + (q_row0 + offs_m).to(tl.int64)[:, None] * head_dim + offs_d[None, :]
        tl.store(
            o_ptrs,
            acc.to(OUT.dtype.element_ty),
            mask=row_ok[:, None] & (offs_d < head_dim)[None, :],
        )


# --------------------------------------------------------------------------- launches


class Problem:
    """bf16 (B, H, N, D) inputs with everything the backward kernels read, computed once."""

    def __init__(self, d: int, n: int, causal: bool, batch: int | None = None, seed: int = 0):
        self.d, self.n, self.causal = d, n, causal
        self.b = batch if batch is not None else max(1, 32768 // n)
        self.h = 2048 // d if batch is None else 2
        g = torch.Generator(device="cuda").manual_seed(seed)
        shape = (self.b, self.h, n, d)
        self.q, self.k, self.v, self.do = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
        )
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty((self.b, self.h, n), device="cuda", dtype=torch.float32)
        self.scale = d**-0.5
        fwd(base_kernel, self, (128, 64, 8, 3))()
        self.delta = (self.do.float() * self.o.float()).sum(-1).contiguous()
        self.dq = torch.empty_like(self.q)
        self.dk, self.dv = torch.empty_like(self.k), torch.empty_like(self.v)
        self.dq32 = torch.zeros(shape, device="cuda", dtype=torch.float32)

    def flops(self, factor: float) -> float:
        f = 4.0 * self.b * self.h * self.n * self.n * self.d * factor
        return f / 2 if self.causal else f

    def sizes(self):
        return (self.n, self.n, self.d, self.h, 1)


def _descs(p: Problem, kern: ModuleType, **blocks):
    out = {}
    for name, (t, rows) in blocks.items():
        desc = kern._desc(t)
        desc.block_shape = [1, 1, rows, p.d]
        out[name] = desc
    return out


def fwd(
    kern: ModuleType, p: Problem, cfg, persistent: str | None = None, **extra
) -> Callable[[], None]:
    bm, bn, w, s = cfg
    d = _descs(p, kern, q=(p.q, bm), k=(p.k, bn), v=(p.v, bn))
    meta = extra | {
        "HEAD_DIM": p.d,
        "CAUSAL": p.causal,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "num_warps": w,
        "num_stages": s,
    }
    if persistent is None:
        grid = (p.b * p.h * triton.cdiv(p.n, bm),)

        def run():
            kern._attn_fwd[grid](
                d["q"], d["k"], d["v"], p.o, p.lse, p.scale, *p.sizes(),
                UPCAST=False, PRECISION="tf32", **meta,
            )  # fmt: skip

        return run
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = min(sms, p.b * p.h * triton.cdiv(p.n, bm))

    def run_persistent():
        _attn_fwd_persistent[(programs,)](
            d["q"], d["k"], d["v"], p.o, p.lse, p.scale, *p.sizes(), p.b * p.h,
            NUM_PROGRAMS=programs, FLATTEN=persistent == "persistent-flat",
            WS=persistent == "persistent-ws", **meta,
        )  # fmt: skip

    return run_persistent


def dkdv(kern: ModuleType, p: Problem, cfg, fused: bool = False, **extra) -> Callable[[], None]:
    bm, bn, w, s = cfg
    d = _descs(p, kern, q=(p.q, bm), k=(p.k, bn), v=(p.v, bn), do=(p.do, bm), dq=(p.dq32, bm))
    grid = (p.b * p.h * triton.cdiv(p.n, bn),)

    def run():
        kern._attn_bwd_dkdv[grid](
            d["q"], d["k"], d["v"], d["do"], p.dk, p.dv, p.dq32, d["dq"], p.lse, p.delta,
            p.scale, *p.sizes(), HEAD_DIM=p.d, CAUSAL=p.causal, GROUPED=False,
            ATOMIC_DQ=fused, DQ_TMA=fused, BLOCK_M=bm, BLOCK_N=bn, UPCAST=False,
            PRECISION="tf32", num_warps=w, num_stages=s, **extra,
        )  # fmt: skip

    return run


def dq(kern: ModuleType, p: Problem, cfg, **extra) -> Callable[[], None]:
    bm, bn, w, s = cfg
    d = _descs(p, kern, q=(p.q, bm), k=(p.k, bn), v=(p.v, bn), o=(p.o, bm), do=(p.do, bm))
    grid = (p.b * p.h * triton.cdiv(p.n, bm),)
    delta = torch.empty_like(p.delta)

    def run():
        kern._attn_bwd_dq[grid](
            d["q"], d["k"], d["v"], d["o"], d["do"], p.dq, p.lse, delta, p.scale, *p.sizes(),
            HEAD_DIM=p.d, CAUSAL=p.causal, BLOCK_M=bm, BLOCK_N=bn, UPCAST=False,
            PRECISION="tf32", num_warps=w, num_stages=s, **extra,
        )  # fmt: skip

    return run


def fp8_fwd(p: Problem, cfg) -> Callable[[], None]:
    from reference_impls.attention import fp8

    bm, bn, w, s = cfg
    qq, kk = fp8.quantize_fp8(p.q), fp8.quantize_fp8(p.k)
    vv = fp8.quantize_fp8(p.v, transpose=True)
    dq_, dk_, dv_ = (
        fp8._desc(qq.data, [p.b, p.h, p.n, p.d]),
        fp8._desc(kk.data, [p.b, p.h, p.n, p.d]),
        fp8._desc(vv.data, [p.b, p.h, p.d, p.n]),
    )
    dq_.block_shape, dk_.block_shape = [1, 1, bm, p.d], [1, 1, bn, p.d]
    dv_.block_shape = [1, 1, p.d, bn]
    grid = (p.b * p.h * triton.cdiv(p.n, bm),)

    def run():
        fp8._attn_fwd_fp8[grid](
            dq_, dk_, dv_, qq.scale, kk.scale, vv.scale, p.o, p.scale, *p.sizes(),
            HEAD_DIM=p.d, CAUSAL=p.causal, SCALE_BLOCK=qq.block_size, BLOCK_M=bm, BLOCK_N=bn,
            num_warps=w, num_stages=s,
        )  # fmt: skip

    return run


def cudnn(p: Problem, mode: str) -> Callable[[], object]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.detach().requires_grad_(mode == "bwd") for t in (p.q, p.k, p.v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        if mode == "fwd":

            def run_fwd():
                with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=p.causal)

            return run_fwd
        out = F.scaled_dot_product_attention(q, k, v, is_causal=p.causal)
    return lambda: torch.autograd.grad(out, (q, k, v), p.do, retain_graph=True)


# --------------------------------------------------------------------------- the plan


def plan(only: set[str], variants: tuple[str, ...] = ("base", "ws")) -> list[tuple]:
    """(kind, variant, d, cfg, extra) for every timed kernel."""
    items: list[tuple] = []
    if "more" in only:  # the second run
        items += [("dkdv", v, 128, c, None) for v in variants for c in DKDV_128_MORE]
        items += [("dq", v, 128, c, None) for v in variants for c in DQ_128_MORE]
        items += [("fused", v, 64, c, None) for v in variants for c in FUSED_64_MORE]
        items += [("dkdv", v, 64, c, None) for v in variants for c in DKDV_64]
        items += [("dq", v, 64, c, None) for v in variants for c in DQ_64]
    if "nreg" in only:  # the third run: a register cap per thread (ptxas -maxrregcount)
        items += [("fwd", "base", 128, c, r) for c in FWD_NREG for r in (None, *NREG)]
        items += [("dkdv", "base", 128, (64, 128, 8, 3), r) for r in (None, 200, 232)]
        items += [("dq", "base", 128, (128, 64, 8, 3), r) for r in (None, 168, 200)]
    if "fp8" in only:
        items += [("fp8", "base", d, c, None) for d in (64, 128) for c in FP8[d]]
    if "dkdv" in only:
        items += [("dkdv", v, 128, c, None) for v in variants for c in DKDV_128]
    if "dq" in only:
        items += [("dq", v, 128, c, None) for v in variants for c in DQ_128]
    if "fused" in only:
        items += [("fused", v, 64, c, None) for v in variants for c in FUSED_64]
    if "fwd" in only:
        items += [("fwd", "base", 128, c, None) for c in FWD_128]
        items += [("fwd", "base", 128, c, m) for c in FWD_128[:2] for m in PERSISTENT]
    return items


def launcher(kind: str, var: str, p: Problem, cfg, extra) -> Callable[[], None]:
    kern = variant(var)
    nreg = {"maxnreg": extra} if isinstance(extra, int) else {}
    if kind == "fp8":
        return fp8_fwd(p, cfg)
    if kind == "fwd":
        return fwd(kern, p, cfg, None if nreg else extra, **nreg)
    if kind == "dq":
        return dq(kern, p, cfg, **nreg)
    return dkdv(kern, p, cfg, fused=kind == "fused", **nreg)


def _compile(item, causal: bool) -> str:
    kind, var, d, cfg, extra = item
    p = Problem(d, 256, causal, batch=1)
    try:
        launcher(kind, var, p, cfg, extra)()
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:  # a config that does not compile is a result, not a crash
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impls.attention.levers")
    parser.add_argument("--json", metavar="PATH", help="write every timing as JSON")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--only", default="dkdv,dq,fused,fwd", help="subset of dkdv,dq,fused,fwd")
    parser.add_argument("--causal", default="no,yes")
    parser.add_argument("--variants", default="base,ws", help="base, ws or both")
    parser.add_argument("--lengths", default=None, help="override the lengths, e.g. 4096")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("levers: needs a CUDA GPU", file=sys.stderr)
        return 2
    items = plan(set(args.only.split(",")), tuple(args.variants.split(",")))
    if args.lengths:
        for d in LENGTHS:
            LENGTHS[d] = tuple(int(n) for n in args.lengths.split(","))
    causals = [{"no": False, "yes": True}[c] for c in args.causal.split(",")]
    todo = [(it, c) for it in items for c in causals]
    variant("ws")  # written once here, before the workers import it
    print(f"# compiling {len(todo)} kernels in {args.jobs} processes", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        status = list(pool.map(_compile, *zip(*todo, strict=True)))
    failed = {(it, c): s for (it, c), s in zip(todo, status, strict=True) if s != "ok"}
    for (it, c), s in failed.items():
        print(f"compile failed: {it} causal={c}: {s}", flush=True)
    results = []
    for d in (128, 64):
        for n in LENGTHS[d]:
            for c in causals:
                mine = [it for it in items if it[2] == d and (it, c) not in failed]
                if not mine or (n != 4096 and not {"fwd", "fp8"} & {it[0] for it in mine}):
                    continue
                p = Problem(d, n, c)
                rows: list[tuple] = []
                for mode in ("fwd", "bwd"):
                    ms = triton.testing.do_bench(cudnn(p, mode), warmup=25, rep=100)
                    rows.append(
                        ("cudnn-" + mode, "-", None, None, ms, 1.0 if mode == "fwd" else 2.5)
                    )
                for kind, var, _, cfg, extra in mine:
                    if n != 4096 and kind not in ("fwd", "fp8"):
                        continue  # the backward sweeps at N=4096; the forward at every N
                    try:
                        fn = launcher(kind, var, p, cfg, extra)
                        fn()
                        torch.cuda.synchronize()
                        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
                    except Exception:
                        traceback.print_exc()
                        continue
                    rows.append((kind, var, cfg, extra, ms, None))
                for kind, var, cfg, extra, ms, factor in rows:
                    rec = {
                        "d": d, "n": n, "causal": c, "kernel": kind, "variant": var,
                        "config": cfg, "persistent": extra, "ms": ms,
                        "tflops": p.flops(factor) / ms / 1e9 if factor else None,
                    }  # fmt: skip
                    results.append(rec)
                    cfg_s = "" if cfg is None else "{}x{}/{}w/{}s".format(*cfg)
                    tf = f"{rec['tflops']:.0f} TFLOP/s" if rec["tflops"] else ""
                    print(
                        f"D={d} N={n} causal={c!s:<5} {kind:<10} {var:<5} {cfg_s:<14}"
                        f" {'' if extra is None else extra!s:<16} {ms:8.3f} ms {tf}",
                        flush=True,
                    )
                del p
                torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "failed": [
                        {"item": repr(it), "causal": c, "error": s} for (it, c), s in failed.items()
                    ],
                    "results": results,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    # Run the package's copy of this module, so that the worker processes (spawned, which
    # import it by name) and this one define the same kernels under the same name.
    from reference_impls.attention import levers

    sys.exit(levers.main())
