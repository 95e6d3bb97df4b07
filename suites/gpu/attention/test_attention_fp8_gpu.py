"""reference_impls.attention.attention_fp8 on a GPU: the e4m3 forward with per-block scales at
realistic shapes, against fp32 SDPA math on the original inputs and against float64 on the
dequantized inputs (which isolates the kernel's own rounding from the inputs' quantization).

Imported inside the fixture, as in test_attention_gpu.py: an import at collection would
define the kernels before the unit and property suites set TRITON_INTERPRET. The shapes are
test_attention_gpu.py's (attention_cases.py).
"""

import pytest
import torch
import triton
from attention_cases import CASES

from harness import assert_equal, rel_error

pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False)",
    ),
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
        reason="fp8 (e4m3) tensor-core matmuls need compute capability 8.9 or newer",
    ),
    pytest.mark.skipif(
        bool(triton.knobs.runtime.interpret),
        reason="TRITON_INTERPRET is set: the kernels would run in the interpreter",
    ),
]

# ||fp8 kernel - reference|| / ||reference||. e4m3 keeps 3 mantissa bits: round to nearest
# leaves each value within u = 2^-4 = 6.25% of itself (about 2.7% RMS over random mantissas).
# - Against float64 on the *dequantized* inputs, only the kernel's own roundings count: P cast
#   to e4m3 before P @ V (RMS ~2.7% per weight, so ~3% of the output's norm: the output is
#   itself a weighted average, shrinking with the error) and the bf16 output. Bound: u.
# - Against fp32 math on the original bf16 inputs, the quantization of q, k (through the
#   scores: ~4% relative error in P) and v (~2.7%) adds: ~5% expected. Bound: 2u.
# Seen on an H200 (docs/benchmarks/attention.md) well inside both.
FP8_VS_DEQUANT_TOL = 2.0**-4
FP8_VS_EXACT_TOL = 2.0**-3


@pytest.fixture(scope="module")
def attn():
    from reference_impls import attention

    return attention


def make(b, h, h_kv, n_q, n_k, d, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(n_q * 7 + n_k * 3 + d)
    q = torch.randn(b, h, n_q, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(b, h_kv, n_k, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(b, h_kv, n_k, d, device="cuda", generator=g).to(dtype)
    return q, k, v


def errors(attn, q, k, v, causal, **kw):
    """(error vs fp32 on the original inputs, error vs float64 on the dequantized inputs)."""
    out = attn.attention_fp8(q, k, v, causal=causal, **kw)
    assert out.shape == q.shape and torch.isfinite(out).all()
    exact = attn.reference_attention(q.double(), k.double(), v.double(), causal=causal)
    # The reference dequantizes what the kernel computes on: the same rows per scale.
    size = {"block_size": kw["block_size"]} if "block_size" in kw else {}
    qq, kk = attn.quantize_fp8(q, **size), attn.quantize_fp8(k, **size)
    vv = attn.quantize_fp8(v, transpose=True, **size)
    deq = attn.reference_attention(
        *(t.dequantize(torch.float64) for t in (qq, kk, vv)), causal=causal
    )
    return rel_error(out, exact), rel_error(out, deq)


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_forward_matches_references(attn, case):
    b, h, h_kv, n_q, n_k, d, causal = CASES[case]
    q, k, v = make(b, h, h_kv, n_q, n_k, d)
    exact, deq = errors(attn, q, k, v, causal)
    bf16 = rel_error(
        attn.attention(q, k, v, causal=causal),
        attn.reference_attention(q.double(), k.double(), v.double(), causal=causal),
    )
    print(f"{case}: fp8 vs exact {exact:.2e}, vs dequantized {deq:.2e}; bf16 kernel {bf16:.2e}")
    assert deq <= FP8_VS_DEQUANT_TOL
    assert exact <= FP8_VS_EXACT_TOL


EDGES = [(1, 1, False), (1, 300, True), (300, 1, True), (700, 77, True), (129, 255, False)]


@pytest.mark.parametrize(
    "n_q, n_k, causal", EDGES, ids=[f"{q}x{k}{'-causal' if c else ''}" for q, k, c in EDGES]
)
def test_fp8_edge_lengths(attn, n_q, n_k, causal):
    # One token, rows that see no key (zeros), ragged tails read through TMA's zero fill.
    q, k, v = make(2, 4, 2, n_q, n_k, 64)
    exact, deq = errors(attn, q, k, v, causal)
    assert deq <= FP8_VS_DEQUANT_TOL and exact <= FP8_VS_EXACT_TOL
    if causal and n_q > n_k:
        out = attn.attention_fp8(q, k, v, causal=True)
        assert (out[:, :, : n_q - n_k] == 0).all()  # bottom-right aligned: no key visible


def test_prequantized_inputs_give_the_same_bits(attn):
    q, k, v = make(1, 8, 8, 1000, 1000, 128)
    inside = attn.attention_fp8(q, k, v, causal=True)
    qq, kk = attn.quantize_fp8(q), attn.quantize_fp8(k)
    vv = attn.quantize_fp8(v, transpose=True)
    assert_equal(attn.attention_fp8(qq, kk, vv, causal=True), inside, bitwise=True)


@pytest.mark.parametrize("block_size", [64, 256])
def test_other_block_sizes_and_fp16_output(attn, block_size):
    q, k, v = make(1, 4, 4, 640, 640, 128, dtype=torch.float16)
    # Each output dtype against the references, not the two outputs against each other:
    # triton's autotuner keys its choice on the arguments' dtypes too, so the two calls may
    # run different tilings, and P's e4m3 rounding follows the tiling (the running max it is
    # scaled by): on an H200 the bf16 and fp16 outputs differed by 1.06e-2 in half of 12
    # runs with identical inputs, both inside the bounds below.
    for out_dtype in (torch.bfloat16, torch.float16):
        exact, deq = errors(attn, q, k, v, False, block_size=block_size, out_dtype=out_dtype)
        assert deq <= FP8_VS_DEQUANT_TOL and exact <= FP8_VS_EXACT_TOL, (out_dtype, exact, deq)
    out = attn.attention_fp8(q, k, v, block_size=block_size, out_dtype=torch.float16)
    assert out.dtype == torch.float16


@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "transposed"])
def test_quantize_kernel_matches_torch_rounding(attn, transpose):
    # The Triton quantization against torch's own round-to-nearest-even cast, at a realistic
    # size with a ragged last block and magnitudes across e4m3's normal and subnormal range.
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(2, 8, 1000, 128, device="cuda", generator=g)
    x = (x * torch.logspace(-4, 2, 128, device="cuda")).to(torch.bfloat16)
    got = attn.quantize_fp8(x, 128, transpose=transpose)
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, 24)).view(2, 8, 8, 128, 128)
    amax = xf.abs().amax(dim=(-1, -2))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    data = (xf / scale[..., None, None]).to(torch.float8_e4m3fn).view(2, 8, 1024, 128)[:, :, :1000]
    assert_equal(got.scale, scale, bitwise=True)
    mine = got.data[..., :1000].transpose(2, 3) if transpose else got.data
    # Values, not bits: a zero may keep or drop its sign.
    differ = (mine.float() != data.float()).nonzero()
    assert len(differ) == 0, (
        f"{len(differ)} of {data.numel()} values differ, first at {differ[0].tolist()}: "
        f"x={x[tuple(differ[0])].item()!r}, kernel {mine[tuple(differ[0])].float().item()}, "
        f"torch {data[tuple(differ[0])].float().item()}"
    )
