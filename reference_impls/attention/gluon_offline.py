"""Compile the Gluon forward (``gluon_fwd.py``) and backward (``gluon_bwd.py``) for sm_90a
without a GPU, and report what the hardware would see: registers, spills, shared memory.

    python -m reference_impls.attention.gluon_offline            # every tiling, both masks
    python -m reference_impls.attention.gluon_offline --dims 128 --default-only --check
    python -m reference_impls.attention.gluon_offline --dims 128 --kernels bwd --check

Triton compiles Gluon through PTX to a cubin with the ``ptxas`` its package carries, so no
driver is needed; ``cuobjdump`` (also in Triton's package) reads the cubin. Compile errors,
register budgets and spills can therefore be settled on a CPU machine before a GPU is spent.
Run it without ``TRITON_INTERPRET``: under the interpreter Triton's own library functions are
defined as interpreted ones, which the compiler refuses.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

from reference_impls.attention import gluon_bwd, gluon_fwd

HOPPER = GPUTarget("cuda", 90, 32)  # sm_90a, 32 threads per warp
ROWS = 4096  # rows of the placeholder (B*H*N, D) tensors: any multiple of the tiles
# Dynamic shared memory one block may use on sm_90: 227 KiB (CUDA programming guide, compute
# capability 9.0).
SM90_MAX_SHARED = 227 * 1024


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What one compile reports."""

    config: gluon_fwd.GluonConfig
    head_dim: int
    causal: bool
    shared_bytes: int  # dynamic shared memory the launch asks for
    spill_stores: int  # STL instructions in the SASS: register spills to local memory
    spill_loads: int
    resource_usage: str  # cuobjdump's line (REG is the launch's maxnreg; setmaxnreg moves it)


def compile_forward(
    config: gluon_fwd.GluonConfig,
    head_dim: int,
    causal: bool,
    dtype: torch.dtype = torch.float16,
) -> Compiled:
    """Compile ``_attn_fwd_ws`` for sm_90a with ``config`` and read its cubin."""
    gdtype = gl.float16 if dtype == torch.float16 else gl.bfloat16
    base = torch.empty(ROWS, head_dim, dtype=dtype)  # only shape, strides, dtype are read

    def desc(rows: int) -> TensorDescriptor:
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gdtype)
        return TensorDescriptor(base, [ROWS, head_dim], [head_dim, 1], [rows, head_dim], layout)

    args = {
        "desc_q": desc(config.block_m),
        "desc_k": desc(config.block_n),
        "desc_v": desc(config.block_n),
        "desc_o": desc(config.block_m),
        "Out": torch.empty(ROWS, head_dim, dtype=dtype),
        "LSE": torch.empty(ROWS, dtype=torch.float32),
        "qk_scale": 0.1,
        "n_q": 1024,
        "n_k": 1024,
        "num_heads": 16,
        "group_size": 1,
        "n_bh": 4,
    }
    constants = {
        "CAUSAL": causal,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "HEAD_DIM": head_dim,
        "STAGES": config.stages,
        "NUM_CONSUMERS": config.consumers,
        "CONSUMER_REGS": gluon_fwd.CONSUMER_REGS[config.consumers],
        "PINGPONG": config.pingpong,
        "PERSISTENT": config.persistent,
        "EMULATED": config.emulated,
        "RESCALE_TH": config.rescale,
        "EARLY_QK": config.early_qk,
    }
    options = {
        "num_warps": gluon_fwd.WARPS_PER_CONSUMER,
        "maxnreg": gluon_fwd.KERNEL_MAXNREG[config.consumers],
    }
    shared, stores, loads, line = _compile(gluon_fwd._attn_fwd_ws, args, constants, options)
    return Compiled(config, head_dim, causal, shared, stores, loads, line)


def _compile(fn, args: dict, constants: dict, options: dict) -> tuple[int, int, int, str]:
    """Compile a Gluon kernel for sm_90a: (shared bytes, spill stores, spill loads, the
    resource-usage line of its cubin)."""
    signature = {}
    constexprs = {}
    for i, name in enumerate(fn.arg_names):
        if name in constants:
            signature[name] = "constexpr"
            constexprs[(i,)] = constants[name]
        else:
            signature[name] = mangle_type(args[name])
    kernel = triton.compile(
        GluonASTSource(fn, signature, constexprs), target=HOPPER, options=options
    )
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        cuobjdump = os.path.join(tools, "cuobjdump")
        usage = subprocess.run(
            [cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [cuobjdump, "--dump-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    line = " ".join(x.strip() for x in usage.splitlines() if "REG:" in x)
    return int(kernel.metadata.shared), sass.count("STL"), sass.count("LDL"), line


@dataclasses.dataclass(frozen=True)
class CompiledBackward:
    """What one compile of the backward reports."""

    config: gluon_bwd.BwdConfig | gluon_bwd.DqConfig
    head_dim: int
    causal: bool
    atomic_dq: bool
    shared_bytes: int
    spill_stores: int
    spill_loads: int
    resource_usage: str


def compile_backward(
    config: gluon_bwd.BwdConfig,
    head_dim: int,
    causal: bool,
    atomic_dq: bool,
    dtype: torch.dtype = torch.float16,
) -> CompiledBackward:
    """Compile ``gluon_bwd._attn_bwd_ws`` for sm_90a with ``config`` and read its cubin."""
    gdtype = gl.float16 if dtype == torch.float16 else gl.bfloat16
    base = torch.empty(ROWS, head_dim, dtype=dtype)

    def desc(rows: int) -> TensorDescriptor:
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gdtype)
        return TensorDescriptor(base, [ROWS, head_dim], [head_dim, 1], [rows, head_dim], layout)

    def rows_desc() -> TensorDescriptor:
        m = config.block_m
        rows = torch.empty(ROWS, dtype=torch.float32)
        return TensorDescriptor(rows, [ROWS // m, m], [m, 1], [1, m], gluon_bwd._row_layout())

    args = {
        "desc_q": desc(config.block_m),
        "desc_do": desc(config.block_m),
        "desc_k": desc(config.block_n),
        "desc_v": desc(config.block_n),
        "DK": torch.empty(ROWS, head_dim, dtype=dtype),
        "DV": torch.empty(ROWS, head_dim, dtype=dtype),
        "desc_lse": rows_desc(),
        "desc_delta": rows_desc(),
        "DQ": torch.empty(ROWS, head_dim, dtype=torch.float32),
        "qk_scale": 0.1,
        "sm_scale": 0.1,
        "n_q": 1024,
        "n_k": 1024,
        "num_heads": 16,
        "group_size": 1,
    }
    constants = {
        "CAUSAL": causal,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "HEAD_DIM": head_dim,
        "STAGES": config.stages,
        "ATOMIC_DQ": atomic_dq,
        "CONSUMER_REGS": gluon_bwd.CONSUMER_REGS,
    }
    options = {"num_warps": gluon_bwd.WARPS_PER_CONSUMER, "maxnreg": gluon_bwd.KERNEL_MAXNREG}
    shared, stores, loads, line = _compile(gluon_bwd._attn_bwd_ws, args, constants, options)
    return CompiledBackward(config, head_dim, causal, atomic_dq, shared, stores, loads, line)


def compile_backward_dq(
    config: gluon_bwd.DqConfig, head_dim: int, causal: bool, dtype: torch.dtype = torch.float16
) -> CompiledBackward:
    """Compile ``gluon_bwd._attn_bwd_dq_ws`` (the dQ kernel) for sm_90a."""
    gdtype = gl.float16 if dtype == torch.float16 else gl.bfloat16
    base = torch.empty(ROWS, head_dim, dtype=dtype)

    def desc(rows: int) -> TensorDescriptor:
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gdtype)
        return TensorDescriptor(base, [ROWS, head_dim], [head_dim, 1], [rows, head_dim], layout)

    args = {
        "desc_q": desc(config.block_m),
        "desc_do": desc(config.block_m),
        "desc_k": desc(config.block_n),
        "desc_v": desc(config.block_n),
        "DQ": torch.empty(ROWS, head_dim, dtype=dtype),
        "LSE": torch.empty(ROWS, dtype=torch.float32),
        "DELTA": torch.empty(ROWS, dtype=torch.float32),
        "qk_scale": 0.1,
        "sm_scale": 0.1,
        "n_q": 1024,
        "n_k": 1024,
        "num_heads": 16,
        "group_size": 1,
    }
    constants = {
        "CAUSAL": causal,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "HEAD_DIM": head_dim,
        "STAGES": config.stages,
        "CONSUMER_REGS": gluon_bwd.CONSUMER_REGS,
    }
    options = {"num_warps": gluon_bwd.WARPS_PER_CONSUMER, "maxnreg": gluon_bwd.KERNEL_MAXNREG}
    shared, stores, loads, line = _compile(gluon_bwd._attn_bwd_dq_ws, args, constants, options)
    return CompiledBackward(config, head_dim, causal, False, shared, stores, loads, line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impls.attention.gluon_offline",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--dims", default="64,128", help="head dims (default: 64,128)")
    parser.add_argument(
        "--default-only", action="store_true", help="only each head dim's default tiling"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if any compile spills or asks for more than 227 KiB of shared memory",
    )
    parser.add_argument(
        "--kernels",
        default="fwd,bwd",
        help="fwd (gluon_fwd.py), bwd (gluon_bwd.py, head dim 128 only) or both (default)",
    )
    args = parser.parse_args(argv)
    kernels = args.kernels.split(",")
    bad = 0
    for d in (int(x) for x in args.dims.split(",")):
        if "bwd" in kernels and d in gluon_bwd.CONFIGS:
            bwd_configs = gluon_bwd.CONFIGS[d]
            for bcfg in bwd_configs[:1] if args.default_only else bwd_configs:
                for causal in (False, True):
                    for atomic in (True, False):
                        cb = compile_backward(bcfg, d, causal, atomic)
                        ok = (
                            cb.spill_stores == cb.spill_loads == 0
                            and cb.shared_bytes <= SM90_MAX_SHARED
                        )
                        # The in-kernel dQ is measured, not dispatched (kernel.GLUON_DQ_MODE):
                        # its few spills are reported, not failed on.
                        bad += not ok and not atomic
                        tag = "ok " if ok else ("SPILLS" if atomic else "BAD")
                        print(
                            f"{tag} bwd D={d} {bcfg} causal={causal!s:<5} "
                            f"atomic_dq={atomic!s:<5} shared {cb.shared_bytes} B, spills "
                            f"{cb.spill_stores} stores / {cb.spill_loads} loads | "
                            f"{cb.resource_usage}",
                            flush=True,
                        )
            dq_configs = gluon_bwd.DQ_CONFIGS[d]
            for dcfg in dq_configs[:1] if args.default_only else dq_configs:
                for causal in (False, True):
                    cb = compile_backward_dq(dcfg, d, causal)
                    ok = cb.spill_stores == cb.spill_loads == 0
                    ok = ok and cb.shared_bytes <= SM90_MAX_SHARED
                    bad += not ok
                    print(
                        f"{'ok ' if ok else 'BAD'} bwd-dq D={d} {dcfg} causal={causal!s:<5} "
                        f"shared {cb.shared_bytes} B, spills {cb.spill_stores} stores / "
                        f"{cb.spill_loads} loads | {cb.resource_usage}",
                        flush=True,
                    )
        if "fwd" not in kernels:
            continue
        configs = gluon_fwd.CONFIGS[d][:1] if args.default_only else gluon_fwd.CONFIGS[d]
        for cfg in configs:
            for causal in (False, True):
                c = compile_forward(cfg, d, causal)
                ok = c.spill_stores == c.spill_loads == 0 and c.shared_bytes <= SM90_MAX_SHARED
                bad += not ok
                print(
                    f"{'ok ' if ok else 'BAD'} D={d} {cfg} causal={causal!s:<5} "
                    f"shared {c.shared_bytes} B, spills {c.spill_stores} stores / "
                    f"{c.spill_loads} loads | {c.resource_usage}",
                    flush=True,
                )
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
