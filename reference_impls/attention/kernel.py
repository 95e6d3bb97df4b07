"""Fused attention in Triton: FlashAttention-2, forward and backward.

FlashAttention-2 (Dao, 2023, https://arxiv.org/abs/2307.08691) on top of FlashAttention
(Dao et al., 2022, https://arxiv.org/abs/2205.14135) and the online softmax of Milakov and
Gimelshein (2018, https://arxiv.org/abs/1805.02867) / Rabe and Staats (2021,
https://arxiv.org/abs/2112.05682). Triton's fused-attention tutorial
(triton-lang/triton, python/tutorials/06-fused-attention.py) is the peer this kernel is
measured against.

Layout: ``q`` is ``(B, H, Nq, D)``, ``k`` and ``v`` are ``(B, Hkv, Nk, D)`` with ``H % Hkv == 0``
(grouped-query attention: query head ``h`` reads key/value head ``h // (H // Hkv)``).

- Forward: one program per block of ``BLOCK_M`` query rows of one head. Keys and values stream
  through in blocks of ``BLOCK_N``; the running row maximum and running row sum stay in fp32
  registers, and the exponentials are ``exp2`` with ``log2(e)`` folded into the softmax scale
  (one multiply per score instead of a multiply inside ``exp``). The log-sum-exp of each row
  is saved, in base 2, for the backward pass.
- Backward: the probabilities are recomputed from the saved log-sum-exp, never stored. Two
  kernels, no atomics: ``_attn_bwd_dq`` (one program per query block; it also computes
  ``delta = rowsum(dO * O)`` for its rows) and ``_attn_bwd_dkdv`` (one program per key/value
  block; under grouped-query attention it loops over the query heads of its group, so dK and
  dV are summed in registers). Recomputing ``Q K^T`` in both costs two extra matmuls over
  FlashAttention-2's atomic dQ update, buys determinism (the same bits on every run) and
  avoids bf16 atomics, which the Triton interpreter cannot run.
- Masks cost only where they are needed: each key loop is split into blocks that need no mask
  (loaded and used as they are) and the few that straddle the causal diagonal or the ragged
  end of a sequence (masked). Causal masking is aligned bottom-right when ``Nq != Nk``, as in
  FlashAttention-2: query ``i`` sees key ``j`` iff ``j <= i + Nk - Nq``. A query row that sees
  no key at all (causal with ``Nq > Nk``) gets an output of zeros and zero gradients.
- Tiles are read through 4-d TMA tensor descriptors over the inputs as given, ``(B, H, N, D)``
  with any strides TMA accepts (a contiguous tensor or a ``(B, N, H, D)`` one transposed;
  anything else is copied first). The copy engine zero-fills rows past a sequence's end and
  columns past D, so a ragged tile never reads another head, and a head dim that is not a
  power of two is padded to one inside the kernel. Outputs are contiguous and stored through
  masked pointers.

Written for Hopper GPUs (TMA descriptors, wgmma); measured on an H200
(docs/benchmarks/attention.md). Under ``TRITON_INTERPRET=1`` (read when this module is imported) the same kernels run on CPU
tensors, with one fixed small configuration instead of autotuning, and bf16 operands of
``tl.dot`` upcast to fp32 (the interpreter multiplies raw bf16 bit patterns otherwise). The
upcast is a constexpr: the GPU build never contains it.
"""

from __future__ import annotations

import math
import numbers

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

__all__ = ["attention", "reference_attention", "SUPPORTED_DTYPES", "MAX_HEAD_DIM"]

# Triton decides between compiling and interpreting when a kernel is defined (at import), from
# TRITON_INTERPRET; this module reads the same knob at the same time.
INTERPRET = bool(triton.knobs.runtime.interpret)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256  # the K/V tiles of one block must fit in shared memory


# ---------------------------------------------------------------------------------------------
# Kernels

# Triton compiles a variant per divisibility-by-16 pattern of integer arguments. Lengths and
# head counts only bound loops and masks here (tiles move by TMA), so one variant serves all;
# head_dim stays specialized: it strides the output stores, which it lets vectorize.
_NOT_SPECIALIZED = ["n_q", "n_k", "num_heads", "group_size"]


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """``a @ b (+ acc)`` in fp32. ``UPCAST`` (interpreter with bf16 only) widens the operands."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _key_range(
    start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr
):
    """Keys a block of queries starting at ``start_m`` attends to: ``[0, full)`` needs no mask,
    ``[full, hi)`` does; ``causal_shift`` aligns the causal diagonal bottom-right (query i sees
    keys j <= i + shift). ``full`` is rounded down to whole key blocks."""
    causal_shift = n_k - n_q
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + causal_shift, 0), n_k)
        # Blocks wholly left of the diagonal for this block's first row need no mask.
        full = tl.minimum(tl.maximum(start_m + causal_shift + 1, 0), n_k)
    else:
        hi = n_k
        full = n_k
    full = (full // BLOCK_N) * BLOCK_N
    return causal_shift, full, hi


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    desc_k,
    desc_v,
    b,
    hkv,
    lo,
    hi,
    offs_m,
    n_k,
    causal_shift,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Fold key/value blocks ``[lo, hi)`` into the running (acc, l_i, m_i) of one query block.

    acc: (BLOCK_M, HEAD_DIM) fp32, unnormalised output; l_i, m_i: (BLOCK_M,) fp32 running sum
    and running max of the scores in base-2 units (score * sm_scale * log2(e)).
    """
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = desc_k.load([b, hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = _dot(q, k.T, None, UPCAST, PRECISION)  # (BLOCK_M, BLOCK_N)
        v = desc_v.load([b, hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        if MASKED:
            offs_n = start_n + offs_n0
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
            s = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(s, 1))
            # A row that has seen no key yet has m_ij == -inf: subtract 0 instead, so that
            # exp2(-inf - -inf) = NaN never happens; its p and alpha are then exactly 0.
            m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(s - m_sub[:, None])
            alpha = tl.math.exp2(m_i - m_sub)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = _dot(p.to(v.dtype), v, acc, UPCAST, PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _attn_fwd(
    desc_q,
    desc_k,
    desc_v,
    O,
    LSE,
    sm_scale,
    n_q,
    n_k,
    head_dim,
    num_heads,
    group_size,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    num_m = tl.cdiv(n_q, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // num_m  # b * H + h
    block_m = pid % num_m
    if CAUSAL:
        # Later query blocks see more keys: start them first so the last wave is short.
        block_m = num_m - 1 - block_m
    b = bh // num_heads
    h = bh % num_heads
    hkv = h // group_size
    q_row0 = bh * n_q  # row of (b, h, 0) in the contiguous outputs
    start_m = block_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)  # stays on chip throughout

    causal_shift, full, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        desc_k,
        desc_v,
        b,
        hkv,
        0,
        full,
        offs_m,
        n_k,
        causal_shift,
        qk_scale,
        BLOCK_N,
        HEAD_DIM,
        False,
        CAUSAL,
        UPCAST,
        PRECISION,
    )
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        desc_k,
        desc_v,
        b,
        hkv,
        full,
        hi,
        offs_m,
        n_k,
        causal_shift,
        qk_scale,
        BLOCK_N,
        HEAD_DIM,
        True,
        CAUSAL,
        UPCAST,
        PRECISION,
    )

    # Rows that saw no key (causal, Nq > Nk) have l_i == 0: output 0, and a log-sum-exp of
    # +inf so that the backward pass recomputes p = exp2(s - inf) = 0 for them.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    row_ok = offs_m < n_q
    tl.store(LSE + q_row0 + offs_m, lse, mask=row_ok)
    o_ptrs = O + (q_row0 + offs_m).to(tl.int64)[:, None] * head_dim + offs_d[None, :]
    tl.store(
        o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d < head_dim)[None, :]
    )


@triton.jit
def _attn_bwd_dq_inner(
    dq,
    q,
    do,
    lse,
    delta,
    desc_k,
    desc_v,
    b,
    hkv,
    lo,
    hi,
    offs_m,
    n_k,
    causal_shift,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dq (BLOCK_M, HEAD_DIM) += dS @ K over key blocks ``[lo, hi)`` (dS not yet scaled)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = desc_k.load([b, hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = desc_v.load([b, hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = _dot(q, k.T, None, UPCAST, PRECISION)  # (BLOCK_M, BLOCK_N)
        p = tl.math.exp2(qk * qk_scale - lse[:, None])
        if MASKED:
            offs_n = start_n + offs_n0
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
            p = tl.where(keep, p, 0.0)
        dp = _dot(do, v.T, None, UPCAST, PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, UPCAST, PRECISION)
    return dq


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _attn_bwd_dq(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    desc_do,
    DQ,
    LSE,
    DELTA,
    sm_scale,
    n_q,
    n_k,
    head_dim,
    num_heads,
    group_size,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    num_m = tl.cdiv(n_q, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // num_m
    block_m = pid % num_m
    if CAUSAL:
        block_m = num_m - 1 - block_m
    b = bh // num_heads
    h = bh % num_heads
    hkv = h // group_size
    q_row0 = bh * n_q
    start_m = block_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)

    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    do = desc_do.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    o = desc_o.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    # delta_i = sum_d dO_id * O_id = sum_j P_ij dP_ij: the softmax backward's row term. Computed
    # here, once per row, and stored for the dK/dV kernel, which runs after this one.
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(DELTA + q_row0 + offs_m, delta, mask=row_ok)
    lse = tl.load(LSE + q_row0 + offs_m, mask=row_ok, other=float("inf"))

    causal_shift, full, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dq = _attn_bwd_dq_inner(
        dq,
        q,
        do,
        lse,
        delta,
        desc_k,
        desc_v,
        b,
        hkv,
        0,
        full,
        offs_m,
        n_k,
        causal_shift,
        qk_scale,
        BLOCK_N,
        HEAD_DIM,
        False,
        CAUSAL,
        UPCAST,
        PRECISION,
    )
    dq = _attn_bwd_dq_inner(
        dq,
        q,
        do,
        lse,
        delta,
        desc_k,
        desc_v,
        b,
        hkv,
        full,
        hi,
        offs_m,
        n_k,
        causal_shift,
        qk_scale,
        BLOCK_N,
        HEAD_DIM,
        True,
        CAUSAL,
        UPCAST,
        PRECISION,
    )
    dq = dq * sm_scale  # d(s * scale)/ds
    dq_ptrs = DQ + (q_row0 + offs_m).to(tl.int64)[:, None] * head_dim + offs_d[None, :]
    tl.store(
        dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d < head_dim)[None, :]
    )


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _attn_bwd_delta(
    desc_o,
    desc_do,
    DELTA,
    n_q,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """delta = rowsum(dO * O) (B, H, Nq) fp32, before the one-pass backward: every key block
    needs it for every query row, so it cannot be computed inside that pass. One read of O and
    dO, memory-bound (about 1-2% of the backward at the benchmark's shapes)."""
    num_m = tl.cdiv(n_q, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // num_m
    start_m = (pid % num_m) * BLOCK_M
    b = bh // num_heads
    h = bh % num_heads
    offs_m = start_m + tl.arange(0, BLOCK_M)
    o = desc_o.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    do = desc_do.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(DELTA + bh * n_q + offs_m, delta, mask=offs_m < n_q)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,
    desc_q,
    desc_do,
    LSE,
    DELTA,
    DQ,
    b,
    h,
    q_row0,
    lo,
    hi,
    offs_n,
    n_q,
    n_k,
    head_dim,
    causal_shift,
    qk_scale,
    sm_scale,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dk += dS^T @ Q and dv += P^T @ dO over query blocks ``[lo, hi)`` of one query head.

    Works on transposed tiles, (BLOCK_N, BLOCK_M), so that each product's left operand is
    already in registers and Q/dO are used as loaded. With ``ATOMIC_DQ`` the same dS also gives
    this key block's share of dQ, dS @ K, added to the fp32 rows of ``DQ`` with atomics (the
    five-matmul backward of FlashAttention-2); dS is then pre-scaled by ``sm_scale``, so neither
    dQ nor dK needs a final multiply.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in tl.range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        do = desc_do.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        if MASKED:
            in_seq = offs_m < n_q
            lse = tl.load(LSE + q_row0 + offs_m, mask=in_seq, other=float("inf"))
            delta = tl.load(DELTA + q_row0 + offs_m, mask=in_seq, other=0.0)
        else:
            lse = tl.load(LSE + q_row0 + offs_m)
            delta = tl.load(DELTA + q_row0 + offs_m)
        qk_t = _dot(k, q.T, None, UPCAST, PRECISION)  # (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])
        if MASKED:
            keep = in_seq[None, :] & (offs_n[:, None] < n_k)
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
            p_t = tl.where(keep, p_t, 0.0)
        dv = _dot(p_t.to(do.dtype), do, dv, UPCAST, PRECISION)
        dp_t = _dot(v, do.T, None, UPCAST, PRECISION)  # (BLOCK_N, BLOCK_M)
        if ATOMIC_DQ:
            ds_t = (p_t * (dp_t - delta[None, :]) * sm_scale).to(q.dtype)
            dk = _dot(ds_t, q, dk, UPCAST, PRECISION)
            dq = _dot(ds_t.T, k, None, UPCAST, PRECISION)  # (BLOCK_M, HEAD_DIM)
            dq_ptrs = DQ + (q_row0 + offs_m).to(tl.int64)[:, None] * head_dim + offs_d[None, :]
            dq_ok = (offs_d < head_dim)[None, :]
            if MASKED:
                dq_ok = dq_ok & in_seq[:, None]
            # Nothing reads the old value: relaxed ordering lets this lower to a reduction.
            tl.atomic_add(dq_ptrs, dq, mask=dq_ok, sem="relaxed")
        else:
            ds_t = p_t * (dp_t - delta[None, :])
            dk = _dot(ds_t.to(q.dtype), q, dk, UPCAST, PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_head(
    dk,
    dv,
    k,
    v,
    desc_q,
    desc_do,
    LSE,
    DELTA,
    DQ,
    b,
    h,
    num_heads,
    lo,
    mid,
    full,
    tail,
    q_end,
    offs_n,
    n_q,
    n_k,
    head_dim,
    causal_shift,
    qk_scale,
    sm_scale,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Accumulate one query head's share of dK and dV: its three ranges of query blocks."""
    q_row0 = (b * num_heads + h) * n_q
    dk, dv = _attn_bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        desc_q,
        desc_do,
        LSE,
        DELTA,
        DQ,
        b,
        h,
        q_row0,
        lo,
        mid,
        offs_n,
        n_q,
        n_k,
        head_dim,
        causal_shift,
        qk_scale,
        sm_scale,
        BLOCK_M,
        HEAD_DIM,
        True,
        CAUSAL,
        ATOMIC_DQ,
        UPCAST,
        PRECISION,
    )
    dk, dv = _attn_bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        desc_q,
        desc_do,
        LSE,
        DELTA,
        DQ,
        b,
        h,
        q_row0,
        mid,
        full,
        offs_n,
        n_q,
        n_k,
        head_dim,
        causal_shift,
        qk_scale,
        sm_scale,
        BLOCK_M,
        HEAD_DIM,
        False,
        CAUSAL,
        ATOMIC_DQ,
        UPCAST,
        PRECISION,
    )
    dk, dv = _attn_bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        desc_q,
        desc_do,
        LSE,
        DELTA,
        DQ,
        b,
        h,
        q_row0,
        tail,
        q_end,
        offs_n,
        n_q,
        n_k,
        head_dim,
        causal_shift,
        qk_scale,
        sm_scale,
        BLOCK_M,
        HEAD_DIM,
        True,
        CAUSAL,
        ATOMIC_DQ,
        UPCAST,
        PRECISION,
    )
    return dk, dv


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _attn_bwd_dkdv(
    desc_q,
    desc_k,
    desc_v,
    desc_do,
    DK,
    DV,
    DQ,
    LSE,
    DELTA,
    sm_scale,
    n_q,
    n_k,
    head_dim,
    num_heads,
    group_size,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    GROUPED: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    num_n = tl.cdiv(n_k, BLOCK_N)
    pid = tl.program_id(0)
    bhk = pid // num_n  # b * Hkv + hkv
    start_n = (pid % num_n) * BLOCK_N
    num_kv_heads = num_heads // group_size
    b = bhk // num_kv_heads
    hkv = bhk % num_kv_heads
    kv_row0 = bhk * n_k
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)

    k = desc_k.load([b, hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)  # both stay on chip
    v = desc_v.load([b, hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Query blocks in three ranges: [lo, mid) straddle the causal diagonal (masked),
    # [mid, full) need no mask, [max(mid, full), n_q) hold the ragged end of the sequence.
    causal_shift = n_k - n_q
    q_end = tl.cdiv(n_q, BLOCK_M) * BLOCK_M
    full = (n_q // BLOCK_M) * BLOCK_M
    if CAUSAL:
        # Query i sees key j iff i >= j - shift: this block's first key is first seen by row
        # start_n - shift and its last key by row start_n + BLOCK_N - 1 - shift.
        lo = (tl.minimum(tl.maximum(start_n - causal_shift, 0), n_q) // BLOCK_M) * BLOCK_M
        mid = (
            tl.cdiv(tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - causal_shift, 0), n_q), BLOCK_M)
            * BLOCK_M
        )
    else:
        lo = 0
        mid = 0
    # The ragged last key block: every query block needs the key mask.
    mid = tl.where(start_n + BLOCK_N > n_k, q_end, mid)
    tail = tl.maximum(mid, full)
    if GROUPED:
        for g in range(group_size):
            dk, dv = _attn_bwd_dkdv_head(
                dk,
                dv,
                k,
                v,
                desc_q,
                desc_do,
                LSE,
                DELTA,
                DQ,
                b,
                hkv * group_size + g,
                num_heads,
                lo,
                mid,
                full,
                tail,
                q_end,
                offs_n,
                n_q,
                n_k,
                head_dim,
                causal_shift,
                qk_scale,
                sm_scale,
                BLOCK_M,
                HEAD_DIM,
                CAUSAL,
                ATOMIC_DQ,
                UPCAST,
                PRECISION,
            )
    else:
        # No loop over heads at all without grouping: around the three loops below it costs
        # registers (spills at D=128) even when it runs once.
        dk, dv = _attn_bwd_dkdv_head(
            dk,
            dv,
            k,
            v,
            desc_q,
            desc_do,
            LSE,
            DELTA,
            DQ,
            b,
            hkv,
            num_heads,
            lo,
            mid,
            full,
            tail,
            q_end,
            offs_n,
            n_q,
            n_k,
            head_dim,
            causal_shift,
            qk_scale,
            sm_scale,
            BLOCK_M,
            HEAD_DIM,
            CAUSAL,
            ATOMIC_DQ,
            UPCAST,
            PRECISION,
        )
    if not ATOMIC_DQ:
        dk = dk * sm_scale  # (with ATOMIC_DQ, dS came pre-scaled)
    col_ok = (offs_n < n_k)[:, None] & (offs_d < head_dim)[None, :]
    row = (kv_row0 + offs_n).to(tl.int64)[:, None] * head_dim + offs_d[None, :]
    tl.store(DK + row, dk.to(DK.dtype.element_ty), mask=col_ok)
    tl.store(DV + row, dv.to(DV.dtype.element_ty), mask=col_ok)


# ---------------------------------------------------------------------------------------------
# Configurations: one fixed small one under the interpreter, a short autotuned list on GPUs


def _set_blocks(**blocks):
    """A pre-hook giving each descriptor its tile shape once the config is known."""

    def hook(nargs):
        d = nargs["HEAD_DIM"]
        for name, block in blocks.items():
            nargs[name].block_shape = [1, 1, nargs[block], d]

    return hook


_FWD_HOOK = _set_blocks(desc_q="BLOCK_M", desc_k="BLOCK_N", desc_v="BLOCK_N")
_DQ_HOOK = _set_blocks(
    desc_q="BLOCK_M", desc_o="BLOCK_M", desc_do="BLOCK_M", desc_k="BLOCK_N", desc_v="BLOCK_N"
)
_DKDV_HOOK = _set_blocks(desc_q="BLOCK_M", desc_do="BLOCK_M", desc_k="BLOCK_N", desc_v="BLOCK_N")


def _configs(hook, table):
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s, pre_hook=hook)
        for bm, bn, w, s in table
    ]


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per padded head dim. Few: every config is compiled
# and timed on the first call of each autotuning key. Register budget per thread decides most
# of it (the fp32 accumulators are BLOCK x HEAD_DIM, twice in dK/dV): the lists were read off
# offline sm_90a compiles (registers, spills, shared memory), then timed on an H200; which
# ones won is in docs/benchmarks/attention.md.
if INTERPRET:
    # Small blocks so that short test sequences still cross several blocks, the causal
    # diagonal and a ragged end; one config each, so nothing is timed.
    _FWD_TABLE = {0: [(32, 16, 4, 1)]}
    _DQ_TABLE = {0: [(32, 16, 4, 1)]}
    _DKDV_TABLE = {0: [(16, 32, 4, 1)]}
    _FUSED_TABLE = {0: [(16, 32, 4, 1)]}
else:
    _FWD_TABLE = {
        32: [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
        64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)],
        128: [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3)],
        256: [(64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2)],
    }
    _DQ_TABLE = {
        32: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 3)],
        64: [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2)],
        128: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3), (64, 128, 8, 2)],
        256: [(64, 64, 8, 2), (64, 32, 4, 2)],  # BLOCK_M=32 loses the wgmma path here
    }
    _DKDV_TABLE = {  # (BLOCK_M = query rows per step, BLOCK_N = keys per program, ...)
        32: [(64, 128, 8, 3), (64, 64, 4, 3), (32, 128, 4, 3)],
        64: [(64, 128, 8, 3), (64, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 3)],
        128: [(64, 64, 8, 3), (64, 64, 8, 4), (128, 64, 8, 3), (32, 128, 8, 3)],
        256: [(64, 64, 8, 2), (32, 64, 8, 2)],  # spills either way: a 2 x 64 x 256 fp32 accumulator
    }
    _FUSED_TABLE = {  # the dK/dV kernel with the atomic dQ (head dims up to 128 only)
        32: [(64, 128, 8, 3), (64, 64, 4, 3), (32, 128, 4, 3)],
        64: [(64, 128, 8, 3), (64, 128, 8, 2), (64, 64, 8, 3), (64, 64, 8, 2), (64, 64, 4, 3),
             (32, 128, 4, 3), (32, 128, 8, 3)],
        128: [(64, 64, 8, 2), (64, 64, 8, 3), (32, 64, 8, 2), (32, 64, 8, 3), (32, 128, 8, 2),
              (32, 128, 8, 3)],
    }
    _FWD_TABLE[64] += [(128, 128, 8, 4), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
    _FWD_TABLE[128] += [(128, 128, 8, 2), (128, 128, 8, 4), (128, 64, 8, 4), (64, 128, 4, 3)]

# fp32 tiles take twice the shared memory and use no tensor-core path at full fp32 precision:
# a few conservative configs that fit, chosen by head dim.
_FP32_TABLE = {
    32: [(64, 32, 4, 2)],
    64: [(64, 32, 4, 2)],
    128: [(64, 32, 4, 2)],
    256: [(32, 32, 4, 1)],
}


def _table_for(table, head_dim, dtype):
    if INTERPRET:
        return table[0]
    if dtype == torch.float32:
        return _FP32_TABLE[max(32, head_dim)]
    return table[max(32, head_dim)]


def _prune(table):
    def prune(configs, nargs, **kwargs):
        dtype = nargs["desc_q"].base.dtype  # every kernel's first argument
        wanted = set(_table_for(table, kwargs["HEAD_DIM"], dtype))
        return [
            c
            for c in configs
            if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in wanted
        ]

    return prune


def _all_configs(hook, table):
    rows = {row for rows in table.values() for row in rows}
    if not INTERPRET:
        rows |= {row for rows in _FP32_TABLE.values() for row in rows}
    return _configs(hook, sorted(rows))


class _KeyArg:
    """An autotuner target that accepts one extra keyword, ``LEN_KEY``, and drops it at launch.

    The autotuning key is (LEN_KEY, HEAD_DIM, CAUSAL, GROUPED where the kernel has it) plus the
    dtypes of the tensor arguments, which triton adds itself. LEN_KEY holds both lengths rounded up to powers of two, so a new
    ragged length reuses the tuned config of its bucket instead of retuning. As a real kernel
    argument it would be part of the kernel's signature for nothing.
    """

    def __init__(self, fn):
        self.fn = fn
        self.arg_names = [*fn.arg_names, "LEN_KEY"]

    def run(self, *args, LEN_KEY=None, **kwargs):
        return self.fn.run(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fn, name)


def _tuned(kernel_fn, hook, table, reset_to_zero=None):
    return triton.autotune(
        _all_configs(hook, table),
        key=["LEN_KEY", "HEAD_DIM", "CAUSAL", "GROUPED"],
        prune_configs_by={"early_config_prune": _prune(table)},
        # The atomic dQ accumulates: each config the autotuner times starts from zeros again.
        reset_to_zero=reset_to_zero,
    )(_KeyArg(kernel_fn))


_fwd = _tuned(_attn_fwd, _FWD_HOOK, _FWD_TABLE)
_bwd_dq = _tuned(_attn_bwd_dq, _DQ_HOOK, _DQ_TABLE)
_bwd_dkdv = _tuned(_attn_bwd_dkdv, _DKDV_HOOK, _DKDV_TABLE)
# The same kernel with ATOMIC_DQ=True: its own tuned configs (dQ's tile adds registers).
_bwd_fused = _tuned(_attn_bwd_dkdv, _DKDV_HOOK, _FUSED_TABLE, reset_to_zero=["DQ"])

# Head dims (padded) up to which the backward defaults to one pass with the atomic dQ. At 256,
# dK, dV and dQ's fp32 tiles together far exceed the register file; the two-pass backward
# stays (it spills less).
MAX_ATOMIC_HEAD_DIM = 128


# ---------------------------------------------------------------------------------------------
# Input checks


def _check(q, k, v, causal, sm_scale, *, kernel: bool) -> None:
    """Raise ValueError naming the offending value; ``kernel`` adds the kernel's own limits."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims (B, H, N, D), got shape {tuple(t.shape)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if sm_scale is not None and (
        isinstance(sm_scale, bool)
        or not isinstance(sm_scale, numbers.Real)
        or not math.isfinite(sm_scale)
        or sm_scale == 0
    ):
        raise ValueError(f"sm_scale must be a finite nonzero number or None, got {sm_scale!r}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    (b, h, n_q, d), (bk, hk, n_k, dk) = q.shape, k.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have one shape, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if bk != b:
        raise ValueError(f"q and k/v must have the same batch size, got {b} and {bk}")
    if dk != d:
        raise ValueError(f"q and k/v must have the same head dim, got {d} and {dk}")
    if hk == 0 or h % hk:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({hk})")
    if min(b, h, n_q, n_k, d) == 0:
        raise ValueError(
            f"q, k and v must be non-empty, got q {tuple(q.shape)} and k/v {tuple(k.shape)}"
        )
    if not kernel:
        return
    if q.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(t).removeprefix("torch.") for t in SUPPORTED_DTYPES)
        raise ValueError(f"dtype must be one of {names}, got {q.dtype}")
    if d % 8 or d > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be a multiple of 8 and at most {MAX_HEAD_DIM}, got {d}")
    if INTERPRET:
        if q.device.type != "cpu":
            raise ValueError(
                f"under TRITON_INTERPRET=1 the kernels run on CPU tensors, got {q.device}"
            )
    elif q.device.type != "cuda":
        raise ValueError(
            f"attention needs CUDA tensors, got {q.device}; set TRITON_INTERPRET=1 before "
            f"importing reference_impls.attention to run the kernels on CPU (slowly)"
        )


def _prepare(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when a TMA descriptor can read it in place, else a contiguous copy.

    A descriptor needs the last dim contiguous, a 16-byte aligned base and every other stride a
    positive multiple of 16 bytes: true of contiguous (B, H, N, D) tensors and of the common
    (B, N, H, D) layout seen through ``.transpose(1, 2)``, for head dims that are multiples of 8.
    """
    align = 16 // t.element_size()
    strides_ok = t.stride(-1) == 1 and all(
        size == 1 or (stride > 0 and stride % align == 0)
        for size, stride in zip(t.shape[:-1], t.stride()[:-1])
    )
    if strides_ok and t.data_ptr() % 16 == 0:
        return t
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _desc(t: torch.Tensor) -> TensorDescriptor:
    """A (B, H, N, D) descriptor over ``t``; the block shape is set per config by the pre-hooks.
    TMA zero-fills rows past N and columns past D, so no tile ever reads another head."""
    align = 16 // t.element_size()
    # A size-1 dim's stride is never used; give it one TMA accepts.
    strides = [
        s if n > 1 else align * max(1, t.numel()) for n, s in zip(t.shape[:-1], t.stride()[:-1])
    ]
    return TensorDescriptor(
        t, shape=list(t.shape), strides=[*strides, 1], block_shape=[1, 1, 16, 16]
    )


def _launch_args(q, k, causal):
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    head_dim_pad = max(16, triton.next_power_of_2(d))
    common = dict(
        HEAD_DIM=head_dim_pad,
        CAUSAL=causal,
        UPCAST=INTERPRET and q.dtype == torch.bfloat16,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        LEN_KEY=(triton.next_power_of_2(n_q), triton.next_power_of_2(n_k)),
    )
    return (n_q, n_k, d, h, h // k.shape[1]), common


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, deterministic):
        q, k, v = _prepare(q), _prepare(k), _prepare(v)
        b, h, n_q, _ = q.shape
        sizes, common = _launch_args(q, k, causal)
        o = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # (B, H, Nq, D), contiguous
        lse = torch.empty((b, h, n_q), device=q.device, dtype=torch.float32)  # base 2
        grid = lambda meta: (b * h * triton.cdiv(n_q, meta["BLOCK_M"]),)  # noqa: E731
        _fwd[grid](_desc(q), _desc(k), _desc(v), o, lse, sm_scale, *sizes, **common)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.deterministic = causal, sm_scale, deterministic
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        do = _prepare(do)
        sizes, common = _launch_args(q, k, ctx.causal)
        if ctx.deterministic or common["HEAD_DIM"] > MAX_ATOMIC_HEAD_DIM:
            dq, dk, dv = _backward_two_pass(q, k, v, o, lse, do, ctx.sm_scale, sizes, common)
        else:
            dq, dk, dv = _backward_atomic(q, k, v, o, lse, do, ctx.sm_scale, sizes, common)
        return dq, dk, dv, None, None, None


def _backward_two_pass(q, k, v, o, lse, do, sm_scale, sizes, common):
    """Deterministic: dQ in one kernel (which also writes delta), dK/dV in a second; seven
    matmuls, no atomics, the same bits on every run."""
    b, h, n_q, _ = q.shape
    hk, n_k = k.shape[1], k.shape[2]
    dq, dk, dv = (torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    delta = torch.empty_like(lse)  # (B, H, Nq) fp32, written by the dq kernel
    grid_dq = lambda meta: (b * h * triton.cdiv(n_q, meta["BLOCK_M"]),)  # noqa: E731
    _bwd_dq[grid_dq](
        _desc(q), _desc(k), _desc(v), _desc(o), _desc(do), dq, lse, delta, sm_scale,
        *sizes, **common,
    )  # fmt: skip
    grid_kv = lambda meta: (b * hk * triton.cdiv(n_k, meta["BLOCK_N"]),)  # noqa: E731
    _bwd_dkdv[grid_kv](
        _desc(q), _desc(k), _desc(v), _desc(do), dk, dv, dq, lse, delta, sm_scale,
        *sizes, GROUPED=hk != h, ATOMIC_DQ=False, **common,
    )  # fmt: skip
    return dq, dk, dv


def _backward_atomic(q, k, v, o, lse, do, sm_scale, sizes, common):
    """One pass over key blocks (five matmuls): delta first, then dK/dV with dQ added to an
    fp32 buffer by atomics, then dQ cast to the input dtype. The order of the atomic adds
    varies from run to run, so dQ's last bits do too."""
    b, h, n_q, _ = q.shape
    hk, n_k = k.shape[1], k.shape[2]
    dk, dv = (torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (k, v))
    dq32 = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # (B, H, Nq, D)
    delta = torch.empty_like(lse)  # (B, H, Nq) fp32
    head_dim_pad = common["HEAD_DIM"]
    block_m = 16 if INTERPRET else 64
    desc_o, desc_do = _desc(o), _desc(do)
    desc_o.block_shape = desc_do.block_shape = [1, 1, block_m, head_dim_pad]
    _attn_bwd_delta[(b * h * triton.cdiv(n_q, block_m),)](
        desc_o, desc_do, delta, n_q, h, HEAD_DIM=head_dim_pad, BLOCK_M=block_m, num_warps=4
    )
    grid_kv = lambda meta: (b * hk * triton.cdiv(n_k, meta["BLOCK_N"]),)  # noqa: E731
    _bwd_fused[grid_kv](
        _desc(q), _desc(k), _desc(v), _desc(do), dk, dv, dq32, lse, delta, sm_scale,
        *sizes, GROUPED=hk != h, ATOMIC_DQ=True, **common,
    )  # fmt: skip
    return dq32.to(q.dtype), dk, dv


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    deterministic: bool | None = None,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale [+ causal mask]) v, fused, differentiable.

    Args:
        q: (B, H, Nq, D) queries; fp16, bf16 or fp32, on CUDA (or CPU under TRITON_INTERPRET=1).
        k, v: (B, Hkv, Nk, D) keys and values, ``H % Hkv == 0`` (grouped-query attention).
        causal: mask key ``j`` from query ``i`` unless ``j <= i + Nk - Nq`` (bottom-right
            aligned, as FlashAttention-2); a query that sees no key gets zeros.
        sm_scale: softmax scale; 1/sqrt(D) when None.
        deterministic: the backward's choice. False: one pass over key blocks with dQ summed
            by fp32 atomics (five matmuls, faster; dQ's last bits vary between runs). True:
            two passes, no atomics, the same bits every run (seven matmuls). None (default):
            follow ``torch.are_deterministic_algorithms_enabled()``. Head dims above 128
            always take the two-pass backward.

    Returns:
        (B, H, Nq, D) in q's dtype. Inputs of any strides are accepted: read in place where TMA can, copied otherwise.

    Raises:
        ValueError: mismatched shapes, dtypes or devices, an unsupported dtype or head dim
            (a multiple of 8 up to 256), or a bad ``causal``/``sm_scale``/``deterministic``.
    """
    _check(q, k, v, causal, sm_scale, kernel=True)
    if deterministic is not None and not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be a bool or None, got {deterministic!r}")
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return _FlashAttention.apply(q, k, v, causal, scale, deterministic)


# ---------------------------------------------------------------------------------------------
# The eager reference


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """The same function as :func:`attention`, in plain PyTorch ops (any device, any float dtype).

    Matmuls run in the inputs' dtype and the softmax in fp32 (fp64 for fp64 inputs), as an
    eager model would; pass float64 inputs for a high-precision reference. Memory is
    O(B * H * Nq * Nk).
    """
    _check(q, k, v, causal, sm_scale, kernel=False)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    n_q, n_k = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)  # (B, H, Nk, D)
        v = v.repeat_interleave(group, dim=1)
    soft_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q @ k.transpose(-2, -1)).to(soft_dtype) * scale  # (B, H, Nq, Nk)
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None, :]
        visible = j <= i + (n_k - n_q)  # (Nq, Nk), bottom-right aligned
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1)
        # Rows that see no key: softmax gives NaN; the kernel's convention is zeros.
        p = p.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0)
    else:
        p = torch.softmax(s, dim=-1)
    return p.to(q.dtype) @ v  # (B, H, Nq, D)
