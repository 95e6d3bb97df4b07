"""Properties of harness.tolerances over generated NumPy arrays (no torch: keeps this file fast)."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from harness.tolerances import DEFAULT_TOLERANCES, assert_close, rel_error

FAST = settings(max_examples=60, deadline=None)  # the whole file stays under ~2 s

SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6)
FLOAT_DTYPES = st.sampled_from([np.float16, np.float32, np.float64])


def finite_arrays(dtype=np.float64, max_magnitude=None, shape=SHAPES):
    bound = (
        {} if max_magnitude is None else {"min_value": -max_magnitude, "max_value": max_magnitude}
    )
    width = np.dtype(dtype).itemsize * 8
    elements = st.floats(allow_nan=False, allow_infinity=False, width=width, **bound)
    return hnp.arrays(dtype, shape, elements=elements)


@FAST
@given(FLOAT_DTYPES.flatmap(finite_arrays))
def test_any_finite_array_is_close_to_itself(x):
    assert_close(x, x.copy())


@FAST
@given(hnp.arrays(np.float64, SHAPES))  # NaN and both infinities included
def test_with_equal_nan_any_array_is_close_to_itself(x):
    assert_close(x, x.copy(), equal_nan=True)


@FAST
@given(finite_arrays(max_magnitude=1e300), st.data())
def test_moving_every_element_less_than_the_bound_passes(expected, data):
    rtol, atol = DEFAULT_TOLERANCES["float64"]
    # Up to 99% of the bound: the 1% margin is far above float64 rounding (1e-16 relative)
    # against a bound of at least 1e-7 relative.
    k = data.draw(hnp.arrays(np.float64, expected.shape, elements=st.floats(-0.99, 0.99)))
    assert_close(expected + k * (atol + rtol * np.abs(expected)), expected)


@FAST
@given(finite_arrays(max_magnitude=1e300), st.data())
def test_moving_one_element_beyond_the_bound_always_fails_and_is_located(expected, data):
    rtol, atol = DEFAULT_TOLERANCES["float64"]
    flat = data.draw(st.integers(0, expected.size - 1), label="flat index")
    k = data.draw(st.floats(1.01, 1e6) | st.floats(-1e6, -1.01), label="multiple of the bound")
    actual = expected.copy()
    index = np.unravel_index(flat, expected.shape)
    actual[index] += k * (atol + rtol * abs(expected[index]))
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected)
    message = str(info.value)
    assert f"Mismatched elements: 1 / {expected.size} " in message
    assert f"at index {tuple(int(i) for i in index)}" in message


@FAST
@given(hnp.arrays(np.int64, SHAPES), st.data())
def test_integers_differing_by_one_anywhere_fail_with_the_exact_difference(expected, data):
    flat = data.draw(st.integers(0, expected.size - 1))
    index = np.unravel_index(flat, expected.shape)
    actual = expected.copy()
    actual[index] += -1 if actual[index] == np.iinfo(np.int64).max else 1
    assert_close(expected.copy(), expected)
    with pytest.raises(AssertionError, match=r"Greatest absolute difference: 1 at index"):
        assert_close(actual, expected)


@FAST
@given(hnp.arrays(np.float64, SHAPES, elements=st.floats(allow_nan=False)))
def test_rel_error_of_identical_inputs_is_zero(x):
    assert rel_error(x, x.copy()) == 0.0


@FAST
@given(finite_arrays(max_magnitude=1e100), st.floats(-10, 10))
def test_rel_error_of_a_scaled_copy_is_the_scale_minus_one(x, c):
    if not np.any(x):
        return  # ||x|| == 0 has its own rule, tested in the unit tests
    # Subnormal entries have too few significant bits for c * x to be c times them (5e-324 * 0.5
    # rounds to 5e-324): the identity is about normal floats.
    assume(np.all((x == 0) | (np.abs(x) >= 1e-290)))
    assert rel_error(c * x, x) == pytest.approx(abs(c - 1), rel=1e-9, abs=1e-12)


@FAST
@given(st.data())
def test_rel_error_times_the_reference_norm_is_symmetric(data):
    shape = data.draw(SHAPES)
    a = data.draw(finite_arrays(max_magnitude=1e100, shape=shape))
    b = data.draw(finite_arrays(max_magnitude=1e100, shape=shape))
    norm_a, norm_b = np.linalg.norm(a), np.linalg.norm(b)
    if norm_a == 0 or norm_b == 0:
        return
    # ||a - b|| is the same from either side; only the reference norm changes.
    assert rel_error(a, b) * norm_b == pytest.approx(rel_error(b, a) * norm_a, rel=1e-9)
    assert not math.isnan(rel_error(a, b))


@FAST
@given(finite_arrays())
def test_rel_error_of_the_negation_is_exactly_two_over_the_whole_float64_range(x):
    # ||x - (-x)|| / ||-x|| = 2, exact in binary at every magnitude: the norms are formed as
    # peak * root, and both sides share the roots. The whole range is drawn on purpose: two
    # elements near the float64 maximum made ||x - (-x)|| overflow to inf before the fix.
    if not np.any(x):
        return  # ||x|| == 0 has its own rule, tested in the unit tests
    assert rel_error(x, -x) == 2.0


# The passing path is proved in the inputs' own precision with a margin for rounding
# (harness.tolerances._proof_margin); these two pin it at the most adversarial points: the
# first representable value past the exact float64 bound, and the last one inside it, for
# random tolerances (zero, subnormal and large ones included) and magnitudes.
TOLERANCES = st.tuples(
    st.sampled_from([0.0, 1e-45, 1e-8, 1.3e-6, 1e-3, 0.5, 1.0, 2.0]) | st.floats(0, 1),
    st.sampled_from([0.0, 1e-45, 1e-320, 1e-5, 1.0]) | st.floats(0, 1e-3),
)


def _ordered(x, dtype):
    """The float's rank among all values of ``dtype`` (an integer, -0.0 and 0.0 both 0)."""
    bits = int(np.array(x, dtype).view(np.int32 if dtype is np.float32 else np.int64))
    return bits if bits >= 0 else -(bits & ~np.iinfo(np.int64).min)


def _from_ordered(k, dtype):
    int_type = np.int32 if dtype is np.float32 else np.int64
    bits = k if k >= 0 else (-k) | int(np.iinfo(int_type).min)
    return np.array(bits, dtype=int_type).view(dtype)[()]


def _boundary_pair(dtype, e, rtol, atol, inside):
    """``(actual, expected)`` arrays where actual[1] is the last (``inside``) or the first value
    of ``dtype`` above expected[1] that the exact rule accepts (rejects); None when the bound
    reaches past the dtype's range."""
    e = dtype(e)

    def accepted(a):  # the exact rule: float64 arithmetic, as harness.tolerances._isclose
        return abs(float(a) - float(e)) <= atol + rtol * abs(float(e))

    lo, hi = _ordered(e, dtype), _ordered(np.finfo(dtype).max, dtype)
    if accepted(_from_ordered(hi, dtype)):
        return None
    while hi - lo > 1:  # accepted(lo) and not accepted(hi): bisect on the rank
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accepted(_from_ordered(mid, dtype)) else (lo, mid)
    a = _from_ordered(lo if inside else hi, dtype)
    return np.array([e, a], dtype), np.array([e, e], dtype)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([np.float32, np.float64]),
    st.floats(-1e30, 1e30, allow_subnormal=True) | st.sampled_from([0.0, 1e-40, 1e-310]),
    TOLERANCES,
    st.booleans(),
)
def test_the_first_value_past_the_exact_bound_fails_and_the_last_inside_passes(
    dtype, e, tolerances, torch_tensors
):
    rtol, atol = tolerances
    outside = _boundary_pair(dtype, e, rtol, atol, inside=False)
    inside = _boundary_pair(dtype, e, rtol, atol, inside=True)
    if outside is None or inside is None:
        return  # the bound reaches past the dtype's range: nothing to step over
    if torch_tensors:
        torch = pytest.importorskip("torch")
        outside = tuple(torch.from_numpy(x) for x in outside)
        inside = tuple(torch.from_numpy(x) for x in inside)
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 2 "):
        assert_close(*outside, rtol=rtol, atol=atol)
    assert_close(*inside, rtol=rtol, atol=atol)
