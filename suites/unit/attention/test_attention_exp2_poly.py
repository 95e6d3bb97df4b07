"""The software exp2 of the Gluon forward (gluon_fwd.py, FlashAttention-4's trick: some
exponentials by a polynomial on the FMA pipe instead of the MUFU unit), checked on the CPU.

The PTX itself runs only on a GPU (suites/gpu/attention/test_attention_gluon_gpu.py compares
the kernel with float64). Here: the generated PTX has the requested mix of hardware and
software exponentials, and the algorithm it spells out (clamp at -127, floor by an add
rounding down against 1.5 * 2**23, the polynomial for 2**f in fp32 Horner steps, the integer
part added to the exponent bits), replayed in numpy float32 with the module's coefficients,
is within 1e-4 of exp2 and exact where the softmax needs it exact.
"""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def gluon_fwd():
    from reference_impls.attention import gluon_fwd

    return gluon_fwd


def _replay(gluon_fwd, x: np.ndarray) -> np.ndarray:
    """The emulated exp2 of gluon_fwd._make_exp2_asm, step by step in float32."""
    c1, c2, c3 = (np.float32(c) for c in gluon_fwd.EXP2_POLY)
    xc = np.maximum(x.astype(np.float32), np.float32(-127.0))
    # add.rm against 1.5 * 2**23 leaves floor(xc) in the low mantissa bits; subtracting the
    # constant again gives it exactly (|xc| <= 127).
    magic = np.float32(1.5 * 2**23)
    j = np.floor(xc + np.float64(magic)).astype(np.float32)
    fl = (j - magic).astype(np.float32)
    fr = (xc - fl).astype(np.float32)
    p = (fr * c3 + c2).astype(np.float32)
    p = (p * fr + c1).astype(np.float32)
    p = (p * fr + np.float32(1.0)).astype(np.float32)
    bits = p.view(np.int32) + (fl.astype(np.int32) << 23)
    return bits.astype(np.int32).view(np.float32)


def test_polynomial_exp2_is_within_1e4_of_exp2(gluon_fwd):
    x = np.linspace(-126.0, 0.0, 1_000_001, dtype=np.float32)
    got = _replay(gluon_fwd, x).astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    rel = np.abs(got - want) / want
    # Degree-3 minimax on [0, 1): 8.6e-5; bf16 and fp16 round P to 3.9e-3 and 4.9e-4.
    assert rel.max() <= 1e-4, rel.max()


def test_polynomial_exp2_is_exact_where_the_softmax_needs_it(gluon_fwd):
    x = np.array([0.0, -1.0, -2.0, -10.0, -126.0, -np.inf, -127.0, -300.0], dtype=np.float32)
    got = _replay(gluon_fwd, x)
    # exp2(0) = 1 for the row's maximum, powers of two exact, masked scores (-inf) and
    # anything under the clamp exactly 0, never a wrapped exponent.
    assert got.tolist() == [1.0, 0.5, 0.25, 2.0**-10, 2.0**-126, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("emulated", range(9))
def test_generated_ptx_mixes_hardware_and_software_exp2_as_asked(gluon_fwd, emulated):
    asm = gluon_fwd._make_exp2_asm(emulated)
    pack = gluon_fwd.EXP2_PACK
    assert asm.count("ex2.approx.ftz.f32") == pack - emulated
    assert asm.count("add.rm.ftz.f32") == emulated
    # Every output $0..$7 written once, from its own input $8..$15.
    for i in range(pack):
        assert asm.count(f" ${i}, ") == 1, (i, asm)
        assert asm.count(f"${pack + i}") == 1, (i, asm)
