"""The warp-specialized Gluon forward (reference_impls/attention/gluon_fwd.py) and backward
(gluon_bwd.py) on an sm_90 GPU: every tiling against a float64 reference, through
``attention(..., forward="gluon")`` with kernel.py's backward reading its log-sum-exp and
through ``attention(..., backward="gluon")``, and the dispatch of ``forward="auto"`` and
``backward="auto"``.

As in test_attention_gpu.py, reference_impls.attention is imported inside a fixture, never at
module import (the unit suites set TRITON_INTERPRET before they import it).
"""

import math

import pytest
import torch
import triton
from attention_cases import CASES, FWD_TOL, GRAD_TOL

from harness import assert_equal, rel_error

HOPPER = (9, 0)

pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False)",
    ),
    pytest.mark.skipif(
        bool(triton.knobs.runtime.interpret),
        reason="TRITON_INTERPRET is set: Gluon kernels do not run in the interpreter",
    ),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() != HOPPER,
        reason="the Gluon forward is written for sm_90 (Hopper) GPUs only",
    ),
]

# Shapes the Gluon kernel covers (whole tiles; causal with Nk >= Nq): (B, H, Hkv, Nq, Nk, D,
# causal). Grouped-query heads, Nq != Nk both ways round the causal diagonal's offset, and a
# sequence long enough for the causal split into unmasked and diagonal blocks to matter.
GLUON_CASES = {
    "d128-n2048": CASES["d128-n2048"],
    "d128-n2048-causal": CASES["d128-n2048-causal"],
    "gqa-d128-causal": CASES["gqa-d128-causal"],
    "d64-n1024-causal": CASES["d64-n1024-causal"],
    "d128-nq512-nk2048-causal": (1, 4, 4, 512, 2048, 128, True),
    "gqa-d64-nq256-nk1280": (1, 4, 2, 256, 1280, 64, False),
    "d128-n4096-causal": (1, 2, 2, 4096, 4096, 128, True),
}


@pytest.fixture(scope="module")
def attn():
    from reference_impls import attention

    return attention


@pytest.fixture(scope="module")
def gluon_fwd():
    from reference_impls.attention import gluon_fwd

    return gluon_fwd


def _inputs(shape, dtype, seed, requires_grad=False):
    b, h, h_kv, n_q, n_k, d, _ = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, generator=g)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_CASES))
def test_gluon_forward_and_gradients_match_float64(attn, case, dtype):
    causal = GLUON_CASES[case][-1]
    q, k, v = _inputs(GLUON_CASES[case], dtype, seed=0, requires_grad=True)
    out = attn.attention(q, k, v, causal=causal, forward="gluon")
    do = torch.randn_like(out)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attn.reference_attention(q64, k64, v64, causal=causal)
    ref.backward(do.double())
    errors = {"out": rel_error(out, ref)}
    for n, t, r in zip("qkv", (q, k, v), (q64, k64, v64), strict=True):
        errors[f"d{n}"] = rel_error(t.grad, r.grad)
    print(f"{case} {dtype}: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))
    assert errors["out"] <= FWD_TOL[dtype], errors
    # The gradients come from kernel.py's backward, which recomputes P from the Gluon
    # kernel's log-sum-exp: a wrong LSE shows up here.
    assert max(errors[n] for n in ("dq", "dk", "dv")) <= GRAD_TOL[dtype], errors


@pytest.mark.parametrize("d", [64, 128])
def test_every_tiling_matches_float64(gluon_fwd, attn, d):
    # The configs the benchmark sweeps, not only the default: each is a different schedule of
    # the same barriers (stages, rows per warpgroup, one or two consumers).
    for i, cfg in enumerate(gluon_fwd.CONFIGS[d]):
        for causal in (False, True):
            shape = (2, 4, 2, 1024, 1024, d, causal)
            q, k, v = _inputs(shape, torch.bfloat16, seed=i)
            assert gluon_fwd.supports(q, k, v, causal, cfg)
            o, lse = gluon_fwd.attention_forward(q, k, v, causal, 1 / math.sqrt(d), config=cfg)
            ref = attn.reference_attention(q.double(), k.double(), v.double(), causal=causal)
            assert rel_error(o, ref) <= FWD_TOL[torch.bfloat16], (cfg, causal)
            # The log-sum-exp in base 2, as kernel.py's backward reads it.
            kk = k.double().repeat_interleave(2, dim=1)
            s = q.double() @ kk.transpose(-2, -1) / math.sqrt(d)  # (B, H, Nq, Nk)
            if causal:
                s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
            lse_ref = torch.logsumexp(s, dim=-1) / math.log(2)
            # fp32 max + log2 of a sum of up to 1024 fp32 terms: ~1e-6 seen; 1e-4 leaves room.
            assert (lse.double() - lse_ref).abs().max().item() <= 1e-4, (cfg, causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_software_exp2_and_conditional_rescale_match_float64(gluon_fwd, attn, dtype):
    # gluon_fwd.LEVER_CONFIGS (not dispatched; measured no faster): some exponentials by a
    # polynomial on the FMA pipe instead of MUFU, the rescale skipped unless a row max grows by
    # more than 2**8. Scores scaled up (q * 16: a standard deviation of ~23 in base-2 units,
    # against 1.4) so that exp2 meets arguments below -126 (the clamp) and row maxima grow by
    # more than 8 between key blocks (the rescale branch is taken, and skipped elsewhere).
    # Each must stay as close to float64 as the default tiling on the same inputs: a wrong
    # coefficient or exponent shift would cost far more than that margin.
    levers = gluon_fwd.LEVER_CONFIGS[64]
    # 128/64 with all three; 64/128 ping-pong persistent with all three.
    pp = next(c for c in levers if c.pingpong and c.emulated and c.rescale and c.early_qk)
    for cfg in (levers[5], pp):
        for causal in (False, True):
            shape = (2, 4, 2, 1024, 1024, 64, causal)
            q, k, v = _inputs(shape, dtype, seed=7)
            q = q * 16
            assert gluon_fwd.supports(q, k, v, causal, cfg)
            scale = 1 / math.sqrt(64)
            o, lse = gluon_fwd.attention_forward(q, k, v, causal, scale, config=cfg)
            o0, lse0 = gluon_fwd.attention_forward(q, k, v, causal, scale)
            ref = attn.reference_attention(q.double(), k.double(), v.double(), causal=causal)
            err, err0 = rel_error(o, ref), rel_error(o0, ref)
            print(f"{cfg} causal={causal} {dtype}: {err:.2e} (default tiling {err0:.2e})")
            assert err <= FWD_TOL[dtype], (cfg, causal, err)
            assert err <= 1.25 * err0 + 1e-4, (cfg, causal, err, err0)
            # The log-sum-exp with a stale running max: m + log2(l) still matches, up to the
            # polynomial's relative error in l (8.6e-5, i.e. 1.2e-4 in log2 units) and fp32
            # rounding of values near 100 (7.6e-6 apart).
            assert (lse - lse0).abs().max().item() <= 2.5e-4, (cfg, causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_thread_release_and_p_in_shared_memory_match_float64(gluon_fwd, attn, dtype):
    # gluon_fwd.LEVER_CONFIGS with run 12's options. thread_release: every consumer thread
    # arrives on the K/V slot's "empty" barrier (and the ping-pong turn) itself, with no
    # bar.sync, against an expected count of 128 per warpgroup; a wrong count deadlocks or
    # lets the producer overwrite a slot still being read. p_smem: P through two shared-memory
    # buffers per consumer; a wrong buffer index or a missing fence reads another block's P.
    # Either shows as an error far over the default tiling's on the same inputs. Shapes with
    # more tiles than SMs (persistent programs take several, through one ring), grouped-query
    # heads, Nq != Nk, causal and not.
    levers = [c for c in gluon_fwd.LEVER_CONFIGS[64] if c.thread_release or c.p_smem]
    assert levers
    shapes = ((2, 4, 2, 1024, 1024, 64), (3, 40, 40, 1024, 1024, 64), (1, 4, 4, 512, 2048, 64))
    for cfg in levers:
        for i, (b, h, h_kv, n_q, n_k, d) in enumerate(shapes):
            for causal in (False, True):
                q, k, v = _inputs((b, h, h_kv, n_q, n_k, d, causal), dtype, seed=31 + i)
                assert gluon_fwd.supports(q, k, v, causal, cfg)
                scale = 1 / math.sqrt(d)
                o, lse = gluon_fwd.attention_forward(q, k, v, causal, scale, config=cfg)
                o0, lse0 = gluon_fwd.attention_forward(q, k, v, causal, scale)
                ref = attn.reference_attention(q.double(), k.double(), v.double(), causal=causal)
                err, err0 = rel_error(o, ref), rel_error(o0, ref)
                print(f"{cfg} {(b, h, h_kv, n_q, n_k)} causal={causal} {dtype}: {err:.2e}"
                      f" (default tiling {err0:.2e})")  # fmt: skip
                assert err <= FWD_TOL[dtype], (cfg, causal, err)
                assert err <= 1.25 * err0 + 1e-4, (cfg, causal, err, err0)
                # The same softmax as the default tiling: only the barriers changed.
                assert (lse - lse0).abs().max().item() <= 1e-4, (cfg, causal)


def test_auto_picks_gluon_only_where_it_measured_faster(attn):
    # "auto" runs the kernel kernel.gluon_forward_by_default names (the same bits as forcing
    # it), at both head dims, both masks, and at D=64 on either side of the key count from
    # which non-causal calls take the Gluon forward (run 13: 16384): Nk = 8192 and 16384,
    # one head each so the long rows stay small.
    from reference_impls.attention import kernel

    shapes = [(2, 4, 4, 1024, 1024, d) for d in (128, 64)]
    shapes += [(1, 1, 1, n, n, 64) for n in (8192, 16384)]
    picked = set()
    for b, h, h_kv, n_q, n_k, d in shapes:
        for causal in (True, False):
            q, k, v = _inputs((b, h, h_kv, n_q, n_k, d, causal), torch.bfloat16, seed=d + n_k)
            auto = attn.attention(q, k, v, causal=causal)
            gluon = kernel.gluon_forward_by_default(d, causal, n_k)
            expected = "gluon" if gluon else "triton"
            forced = attn.attention(q, k, v, causal=causal, forward=expected)
            assert_equal(auto, forced, bitwise=True)
            picked.add((d, causal, n_k >= 16384, expected))
    # The policy measured in run 13, as the table says: D=128 always Gluon; D=64 causal
    # always Triton; D=64 non-causal Gluon from 16384 keys on.
    assert (64, False, True, "gluon") in picked and (64, False, False, "triton") in picked
    assert (64, True, True, "triton") in picked and (128, True, False, "gluon") in picked


def test_shapes_the_gluon_kernel_does_not_cover_fall_back_to_triton(attn):
    # Ragged lengths and causal with Nq > Nk: "auto" takes the Triton forward (same bits as
    # forcing it); forcing Gluon is an error that says why.
    for shape in ((1, 4, 4, 1000, 1531, 128, True), (1, 4, 4, 1024, 512, 128, True)):
        causal = shape[-1]
        q, k, v = _inputs(shape, torch.bfloat16, seed=1)
        auto = attn.attention(q, k, v, causal=causal)
        assert_equal(auto, attn.attention(q, k, v, causal=causal, forward="triton"), bitwise=True)
        with pytest.raises(ValueError, match="forward='gluon' cannot run this call"):
            attn.attention(q, k, v, causal=causal, forward="gluon")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_programs_cover_every_tile_once(gluon_fwd, attn, causal):
    # More tiles than SMs, in a count no grid divides evenly (3 * 6 heads * 16 tiles = 288 over
    # 132 SMs on an H200), with grouped-query heads: each program runs tiles of several heads
    # through one ring, so a wrong ring phase, Q hand-over or tile number shows up as a wrong
    # row somewhere. Every persistent tiling of both head dims.
    for d in (64, 128):
        for cfg in (c for c in gluon_fwd.CONFIGS[d] if c.persistent):
            q, k, v = _inputs((3, 6, 2, 2048, 2048, d, causal), torch.bfloat16, seed=d)
            assert gluon_fwd.supports(q, k, v, causal, cfg)
            o, lse = gluon_fwd.attention_forward(q, k, v, causal, 1 / math.sqrt(d), config=cfg)
            ref = attn.reference_attention(q.double(), k.double(), v.double(), causal=causal)
            # Row by row: a tile computed twice or never would leave some rows far off while
            # the norm over the whole tensor stayed small. One row's bf16 rounding error is of
            # the whole tensor's size (~2e-3); twice the suite's bf16 tolerance covers the
            # worst of 37k rows and is still far below a wrong row's (~1).
            err = (o.double() - ref).norm(dim=-1) / ref.norm(dim=-1)
            assert err.max().item() <= 2 * FWD_TOL[torch.bfloat16], (cfg, err.max().item())
            assert torch.isfinite(lse).all(), cfg


# ---------------------------------------------------------------------------------------------
# The Gluon backward (reference_impls/attention/gluon_bwd.py): head dim 128, whole tiles.

GLUON_BWD_CASES = {n: c for n, c in GLUON_CASES.items() if c[5] == 128}


@pytest.fixture(scope="module")
def gluon_bwd():
    from reference_impls.attention import gluon_bwd

    return gluon_bwd


def _grads_vs_float64(attn, shape, dtype, seed, **kw):
    """{name: relative error} of the output and dq, dk, dv against float64 autograd."""
    causal = shape[-1]
    q, k, v = _inputs(shape, dtype, seed=seed, requires_grad=True)
    out = attn.attention(q, k, v, causal=causal, **kw)
    do = torch.randn_like(out)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attn.reference_attention(q64, k64, v64, causal=causal)
    ref.backward(do.double())
    errors = {"out": rel_error(out, ref)}
    for n, t, r in zip("qkv", (q, k, v), (q64, k64, v64), strict=True):
        errors[f"d{n}"] = rel_error(t.grad, r.grad)
    return errors


@pytest.mark.parametrize("mode", ["triton", "atomic"], ids=["dq-pass", "atomic-dq"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_BWD_CASES))
def test_gluon_backward_matches_float64(attn, case, dtype, mode, monkeypatch):
    # dQ from kernel.py's dQ pass (the default, kernel.GLUON_DQ_MODE) or added by the Gluon
    # dK/dV kernel's own fp32 reductions.
    from reference_impls.attention import kernel

    det = mode != "atomic"
    monkeypatch.setitem(kernel.GLUON_DQ_MODE, det, mode)
    errors = _grads_vs_float64(
        attn, GLUON_BWD_CASES[case], dtype, 0, backward="gluon", deterministic=det
    )
    print(f"{case} {dtype} {mode}: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))
    assert max(errors[n] for n in ("dq", "dk", "dv")) <= GRAD_TOL[dtype], errors


def test_every_backward_tiling_and_dq_way_matches_float64(gluon_bwd, attn, monkeypatch):
    # Each tiling of the dK/dV kernel and of the dQ kernel, each way of getting dQ (in-kernel
    # reductions, the Gluon dQ kernel, kernel.py's), causal or not, grouped-query heads
    # (several query heads stream through one program's ring).
    from reference_impls.attention import kernel

    dkdv, dqs = gluon_bwd.CONFIGS[128], gluon_bwd.DQ_CONFIGS[128]
    variants = [("atomic", c, dqs[0]) for c in dkdv] + [("triton", dkdv[0], dqs[0])]
    variants += [("gluon", dkdv[0], c) for c in dqs] + [("gluon", c, dqs[0]) for c in dkdv[1:]]
    for i, (mode, cfg, dq_cfg) in enumerate(variants):
        det = mode != "atomic"
        monkeypatch.setitem(gluon_bwd.CONFIGS, 128, (cfg,))
        monkeypatch.setitem(gluon_bwd.DQ_CONFIGS, 128, (dq_cfg,))
        monkeypatch.setitem(kernel.GLUON_DQ_MODE, det, mode)
        for causal in (False, True):
            shape = (2, 4, 2, 1024, 1024, 128, causal)
            errors = _grads_vs_float64(
                attn, shape, torch.bfloat16, i, backward="gluon", deterministic=det
            )
            worst = max(errors[n] for n in ("dq", "dk", "dv"))
            assert worst <= GRAD_TOL[torch.bfloat16], (mode, cfg, dq_cfg, causal, errors)


def test_auto_backward_picks_gluon_only_where_it_measured_faster(attn):
    from reference_impls.attention import kernel

    # deterministic=True: both kernels' gradients are then the same bits on every run.
    for d, causal in ((128, True), (128, False), (64, True)):
        q, k, v = _inputs((2, 4, 4, 1024, 1024, d, causal), torch.bfloat16, 5, True)
        do = torch.randn_like(q)
        expected = "gluon" if d in kernel.GLUON_BACKWARD_HEAD_DIMS else "triton"
        grads = {}
        for which in ("auto", expected):
            out = attn.attention(q, k, v, causal=causal, deterministic=True, backward=which)
            grads[which] = torch.autograd.grad(out, (q, k, v), do)
        for a, b in zip(grads["auto"], grads[expected], strict=True):
            assert_equal(a, b, bitwise=True)


def test_backward_shapes_the_gluon_kernel_does_not_cover_fall_back_to_triton(attn):
    # Ragged lengths, causal with Nq > Nk, D=64: "auto" runs the Triton backward (same bits
    # as forcing it, deterministic); forcing Gluon is an error that says why.
    for shape in (
        (1, 4, 4, 1000, 1531, 128, True),
        (1, 4, 4, 1024, 512, 128, True),
        (1, 4, 4, 1024, 1024, 64, False),
    ):
        causal = shape[-1]
        q, k, v = _inputs(shape, torch.bfloat16, 2, True)
        do = torch.randn_like(q)
        grads = {}
        for which in ("auto", "triton"):
            out = attn.attention(q, k, v, causal=causal, deterministic=True, backward=which)
            grads[which] = torch.autograd.grad(out, (q, k, v), do)
        for a, b in zip(grads["auto"], grads["triton"], strict=True):
            assert_equal(a, b, bitwise=True)
        with pytest.raises(ValueError, match="backward='gluon' cannot run this call"):
            attn.attention(q, k, v, causal=causal, backward="gluon")
