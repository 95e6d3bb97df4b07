"""The ring's combine step (``mine = op(mine, incoming)``) as a Triton kernel with a fixed grid.

``torch.add_`` launches as many thread blocks as the tensor has tiles, so while it runs it
can take every SM of the GPU; NCCL's copy kernels for the next transfer then wait for SMs,
and a pipelined ring (``RingConfig.segments > 1``) loses the overlap it was built for. This
kernel runs a fixed number of persistent programs (``ctas``) that stride over the tensor, so
the rest of the GPU stays free for NCCL. ``RingConfig(combine_ctas=N)`` selects it on CUDA
tensors; CPU tensors (gloo) always use torch's ops.

Semantics equal torch's: 16-bit floats are combined in float32 and rounded once (as
``add_`` does), integers wrap, ``max``/``min`` propagate NaN like ``torch.maximum``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["COMBINE_OPS", "combine_"]

COMBINE_OPS = ("sum", "max", "min")
_BLOCK = 8192
_NUM_WARPS = (
    8  # 256 threads a program: 64 KiB of loads in flight each, a few programs per SM at most
)


@triton.jit
def _combine_kernel(
    dst_ptr, src_ptr, n, OP: tl.constexpr, UPCAST: tl.constexpr, BLOCK: tl.constexpr
):
    pid = tl.program_id(0).to(tl.int64)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    for start in tl.range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)  # (BLOCK,) int64
        mask = offs < n
        a = tl.load(dst_ptr + offs, mask=mask)
        b = tl.load(src_ptr + offs, mask=mask)
        if UPCAST:
            a32 = a.to(tl.float32)
            b32 = b.to(tl.float32)
        else:
            a32 = a
            b32 = b
        if OP == 0:
            c = a32 + b32
        elif OP == 1:
            c = tl.maximum(a32, b32, propagate_nan=tl.PropagateNan.ALL)
        else:
            c = tl.minimum(a32, b32, propagate_nan=tl.PropagateNan.ALL)
        tl.store(dst_ptr + offs, c.to(a.dtype), mask=mask)


def combine_(dst: torch.Tensor, src: torch.Tensor, op: str, ctas: int) -> torch.Tensor:
    """``dst = op(dst, src)`` in place with ``ctas`` persistent programs; returns ``dst``.

    Both tensors: 1-D, contiguous, same dtype, length and device. ``op``: sum, max or min
    (the ring divides for ``mean`` separately).
    """
    if op not in COMBINE_OPS:
        raise ValueError(f"combine op must be one of {', '.join(COMBINE_OPS)}; got {op!r}")
    if dst.shape != src.shape or dst.dtype != src.dtype or dst.device != src.device:
        raise ValueError(
            f"combine_ needs equal shapes, dtypes and devices; got {tuple(dst.shape)} {dst.dtype} "
            f"{dst.device} and {tuple(src.shape)} {src.dtype} {src.device}"
        )
    if dst.dim() != 1 or not (dst.is_contiguous() and src.is_contiguous()):
        raise ValueError("combine_ works on contiguous 1-D tensors")
    if not isinstance(ctas, int) or ctas < 1:
        raise ValueError(f"ctas must be an int >= 1, got {ctas!r}")
    n = dst.numel()
    if n == 0:
        return dst
    grid = (min(ctas, triton.cdiv(n, _BLOCK)),)
    upcast = dst.dtype in (torch.float16, torch.bfloat16)
    _combine_kernel[grid](
        dst, src, n, OP=COMBINE_OPS.index(op), UPCAST=upcast, BLOCK=_BLOCK, num_warps=_NUM_WARPS
    )
    return dst
