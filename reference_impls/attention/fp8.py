"""FP8 (e4m3) attention forward for inference, with per-block scales.

    from reference_impls.attention import attention_fp8, quantize_fp8
    o = attention_fp8(q, k, v, causal=True)            # bf16/fp16 in: quantized per call
    qq, kk, vv = quantize_fp8(q), quantize_fp8(k), quantize_fp8(v, transpose=True)
    o = attention_fp8(qq, kk, vv, causal=True)         # pre-quantized (an fp8 KV cache)

What it computes: the same ``softmax(q k^T * sm_scale) v`` as :func:`attention`, with q, k and
v stored as ``float8_e4m3fn`` (3 mantissa bits, largest finite value 448) and one fp32 scale
per block of ``block_size`` rows of one head: ``x ~= data * scale[row // block_size]``. A block
scale instead of one per tensor keeps an outlier block (a few very large activations) from
flushing every other block's small values towards fp8's subnormals. Both matmuls run on the
fp8 tensor cores with fp32 accumulation (Hopper's wgmma: twice the bf16 rate):

- ``S = Q K^T``: fp8 x fp8, then multiplied by each query row's scale times the key block's
  scale times ``sm_scale * log2(e)`` (one multiply per score, as the bf16 kernel's).
- ``P V``: the probabilities are cast to e4m3 too. ``P`` lies in [0, 1], where e4m3 has only
  subnormals below 2^-6; the kernel computes ``P * 256`` instead (the running maximum is
  shifted by 8 inside ``exp2``, which costs nothing) so that values down to ~6e-5 keep full
  precision, and the factor cancels in the final division by the row sum, which is
  accumulated from the same scaled values. Each key block's product is multiplied by that
  block's V scale before it is added (one extra multiply-add per output element and block).
- Hopper's fp8 wgmma needs both operands K-major (the reduction dim contiguous in memory). For
  ``P V`` the reduction runs over keys, so V is stored transposed, ``(B, Hkv, D, Nk)``:
  :func:`quantize_fp8` with ``transpose=True`` writes it so (Triton's fused-attention tutorial
  does the same for its fp8 V). K needs no transpose: ``Q K^T`` reduces over D, which is
  already contiguous.

Accuracy, measured and bounded in suites/{unit,gpu}/attention (docs/benchmarks/attention.md):
e4m3's unit roundoff is 2^-4 = 6.25%, so each stored input is off by up to that much of its
own size; the output differs from the bf16 kernel's by a few percent in relative norm, not
by bf16's 0.2-0.4%. Inference only: no backward, no log-sum-exp saved.

Layout and limits as :func:`attention` (grouped-query attention, causal bottom-right aligned,
any lengths), except head dims: a multiple of 16 (an fp8 row must be a whole number of 16-byte
TMA units) up to 256.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from reference_impls.attention.kernel import (
    _NOT_SPECIALIZED,
    INTERPRET,
    LOG2E,
    MAX_HEAD_DIM,
    _check,
    _configs,
    _key_range,
    _KeyArg,
    _query_block,
)

__all__ = ["Fp8Blocks", "attention_fp8", "quantize_fp8", "FP8_DTYPE", "FP8_MAX"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
FP8_MAX_TL = tl.constexpr(FP8_MAX)
# Rows per scale, default. Key blocks of the kernel must not straddle two scale blocks, so the
# smallest block size is the largest BLOCK_N of the configs (64 on GPUs; 16 interpreted).
DEFAULT_BLOCK_SIZE = 128
MIN_BLOCK_SIZE = 16 if INTERPRET else 64
P_SHIFT = tl.constexpr(8.0)
"""P is computed as exp2(s - m + 8) = 256 * exp2(s - m): see the module docstring."""
OUT_DTYPES = (torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class Fp8Blocks:
    """A (B, H, N, D) tensor quantized to e4m3 with one fp32 scale per block of rows.

    data: ``float8_e4m3fn``; ``(B, H, N, D)``, or with ``transposed`` the transpose
        ``(B, H, D, N)``, stored with N padded to a multiple of 16 (TMA's 16-byte rows):
        use :attr:`shape` for the logical shape.
    scale: ``(B, H, ceil(N / block_size))`` fp32; row ``n`` of head ``(b, h)`` is
        ``data[b, h, n] * scale[b, h, n // block_size]``.
    """

    data: torch.Tensor
    scale: torch.Tensor
    block_size: int
    transposed: bool
    n: int  # the logical sequence length (the transposed data is padded past it)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        b, h = self.data.shape[:2]
        d = self.data.shape[2] if self.transposed else self.data.shape[3]
        return (b, h, self.n, d)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The (B, H, N, D) values the kernel computes with, in ``dtype``."""
        data = self.data[..., : self.n].transpose(2, 3) if self.transposed else self.data
        rows = self.scale.repeat_interleave(self.block_size, dim=2)[:, :, : self.n]
        return (data.to(torch.float32) * rows[..., None]).to(dtype)


def quantize_fp8(
    x: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE, transpose: bool = False
) -> Fp8Blocks:
    """Quantize a (B, H, N, D) fp16/bf16/fp32 tensor to e4m3 with one scale per block of
    ``block_size`` rows of each head: ``scale = max|block| / 448`` (1 for an all-zero block),
    ``data = round_to_nearest(x / scale)``, in one Triton kernel (one read of ``x``).
    ``transpose=True`` stores (B, H, D, N), the layout the kernel needs for V. Like the bf16
    kernel, it does not look for inf or NaN: a block holding one comes out NaN."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"quantize_fp8 needs a (B, H, N, D) tensor, got {shape}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"quantize_fp8 needs fp16, bf16 or fp32 input, got {x.dtype}")
    _check_block_size(block_size)
    b, h, n, d = x.shape
    if d % 16:
        raise ValueError(
            f"fp8 attention needs a head dim that is a multiple of 16 (whole 16-byte rows), got {d}"
        )
    if min(b, h, n) == 0:
        raise ValueError(f"quantize_fp8 needs a non-empty tensor, got {tuple(x.shape)}")
    _check_device(x.device)
    if x.stride(-1) != 1:
        x = x.contiguous()
    blocks = triton.cdiv(n, block_size)
    n_out = triton.cdiv(n, 16) * 16 if transpose else n
    shape = (b, h, d, n_out) if transpose else (b, h, n, d)
    data = torch.empty(shape, device=x.device, dtype=FP8_DTYPE)
    scale = torch.empty((b, h, blocks), device=x.device, dtype=torch.float32)
    head_dim = triton.next_power_of_2(d)
    _quantize_kernel[(b * h * blocks,)](
        x, data, scale, n, d, n_out, *x.stride()[:3], h, blocks,
        BLOCK=block_size, HEAD_DIM=head_dim, TRANSPOSE=transpose,
        num_warps=8 if block_size * head_dim >= 8192 else 4,
    )  # fmt: skip
    return Fp8Blocks(data, scale, block_size, transpose, n)


@triton.jit
def _round_to_e4m3(y):
    """fp32 ``y`` (|y| <= 448) rounded to the nearest e4m3 value, ties to even, still as fp32.

    Done by hand rather than left to the cast, because the interpreter's fp32 -> fp8 rounding
    loses the carry into the exponent (1.96 rounds to 1.0 at some exponents); after this the
    cast is exact on both. Normal range (|y| >= 2^-6): round the fp32 bits to 3 mantissa bits
    (adding below bit 20 carries into the exponent as it should). Subnormals: multiples of
    2^-9, by the add-and-subtract-1.5 * 2^23 trick (fp32 rounds to an integer there)."""
    y = tl.minimum(tl.maximum(y, -FP8_MAX_TL), FP8_MAX_TL)
    bits = y.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576: 0xFFF00000
    normal = bits.to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2^23
    sub = ((y * 512.0 + magic) - magic) * 0.001953125  # * 2^-9
    return tl.where(tl.abs(y) < 0.015625, sub, normal)


@triton.jit(do_not_specialize=["n", "n_out", "num_heads", "n_blocks"])
def _quantize_kernel(
    X,
    DATA,
    SCALE,
    n,
    d,
    n_out,
    stride_b,
    stride_h,
    stride_n,
    num_heads,
    n_blocks,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TRANSPOSE: tl.constexpr,
):
    """One program per block of BLOCK rows of one head: scale = max|x| / 448 (1 when the block
    is all zeros), data = x / scale rounded to nearest even. Rows past ``n`` (the transposed
    layout's padding up to ``n_out``) are written as zeros."""
    pid = tl.program_id(0)
    bh = pid // n_blocks
    rows = (pid % n_blocks) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    col_ok = (cols < d)[None, :]
    b = (bh // num_heads).to(tl.int64)
    h = (bh % num_heads).to(tl.int64)
    src = X + b * stride_b + h * stride_h + rows.to(tl.int64)[:, None] * stride_n + cols[None, :]
    x = tl.load(src, mask=(rows < n)[:, None] & col_ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), 1), 0)
    scale = tl.where(amax > 0, amax / FP8_MAX_TL, 1.0)
    # div_rn: IEEE division, as torch's; plain "/" is approximate (2 ulp) on GPUs, which moves
    # the odd value across a rounding boundary of e4m3.
    y = _round_to_e4m3(tl.math.div_rn(x, scale)).to(DATA.dtype.element_ty)  # exact cast
    tl.store(SCALE + pid, scale)
    if TRANSPOSE:  # DATA (B, H, D, n_out)
        dst = DATA + (bh.to(tl.int64) * d + cols[None, :]) * n_out + rows[:, None]
        tl.store(dst, y, mask=(rows < n_out)[:, None] & col_ok)
    else:  # DATA (B, H, n, D)
        dst = DATA + (bh.to(tl.int64) * n + rows[:, None]) * d + cols[None, :]
        tl.store(dst, y, mask=(rows < n)[:, None] & col_ok)


def _check_device(device: torch.device) -> None:
    if INTERPRET:
        if device.type != "cpu":
            raise ValueError(
                f"under TRITON_INTERPRET=1 the kernels run on CPU tensors, got {device}"
            )
    elif device.type != "cuda":
        raise ValueError(f"fp8 attention needs CUDA tensors, got {device}")


def _check_block_size(block_size: object) -> None:
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, int)
        or block_size < MIN_BLOCK_SIZE
        or block_size & (block_size - 1)
    ):
        raise ValueError(
            f"block_size must be a power of two of at least {MIN_BLOCK_SIZE} (a key block of "
            f"the kernel must not straddle two scales), got {block_size!r}"
        )


# ---------------------------------------------------------------------------------------------
# Kernel


@triton.jit
def _fp8_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    row_scale,
    desc_k,
    desc_vt,
    K_SCALE,
    V_SCALE,
    b,
    hkv,
    lo,
    hi,
    offs_m,
    n_k,
    causal_shift,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """Fold key blocks ``[lo, hi)`` into (acc, l_i, m_i), as ``kernel._attn_fwd_inner`` with
    fp8 operands. K_SCALE / V_SCALE point at this K/V head's block scales; ``row_scale`` is
    each query row's scale times ``sm_scale * log2(e)``."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = desc_k.load([b, hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        k_scale = tl.load(K_SCALE + start_n // SCALE_BLOCK)
        v_scale = tl.load(V_SCALE + start_n // SCALE_BLOCK)
        qk = tl.dot(q, k.T)  # (BLOCK_M, BLOCK_N) fp32, in units of q_scale * k_scale
        s = qk * (row_scale * k_scale)[:, None]  # base-2 scaled scores
        if MASKED:
            offs_n = start_n + offs_n0
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
            s = tl.where(keep, s, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet has m_ij == -inf: subtract 0 there instead (its p and
        # alpha are then exactly 0, never NaN).
        m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(s - (m_sub - P_SHIFT)[:, None])  # in [0, 256]
        alpha = tl.math.exp2(m_i - m_sub)
        vt = desc_vt.load([b, hkv, 0, start_n]).reshape(HEAD_DIM, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = tl.dot(p.to(vt.dtype), vt.T)  # (BLOCK_M, HEAD_DIM), V K-major in shared memory
        acc = acc * alpha[:, None] + pv * v_scale
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _attn_fwd_fp8(
    desc_q,
    desc_k,
    desc_vt,
    Q_SCALE,
    K_SCALE,
    V_SCALE,
    OUT,
    sm_scale,
    n_q,
    n_k,
    head_dim,
    num_heads,
    group_size,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh, b, h, hkv, start_m = _query_block(n_q, num_heads, group_size, CAUSAL, BLOCK_M)
    q_row0 = bh * n_q
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    q_blocks = tl.cdiv(n_q, SCALE_BLOCK)
    k_blocks = tl.cdiv(n_k, SCALE_BLOCK)
    # Per-row scales: a query block may hold rows of two scale blocks when BLOCK_M > SCALE_BLOCK.
    q_scale = tl.load(Q_SCALE + bh * q_blocks + offs_m // SCALE_BLOCK, mask=row_ok, other=1.0)
    row_scale = q_scale * (sm_scale * LOG2E)
    kv_head = b * (num_heads // group_size) + hkv
    k_scale_ptr = K_SCALE + kv_head * k_blocks
    v_scale_ptr = V_SCALE + kv_head * k_blocks

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)

    causal_shift, full, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fp8_fwd_inner(
        acc, l_i, m_i, q, row_scale, desc_k, desc_vt, k_scale_ptr, v_scale_ptr, b, hkv,
        0, full, offs_m, n_k, causal_shift, BLOCK_N, HEAD_DIM, SCALE_BLOCK, False, CAUSAL,
    )  # fmt: skip
    acc, l_i, m_i = _fp8_fwd_inner(
        acc, l_i, m_i, q, row_scale, desc_k, desc_vt, k_scale_ptr, v_scale_ptr, b, hkv,
        full, hi, offs_m, n_k, causal_shift, BLOCK_N, HEAD_DIM, SCALE_BLOCK, True, CAUSAL,
    )  # fmt: skip

    # acc and l_i both carry the factor 256 of P_SHIFT: it cancels here. Rows that saw no key
    # (causal, Nq > Nk) have l_i == 0 and get zeros.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_safe[:, None]
    o_ptrs = OUT + (q_row0 + offs_m).to(tl.int64)[:, None] * head_dim + offs_d[None, :]
    tl.store(
        o_ptrs, acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_d < head_dim)[None, :]
    )


def _fp8_hook(nargs):
    d = nargs["HEAD_DIM"]
    nargs["desc_q"].block_shape = [1, 1, nargs["BLOCK_M"], d]
    nargs["desc_k"].block_shape = [1, 1, nargs["BLOCK_N"], d]
    nargs["desc_vt"].block_shape = [1, 1, d, nargs["BLOCK_N"]]


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per padded head dim, timed on an H200
# (docs/benchmarks/attention.md): one warpgroup over 64 query rows and 128 keys won at D=64
# and D=128 (by 10-25% over 128 x 128 with 8 warps); 64 x 64 at short causal rows.
if INTERPRET:
    _FP8_TABLE = {0: [(32, 16, 4, 1)]}
else:
    _FP8_TABLE = {
        32: [(64, 128, 4, 3), (128, 64, 4, 3), (64, 64, 4, 3)],
        64: [(64, 128, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 4, 3)],
        128: [(64, 128, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2), (128, 128, 8, 3)],
        256: [(128, 64, 8, 2), (64, 64, 4, 2), (128, 128, 8, 2)],
    }


def _fp8_prune(configs, nargs, **kwargs):
    table = _FP8_TABLE[0] if INTERPRET else _FP8_TABLE[kwargs["HEAD_DIM"]]
    wanted = {row for row in table if row[1] <= kwargs["SCALE_BLOCK"]}
    return [
        c
        for c in configs
        if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in wanted
    ]


_fwd_fp8 = triton.autotune(
    _configs(_fp8_hook, sorted({row for rows in _FP8_TABLE.values() for row in rows})),
    key=["LEN_KEY", "HEAD_DIM", "CAUSAL", "SCALE_BLOCK"],
    prune_configs_by={"early_config_prune": _fp8_prune},
)(_KeyArg(_attn_fwd_fp8))


def _desc(t: torch.Tensor, shape: list[int]) -> TensorDescriptor:
    """A 4-d descriptor over contiguous fp8 ``t`` seen as ``shape`` (the last dim may be
    shorter than the stored one: the transposed V's padding); block shapes come from the hook."""
    strides = [t.stride(0), t.stride(1), t.stride(2), 1]
    # A size-1 dim's stride is never used; give it one TMA accepts (16-byte multiple).
    strides = [
        s if n > 1 else 16 * max(1, t.numel()) for n, s in zip(shape[:3], strides[:3], strict=True)
    ]
    return TensorDescriptor(t, shape=shape, strides=[*strides, 1], block_shape=[1, 1, 16, 16])


def _as_blocks(name: str, x: torch.Tensor | Fp8Blocks, block_size: int, transpose: bool):
    if isinstance(x, Fp8Blocks):
        if x.transposed != transpose:
            want = "quantize_fp8(v, transpose=True)" if transpose else "transpose=False"
            raise ValueError(
                f"{name} was quantized with transpose={x.transposed}; the kernel needs {want}"
            )
        if x.block_size != block_size:
            raise ValueError(
                f"{name} was quantized with block_size={x.block_size}, but block_size="
                f"{block_size} was asked for: quantize q, k and v with one block size"
            )
        return x
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor or Fp8Blocks, got {type(x).__name__}")
    return quantize_fp8(x, block_size, transpose)


def attention_fp8(
    q: torch.Tensor | Fp8Blocks,
    k: torch.Tensor | Fp8Blocks,
    v: torch.Tensor | Fp8Blocks,
    causal: bool = False,
    sm_scale: float | None = None,
    block_size: int | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale [+ causal mask]) v with fp8 (e4m3) operands; forward only.

    Args:
        q: (B, H, Nq, D) queries; k, v: (B, Hkv, Nk, D), ``H % Hkv == 0``. Each either a
            fp16/bf16/fp32 tensor (quantized here, per call) or an :class:`Fp8Blocks` from
            :func:`quantize_fp8` (v with ``transpose=True``), e.g. a cache kept in fp8.
        causal, sm_scale: as :func:`attention` (bottom-right aligned; 1/sqrt(D) when None).
        block_size: rows per scale when quantizing here; default the pre-quantized inputs'
            (they must agree) or 128.
        out_dtype: bf16 (default) or fp16.

    Returns:
        (B, H, Nq, D) in ``out_dtype``, contiguous. Not differentiable.

    Raises:
        ValueError: as :func:`attention`, plus a head dim that is not a multiple of 16, a bad
            ``block_size`` or ``out_dtype``, or inputs quantized with other settings.
    """
    if block_size is None:
        given = [t.block_size for t in (q, k, v) if isinstance(t, Fp8Blocks)]
        block_size = given[0] if given else DEFAULT_BLOCK_SIZE
    _check_block_size(block_size)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    qb, kb, vb = (
        _as_blocks(name, t, block_size, name == "v") for name, t in (("q", q), ("k", k), ("v", v))
    )
    # The shape checks of the bf16 kernel, on shape-only stand-ins of the logical tensors.
    device = qb.data.device
    q_meta, k_meta, v_meta = (
        torch.empty(t.shape, device="meta", dtype=out_dtype) for t in (qb, kb, vb)
    )
    _check(q_meta, k_meta, v_meta, causal, sm_scale, kernel=False)
    if not (kb.data.device == vb.data.device == device):
        raise ValueError(
            f"q, k and v must be on one device, got {device}, {kb.data.device}, {vb.data.device}"
        )
    b, h, n_q, d = qb.shape
    h_kv, n_k = kb.shape[1], kb.shape[2]
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be at most {MAX_HEAD_DIM}, got {d}")
    if INTERPRET:
        if device.type != "cpu":
            raise ValueError(
                f"under TRITON_INTERPRET=1 the kernels run on CPU tensors, got {device}"
            )
    elif device.type != "cuda":
        raise ValueError(f"attention_fp8 needs CUDA tensors, got {device}")
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    head_dim = max(32, triton.next_power_of_2(d))  # fp8 wgmma reduces over >= 32 at a time
    o = torch.empty((b, h, n_q, d), device=device, dtype=out_dtype)
    grid = lambda meta: (b * h * triton.cdiv(n_q, meta["BLOCK_M"]),)  # noqa: E731
    _fwd_fp8[grid](
        _desc(qb.data, [b, h, n_q, d]),
        _desc(kb.data, [b, h_kv, n_k, d]),
        _desc(vb.data, [b, h_kv, d, n_k]),
        qb.scale, kb.scale, vb.scale, o, scale, n_q, n_k, d, h, h // h_kv,
        HEAD_DIM=head_dim, CAUSAL=causal, SCALE_BLOCK=block_size,
        LEN_KEY=(triton.next_power_of_2(n_q), triton.next_power_of_2(n_k)),
    )  # fmt: skip
    return o
