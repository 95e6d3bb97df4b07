"""reference_impls.collectives.combine: the ring's Triton combine against torch's own ops.

Without a GPU the kernel runs under the Triton interpreter on CPU tensors (suites/conftest.py
sets TRITON_INTERPRET); with one, on CUDA. Inputs are integer-valued, so every sum, max and
min is exact in every dtype here and the kernel must equal torch bit for bit (16-bit floats:
integers up to 256 are exact in bfloat16, so their sums of two are exact too).
"""

import pytest
import torch

from harness import assert_equal
from reference_impls.attention.kernel import INTERPRET
from reference_impls.collectives.combine import combine_

DEVICE = "cpu" if INTERPRET else "cuda"
TORCH_OP = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int8]
)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize(("numel", "ctas"), [(1, 4), (8193, 1), (3 * 8192 + 5, 2)])
def test_combine_equals_torch_bit_for_bit(dtype, op, numel, ctas):
    # (8193, 1): one program strides over two tiles; (3*8192 + 5, 2): two programs, four tiles,
    # the last one ragged.
    g = torch.Generator().manual_seed(numel * 31 + ctas)
    bound = 60 if dtype == torch.int8 else 128
    a = torch.randint(-bound, bound, (numel,), generator=g).to(dtype).to(DEVICE)
    b = torch.randint(-bound, bound, (numel,), generator=g).to(dtype).to(DEVICE)
    expected = TORCH_OP[op](a, b)
    out = combine_(a.clone(), b, op, ctas)
    assert_equal(out, expected)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_propagate_nan_like_torch(op):
    a = torch.tensor([1.0, float("nan"), 3.0, -2.0], device=DEVICE)
    b = torch.tensor([float("nan"), 2.0, 1.0, float("nan")], device=DEVICE)
    out = combine_(a.clone(), b, op, 1)
    assert_equal(out.isnan(), TORCH_OP[op](a, b).isnan())
    assert out[2].item() == TORCH_OP[op](a, b)[2].item()


def test_combine_leaves_the_source_untouched_and_writes_only_the_destination():
    a = torch.arange(10, dtype=torch.float32, device=DEVICE)
    b = torch.full((10,), 2.0, device=DEVICE)
    combine_(a[2:7], b[2:7], "sum", 3)
    assert a.tolist() == [0, 1, 4, 5, 6, 7, 8, 7, 8, 9]
    assert b.tolist() == [2.0] * 10


@pytest.mark.parametrize(
    ("dst", "src", "op", "ctas", "message"),
    [
        (torch.zeros(4), torch.zeros(5), "sum", 1, "equal shapes"),
        (torch.zeros(4), torch.zeros(4, dtype=torch.float64), "sum", 1, "equal shapes"),
        (torch.zeros(2, 2), torch.zeros(2, 2), "sum", 1, "contiguous 1-D"),
        (torch.zeros(4), torch.zeros(4), "mean", 1, "one of sum, max, min"),
        (torch.zeros(4), torch.zeros(4), "sum", 0, "ctas must be an int >= 1"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(dst, src, op, ctas, message):
    with pytest.raises(ValueError, match=message):
        combine_(dst.to(DEVICE), src.to(DEVICE), op, ctas)
