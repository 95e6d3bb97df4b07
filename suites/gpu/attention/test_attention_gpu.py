"""reference_impls.attention on a GPU: realistic shapes against SDPA's math backend in fp32
(both backwards: the default one pass with an atomic dQ, and the deterministic two passes),
bitwise determinism of the latter, and speed relative to SDPA's flash backend against a stored
baseline.

reference_impls.attention is imported inside the `attn` fixture, never at module import: on a
CPU machine this module is still collected (then skipped), and an import here would define the
kernels before the unit and property suites set TRITON_INTERPRET. The shapes are shared with
test_attention_fp8_gpu.py (attention_cases.py).
"""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton
from attention_cases import CASES, FWD_TOL, GRAD_TOL
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import assert_equal, assert_within, rel_error

pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False)",
    ),
    pytest.mark.skipif(
        bool(triton.knobs.runtime.interpret),
        reason="TRITON_INTERPRET is set: the kernels would run in the interpreter",
    ),
]

BASELINE = Path(__file__).with_name("speed_baseline.json")


@pytest.fixture(scope="module")
def attn():
    from reference_impls import attention

    return attention


def sdpa_math_fp32(q, k, v, causal):
    """SDPA's math backend on fp32 copies; causal masks bottom-right aligned, as the kernel's."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    n_q, n_k = q.shape[2], k.shape[2]
    mask = None
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None, :]
        mask = j <= i + (n_k - n_q)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
        )
    return out, (q, k, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_output_and_gradients_match_sdpa_math_in_fp32(attn, case, dtype):
    b, h, h_kv, n_q, n_k, d, causal = CASES[case]
    q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, requires_grad=True)
    out = attn.attention(q, k, v, causal=causal)
    do = torch.randn_like(out)
    out.backward(do)
    ref, leaves = sdpa_math_fp32(q, k, v, causal)
    ref.backward(do.float())
    errors = {"out": rel_error(out, ref)}
    errors.update(
        {
            f"d{n}": rel_error(t.grad, r.grad)
            for n, t, r in zip("qkv", (q, k, v), leaves, strict=True)
        }
    )
    print(f"{case} {dtype}: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))
    assert_within(errors["out"], FWD_TOL[dtype], msg=str(errors))
    assert_within(max(errors[n] for n in ("dq", "dk", "dv")), GRAD_TOL[dtype], msg=str(errors))


@pytest.mark.parametrize("d", [32, 256])
def test_small_and_large_head_dims(attn, d):
    q, k, v = (
        torch.randn(1, 4, 512, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    out = attn.attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    out.backward(do)
    ref, leaves = sdpa_math_fp32(q, k, v, True)
    ref.backward(do.float())
    assert rel_error(out, ref) <= FWD_TOL[torch.bfloat16]
    for t, r in zip((q, k, v), leaves, strict=True):
        assert rel_error(t.grad, r.grad) <= GRAD_TOL[torch.bfloat16]


EDGES = [
    (1, 1, False),
    (1, 300, True),
    (300, 1, True),
    (700, 77, True),
    (77, 700, True),
    (129, 255, False),
]


@pytest.mark.parametrize(
    "n_q, n_k, causal", EDGES, ids=[f"{q}x{k}{'-causal' if c else ''}" for q, k, c in EDGES]
)
def test_edge_lengths_against_float64(attn, n_q, n_k, causal):
    # One token, keys shorter than queries (rows that see no key: zeros), ragged tails: where
    # TMA's zero fill past a sequence's end replaces masks. float64 reference: SDPA's math
    # backend gives NaN for rows that see no key.
    q = torch.randn(2, 4, n_q, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.randn(2, 2, n_k, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(2)
    )
    out = attn.attention(q, k, v, causal=causal)
    do = torch.randn_like(out)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attn.reference_attention(q64, k64, v64, causal=causal)
    ref.backward(do.double())
    assert torch.isfinite(out).all()
    assert rel_error(out, ref) <= FWD_TOL[torch.bfloat16]
    for t, r in zip((q, k, v), (q64, k64, v64), strict=True):
        # With one key, dq and dk are exactly 0 in float64: compare against the output's scale.
        err = (t.grad.double() - r.grad).norm() / max(r.grad.norm(), 1e-3 * ref.norm())
        assert err <= GRAD_TOL[torch.bfloat16]


def test_transposed_inputs_are_read_in_place_with_the_same_result(attn):
    b, n, h, d = 2, 1000, 8, 128
    q, k, v = (
        torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        for _ in range(3)
    )  # (B, H, N, D) views of (B, N, H, D) memory
    assert not q.is_contiguous()
    assert_equal(
        attn.attention(q, k, v, causal=True),
        attn.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True),
        bitwise=True,
    )


def test_fp32_inputs_keep_fp32_accuracy(attn):
    q, k, v = (torch.randn(1, 4, 300, 64, device="cuda", requires_grad=True) for _ in range(3))
    out = attn.attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attn.reference_attention(q64, k64, v64, causal=True)
    ref.backward(do.double())
    # Full fp32 products (input_precision="ieee"), not tf32: ~1e-7 relative.
    assert rel_error(out, ref) <= FWD_TOL[torch.float32]
    for t, r in zip((q, k, v), (q64, k64, v64), strict=True):
        assert rel_error(t.grad, r.grad) <= GRAD_TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "case", ["d64-n1024-causal", "d128-n2048", "gqa-d128-causal", "ragged-d64"]
)
def test_two_pass_backward_matches_sdpa_math_in_fp32(attn, case, dtype):
    # The deterministic backward (no atomics) is a separate code path: same bounds.
    b, h, h_kv, n_q, n_k, d, causal = CASES[case]
    q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, requires_grad=True)
    out = attn.attention(q, k, v, causal=causal, deterministic=True)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref, leaves = sdpa_math_fp32(q, k, v, causal)
    ref.backward(do.float())
    assert_within(rel_error(out, ref), FWD_TOL[dtype])
    for g, r in zip(grads, leaves, strict=True):
        assert_within(rel_error(g, r.grad), GRAD_TOL[dtype])


def test_forward_and_backward_are_bitwise_deterministic(attn):
    # torch.use_deterministic_algorithms(True) selects the two-pass backward (no atomics): the
    # same inputs give the same bits, run after run.
    q, k, v = (
        torch.randn(2, 8, 1536, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    do = torch.randn(2, 8, 1536, 128, device="cuda", dtype=torch.bfloat16)
    runs = []
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(3):
            out = attn.attention(q, k, v, causal=True)
            runs.append((out, *torch.autograd.grad(out, (q, k, v), do)))
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert_equal(a, b, bitwise=True)
    # And the explicit argument gives those same bits.
    out = attn.attention(q, k, v, causal=True, deterministic=True)
    for a, b in zip(runs[0], (out, *torch.autograd.grad(out, (q, k, v), do)), strict=True):
        assert_equal(a, b, bitwise=True)


# --------------------------------------------------------------------------- speed

SPEED_CASES = [
    ("fwd", False),
    ("fwd", True),
    ("bwd", False),
    ("bwd", True),
    ("fwd+bwd", False),
    ("fwd+bwd", True),
    ("fp8", False),  # attention_fp8's forward (inputs quantized beforehand) against bf16 flash
    ("fp8", True),
]
SPEED_DROP = 0.10  # fail when the ratio to flash falls more than 10% below the baseline


@pytest.mark.parametrize(
    "mode, causal", SPEED_CASES, ids=[f"{m}-{'causal' if c else 'full'}" for m, c in SPEED_CASES]
)
def test_speed_relative_to_sdpa_flash_holds_its_baseline(mode, causal):
    """Ratio of this kernel's TFLOP/s to SDPA flash's, both timed in this run (so a slower or
    busier GPU moves both), at D=128, N=4096, bf16, B=4, H=16.

    Record a new baseline with ``ATTENTION_SPEED_BASELINE=update`` (it writes
    speed_baseline.json next to this file); the file names the GPU it was measured on, and
    another GPU model skips the comparison rather than judging it by the wrong machine.
    """
    from reference_impls.attention import bench

    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)  # SDPA flash's backward is not deterministic
    try:
        # B=4 rather than the table's 8: half the time, still about four waves of programs.
        timed = "fwd" if mode == "fp8" else mode
        case = bench.Case(d=128, n=4096, causal=causal, mode=timed, batch=4, heads=16)
        inputs = bench.make_inputs(case)
        ours = bench.measure(case, "fp8" if mode == "fp8" else "triton", inputs)
        flash = bench.measure(case, "flash", inputs)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    assert ours.error is None and flash.error is None, (ours.error, flash.error)
    ratio = flash.ms / ours.ms
    key = f"d128-n4096-{mode}-{'causal' if causal else 'full'}"
    gpu = torch.cuda.get_device_name()
    print(
        f"{key}: triton {ours.tflops:.0f} TFLOP/s, flash {flash.tflops:.0f} TFLOP/s, "
        f"ratio {ratio:.3f}"
    )

    stored = json.loads(BASELINE.read_text()) if BASELINE.exists() else {"gpu": gpu, "ratios": {}}
    if os.environ.get("ATTENTION_SPEED_BASELINE") == "update":
        stored = stored if stored.get("gpu") == gpu else {"gpu": gpu, "ratios": {}}
        stored["ratios"][key] = round(ratio, 3)
        BASELINE.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")
        return
    if stored.get("gpu") != gpu:
        pytest.skip(
            f"speed baseline recorded on {stored.get('gpu')!r}, this GPU is {gpu!r}; "
            f"record one here with ATTENTION_SPEED_BASELINE=update"
        )
    if key not in stored["ratios"]:
        pytest.fail(
            f"no baseline for {key} in {BASELINE.name}: "
            "record one with ATTENTION_SPEED_BASELINE=update"
        )
    floor = stored["ratios"][key] * (1 - SPEED_DROP)
    assert ratio >= floor, (
        f"{key}: triton/flash ratio {ratio:.3f} fell below {floor:.3f} "
        f"(baseline {stored['ratios'][key]} - {SPEED_DROP:.0%})"
    )
