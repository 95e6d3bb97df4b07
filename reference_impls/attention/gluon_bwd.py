"""Fused attention backward for Hopper in Gluon: dK and dV per key block, warp-specialized.

The backward of FlashAttention-2 (Dao, 2023, https://arxiv.org/abs/2307.08691) scheduled the
way FlashAttention-3 (Shah et al., 2024, https://arxiv.org/abs/2407.08608) schedules it on
Hopper; the arithmetic is ``kernel.py``'s one-pass backward (``_attn_bwd_dkdv`` with
``ATOMIC_DQ``), reading the same base-2 log-sum-exp and ``delta = rowsum(dO * O)``.

- One program per block of ``BLOCK_N`` keys of one key/value head. K and V are loaded once by
  TMA and stay in shared memory; a producer warp streams the query blocks (Q and dO,
  ``BLOCK_M`` rows each) of every query head of the group through a ring of ``STAGES``
  slots, each guarded by a "ready" mbarrier (the copy engine's) and an "empty" one (both
  consumers release it).
- Two consumer warpgroups each own half of the key block (``BLOCK_N / 2`` keys) and keep
  their dK and dV in fp32 registers. Per query block, on transposed tiles so that every
  product's left operand is at hand: ``S^T = K Q^T`` and ``dP^T = V dO^T`` (async wgmma from
  shared memory), ``P^T = exp2(S^T * scale - lse)``, ``dV += P^T dO`` with P^T from registers,
  ``dS^T = P^T (dP^T - delta) * sm_scale``, ``dK += dS^T Q``.
- dQ, three ways (``kernel.GLUON_DQ_MODE`` picks; docs/benchmarks/attention.md has the
  numbers):
  - in this kernel (``ATOMIC_DQ``): both halves of dS^T go to shared memory (two buffers),
    and each consumer computes half of dQ's columns over the whole key block,
    ``dS K[:, half]`` (FlashAttention-3's split), which it adds to an fp32 buffer with vector
    reductions (``red.global.add.v2.f32``; Gluon on Hopper has no TMA reduce). Five matmuls,
    but measured slower than either separate pass: the reductions cost more than a dQ pass.
    The order of the adds varies, so dQ's last bits vary between runs.
  - a separate pass, this file's ``_attn_bwd_dq_ws`` (a forward-shaped program per 128 query
    rows, K/V streamed through a ring, the dQ product of block j overlapping block j+1's
    two), or ``kernel.py``'s ``_attn_bwd_dq`` (the default: faster than this file's); then
    this kernel computes dK and dV alone (four matmuls). Deterministic, two matmuls more.

What it covers: fp16/bf16, head dim 128 (dQ's column split needs halves of whole 128-byte
swizzle rows), contiguous ``(B, H, N, D)`` inputs, ``Nq % BLOCK_M == 0``,
``Nk % BLOCK_N == 0`` and, when causal, ``Nk >= Nq``. ``kernel.attention`` falls back to its
Triton backward for everything else (``unsupported_reason`` says why).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = [
    "BwdConfig",
    "DqConfig",
    "CONFIGS",
    "DQ_CONFIGS",
    "supports",
    "unsupported_reason",
    "attention_backward_dkdv",
    "attention_backward_dq",
]

LOG2E = 1.4426950408889634

WARPS_PER_CONSUMER = 4
LOADER_WARPS = gl.constexpr(1)
LOADER_REGS = gl.constexpr(24)
# Two consumer warpgroups and the loader's warp (allocated a whole warpgroup): 65536 / (128 * 3)
# = 170 per thread on average; the consumers take 240 each (setmaxnreg), the loader 24.
CONSUMER_REGS = 240
KERNEL_MAXNREG = 168


# ---------------------------------------------------------------------------------------------
# Kernels


@gluon.jit
def _key_block(n_q, n_k, num_heads, group_size, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr):  # fmt: skip
    """This program's key block: (b, hkv, first key, first K/V row in the flat view, first
    query row to visit ``lo``, first unmasked query row ``mid``, query blocks per head)."""
    start_n = gl.program_id(0) * BLOCK_N
    bhk = gl.program_id(1)  # b * Hkv + hkv
    num_kv_heads = num_heads // group_size
    b = bhk // num_kv_heads
    hkv = bhk % num_kv_heads
    kv_row0 = bhk * n_k + start_n
    if CAUSAL:
        # Query i sees key j iff j <= i + shift. This block's first key is first seen by row
        # start_n - shift; rows from start_n + BLOCK_N - 1 - shift on see all of its keys.
        # Nk >= Nq (``supports``), so shift >= 0 and both are below Nq for every block.
        shift = n_k - n_q
        lo = (gl.maximum(start_n - shift, 0) // BLOCK_M) * BLOCK_M
        mid = gl.minimum(gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - shift, 0), BLOCK_M) * BLOCK_M,
                         n_q)  # fmt: skip
    else:
        lo = 0
        mid = 0
    per_head = (n_q - lo) // BLOCK_M
    return b, hkv, start_n, kv_row0, lo, mid, per_head


@gluon.jit
def _red_add_v2(ptrs, x):
    """``*ptrs += x`` (fp32) with one ``red.global.add.v2.f32`` per pair of neighbouring
    columns a thread holds (the wgmma accumulator layout keeps them adjacent)."""
    gl.inline_asm_elementwise(
        "red.global.add.v2.f32 [$2], {$4, $5};\n\tmov.u32 $0, 0;\n\tmov.u32 $1, 0;",
        "=r,=r,l,l,r,r",
        [ptrs.to(gl.int64, bitcast=True), x.to(gl.int32, bitcast=True)],
        dtype=gl.int32,
        is_pure=False,
        pack=2,
    )


@gluon.jit
def _query_blocks(
    dk,
    dv,
    k_c,
    v_c,
    k_half,
    q_ring,
    do_ring,
    ds_smem,
    lse_ring,
    delta_ring,
    qdo_ready,
    qdo_empty,
    ds_ready,
    ds_free,
    DQ,
    q_row0,
    lo,
    hi,
    t0,
    key0,
    shift,
    qk_scale,
    sm_scale,
    s_layout: gl.constexpr,
    acc_layout: gl.constexpr,
    op_layout: gl.constexpr,
    dq_layout: gl.constexpr,
    BLOCK_M: gl.constexpr,
    HALF_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    MASKED: gl.constexpr,
    ATOMIC_DQ: gl.constexpr,
    CONSUMER: gl.constexpr,
):
    """Query rows ``lo .. hi-1`` of one query head (flat row ``q_row0`` is its row 0) against
    this consumer's HALF_N keys (``key0 ..``); ``t0``: the ring iteration of row ``lo``."""
    dtype: gl.constexpr = q_ring.dtype
    HALF_D: gl.constexpr = HEAD_DIM // 2
    col_base = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    keys = key0 + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols = CONSUMER * HALF_D + gl.arange(0, HALF_D, layout=gl.SliceLayout(0, dq_layout))
    for start_m in range(lo, hi, BLOCK_M):
        t = t0 + (start_m - lo) // BLOCK_M
        slot = t % STAGES
        q_s = q_ring.index(slot)
        do_s = do_ring.index(slot)
        mbarrier.wait(qdo_ready.index(slot), (t // STAGES) & 1)
        zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout)
        st = warpgroup_mma(k_c, q_s.permute((1, 0)), zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_c, do_s.permute((1, 0)), zero, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        # (1, BLOCK_M) rows of the ring, read where they are used: held in registers across
        # the loop they would take 2 * BLOCK_M / 4 per thread.
        pt = gl.exp2(st * qk_scale - lse_ring.index(slot).load(s_layout))
        if MASKED:
            cols = start_m + col_base
            pt = gl.where(keys[:, None] <= cols[None, :] + shift, pt, 0.0)
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_s, dv, is_async=True)
        dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt,))
        # dS pre-scaled by sm_scale: neither dK nor dQ needs a final multiply.
        dst = (pt * (dpt - delta_ring.index(slot).load(s_layout)) * sm_scale).to(dtype)
        ds_op = gl.convert_layout(dst, op_layout)
        dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
        if ATOMIC_DQ:
            buf = t % 2
            ds_buf = ds_smem.index(buf)
            # The dQ products that read this buffer two iterations ago are done (both
            # consumers released it; a fresh barrier passes the first wait).
            mbarrier.wait(ds_free.index(buf), ((t // 2) & 1) ^ 1)
            ds_buf.slice(CONSUMER * HALF_N, HALF_N, dim=0).store(dst)
            fence_async_shared()
            gl.thread_barrier()  # the whole warpgroup's stores, before its one arrival
            mbarrier.arrive(ds_ready.index(buf), count=1)
            mbarrier.wait(ds_ready.index(buf), (t // 2) & 1)  # the other half is there too
            dq = warpgroup_mma(
                ds_buf.permute((1, 0)),
                k_half,
                gl.zeros([BLOCK_M, HALF_D], gl.float32, dq_layout),
                use_acc=False,
                is_async=True,
            )
            dq, dk, dv, pt_op, ds_op = warpgroup_mma_wait(
                num_outstanding=0, deps=(dq, dk, dv, pt_op, ds_op)
            )
            mbarrier.arrive(ds_free.index(buf), count=1)
            mbarrier.arrive(qdo_empty.index(slot), count=1)
            rows = (q_row0 + start_m + dq_rows).to(gl.int64)
            _red_add_v2(DQ + (rows[:, None] * HEAD_DIM + dq_cols[None, :]), dq)
        else:
            dk, dv, pt_op, ds_op = warpgroup_mma_wait(
                num_outstanding=0, deps=(dk, dv, pt_op, ds_op)
            )
            mbarrier.arrive(qdo_empty.index(slot), count=1)
    return dk, dv


@gluon.jit
def _consumer(
    DK,
    DV,
    DQ,
    k_smem,
    v_smem,
    q_ring,
    do_ring,
    ds_smem,
    lse_ring,
    delta_ring,
    kv_bar,
    qdo_ready,
    qdo_empty,
    ds_ready,
    ds_free,
    n_q,
    n_k,
    num_heads,
    group_size,
    qk_scale,
    sm_scale,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    ATOMIC_DQ: gl.constexpr,
    CONSUMER: gl.constexpr,
):
    """Consumer warpgroup ``CONSUMER``: keys ``CONSUMER * BLOCK_N/2 ..`` of the block; writes
    their rows of dK and dV."""
    HALF_N: gl.constexpr = BLOCK_N // 2
    HALF_D: gl.constexpr = HEAD_DIM // 2
    # Accumulators: the warpgroup's 4 warps split the rows, the instruction spans the width.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF_D, 16]
    )
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    b, hkv, start_n, kv_row0, lo, mid, per_head = _key_block(
        n_q, n_k, num_heads, group_size, CAUSAL, BLOCK_M, BLOCK_N
    )
    key0 = start_n + CONSUMER * HALF_N
    shift = n_k - n_q
    k_c = k_smem.slice(CONSUMER * HALF_N, HALF_N, dim=0)
    v_c = v_smem.slice(CONSUMER * HALF_N, HALF_N, dim=0)
    k_half = k_smem.slice(CONSUMER * HALF_D, HALF_D, dim=1)
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    for g in range(group_size):
        q_row0 = (b * num_heads + hkv * group_size + g) * n_q
        t0 = g * per_head
        if CAUSAL:
            dk, dv = _query_blocks(
                dk, dv, k_c, v_c, k_half, q_ring, do_ring, ds_smem, lse_ring, delta_ring,
                qdo_ready, qdo_empty, ds_ready, ds_free, DQ, q_row0, lo, mid, t0, key0, shift,
                qk_scale, sm_scale, s_layout, acc_layout, op_layout, dq_layout, BLOCK_M,
                HALF_N, HEAD_DIM, STAGES, True, ATOMIC_DQ, CONSUMER,
            )  # fmt: skip
        dk, dv = _query_blocks(
            dk, dv, k_c, v_c, k_half, q_ring, do_ring, ds_smem, lse_ring, delta_ring,
            qdo_ready, qdo_empty, ds_ready, ds_free, DQ, q_row0, mid, n_q,
            t0 + (mid - lo) // BLOCK_M, key0, shift, qk_scale, sm_scale, s_layout, acc_layout,
            op_layout, dq_layout, BLOCK_M, HALF_N, HEAD_DIM, STAGES, False, ATOMIC_DQ, CONSUMER,
        )  # fmt: skip

    rows = kv_row0 + CONSUMER * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, acc_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    offs = rows.to(gl.int64)[:, None] * HEAD_DIM + dims[None, :]
    gl.store(DK + offs, dk.to(DK.dtype.element_ty))
    gl.store(DV + offs, dv.to(DV.dtype.element_ty))


@gluon.jit
def _loader(
    desc_q,
    desc_do,
    desc_k,
    desc_v,
    desc_lse,
    desc_delta,
    k_smem,
    v_smem,
    q_ring,
    do_ring,
    lse_ring,
    delta_ring,
    kv_bar,
    qdo_ready,
    qdo_empty,
    n_q,
    n_k,
    num_heads,
    group_size,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
):
    """The producer warp: K and V once, then Q and dO of every query block the consumers
    visit, in their order, into ring slot ``t % STAGES`` once both released it."""
    b, hkv, start_n, kv_row0, lo, mid, per_head = _key_block(
        n_q, n_k, num_heads, group_size, CAUSAL, BLOCK_M, BLOCK_N
    )
    mbarrier.expect(kv_bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [kv_row0, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(desc_v, [kv_row0, 0], kv_bar, v_smem)
    for g in range(group_size):
        q_row0 = (b * num_heads + hkv * group_size + g) * n_q + lo
        for i in range(per_head):
            t = g * per_head + i
            slot = t % STAGES
            # A fresh mbarrier counts as having completed the phase before phase 0.
            mbarrier.wait(qdo_empty.index(slot), ((t // STAGES) & 1) ^ 1)
            bar = qdo_ready.index(slot)
            nbytes: gl.constexpr = (
                desc_q.block_type.nbytes
                + desc_do.block_type.nbytes
                + desc_lse.block_type.nbytes
                + desc_delta.block_type.nbytes
            )
            mbarrier.expect(bar, nbytes)
            row = q_row0 + i * BLOCK_M
            tma.async_copy_global_to_shared(desc_q, [row, 0], bar, q_ring.index(slot))
            tma.async_copy_global_to_shared(desc_do, [row, 0], bar, do_ring.index(slot))
            # LSE and delta seen as (rows / BLOCK_M, BLOCK_M): one row per query block.
            tma.async_copy_global_to_shared(
                desc_lse, [row // BLOCK_M, 0], bar, lse_ring.index(slot)
            )
            tma.async_copy_global_to_shared(
                desc_delta, [row // BLOCK_M, 0], bar, delta_ring.index(slot)
            )


@gluon.jit
def _attn_bwd_ws(
    desc_q,
    desc_do,
    desc_k,
    desc_v,
    desc_lse,
    desc_delta,
    DK,
    DV,
    DQ,
    qk_scale,
    sm_scale,
    n_q,
    n_k,
    num_heads,
    group_size,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    ATOMIC_DQ: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
):
    """desc_q/desc_do: (B*H*Nq, D), (BLOCK_M, D) tiles; desc_k/desc_v: (B*Hkv*Nk, D),
    (BLOCK_N, D) tiles; DK, DV: (B*Hkv*Nk, D) in the input dtype; DQ: (B*H*Nq, D) fp32, added
    to (``ATOMIC_DQ``); LSE (base 2), DELTA: (B*H*Nq,) fp32. Grid (Nk / BLOCK_N, B * Hkv)."""
    dtype: gl.constexpr = desc_q.dtype
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], desc_v.layout)
    q_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_q.layout)
    do_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_do.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    DS_BUFS: gl.constexpr = 2 if ATOMIC_DQ else 1
    DS_ROWS: gl.constexpr = BLOCK_N if ATOMIC_DQ else 16  # unused without ATOMIC_DQ
    ds_smem = gl.allocate_shared_memory(dtype, [DS_BUFS, DS_ROWS, BLOCK_M], ds_layout)
    lse_ring = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], desc_lse.layout)
    delta_ring = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], desc_delta.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(s), count=1)
        mbarrier.init(qdo_empty.index(s), count=2)  # each consumer releases once
    for s in gl.static_range(2):
        mbarrier.init(ds_ready.index(s), count=2)
        mbarrier.init(ds_free.index(s), count=2)

    gl.warp_specialize(
        [
            (
                _consumer,
                (
                    DK, DV, DQ, k_smem, v_smem, q_ring, do_ring, ds_smem, lse_ring, delta_ring,
                    kv_bar, qdo_ready, qdo_empty, ds_ready, ds_free, n_q, n_k, num_heads,
                    group_size, qk_scale, sm_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                    ATOMIC_DQ, 0,
                ),
            ),
            (
                _consumer,
                (
                    DK, DV, DQ, k_smem, v_smem, q_ring, do_ring, ds_smem, lse_ring, delta_ring,
                    kv_bar, qdo_ready, qdo_empty, ds_ready, ds_free, n_q, n_k, num_heads,
                    group_size, qk_scale, sm_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                    ATOMIC_DQ, 1,
                ),
            ),
            (
                _loader,
                (
                    desc_q, desc_do, desc_k, desc_v, desc_lse, desc_delta, k_smem, v_smem,
                    q_ring, do_ring, lse_ring, delta_ring, kv_bar, qdo_ready, qdo_empty, n_q,
                    n_k, num_heads, group_size, CAUSAL, BLOCK_M, BLOCK_N, STAGES,
                ),
            ),
        ],
        [4, LOADER_WARPS],
        [CONSUMER_REGS, LOADER_REGS],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The dQ kernel: one program per 2 * BLOCK_M query rows of one head (the forward's shape)


@gluon.jit
def _dq_tile(n_q, n_k, num_heads, group_size, CAUSAL: gl.constexpr, TILE_M: gl.constexpr,
             BLOCK_N: gl.constexpr):  # fmt: skip
    """(first Q row in the flat (B*H*Nq, D) view, first query index, first K/V row, key blocks
    to visit). Causal tiles are numbered longest first."""
    num_m = n_q // TILE_M
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    b = bh // num_heads
    hkv = (bh % num_heads) // group_size
    start_m = pid_m * TILE_M
    kv_row0 = (b * (num_heads // group_size) + hkv) * n_k
    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum(start_m + TILE_M + n_k - n_q, n_k), BLOCK_N)
    else:
        n_blocks = n_k // BLOCK_N
    return bh * n_q + start_m, start_m, kv_row0, n_blocks


@gluon.jit
def _dq_consumer(
    DQ,
    LSE,
    DELTA,
    q_bufs,
    do_bufs,
    k_ring,
    v_ring,
    qdo_bar,
    kv_ready,
    kv_empty,
    n_q,
    n_k,
    num_heads,
    group_size,
    qk_scale,
    sm_scale,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CONSUMER: gl.constexpr,
):
    """BLOCK_M query rows: dQ = sum over key blocks of dS K, dS = P (dP - delta) * sm_scale,
    P = exp2(Q K^T * scale - lse), dP = dO V^T. dQ_{j} (async) overlaps block j+1's two
    products; a slot is released once the dQ product that reads its K is done."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = q_bufs.dtype

    q_row0, start_m0, kv_row0, n_blocks = _dq_tile(
        n_q, n_k, num_heads, group_size, CAUSAL, 2 * BLOCK_M, BLOCK_N
    )
    row = q_row0 + CONSUMER * BLOCK_M
    offs_m = start_m0 + CONSUMER * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)
    lse = gl.load(LSE + row + gl.arange(0, BLOCK_M, layout=row_s))
    delta = gl.load(DELTA + row + gl.arange(0, BLOCK_M, layout=row_s))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    shift = n_k - n_q
    q_s = q_bufs.index(CONSUMER)
    do_s = do_bufs.index(CONSUMER)
    mbarrier.wait(qdo_bar.index(CONSUMER), 0)
    # Carried through the loop as an in-flight wgmma accumulator (waited for one block later).
    dq = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout))
    ds_op = gl.zeros([BLOCK_M, BLOCK_N], dtype, op_layout)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for j in range(n_blocks):
        slot = j % STAGES
        mbarrier.wait(kv_ready.index(slot), (j // STAGES) & 1)
        s = warpgroup_mma(q_s, k_ring.index(slot).permute((1, 0)), zero, use_acc=False,
                          is_async=True)  # fmt: skip
        dp = warpgroup_mma(do_s, v_ring.index(slot).permute((1, 0)), zero, use_acc=False,
                           is_async=True)  # fmt: skip
        # Everything but dP is done: S, and the previous block's dQ product (its K's slot is
        # free now).
        s, dq, ds_op = warpgroup_mma_wait(num_outstanding=1, deps=(s, dq, ds_op))
        if j > 0:
            mbarrier.arrive(kv_empty.index((j - 1) % STAGES), count=1)
        p = gl.exp2(s * qk_scale - lse[:, None])
        if CAUSAL:
            # Only blocks that reach past this warpgroup's first row's diagonal need it; the
            # select is cheap next to the exponentials, so every block takes it.
            keep = (j * BLOCK_N + cols)[None, :] <= offs_m[:, None] + shift
            p = gl.where(keep, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
        ds = (p * (dp - delta[:, None]) * sm_scale).to(dtype)
        ds_op = gl.convert_layout(ds, op_layout)
        dq = warpgroup_mma(ds_op, k_ring.index(slot), dq, is_async=True)
    dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))
    mbarrier.arrive(kv_empty.index((n_blocks - 1) % STAGES), count=1)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    base = DQ + row.to(gl.int64) * HEAD_DIM
    gl.store(base + (rows[:, None] * HEAD_DIM + dims[None, :]), dq.to(DQ.dtype.element_ty))


@gluon.jit
def _dq_loader(
    desc_q,
    desc_do,
    desc_k,
    desc_v,
    q_bufs,
    do_bufs,
    k_ring,
    v_ring,
    qdo_bar,
    kv_ready,
    kv_empty,
    n_q,
    n_k,
    num_heads,
    group_size,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
):
    """Q and dO of both consumers once, then K_j and V_j into slot j % STAGES."""
    q_row0, start_m0, kv_row0, n_blocks = _dq_tile(
        n_q, n_k, num_heads, group_size, CAUSAL, 2 * BLOCK_M, BLOCK_N
    )
    for c in gl.static_range(2):
        bar = qdo_bar.index(c)
        mbarrier.expect(bar, desc_q.block_type.nbytes + desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [q_row0 + c * BLOCK_M, 0], bar, q_bufs.index(c))
        tma.async_copy_global_to_shared(desc_do, [q_row0 + c * BLOCK_M, 0], bar, do_bufs.index(c))
    for j in range(n_blocks):
        slot = j % STAGES
        mbarrier.wait(kv_empty.index(slot), ((j // STAGES) & 1) ^ 1)
        bar = kv_ready.index(slot)
        mbarrier.expect(bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
        row = kv_row0 + j * BLOCK_N
        tma.async_copy_global_to_shared(desc_k, [row, 0], bar, k_ring.index(slot))
        tma.async_copy_global_to_shared(desc_v, [row, 0], bar, v_ring.index(slot))


@gluon.jit
def _attn_bwd_dq_ws(
    desc_q,
    desc_do,
    desc_k,
    desc_v,
    DQ,
    LSE,
    DELTA,
    qk_scale,
    sm_scale,
    n_q,
    n_k,
    num_heads,
    group_size,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
):
    """dQ alone (three matmuls per block, no atomics: deterministic). desc_q/desc_do:
    (B*H*Nq, D) with (BLOCK_M, D) tiles; desc_k/desc_v: (B*Hkv*Nk, D) with (BLOCK_N, D)
    tiles; DQ: (B*H*Nq, D) in the input dtype. Grid (Nq / (2 * BLOCK_M), B * H)."""
    dtype: gl.constexpr = desc_q.dtype
    q_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], desc_q.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], desc_do.layout)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    qdo_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(qdo_bar.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=2)

    gl.warp_specialize(
        [
            (
                _dq_consumer,
                (
                    DQ, LSE, DELTA, q_bufs, do_bufs, k_ring, v_ring, qdo_bar, kv_ready,
                    kv_empty, n_q, n_k, num_heads, group_size, qk_scale, sm_scale, CAUSAL,
                    BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, 0,
                ),
            ),
            (
                _dq_consumer,
                (
                    DQ, LSE, DELTA, q_bufs, do_bufs, k_ring, v_ring, qdo_bar, kv_ready,
                    kv_empty, n_q, n_k, num_heads, group_size, qk_scale, sm_scale, CAUSAL,
                    BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, 1,
                ),
            ),
            (
                _dq_loader,
                (
                    desc_q, desc_do, desc_k, desc_v, q_bufs, do_bufs, k_ring, v_ring, qdo_bar,
                    kv_ready, kv_empty, n_q, n_k, num_heads, group_size, CAUSAL, BLOCK_M,
                    BLOCK_N, STAGES,
                ),
            ),
        ],
        [4, LOADER_WARPS],
        [CONSUMER_REGS, LOADER_REGS],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Configurations and the launcher


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    """One tiling of the warp-specialized backward."""

    block_m: int  # query rows per step
    block_n: int  # keys per program (half per consumer warpgroup)
    stages: int  # Q/dO slots in the ring


# The first entry is the default: alone at N=4096 (bf16, run 10) the dK/dV kernel took 3.84 ms
# with a 2-slot ring, 3.99 with 3; with the in-kernel dQ 6.94 and 6.90 ms. Offline sm_90a
# compiles: no spills without the in-kernel dQ; with it, 1 (non-causal) and 15 (causal) spilled
# registers at 2 slots, 0 and 15 at 3.
CONFIGS: dict[int, tuple[BwdConfig, ...]] = {
    128: (BwdConfig(64, 128, 2), BwdConfig(64, 128, 3)),
}


@dataclasses.dataclass(frozen=True)
class DqConfig:
    """One tiling of the dQ kernel."""

    block_m: int  # query rows per consumer warpgroup (two per program)
    block_n: int  # keys per block
    stages: int  # K/V slots in the ring

    @property
    def tile_m(self) -> int:
        return 2 * self.block_m


# The first entry is the default. Alone at N=4096 (bf16, run 10): 64/128/2 2.73 ms, 64/64/4
# 3.08, 64/64/3 3.17; kernel.py's dQ kernel 2.65 ms, which is why kernel.GLUON_DQ_MODE takes
# that one. None spills (offline sm_90a compiles).
DQ_CONFIGS: dict[int, tuple[DqConfig, ...]] = {
    128: (DqConfig(64, 128, 2), DqConfig(64, 64, 4), DqConfig(64, 64, 3)),
}


def unsupported_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    config: BwdConfig | None = None,
) -> str | None:
    """None when this kernel computes dK and dV (and dQ) as ``kernel.py``'s backward would."""
    if q.device.type != "cuda":
        return f"needs CUDA tensors, got {q.device}"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"needs float16 or bfloat16, got {q.dtype}"
    d = q.shape[-1]
    if d not in CONFIGS:
        return f"head dim must be one of {sorted(CONFIGS)}, got {d}"
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return "needs contiguous (B, H, N, D) tensors"
    cfg = config or CONFIGS[d][0]
    dq_cfg = DQ_CONFIGS[d][0]
    n_q, n_k = q.shape[2], k.shape[2]
    m = max(cfg.block_m, dq_cfg.tile_m)
    n = max(cfg.block_n, dq_cfg.block_n)
    if n_q % m or n_k % n:
        return f"needs Nq % {m} == 0 and Nk % {n} == 0, got {n_q} and {n_k}"
    if causal and n_k < n_q:
        return f"causal needs Nk >= Nq, got Nq={n_q}, Nk={n_k}"
    return None


def supports(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    config: BwdConfig | None = None,
) -> bool:
    return unsupported_reason(q, k, v, causal, config) is None


@functools.cache
def _layouts(block_m: int, block_n: int, d: int, dtype: torch.dtype) -> tuple[object, object]:
    gdtype = gl.float16 if dtype == torch.float16 else gl.bfloat16
    return (
        gl.NVMMASharedLayout.get_default_for([block_m, d], gdtype),
        gl.NVMMASharedLayout.get_default_for([block_n, d], gdtype),
    )


@functools.cache
def _row_layout() -> object:
    """The shared layout of the (1, BLOCK_M) fp32 rows of LSE and delta: no swizzle."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def attention_backward_dkdv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    dq32: torch.Tensor | None,
    causal: bool,
    sm_scale: float,
    config: BwdConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv) in k's dtype. ``lse`` (base 2) and ``delta`` (rowsum(dO * O)): (B, H, Nq) fp32.
    ``dq32``: a (B, H, Nq, D) fp32 buffer that dS @ K is added to, or None to skip dQ.
    Inputs must pass :func:`supports`; ``do`` must be contiguous."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    cfg = config or CONFIGS[d][0]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    q_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, d, q.dtype)
    q_rows, kv_rows = b * h * n_q, b * h_kv * n_k
    desc_q = TensorDescriptor(q, [q_rows, d], [d, 1], [cfg.block_m, d], q_layout)
    desc_do = TensorDescriptor(do, [q_rows, d], [d, 1], [cfg.block_m, d], q_layout)
    desc_k = TensorDescriptor(k, [kv_rows, d], [d, 1], [cfg.block_n, d], kv_layout)
    desc_v = TensorDescriptor(v, [kv_rows, d], [d, 1], [cfg.block_n, d], kv_layout)
    rows_layout = _row_layout()
    m_blocks = q_rows // cfg.block_m
    desc_lse = TensorDescriptor(
        lse, [m_blocks, cfg.block_m], [cfg.block_m, 1], [1, cfg.block_m], rows_layout
    )
    desc_delta = TensorDescriptor(
        delta, [m_blocks, cfg.block_m], [cfg.block_m, 1], [1, cfg.block_m], rows_layout
    )
    atomic = dq32 is not None
    grid = (n_k // cfg.block_n, b * h_kv)
    _attn_bwd_ws[grid](
        desc_q, desc_do, desc_k, desc_v, desc_lse, desc_delta, dk, dv,
        dq32 if atomic else delta,
        sm_scale * LOG2E, sm_scale, n_q, n_k, h, h // h_kv,
        CAUSAL=causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d,
        STAGES=cfg.stages, ATOMIC_DQ=atomic, CONSUMER_REGS=CONSUMER_REGS,
        num_warps=WARPS_PER_CONSUMER, maxnreg=KERNEL_MAXNREG,
    )  # fmt: skip
    return dk, dv


def attention_backward_dq(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: DqConfig | None = None,
) -> torch.Tensor:
    """dq in q's dtype, deterministic (no atomics). Same inputs as
    :func:`attention_backward_dkdv`."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    cfg = config or DQ_CONFIGS[d][0]
    dq = torch.empty_like(q)
    q_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, d, q.dtype)
    q_rows, kv_rows = b * h * n_q, b * h_kv * n_k
    desc_q = TensorDescriptor(q, [q_rows, d], [d, 1], [cfg.block_m, d], q_layout)
    desc_do = TensorDescriptor(do, [q_rows, d], [d, 1], [cfg.block_m, d], q_layout)
    desc_k = TensorDescriptor(k, [kv_rows, d], [d, 1], [cfg.block_n, d], kv_layout)
    desc_v = TensorDescriptor(v, [kv_rows, d], [d, 1], [cfg.block_n, d], kv_layout)
    _attn_bwd_dq_ws[(n_q // cfg.tile_m, b * h)](
        desc_q, desc_do, desc_k, desc_v, dq, lse, delta, sm_scale * LOG2E, sm_scale, n_q, n_k,
        h, h // h_kv, CAUSAL=causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d,
        STAGES=cfg.stages, CONSUMER_REGS=CONSUMER_REGS, num_warps=WARPS_PER_CONSUMER,
        maxnreg=KERNEL_MAXNREG,
    )  # fmt: skip
    return dq
