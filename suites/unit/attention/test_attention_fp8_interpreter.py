"""reference_impls.attention.attention_fp8 and quantize_fp8 against float64, on small shapes.

Without a GPU the kernels run under the Triton interpreter (suites/conftest.py sets
TRITON_INTERPRET), which handles fp8: it stores e4m3 as bytes, and its ``tl.dot`` widens fp8
operands to fp16 (exact) before multiplying. One difference from the GPU: its fp32 -> fp8
cast rounds P (the probabilities) badly, dropping the carry into the exponent (a value just
under 2^k can come out as 2^(k-1)), so the kernel's own error is larger here than on a GPU;
the bounds below say by how much. quantize_fp8 rounds by hand before its cast and so is exact
on both (checked here against torch's own e4m3 rounding).
"""

import pytest
import torch

from harness import assert_equal, rel_error
from reference_impls.attention import Fp8Blocks, attention_fp8, quantize_fp8, reference_attention
from reference_impls.attention.fp8 import FP8_MAX, MIN_BLOCK_SIZE
from reference_impls.attention.kernel import INTERPRET

DEVICE = "cpu" if INTERPRET else "cuda"
BLOCK = MIN_BLOCK_SIZE  # 16 interpreted: short test sequences still span several scale blocks

# ||kernel - float64 on the dequantized inputs|| / ||float64||: only the kernel's own rounding
# (P to e4m3 before P @ V; the bf16 output). e4m3's unit roundoff is u = 2^-4; on a GPU the
# error is ~2-2.5e-2 (docs/benchmarks/attention.md). Interpreted, the broken carry above adds:
# seen 4.6e-2 to 6.8e-2. Bound 2u = 0.125.
VS_DEQUANT_TOL = 2.0**-3
# Against float64 on the original inputs, the inputs' own quantization (each value within u,
# ~2.7% RMS) adds through the scores and V: seen 6-8e-2 interpreted (~5e-2 on a GPU). 3u.
VS_EXACT_TOL = 3 * 2.0**-4


def make(b, h, h_kv, n_q, n_k, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g).to(DEVICE)
    k = torch.randn(b, h_kv, n_k, d, generator=g).to(DEVICE)
    v = torch.randn(b, h_kv, n_k, d, generator=g).to(DEVICE)
    return q, k, v


def torch_quantize(x, block):
    """The reference quantization, in torch ops: scale = amax / 448 per block of rows, then
    torch's own round-to-nearest-even cast to e4m3."""
    b, h, n, d = x.shape
    blocks = -(-n // block)
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, blocks * block - n))
    xf = xf.view(b, h, blocks, block, d)
    amax = xf.abs().amax(dim=(-1, -2))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    data = (xf / scale[..., None, None]).to(torch.float8_e4m3fn).view(b, h, -1, d)[:, :, :n]
    return data, scale


def check(q, k, v, causal, **kw):
    out = attention_fp8(q, k, v, causal=causal, block_size=BLOCK, **kw)
    assert out.shape == q.shape and torch.isfinite(out).all()
    exact = reference_attention(q.double(), k.double(), v.double(), causal=causal)
    qq, kk = quantize_fp8(q, BLOCK), quantize_fp8(k, BLOCK)
    vv = quantize_fp8(v, BLOCK, transpose=True)
    deq = reference_attention(*(t.dequantize(torch.float64) for t in (qq, kk, vv)), causal=causal)
    assert rel_error(out, deq) <= VS_DEQUANT_TOL
    assert rel_error(out, exact) <= VS_EXACT_TOL
    return out


# --------------------------------------------------------------------------- quantization


@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "transposed"])
def test_quantize_matches_torch_rounding_with_one_scale_per_block(transpose):
    # Magnitudes from 1e-4 to 1e2 across columns: normal and subnormal e4m3 values; an all-zero
    # block (scale 1); 37 rows: a ragged last block.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 37, 32, generator=g) * torch.logspace(-4, 2, 32)
    x[0, 0, :BLOCK] = 0
    x = x.to(DEVICE)
    got = quantize_fp8(x, BLOCK, transpose=transpose)
    data, scale = torch_quantize(x, BLOCK)
    assert got.shape == x.shape and got.transposed == transpose
    assert_equal(got.scale, scale, bitwise=True)
    mine = got.data[..., :37].transpose(2, 3) if transpose else got.data
    # Values, not bits: an underflow to zero may keep or drop its sign.
    assert torch.equal(mine.float(), data.float())
    if transpose:  # (B, H, D, N padded to a multiple of 16): the padding is zeros
        assert got.data.shape == (2, 3, 32, 48)
        assert (got.data[..., 37:].float() == 0).all()


def test_per_block_scales_keep_small_blocks_accurate_next_to_an_outlier_block():
    # One block 1e6 times larger than the rest (e4m3 spans 448 / 2^-9 ~ 2.3e5 in all): with one
    # scale per head (block_size >= N) the small blocks round to zero; with one per block each
    # keeps e4m3's relative precision (within u = 2^-4 of every value).
    x = torch.randn(1, 1, 4 * BLOCK, 32, generator=torch.Generator().manual_seed(2))
    x[:, :, :BLOCK] *= 1e6
    x = x.to(DEVICE)
    rest = slice(BLOCK, None)
    per_block = quantize_fp8(x, BLOCK).dequantize()
    per_head = quantize_fp8(x, 4 * BLOCK).dequantize()
    err_block = rel_error(per_block[:, :, rest], x[:, :, rest])
    err_head = rel_error(per_head[:, :, rest], x[:, :, rest])
    assert err_block <= 2.0**-4
    assert err_head >= 0.9  # nearly all of the small values are gone


# --------------------------------------------------------------------------- the kernel


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp8_forward_matches_float64(causal):
    # 80 rows: 2.5 query blocks, 5 key blocks and 5 scale blocks of the interpreter's sizes.
    check(*make(1, 2, 1, 80, 80, 32), causal)


@pytest.mark.parametrize("n_q, n_k", [(37, 91), (91, 37), (1, 50)])
def test_fp8_ragged_lengths_and_grouped_heads(n_q, n_k):
    check(*make(1, 2, 1, n_q, n_k, 32, seed=n_q), causal=True)


def test_fp8_rows_that_see_no_key_are_zero():
    q, k, v = make(1, 2, 2, 40, 5, 16)  # causal, Nq > Nk: rows 0..34 precede every key
    out = attention_fp8(q, k, v, causal=True, block_size=BLOCK)
    assert (out[:, :, :35] == 0).all()
    assert torch.isfinite(out).all()


def test_prequantized_inputs_give_the_same_bits_and_fp16_output():
    q, k, v = make(1, 2, 2, 48, 48, 32, seed=3)
    blocks = quantize_fp8(q, BLOCK), quantize_fp8(k, BLOCK), quantize_fp8(v, BLOCK, True)
    assert_equal(attention_fp8(*blocks), attention_fp8(q, k, v, block_size=BLOCK), bitwise=True)
    half = attention_fp8(*blocks, out_dtype=torch.float16)
    assert half.dtype == torch.float16
    assert rel_error(half, attention_fp8(*blocks)) <= 4e-3  # bf16's unit roundoff: 2^-8


# --------------------------------------------------------------------------- bad input

X = torch.randn(1, 1, 32, 32).to(DEVICE)

BAD = {
    "head dim 24": (lambda: attention_fp8(*(torch.randn(1, 1, 8, 24).to(DEVICE),) * 3), r"16.*24"),
    "block size 48": (lambda: quantize_fp8(X, 48), r"block_size .* got 48"),
    "block size small": (lambda: quantize_fp8(X, MIN_BLOCK_SIZE // 2), r"at least"),
    "3 dims": (lambda: quantize_fp8(X[0]), r"\(B, H, N, D\).*\(1, 32, 32\)"),
    "int input": (lambda: quantize_fp8(X.to(torch.int32)), r"torch.int32"),
    "v not transposed": (
        lambda: attention_fp8(X, X, quantize_fp8(X, BLOCK), block_size=BLOCK),
        r"v was quantized with transpose=False.*transpose=True",
    ),
    "mixed block sizes": (
        lambda: attention_fp8(quantize_fp8(X, BLOCK), X, X, block_size=2 * BLOCK),
        r"block_size=16|block_size=" + str(BLOCK),
    ),
    "out dtype": (lambda: attention_fp8(X, X, X, out_dtype=torch.float32), r"out_dtype"),
    "batch": (
        lambda: attention_fp8(X, *(torch.randn(2, 1, 32, 32).to(DEVICE),) * 2),
        r"batch size, got 1 and 2",
    ),
    "causal": (lambda: attention_fp8(X, X, X, causal=1), r"causal must be a bool"),
    "not a tensor": (lambda: attention_fp8([1.0], X, X), r"q must be a torch.Tensor or Fp8Blocks"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_value_error_naming_the_value(case):
    call, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_fp8_blocks_report_the_logical_shape():
    vv = quantize_fp8(torch.randn(1, 2, 37, 32).to(DEVICE), BLOCK, transpose=True)
    assert isinstance(vv, Fp8Blocks) and vv.shape == (1, 2, 37, 32)
    assert vv.dequantize().shape == (1, 2, 37, 32)
