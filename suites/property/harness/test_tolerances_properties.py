"""Properties of harness.tolerances over generated NumPy arrays (no torch: keeps this file fast)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
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
