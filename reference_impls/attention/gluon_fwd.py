"""Fused attention forward for Hopper in Gluon: warp-specialized, FlashAttention-3 style.

FlashAttention-3 (Shah et al., 2024, https://arxiv.org/abs/2407.08608) on top of
FlashAttention-2 (Dao, 2023, https://arxiv.org/abs/2307.08691): the same online softmax as
``kernel.py``, scheduled the way FlashAttention-3 schedules it on Hopper.

- A producer warp issues the TMA copies: the query tiles once, then key and value blocks into
  a ring of ``STAGES`` shared-memory slots, each guarded by a "ready" mbarrier (the copy
  engine arrives when the bytes have landed) and an "empty" one (every consumer arrives when
  it has finished reading the slot). It holds 24 registers per thread; the consumers take the
  rest (``setmaxnreg``), which is what lets a consumer keep two score tiles and the output
  tile in registers at once.
- ``NUM_CONSUMERS`` consumer warpgroups (4 warps each), each with its own ``BLOCK_M`` query
  rows, read the same key/value slots. Their matmuls are asynchronous wgmma with fp32
  accumulators in registers; P stays in registers as the A operand of P @ V.
- Inside a consumer the softmax of key block j runs while the tensor cores compute
  ``P_{j-1} V_{j-1}`` (FlashAttention-3's intra-warpgroup pipelining, one block deep): the loop
  issues block j's score wgmma and then the previous block's P @ V wgmma, and waits for only
  the former before the softmax. Across the two consumers, one's softmax overlaps the other's
  matmuls as the warp scheduler interleaves them; an explicit ping-pong (``PINGPONG``, the two
  taking turns to issue) measured no faster and is off by default.
- Causal: blocks left of the diagonal take the loop without masks; only the blocks that
  straddle the diagonal compute one.
- Options measured at D=64 (run 11 in docs/benchmarks/attention.md): ``early_qk`` issues
  block j's score wgmma before O is rescaled for P_{j-1} @ V_{j-1} (part of the D=64 default
  tiling); ``emulated`` computes some exponentials in software on the FMA pipe
  (FlashAttention-4's polynomial exp2) and ``rescale`` skips the rescale of O while no row
  max grows by more than a threshold (FlashAttention-4's conditional rescaling): both
  correct, neither faster on Hopper (``LEVER_CONFIGS``).
- Options measured at D=64 in run 12 (``_attn_fwd_ws_run12``), correct, both slower than
  the default tiling (``LEVER_CONFIGS``): ``thread_release`` releases K/V slots and ping-pong
  turns by every consumer thread's arrive instead of one thread's after a warpgroup
  ``bar.sync``; ``p_smem`` passes P to the P @ V wgmma through shared memory, which keeps
  the softmax overlapped with that wgmma in the SASS (with P in registers ptxas puts the
  wait for it above the exponentials).
- ``persistent`` tilings launch one program per SM, each looping over tiles (groups of
  ``GROUP_HEADS`` heads, query block as the slow index) through one K/V ring: the producer
  loads the next tile's Q as soon as the consumers' last score wgmma is done, and O is
  stored from registers. Measured, tested, not the default (see ``CONFIGS``).

What this kernel covers is narrower than ``kernel.py``: fp16/bf16, head dims 64 and 128,
contiguous ``(B, H, N, D)`` inputs, lengths that are whole multiples of its tiles and, when
causal, ``Nk >= Nq`` (so every query row sees at least one key). ``supports`` says whether a
call qualifies; ``kernel.attention`` falls back to the Triton kernel for everything else, so
the semantics never depend on which kernel ran. The log-sum-exp it saves follows
``kernel.py``'s convention (base 2), so that file's backward consumes it unchanged.

Gluon does not run under ``TRITON_INTERPRET``; importing this module is safe anywhere (the
kernels are only compiled when launched on a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
import struct

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["GluonConfig", "CONFIGS", "supports", "unsupported_reason", "attention_forward"]

LOG2E = 1.4426950408889634
"""log2(e): exp(x) is computed as exp2(x * log2(e)), folded into the softmax scale."""

WARPS_PER_CONSUMER = 4  # one warpgroup: the unit wgmma issues on
_CONSUMER_THREADS = gl.constexpr(WARPS_PER_CONSUMER * 32)
LOADER_WARPS = gl.constexpr(1)
# The fewest registers setmaxnreg allows: the loader holds only scalars.
LOADER_REGS = gl.constexpr(24)
# Register budget per thread of a consumer warpgroup, out of 64K registers per SM shared by
# (NUM_CONSUMERS + 1) warpgroups (the loader's warp is allocated a whole warpgroup).
CONSUMER_REGS = {1: 240, 2: 240}
# maxnreg for the launch: the average per thread that the budget above allows, rounded down
# to a multiple of 8 (65536 / (128 * warpgroups)).
KERNEL_MAXNREG = {1: 248, 2: 168}
# Persistent programs take the tiles of this many heads at a time (see _tile): 8 heads' K/V at
# N = 16384, D = 128 is 64 MiB, about L2's size; shorter sequences fit several times over.
GROUP_HEADS = gl.constexpr(8)


# Software exp2 (FlashAttention-4's trick): on Hopper the MUFU unit computes 16 exp2 per clock
# per SM, against 128 fp32 FMAs; at D=64 a score tile's exp2s take as long as its two matmuls.
# ``EMULATED`` of every ``EXP2_PACK`` consecutive scores of a thread go through a polynomial on
# the FMA pipe instead: x = j + f with j = floor(x) (one add rounding down against 1.5 * 2**23,
# whose low mantissa bits then hold j), 2**f on [0, 1) by a degree-3 minimax polynomial (p(0) =
# 1 exactly; relative error 8.6e-5, under bf16's and fp16's rounding of P), and 2**j added to
# the exponent field as an integer (j << 23). x is clamped at -127 first, which makes
# exp2(-inf) (masked scores) exactly 0: 1.0's bits minus 127 << 23. Inputs are <= 0 here.
EXP2_PACK = 8
EXP2_POLY = (0.6951172947883606, 0.22764353454113007, 0.077068030834198)  # f, f^2, f^3
_EXP2_PACK = gl.constexpr(EXP2_PACK)

_EXP2_CONSTRAINTS = gl.constexpr(
    ",".join(["=r"] * EXP2_PACK + ["r"] * EXP2_PACK)  # 8 results, then 8 inputs (fp32 bits)
)


def _f32(x: float) -> str:
    """x as a PTX fp32 literal (0f + its bits in hex)."""
    return f"0f{struct.unpack('<I', struct.pack('<f', x))[0]:08X}"


def _make_exp2_asm(emulated: int) -> str:
    """PTX for EXP2_PACK exp2s, ``emulated`` of them by the polynomial, spread over the pack."""
    soft = set()
    if emulated:
        soft = {i * EXP2_PACK // emulated for i in range(emulated)}
    c1, c2, c3 = (_f32(c) for c in EXP2_POLY)
    magic = _f32(1.5 * 2**23)
    lines = []
    for i in range(EXP2_PACK):
        out, x = f"${i}", f"${EXP2_PACK + i}"
        if i not in soft:
            lines.append(f"ex2.approx.ftz.f32 {out}, {x};")
            continue
        lines.append(
            "{ .reg .f32 xc, j, fl, fr, p; .reg .b32 jb, pb; "
            f"max.ftz.f32 xc, {x}, {_f32(-127.0)}; "
            f"add.rm.ftz.f32 j, xc, {magic}; "
            f"sub.ftz.f32 fl, j, {magic}; "
            "sub.ftz.f32 fr, xc, fl; "
            f"fma.rn.ftz.f32 p, fr, {c3}, {c2}; "
            f"fma.rn.ftz.f32 p, p, fr, {c1}; "
            f"fma.rn.ftz.f32 p, p, fr, {_f32(1.0)}; "
            "mov.b32 jb, j; shl.b32 jb, jb, 23; mov.b32 pb, p; "
            f"add.s32 {out}, pb, jb; }}"
        )
    return "\n".join(lines)


_EXP2_ASM = tuple(_make_exp2_asm(k) for k in range(EXP2_PACK + 1))


@triton.constexpr_function
def _exp2_asm(emulated: int) -> str:
    return _EXP2_ASM[emulated]


# ---------------------------------------------------------------------------------------------
# Kernels


@gluon.jit
def _exp2(x, EMULATED: gl.constexpr):
    """exp2 of an fp32 tensor: on the MUFU unit, or for EMULATED of every 8 elements of each
    thread in software on the FMA pipe (``_exp2_asm``)."""
    if EMULATED == 0:
        return gl.exp2(x)
    else:
        return gl.inline_asm_elementwise(
            _exp2_asm(EMULATED), _EXP2_CONSTRAINTS, [x], gl.float32, True, _EXP2_PACK
        )


@gluon.jit
def _softmax_step(
    qk,
    m_i,
    l_i,
    qk_scale,
    offs_m,
    offs_n,
    causal_shift,
    MASKED: gl.constexpr,
    EMULATED: gl.constexpr,
    RESCALE_TH: gl.constexpr,
):
    """One block's online softmax. qk: (BLOCK_M, BLOCK_N) fp32 raw scores; m_i, l_i: (BLOCK_M,)
    running max (base-2 units) and sum. Returns (p, alpha, grew, m_new, l_new), p
    unnormalised; ``acc`` must be multiplied by alpha (per row) iff ``grew`` > 0.

    RESCALE_TH > 0 (FlashAttention-4's conditional rescaling): a row's running max moves only
    when this block's max exceeds it by more than RESCALE_TH (base 2); otherwise the old max
    stays (alpha = 1) and p may reach 2**RESCALE_TH (well inside fp16/bf16 range). Exact
    either way: lse = m + log2(l) and O = acc / l for whichever m was used. ``grew`` (one
    scalar for the warpgroup, reduced after the exponentials so that they need not wait for
    it) says whether any row moved, i.e. whether acc must be rescaled at all."""
    if MASKED:
        # Causal only: ragged lengths never reach this kernel (``supports``).
        keep = offs_n[None, :] <= offs_m[:, None] + causal_shift
        s = gl.where(keep, qk * qk_scale, float("-inf"))
        m_blk = gl.max(s, axis=1)
    else:
        m_blk = gl.max(qk, axis=1) * qk_scale
    if RESCALE_TH > 0:
        grow = m_blk > m_i + RESCALE_TH
        m_new = gl.where(grow, gl.maximum(m_i, m_blk), m_i)
    else:
        m_new = gl.maximum(m_i, m_blk)
    # Every row sees key 0 (Nk >= Nq), so m_new is finite after the first block: no NaN
    # from (-inf) - (-inf).
    if MASKED:
        p = _exp2(s - m_new[:, None], EMULATED)
    else:
        p = _exp2(qk * qk_scale - m_new[:, None], EMULATED)
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    grew = gl.max(grow.to(gl.int32), axis=0) if RESCALE_TH > 0 else gl.to_tensor(1)
    return p, alpha, grew, m_new, l_new


@gluon.jit
def _rescale(acc, alpha, grew, row_o: gl.constexpr, RESCALE_TH: gl.constexpr):
    """acc * alpha (per row); with conditional rescaling only when some row's max moved."""
    if RESCALE_TH > 0:
        if grew > 0:
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    else:
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    return acc


@gluon.jit
def _release(bar):
    """THREAD_RELEASE: every thread of the consumer warpgroup arrives on ``bar`` itself
    (``cp.async.mbarrier.arrive.noinc``, counted against the barrier's expected count: 128 per
    warpgroup), after its own wait for the wgmma that read the slot. ``mbarrier.arrive`` is one
    thread's arrive, and Triton puts a warpgroup ``bar.sync`` before it so that the other 127
    are done too; here the barrier's count does that, and no thread waits for another."""
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def _block(
    acc,
    p_op,
    alpha,
    grew,
    m_i,
    l_i,
    q_smem,
    k_smem,
    v_smem,
    k_ready,
    v_ready,
    kv_empty,
    turns,
    turns_peer,
    p_smem,
    kv_base,
    turn_parity,
    j,
    qk_scale,
    offs_m,
    causal_shift,
    s_layout: gl.constexpr,
    o_layout: gl.constexpr,
    p_layout: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    MASKED: gl.constexpr,
    CONSUMER: gl.constexpr,
    PINGPONG: gl.constexpr,
    EMULATED: gl.constexpr,
    RESCALE_TH: gl.constexpr,
    EARLY_QK: gl.constexpr,
    THREAD_RELEASE: gl.constexpr,
    P_SMEM: gl.constexpr,
):
    """Key block j of ``_pipelined_blocks``; returns P_j as a new value (p_op, P_{j-1}, is
    read by the P @ V wgmma in flight until the wait at the end)."""
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    # g: the block's number in this program's stream of key blocks (over all its tiles),
    # which fixes its ring slot and the phase of that slot's barriers.
    g = kv_base + j
    slot = g % STAGES
    prev = (g - 1) % STAGES
    mbarrier.wait(k_ready.index(slot), (g // STAGES) & 1)
    if not EARLY_QK:
        mbarrier.wait(v_ready.index(prev), ((g - 1) // STAGES) & 1)
        acc = _rescale(acc, alpha, grew, row_o, RESCALE_TH)
    if PINGPONG:
        # The k-th turn of this program (over all its tiles) waits for parity k & 1; each
        # tile takes one turn per block but its first: k = kv_base - tiles_before + j - 1,
        # whose parity is turn_parity ^ ((j - 1) & 1).
        if THREAD_RELEASE:
            mbarrier.wait(turns.index(0), turn_parity ^ ((j - 1) & 1))
        else:
            mbarrier.wait(turns.index(CONSUMER), turn_parity ^ ((j - 1) & 1))
    qk = warpgroup_mma(
        q_smem,
        k_smem.index(slot).permute((1, 0)),
        gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
        use_acc=False,
        is_async=True,
    )
    if EARLY_QK:
        # The score wgmma goes to the tensor cores first; the rescale of acc (which only
        # P @ V reads) and the wait for V overlap it.
        mbarrier.wait(v_ready.index(prev), ((g - 1) // STAGES) & 1)
        acc = _rescale(acc, alpha, grew, row_o, RESCALE_TH)
    if P_SMEM:
        # P_{j-1} from its shared-memory buffer (j - 1) % 2, written at the end of block j-1.
        acc = warpgroup_mma(p_smem.index((j - 1) % 2), v_smem.index(prev), acc, is_async=True)
    else:
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    if PINGPONG:
        if THREAD_RELEASE:
            _release(turns_peer.index(0))
        else:
            mbarrier.arrive(turns.index(1 - CONSUMER), count=1)
    # Only the score wgmma (issued first) must be done; P @ V keeps the tensor cores busy
    # through the softmax below.
    qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk,))
    p, alpha, grew, m_i, l_i = _softmax_step(
        qk, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + cols, causal_shift, MASKED, EMULATED,
        RESCALE_TH,
    )  # fmt: skip
    if P_SMEM:
        # P_j into the other buffer, which the P @ V of block j-2 read (completed, waited for
        # in that block); the wait for P_{j-1} @ V_{j-1} comes only after it. No register of
        # the wgmma in flight is rewritten, so ptxas keeps the softmax above that wait (with P
        # in registers it moves the wait above the exponentials: run 11).
        p_smem.index(j % 2).store(p.to(q_smem.dtype))
        fence_async_shared()
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        p_new = p_op  # unused placeholder
    else:
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        p_new = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    if THREAD_RELEASE:
        _release(kv_empty.index(prev))
    else:
        mbarrier.arrive(kv_empty.index(prev), count=1)
    return acc, p_new, alpha, grew, m_i, l_i


@gluon.jit
def _pipelined_blocks(
    acc,
    p_op,
    alpha,
    grew,
    m_i,
    l_i,
    q_smem,
    k_smem,
    v_smem,
    k_ready,
    v_ready,
    kv_empty,
    turns,
    turns_peer,
    p_smem,
    kv_base,
    turn_parity,
    lo,
    hi,
    qk_scale,
    offs_m,
    causal_shift,
    s_layout: gl.constexpr,
    o_layout: gl.constexpr,
    p_layout: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    MASKED: gl.constexpr,
    CONSUMER: gl.constexpr,
    PINGPONG: gl.constexpr,
    EMULATED: gl.constexpr,
    RESCALE_TH: gl.constexpr,
    EARLY_QK: gl.constexpr,
    THREAD_RELEASE: gl.constexpr,
    P_SMEM: gl.constexpr,
):
    """Key blocks ``lo .. hi-1`` (block indices, lo >= 1): block j's scores are issued, then
    P_{j-1} @ V_{j-1}, and the softmax of j runs while the latter is still on the tensor cores.

    ``kv_base``: how many key blocks this program consumed before this tile (persistent
    programs run several tiles through one ring).

    Carried in: acc (BLOCK_M, HEAD_DIM) fp32 = sum over blocks < j-1, not yet rescaled by
    alpha (the factor block j-1's softmax produced) if ``grew`` > 0; p_op = P_{j-1} as the
    wgmma A operand.

    PINGPONG (two consumers): the warpgroups take turns to issue their two wgmmas (the
    ``turns`` mbarriers), so that one's softmax runs while the other's matmuls hold the tensor
    cores (FlashAttention-3's inter-warpgroup schedule). Both run the same tiles and so the
    same number of iterations, so the k-th wait on a turn barrier is for its k-th completion
    (parity k & 1; consumer 0's barrier was completed once before the first tile to let it
    start).
    """
    for j in range(lo, hi):
        acc, p_op, alpha, grew, m_i, l_i = _block(
            acc, p_op, alpha, grew, m_i, l_i, q_smem, k_smem, v_smem, k_ready, v_ready,
            kv_empty, turns, turns_peer, p_smem, kv_base, turn_parity, j, qk_scale, offs_m,
            causal_shift, s_layout, o_layout, p_layout, BLOCK_M, BLOCK_N, STAGES, MASKED,
            CONSUMER, PINGPONG, EMULATED, RESCALE_TH, EARLY_QK, THREAD_RELEASE, P_SMEM,
        )  # fmt: skip
    return acc, p_op, alpha, grew, m_i, l_i


@gluon.jit
def _consumer(
    q_smem,
    k_smem,
    v_smem,
    q_bar,
    q_empty,
    k_ready,
    v_ready,
    kv_empty,
    turns,
    turns_peer,
    p_smem,
    desc_o,
    Out,
    LSE,
    o_row,
    lse_row,
    start_m,
    n_q,
    n_k,
    n_blocks,
    kv_base,
    q_phase,
    qk_scale,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CONSUMER: gl.constexpr,
    PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
    EMULATED: gl.constexpr,
    RESCALE_TH: gl.constexpr,
    EARLY_QK: gl.constexpr,
    THREAD_RELEASE: gl.constexpr,
    P_SMEM: gl.constexpr,
):
    """One warpgroup, one tile: BLOCK_M query rows starting at ``start_m`` against key blocks
    ``0 .. n_blocks-1`` (blocks ``kv_base ..`` of the program's stream through the ring);
    writes O and the base-2 log-sum-exp.

    Not persistent: O leaves through ``q_smem`` (free once the last score is computed) and a
    TMA store. Persistent: ``q_smem`` is released (``q_empty``) as soon as the last score
    wgmma is done, so that the producer loads the next tile's Q while this one finishes, and O
    is stored from registers."""
    # Accumulator layouts: the warpgroup's 4 warps split the rows; the instruction's N is the
    # whole tile width (one wgmma per 16-deep K step).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    # P as the A operand straight from registers: the accumulator layout of QK^T maps onto it
    # without a shuffle (k_width 2 for 16-bit types).
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    causal_shift = n_k - n_q
    # Causal: blocks wholly left of the diagonal for this warpgroup's first row need no mask.
    n_full = gl.minimum((start_m + causal_shift + 1) // BLOCK_N, n_blocks) if CAUSAL else n_blocks

    mbarrier.wait(q_bar, q_phase)
    # q_phase is the parity of the tiles this program ran before; see _pipelined_blocks.
    turn_parity = (kv_base & 1) ^ q_phase
    # Block 0 alone: its scores, its softmax (masked: in a causal kernel it may straddle the
    # diagonal; the mask is harmless elsewhere).
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    mbarrier.wait(k_ready.index(kv_base % STAGES), (kv_base // STAGES) & 1)
    qk = warpgroup_mma(
        q_smem,
        k_smem.index(kv_base % STAGES).permute((1, 0)),
        gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
        use_acc=False,
        is_async=True,
    )
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
    p, alpha, grew, m_i, l_i = _softmax_step(
        qk, m_i, l_i, qk_scale, offs_m, cols, causal_shift, CAUSAL, EMULATED, RESCALE_TH
    )
    if P_SMEM:
        p_smem.index(0).store(p.to(q_smem.dtype))
        fence_async_shared()
        p_op = gl.to_tensor(0)  # P lives in p_smem; this only fills the loop's slot
    else:
        p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    # acc starts at zero: block 0's alpha need not be applied to it.
    grew = gl.to_tensor(0)
    acc, p_op, alpha, grew, m_i, l_i = _pipelined_blocks(
        acc, p_op, alpha, grew, m_i, l_i, q_smem, k_smem, v_smem, k_ready, v_ready, kv_empty,
        turns, turns_peer, p_smem, kv_base, turn_parity, 1, gl.maximum(n_full, 1), qk_scale, offs_m,
        causal_shift, s_layout, o_layout, p_layout, BLOCK_M, BLOCK_N, STAGES, False, CONSUMER,
        PINGPONG, EMULATED, RESCALE_TH, EARLY_QK, THREAD_RELEASE, P_SMEM,
    )  # fmt: skip
    acc, p_op, alpha, grew, m_i, l_i = _pipelined_blocks(
        acc, p_op, alpha, grew, m_i, l_i, q_smem, k_smem, v_smem, k_ready, v_ready, kv_empty,
        turns, turns_peer, p_smem, kv_base, turn_parity, gl.maximum(n_full, 1), n_blocks, qk_scale,
        offs_m, causal_shift, s_layout, o_layout, p_layout, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
        CONSUMER, PINGPONG, EMULATED, RESCALE_TH, EARLY_QK, THREAD_RELEASE, P_SMEM,
    )  # fmt: skip
    if PERSISTENT:
        # Every score wgmma of this tile has completed (waited for above): Q's slot is free.
        mbarrier.arrive(q_empty, count=1)

    # The last block's P @ V.
    last = kv_base + n_blocks - 1
    slot = last % STAGES
    acc = _rescale(acc, alpha, grew, row_o, RESCALE_TH)
    mbarrier.wait(v_ready.index(slot), (last // STAGES) & 1)
    if P_SMEM:
        last_p = p_smem.index((n_blocks - 1) % 2)
        acc = warpgroup_mma(last_p, v_smem.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    else:
        acc = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    if THREAD_RELEASE:
        _release(kv_empty.index(slot))
    else:
        mbarrier.arrive(kv_empty.index(slot), count=1)

    # Every row saw key 0, so l_i > 0.
    acc = acc / gl.convert_layout(l_i, row_o)[:, None]
    lse = m_i + gl.log2(l_i)  # base 2, as kernel.py's backward reads it
    gl.store(LSE + lse_row + gl.arange(0, BLOCK_M, layout=row_s), lse)
    if PERSISTENT:
        # Straight from the accumulator's registers: Q's slot already holds the next tile.
        rows = gl.arange(0, BLOCK_M, layout=row_o)
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        base = Out + o_row.to(gl.int64) * HEAD_DIM
        gl.store(base + (rows[:, None] * HEAD_DIM + dims[None, :]), acc.to(q_smem.dtype))
    else:
        # Q's tile is dead (every wgmma reading it has completed): it holds O on its way out.
        q_smem.store(acc.to(q_smem.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(desc_o, [o_row, 0], q_smem)
        tma.store_wait(pendings=0)


@gluon.jit
def _tile(
    tile,
    num_m,
    n_q,
    n_k,
    num_heads,
    group_size,
    n_bh,
    CAUSAL: gl.constexpr,
    TILE_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    PERSISTENT: gl.constexpr,
):
    """Tile number -> (first Q row in the flat (B*H*Nq, D) view, first query index in the
    sequence, first K/V row in the flat (B*Hkv*Nk, D) view, key blocks to visit). Causal tiles
    are numbered longest first, so the last tiles to start are short ones.

    One tile per program: the tiles of one head are consecutive, so the programs running at
    the same time share K/V through L2. Persistent: heads go in groups of GROUP_HEADS, inside
    which the query block is the slow index. Program p runs tiles p, p + P, p + 2P, ...; had
    each head's tiles been consecutive, P (the SM count, 132) modulo the tiles per head would
    give program p only some query blocks (the short causal ones, say) and its neighbour
    others. Across a group the block index changes every GROUP_HEADS tiles, so every program
    samples all of them, and the ~P tiles in flight still read only a few heads' K/V."""
    if PERSISTENT:
        group = tile // (GROUP_HEADS * num_m)
        heads = gl.minimum(n_bh - group * GROUP_HEADS, GROUP_HEADS)
        u = tile - group * (GROUP_HEADS * num_m)
        bh = group * GROUP_HEADS + u % heads
        pid_m = u // heads
    else:
        bh = tile // num_m  # b * H + h
        pid_m = tile % num_m
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    b = bh // num_heads
    hkv = (bh % num_heads) // group_size
    start_m0 = pid_m * TILE_M
    q_row0 = bh * n_q + start_m0
    kv_row0 = (b * (num_heads // group_size) + hkv) * n_k
    if CAUSAL:
        # Keys up to the last row's diagonal: query i sees key j iff j <= i + (Nk - Nq).
        n_blocks = gl.cdiv(gl.minimum(start_m0 + TILE_M + n_k - n_q, n_k), BLOCK_N)
    else:
        n_blocks = n_k // BLOCK_N
    return q_row0, start_m0, kv_row0, n_blocks


@gluon.jit
def _consumer_partition(
    desc_o,
    Out,
    LSE,
    q_bufs,
    k_smem,
    v_smem,
    q_bars,
    q_empty,
    k_ready,
    v_ready,
    kv_empty,
    turns,
    turns_peer,
    first,
    step,
    n_tiles,
    num_m,
    n_q,
    n_k,
    num_heads,
    group_size,
    qk_scale,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    CONSUMER: gl.constexpr,
    PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
    EMULATED: gl.constexpr,
    RESCALE_TH: gl.constexpr,
    EARLY_QK: gl.constexpr,
    THREAD_RELEASE: gl.constexpr,
    P_SMEM: gl.constexpr,
):
    """Consumer warpgroup number ``CONSUMER``: its own BLOCK_M rows of each of the program's
    tiles (``first``, ``first + step``, ...)."""
    if P_SMEM:
        # P of two consecutive key blocks, as the A operand of the P @ V wgmma.
        p_smem = gl.allocate_shared_memory(
            q_bufs.dtype,
            [2, BLOCK_M, BLOCK_N],
            gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], q_bufs.dtype),
        )
    else:
        p_smem = q_bufs  # unused
    kv_base = 0
    for tile in range(first, n_tiles, step):
        it = (tile - first) // step  # this program's tile count so far
        q_row0, start_m0, kv_row0, n_blocks = _tile(
            tile, num_m, n_q, n_k, num_heads, group_size, n_tiles // num_m, CAUSAL,
            NUM_CONSUMERS * BLOCK_M, BLOCK_N, PERSISTENT,
        )  # fmt: skip
        row = q_row0 + CONSUMER * BLOCK_M
        _consumer(
            q_bufs.index(CONSUMER), k_smem, v_smem, q_bars.index(CONSUMER),
            q_empty.index(CONSUMER), k_ready, v_ready, kv_empty, turns, turns_peer, p_smem,
            desc_o, Out, LSE, row, row, start_m0 + CONSUMER * BLOCK_M, n_q, n_k, n_blocks,
            kv_base, it & 1, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, CONSUMER,
            PINGPONG, PERSISTENT, EMULATED, RESCALE_TH, EARLY_QK, THREAD_RELEASE, P_SMEM,
        )  # fmt: skip
        kv_base += n_blocks


@gluon.jit
def _loader(
    desc_q,
    desc_k,
    desc_v,
    q_bufs,
    k_smem,
    v_smem,
    q_bars,
    q_empty,
    k_ready,
    v_ready,
    kv_empty,
    first,
    step,
    n_tiles,
    num_m,
    n_q,
    n_k,
    num_heads,
    group_size,
    CAUSAL: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    PERSISTENT: gl.constexpr,
):
    """The producer warp: per tile, each consumer's Q once that consumer has released its Q
    slot, then K_j and V_j into ring slot (g % STAGES), g counting the program's key blocks
    over all its tiles, once every consumer has released that slot's previous contents."""
    kv_base = 0
    for tile in range(first, n_tiles, step):
        it = (tile - first) // step  # this program's tile count so far
        q_row0, start_m0, kv_row0, n_blocks = _tile(
            tile, num_m, n_q, n_k, num_heads, group_size, n_tiles // num_m, CAUSAL,
            NUM_CONSUMERS * BLOCK_M, BLOCK_N, PERSISTENT,
        )  # fmt: skip
        for c in gl.static_range(NUM_CONSUMERS):
            # A fresh mbarrier counts as having completed the phase before phase 0: the first
            # wait (parity 1) passes at once; so do the first STAGES waits on kv_empty below.
            mbarrier.wait(q_empty.index(c), (it & 1) ^ 1)
            mbarrier.expect(q_bars.index(c), desc_q.block_type.nbytes)
            tma.async_copy_global_to_shared(
                desc_q, [q_row0 + c * BLOCK_M, 0], q_bars.index(c), q_bufs.index(c)
            )
        for j in range(n_blocks):
            g = kv_base + j
            slot = g % STAGES
            mbarrier.wait(kv_empty.index(slot), ((g // STAGES) & 1) ^ 1)
            row = kv_row0 + j * BLOCK_N
            mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
            tma.async_copy_global_to_shared(
                desc_k, [row, 0], k_ready.index(slot), k_smem.index(slot)
            )
            mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
            tma.async_copy_global_to_shared(
                desc_v, [row, 0], v_ready.index(slot), v_smem.index(slot)
            )
        kv_base += n_blocks


@gluon.jit
def _attn_fwd_body(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    Out,
    LSE,
    qk_scale,
    n_q,
    n_k,
    num_heads,
    group_size,
    n_bh,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
    EMULATED: gl.constexpr,
    RESCALE_TH: gl.constexpr,
    EARLY_QK: gl.constexpr,
    THREAD_RELEASE: gl.constexpr,
    P_SMEM: gl.constexpr,
):
    """The kernel (``_attn_fwd_ws`` and ``_attn_fwd_ws_run12`` launch it).

    desc_q/desc_o: (B*H*Nq, D) with (BLOCK_M, D) tiles; desc_k/desc_v: (B*Hkv*Nk, D) with
    (BLOCK_N, D) tiles; Out: the same (B*H*Nq, D) as desc_o; LSE: (B*H*Nq,). A tile is
    NUM_CONSUMERS * BLOCK_M query rows of one head; there are (Nq / tile) * n_bh of them.

    Grid: (Nq / tile, B * H), one tile per program; or, PERSISTENT, (programs, 1) with
    programs <= the SM count, each taking tiles ``pid, pid + programs, ...`` so that the next
    tile's loads overlap the current one's last matmuls and stores."""
    TILE_M: gl.constexpr = NUM_CONSUMERS * BLOCK_M
    num_m = n_q // TILE_M
    n_tiles = num_m * n_bh
    first = gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)
    step = gl.num_programs(0) * gl.num_programs(1)

    dtype: gl.constexpr = desc_q.dtype
    q_bufs = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, BLOCK_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_bars.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        if THREAD_RELEASE:
            # Every thread of every consumer releases the slot (_release).
            mbarrier.init(kv_empty.index(s), count=NUM_CONSUMERS * _CONSUMER_THREADS)
        else:
            mbarrier.init(kv_empty.index(s), count=NUM_CONSUMERS)  # each consumer releases once
    if THREAD_RELEASE:
        # Ping-pong turns released by every thread (_release): one barrier per consumer, each
        # its own allocation (turns_0: consumer 0 waits on it, consumer 1 arrives; turns_1 the
        # other way round). Two slots of one allocation would read to Triton's barrier pass as
        # one location written by one warpgroup and read by the other, and it would put a
        # bar.sync before every arrive again.
        turns_0 = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        turns_1 = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(turns_0.index(0), count=_CONSUMER_THREADS)
        mbarrier.init(turns_1.index(0), count=_CONSUMER_THREADS)
        if PINGPONG:
            gl.static_assert(NUM_CONSUMERS == 2, "ping-pong needs two consumer warpgroups")
            # consumer 0 issues first
            mbarrier.arrive(turns_0.index(0), count=_CONSUMER_THREADS)
    else:
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(2):
            mbarrier.init(turns.index(c), count=1)
        if PINGPONG:
            gl.static_assert(NUM_CONSUMERS == 2, "ping-pong needs two consumer warpgroups")
            mbarrier.arrive(turns.index(0), count=1)  # consumer 0 issues first
        # Each consumer indexes the one allocation by its number.
        turns_0 = turns
        turns_1 = turns

    # The partitions' arguments: descriptors, shared-memory views and scalars (only the
    # default partition may take tensors).
    if NUM_CONSUMERS == 2:
        gl.warp_specialize(
            [
                (
                    _consumer_partition,
                    (
                        desc_o, Out, LSE, q_bufs, k_smem, v_smem, q_bars, q_empty, k_ready,
                        v_ready, kv_empty, turns_0, turns_1, first, step, n_tiles, num_m, n_q, n_k,
                        num_heads, group_size, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM,
                        STAGES, NUM_CONSUMERS, 0, PINGPONG, PERSISTENT, EMULATED, RESCALE_TH,
                        EARLY_QK, THREAD_RELEASE, P_SMEM,
                    ),
                ),
                (
                    _consumer_partition,
                    (
                        desc_o, Out, LSE, q_bufs, k_smem, v_smem, q_bars, q_empty, k_ready,
                        v_ready, kv_empty, turns_1, turns_0, first, step, n_tiles, num_m, n_q, n_k,
                        num_heads, group_size, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM,
                        STAGES, NUM_CONSUMERS, 1, PINGPONG, PERSISTENT, EMULATED, RESCALE_TH,
                        EARLY_QK, THREAD_RELEASE, P_SMEM,
                    ),
                ),
                (
                    _loader,
                    (
                        desc_q, desc_k, desc_v, q_bufs, k_smem, v_smem, q_bars, q_empty,
                        k_ready, v_ready, kv_empty, first, step, n_tiles, num_m, n_q, n_k,
                        num_heads, group_size, CAUSAL, NUM_CONSUMERS, BLOCK_M, BLOCK_N, STAGES,
                        PERSISTENT,
                    ),
                ),
            ],
            [4, LOADER_WARPS],
            [CONSUMER_REGS, LOADER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (
                    _consumer_partition,
                    (
                        desc_o, Out, LSE, q_bufs, k_smem, v_smem, q_bars, q_empty, k_ready,
                        v_ready, kv_empty, turns_0, turns_1, first, step, n_tiles, num_m, n_q, n_k,
                        num_heads, group_size, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM,
                        STAGES, NUM_CONSUMERS, 0, PINGPONG, PERSISTENT, EMULATED, RESCALE_TH,
                        EARLY_QK, THREAD_RELEASE, P_SMEM,
                    ),
                ),
                (
                    _loader,
                    (
                        desc_q, desc_k, desc_v, q_bufs, k_smem, v_smem, q_bars, q_empty,
                        k_ready, v_ready, kv_empty, first, step, n_tiles, num_m, n_q, n_k,
                        num_heads, group_size, CAUSAL, NUM_CONSUMERS, BLOCK_M, BLOCK_N, STAGES,
                        PERSISTENT,
                    ),
                ),
            ],
            [LOADER_WARPS],
            [LOADER_REGS],
        )  # fmt: skip


@gluon.jit
def _attn_fwd_ws(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    Out,
    LSE,
    qk_scale,
    n_q,
    n_k,
    num_heads,
    group_size,
    n_bh,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
    EMULATED: gl.constexpr = 0,
    RESCALE_TH: gl.constexpr = 0.0,
    EARLY_QK: gl.constexpr = False,
):
    """The forward: see ``_attn_fwd_body``; K/V slots and ping-pong turns released by one
    thread per consumer after a warpgroup ``bar.sync`` (``mbarrier.arrive``)."""
    _attn_fwd_body(
        desc_q, desc_k, desc_v, desc_o, Out, LSE, qk_scale, n_q, n_k, num_heads, group_size,
        n_bh, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, NUM_CONSUMERS, CONSUMER_REGS,
        PINGPONG, PERSISTENT, EMULATED, RESCALE_TH, EARLY_QK, False, False,
    )  # fmt: skip


# A kernel of its own rather than more constexprs of ``_attn_fwd_ws``: that kernel's signature
# is what ``gluon_offline`` compiles, and stays as it was.
@gluon.jit
def _attn_fwd_ws_run12(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    Out,
    LSE,
    qk_scale,
    n_q,
    n_k,
    num_heads,
    group_size,
    n_bh,
    CAUSAL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PINGPONG: gl.constexpr,
    PERSISTENT: gl.constexpr,
    EMULATED: gl.constexpr = 0,
    RESCALE_TH: gl.constexpr = 0.0,
    EARLY_QK: gl.constexpr = False,
    THREAD_RELEASE: gl.constexpr = False,
    P_SMEM: gl.constexpr = False,
):
    """The forward with run 12's options: ``GluonConfig.thread_release`` (every consumer thread
    arrives on the K/V slot's "empty" barrier and the ping-pong turn itself, ``_release``, no
    ``bar.sync``) and ``GluonConfig.p_smem`` (P through shared memory)."""
    _attn_fwd_body(
        desc_q, desc_k, desc_v, desc_o, Out, LSE, qk_scale, n_q, n_k, num_heads, group_size,
        n_bh, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, NUM_CONSUMERS, CONSUMER_REGS,
        PINGPONG, PERSISTENT, EMULATED, RESCALE_TH, EARLY_QK, THREAD_RELEASE, P_SMEM,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Configurations and the launcher


@dataclasses.dataclass(frozen=True)
class GluonConfig:
    """One tiling of the warp-specialized forward."""

    block_m: int  # query rows per consumer warpgroup
    block_n: int  # keys per block
    stages: int  # key/value slots in the ring
    consumers: int  # consumer warpgroups per program (1 or 2)
    pingpong: bool = False  # two consumers take turns to issue their wgmmas
    persistent: bool = False  # one program per SM, looping over tiles
    emulated: int = 0  # of every EXP2_PACK exp2s of a thread, how many by the FMA polynomial
    rescale: float = 0.0  # > 0: rescale only when a row max grows by more (FA4's conditional)
    early_qk: bool = False  # issue the score wgmma before rescaling acc for P @ V (run 11)
    # Release K/V slots (and ping-pong turns) by every consumer thread's own arrive, with no
    # warpgroup bar.sync before one thread's (run 12; ``_attn_fwd_ws_run12``).
    thread_release: bool = False
    # P of each key block through shared memory (two buffers per consumer) as the A operand of
    # P @ V, instead of registers, so that ptxas keeps the softmax overlapped with the P @ V
    # wgmma in flight (run 12; ``_attn_fwd_ws_run12``).
    p_smem: bool = False

    @property
    def tile_m(self) -> int:
        """Query rows per program."""
        return self.block_m * self.consumers


# Per head dim: registers per consumer thread are BLOCK_M * (HEAD_DIM + 2 * BLOCK_N) / 128
# fp32 values for O and two score tiles, plus P; shared memory is the Q tiles plus
# STAGES * 2 * BLOCK_N * HEAD_DIM * 2 bytes (of 227 KiB: (64, 128, 3, 2) at D=128 takes 224).
# None spills (offline sm_90a compiles). The first entry is the default: the fastest in two
# same-run sweeps on an H200 (docs/benchmarks/attention.md), which also timed and dropped
# 2-slot rings and a single 128-row consumer; 128-row tiles with 128-key blocks spill. The
# others stay, tested, as the alternatives measured: ping-pong ran -9% to +2% against letting
# the two warpgroups interleave freely; persistent programs (with or without ping-pong) ran
# 0.81-0.99x the default at D=128, N >= 4096 and were faster only at N=1024 (run 9b). At D=64
# the first entry (ping-pong, persistent, score wgmma first) was the fastest tiling or within
# 1% of it on every N >= 4096 row of run 11e, 0.94-0.99x cuDNN, 1.00-1.06x the Triton forward;
# at D=64 ``auto`` runs it for non-causal calls from 16384 keys on
# (kernel.GLUON_FORWARD_NONCAUSAL_MIN_KEYS, run 13) and the Triton forward otherwise.
CONFIGS: dict[int, tuple[GluonConfig, ...]] = {
    64: (
        GluonConfig(64, 128, 3, 2, pingpong=True, persistent=True, early_qk=True),
        GluonConfig(128, 64, 3, 2),
        GluonConfig(64, 128, 3, 2),
        GluonConfig(128, 64, 3, 2, pingpong=True),
        GluonConfig(128, 64, 3, 2, persistent=True),
        GluonConfig(64, 128, 3, 2, persistent=True),
        GluonConfig(64, 128, 3, 2, pingpong=True, persistent=True),
    ),
    128: (
        GluonConfig(64, 128, 3, 2),
        GluonConfig(64, 64, 4, 2),
        GluonConfig(64, 128, 3, 2, pingpong=True),
        GluonConfig(64, 128, 3, 2, persistent=True),
        GluonConfig(64, 128, 3, 2, pingpong=True, persistent=True),
    ),
}


# Levers measured at D=64 on an H200 (docs/benchmarks/attention.md, runs 11 and 12) and not
# faster than CONFIGS[64][0] there: FlashAttention-4's software exp2 for 1, 2 or 4 of every 8
# exponentials, its conditional rescaling (threshold 8, base 2), and the score wgmma issued
# first on the 128/64 tiling, alone and together (run 11); the slot release by every thread
# and P through shared memory (run 12: -9% to +1% and -6% to -1% against the same tiling
# without them at N >= 4096). Correct (gpu tier), kept so that the measurement can be
# repeated (``gluon_sweep --levers``); not swept by default.
LEVER_CONFIGS: dict[int, tuple[GluonConfig, ...]] = {
    64: (
        GluonConfig(128, 64, 3, 2, emulated=1),
        GluonConfig(128, 64, 3, 2, emulated=2),
        GluonConfig(128, 64, 3, 2, emulated=4),
        GluonConfig(128, 64, 3, 2, rescale=8.0),
        GluonConfig(128, 64, 3, 2, early_qk=True),
        GluonConfig(128, 64, 3, 2, emulated=2, rescale=8.0, early_qk=True),
        GluonConfig(64, 128, 3, 2, emulated=2),
        GluonConfig(64, 128, 3, 2, emulated=2, rescale=8.0, early_qk=True),
        GluonConfig(
            64, 128, 3, 2, pingpong=True, persistent=True, emulated=2, rescale=8.0, early_qk=True
        ),
        # Run 12: K/V slots and ping-pong turns released by every consumer thread, no
        # warpgroup bar.sync (``thread_release``); P through shared memory (``p_smem``).
        GluonConfig(
            64, 128, 3, 2, pingpong=True, persistent=True, early_qk=True, thread_release=True
        ),
        GluonConfig(128, 64, 3, 2, thread_release=True),
        GluonConfig(64, 128, 3, 2, thread_release=True),
        GluonConfig(64, 128, 3, 2, pingpong=True, persistent=True, early_qk=True, p_smem=True),
        GluonConfig(
            64,
            128,
            3,
            2,
            pingpong=True,
            persistent=True,
            early_qk=True,
            thread_release=True,
            p_smem=True,
        ),  # fmt: skip
        GluonConfig(128, 64, 3, 2, thread_release=True, p_smem=True),
        GluonConfig(64, 128, 3, 2, thread_release=True, p_smem=True),
        GluonConfig(
            64, 128, 3, 2, persistent=True, early_qk=True, thread_release=True, p_smem=True
        ),
    ),
}


def unsupported_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    config: GluonConfig | None = None,
) -> str | None:
    """None when this kernel (with ``config``, default the head dim's first) computes what
    ``kernel.attention`` would for these inputs, else why not."""
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
    n_q, n_k = q.shape[2], k.shape[2]
    # Whole tiles only: there is no ragged end to mask.
    if n_q % cfg.tile_m or n_k % cfg.block_n:
        return f"needs Nq % {cfg.tile_m} == 0 and Nk % {cfg.block_n} == 0, got {n_q} and {n_k}"
    # Causal with Nq > Nk leaves rows that see no key (the Triton kernel's zeros convention).
    if causal and n_k < n_q:
        return f"causal needs Nk >= Nq, got Nq={n_q}, Nk={n_k}"
    return None


def supports(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    config: GluonConfig | None = None,
) -> bool:
    """Whether :func:`attention_forward` computes exactly what ``kernel.attention`` would."""
    return unsupported_reason(q, k, v, causal, config) is None


@functools.cache
def _layouts(block_m: int, block_n: int, d: int, dtype: torch.dtype) -> tuple[object, object]:
    """The shared-memory layouts of the Q/O and K/V tiles (pure functions of the tiling)."""
    gdtype = gl.float16 if dtype == torch.float16 else gl.bfloat16
    return (
        gl.NVMMASharedLayout.get_default_for([block_m, d], gdtype),
        gl.NVMMASharedLayout.get_default_for([block_n, d], gdtype),
    )


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    config: GluonConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): o (B, H, Nq, D) in q's dtype, lse (B, H, Nq) fp32 in base 2. Inputs must pass
    :func:`supports`."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    cfg = config or CONFIGS[d][0]
    o = torch.empty_like(q)  # (B, H, Nq, D)
    lse = torch.empty((b, h, n_q), device=q.device, dtype=torch.float32)
    q_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, d, q.dtype)
    q_rows, kv_rows = b * h * n_q, b * h_kv * n_k
    # Contiguous inputs (``supports``): the flat (rows, D) views need no reshape.
    desc_q = TensorDescriptor(q, [q_rows, d], [d, 1], [cfg.block_m, d], q_layout)
    desc_k = TensorDescriptor(k, [kv_rows, d], [d, 1], [cfg.block_n, d], kv_layout)
    desc_v = TensorDescriptor(v, [kv_rows, d], [d, 1], [cfg.block_n, d], kv_layout)
    desc_o = TensorDescriptor(o, [q_rows, d], [d, 1], [cfg.block_m, d], q_layout)
    num_m = n_q // cfg.tile_m
    if cfg.persistent:
        grid: tuple[int, int] = (min(num_m * b * h, _sm_count(q.device.index or 0)), 1)
    else:
        grid = (num_m, b * h)
    run12 = {}
    if cfg.thread_release or cfg.p_smem:
        run12 = {"THREAD_RELEASE": cfg.thread_release, "P_SMEM": cfg.p_smem}
    fwd = _attn_fwd_ws_run12 if run12 else _attn_fwd_ws
    fwd[grid](
        desc_q, desc_k, desc_v, desc_o, o, lse, sm_scale * LOG2E, n_q, n_k, h, h // h_kv, b * h,
        CAUSAL=causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d,
        STAGES=cfg.stages, NUM_CONSUMERS=cfg.consumers,
        CONSUMER_REGS=CONSUMER_REGS[cfg.consumers], PINGPONG=cfg.pingpong,
        PERSISTENT=cfg.persistent, EMULATED=cfg.emulated, RESCALE_TH=cfg.rescale,
        EARLY_QK=cfg.early_qk, **run12,
        num_warps=WARPS_PER_CONSUMER, maxnreg=KERNEL_MAXNREG[cfg.consumers],
    )  # fmt: skip
    return o, lse
