"""Unit tests for harness.tolerances: the dtype table, assert_close and its report, rel_error."""

import functools
import math
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from harness import DEFAULT_TOLERANCES, assert_close, assert_equal, rel_error

torch = pytest.importorskip("torch")

# The specification, written out independently of the module: every boundary test below
# derives its perturbation from these numbers, so a wrong edit to DEFAULT_TOLERANCES fails.
SPEC = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float8_e4m3fn": (0.125, 1e-3),  # 3 mantissa bits: 2**-3
    "float8_e4m3fnuz": (0.125, 1e-3),
    "float8_e5m2": (0.25, 1e-3),  # 2 mantissa bits: 2**-2
    "float8_e5m2fnuz": (0.25, 1e-3),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}
INTEGER_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
REAL_FLOATS = [name for name in SPEC if not name.startswith("complex")]


def message_of(actual, expected, **kwargs) -> str:
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, **kwargs)
    return str(info.value)


# --- the table -----------------------------------------------------------------------------------


def test_the_default_table_holds_the_specified_tolerances():
    expected = {**SPEC, **dict.fromkeys(INTEGER_DTYPES, (0.0, 0.0))}
    assert expected == DEFAULT_TOLERANCES


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_the_table_agrees_with_torch_testing_where_torch_has_a_default():
    # A private helper: if a torch release moves it, skip rather than fail (SPEC still holds).
    default_tolerances = getattr(torch.testing._comparison, "default_tolerances", None)
    if default_tolerances is None:
        pytest.skip("torch.testing._comparison.default_tolerances is gone in this torch")
    for name in [
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "complex32",
        "complex64",
        "complex128",
    ]:
        torch_defaults = default_tolerances(torch.empty(0, dtype=getattr(torch, name)))
        assert DEFAULT_TOLERANCES[name] == pytest.approx(torch_defaults), name


# --- each dtype's default at its boundary --------------------------------------------------------

# The expected value is stored in the dtype under test, the actual value in float64 with
# check_dtype=False: the looser of float64's and the dtype's defaults is the dtype's own (every
# entry is at least float64's in both rtol and atol), and a float64 actual can sit 0.1% from
# the boundary, which a float16 or float8 actual could not represent.
MAGNITUDES = [0.0, 1.0, 3.0]  # 0 tests atol alone; 1 and 3 (exact in float8) add rtol * |e|


def boundary_cases(inside: bool) -> list:
    factor = 0.999 if inside else 1.001
    return [
        pytest.param(name, e, factor, id=f"{name}-{e}") for name in REAL_FLOATS for e in MAGNITUDES
    ]


@pytest.mark.parametrize(("name", "e", "factor"), boundary_cases(inside=True))
def test_a_perturbation_just_inside_the_default_passes(name, e, factor):
    rtol, atol = SPEC[name]
    expected = torch.tensor([e, -e], dtype=getattr(torch, name))
    actual = torch.tensor([e, -e], dtype=torch.float64) + factor * (atol + rtol * e)
    assert_close(actual, expected, check_dtype=False)


@pytest.mark.parametrize(("name", "e", "factor"), boundary_cases(inside=False))
def test_a_perturbation_just_outside_the_default_fails(name, e, factor):
    rtol, atol = SPEC[name]
    expected = torch.tensor([e, -e], dtype=getattr(torch, name))
    actual = torch.tensor([e, -e], dtype=torch.float64) - factor * (atol + rtol * e)
    message = message_of(actual, expected, check_dtype=False)
    assert "Mismatched elements: 2 / 2 (100.0%)" in message
    assert f"rtol={rtol!r}, atol={atol!r}" in message


@pytest.mark.parametrize("name", ["complex32", "complex64", "complex128"])
@pytest.mark.parametrize("factor", [0.999, 1.001])
def test_complex_values_are_close_by_the_modulus_of_their_difference(name, factor):
    rtol, atol = SPEC[name]
    expected = torch.tensor([3 + 4j], dtype=getattr(torch, name))  # |e| = 5
    # Split the allowed distance between both components: only the modulus counts.
    step = factor * (atol + rtol * 5.0) / math.sqrt(2)
    actual = torch.tensor([3 + 4j], dtype=torch.complex128) + complex(step, step)
    if factor < 1:
        assert_close(actual, expected, check_dtype=False)
    else:
        assert "not close" in message_of(actual, expected, check_dtype=False)


@functools.cache
def every_finite_value(dtype):
    bits = torch.finfo(dtype).bits
    codes = torch.arange(2**bits, dtype=torch.int32).to(getattr(torch, f"int{bits}"))
    values = codes.view(dtype).to(torch.float64)  # every bit pattern, reinterpreted
    return values[torch.isfinite(values)]


def representable_neighbours(dtype, limit: float) -> tuple[float, float]:
    """The largest value of ``dtype`` <= limit, and the smallest above it."""
    if torch.finfo(dtype).bits <= 16:
        values = every_finite_value(dtype)
        return values[values <= limit].max().item(), values[values > limit].min().item()
    below = np.float32(limit)
    if float(below) > limit:  # in float64: NumPy would round limit to float32 first
        below = np.nextafter(below, np.float32(-np.inf))
    return float(below), float(np.nextafter(below, np.float32(np.inf)))


@pytest.mark.parametrize("name", [n for n in REAL_FLOATS if n != "float64"])
def test_in_its_own_dtype_the_last_value_inside_passes_and_the_next_fails(name):
    # The same boundary without check_dtype=False, as tests use it. (float64 needs no such
    # test: the boundary tests above already compare float64 with float64.)
    rtol, atol = SPEC[name]
    dtype = getattr(torch, name)
    for e in MAGNITUDES:
        inside, outside = representable_neighbours(dtype, e + (atol + rtol * e))
        expected = torch.tensor([e], dtype=dtype)
        assert_close(torch.tensor([inside], dtype=dtype), expected)
        with pytest.raises(AssertionError, match=f"default for {name}"):
            assert_close(torch.tensor([outside], dtype=dtype), expected)


@pytest.mark.parametrize("name", INTEGER_DTYPES)
def test_integers_and_bools_must_match_exactly(name):
    values = np.array([0, 1, 1], dtype=name)
    assert_close(values, values.copy())
    changed = values.copy()
    changed[0] = 1
    assert "Tensor-likes are not equal!" in message_of(changed, values)
    assert_close(torch.from_numpy(values), values)


@pytest.mark.parametrize(
    ("value", "changed", "dtype_name"),
    [
        (1.0, 1.0 + 3e-7, "float64"),
        (1 + 0j, 1 + 3e-7j, "complex128"),
        (7, 8, "int64"),
        (True, False, "bool"),
    ],
)
def test_python_scalars_take_float64_complex128_int64_and_bool_defaults(value, changed, dtype_name):
    rtol, atol = SPEC.get(dtype_name, (0.0, 0.0))
    assert abs(changed - value) > atol + rtol * abs(value)  # so that the change must fail
    message = message_of(changed, value)
    assert message.startswith("Scalars are not")
    assert f"(default for {dtype_name})" in message
    assert_close(value, value)


# --- kinds of input ------------------------------------------------------------------------------


def test_bfloat16_tensors_are_compared_through_float64():
    expected = torch.tensor([1.0, 2.0, 256.0], dtype=torch.bfloat16)
    assert_close(expected * (1 + 2**-7), expected)  # one bfloat16 ulp at 1.0 passes
    message = message_of(expected * 1.5, expected)
    assert "Greatest absolute difference: 128.0 at index (2,)" in message
    assert "(default for bfloat16)" in message


def test_float16_tensors_use_the_float16_default():
    expected = torch.tensor([1.0, 1.5, 1.75], dtype=torch.float16)
    assert_close(expected + torch.tensor(2**-10, dtype=torch.float16), expected)  # one ulp
    assert "rtol=0.001, atol=1e-05 (default for float16)" in message_of(expected + 0.25, expected)


def test_numpy_arrays_are_compared_like_tensors():
    expected = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_close(expected + np.float32(1e-6), expected)
    message = message_of(expected + np.float32(1), expected)
    assert message.startswith("Tensor-likes are not close!")
    assert "Mismatched elements: 6 / 6 (100.0%)" in message


def test_torch_and_numpy_inputs_of_the_same_dtype_compare():
    assert_close(torch.ones(2, 3), np.ones((2, 3), dtype=np.float32))
    assert_close(np.arange(3), torch.arange(3))
    assert "dtype mismatch" in message_of(torch.ones(3), np.ones(3))  # float32 vs float64


def test_tensors_that_require_grad_or_are_conjugate_views_are_compared_by_value():
    weight = torch.ones(3, requires_grad=True)
    assert_close(weight * 2, torch.full((3,), 2.0))
    z = torch.tensor([1 + 2j])
    assert_close(z.conj(), np.array([1 - 2j], dtype=np.complex64))


def test_tensors_are_compared_with_numpy_scalars_and_zero_dimensional_arrays():
    assert_close(torch.tensor(1.5, dtype=torch.float64), np.float64(1.5))
    assert_close(np.array(1.5), 1.5)


# --- nested structures ---------------------------------------------------------------------------


def test_nested_structures_are_compared_leaf_by_leaf():
    state = {"layer1": [torch.ones(2), 3, (1.5, None)], "step": np.int64(4)}
    same = {"step": np.int64(4), "layer1": [torch.ones(2), 3, [1.5, None]]}
    assert_close(state, same)  # key order and list-vs-tuple do not matter


def test_a_mismatch_in_a_nested_structure_names_its_path():
    actual = {"layer1": [1.0, 2.0, torch.zeros(3)]}
    expected = {"layer1": [1.0, 2.0, torch.tensor([0.0, 0.5, 0.0])]}
    message = message_of(actual, expected)
    assert message.startswith("Tensor-likes are not close!")
    assert message.endswith("The failure occurred at actual['layer1'][2].")


def test_different_dict_keys_name_the_missing_and_the_extra_keys():
    message = message_of({"w": 1, "extra": 2}, {"w": 1, "b": 2})
    assert message == "dict keys differ: missing from actual ['b'], not expected ['extra']"


def test_different_sequence_lengths_name_both_lengths_and_the_path():
    message = message_of({"grads": [1, 2]}, {"grads": [1, 2, 3]})
    assert "length mismatch: actual has 2 items, expected 3" in message
    assert "The failure occurred at actual['grads']." in message


def test_a_container_against_a_leaf_is_a_type_mismatch():
    assert "type mismatch: actual is list, expected is dict" in message_of([1], {"a": 1})
    assert "type mismatch: actual is NoneType, expected is float" in message_of([None], [1.0])


def test_none_matches_only_none():
    assert_close([None, 1], [None, 1])
    assert "The failure occurred at actual[0]." in message_of([torch.ones(1)], [None])


@pytest.mark.parametrize(
    "bad", ["1.0", b"1", {1, 2}, object()], ids=["str", "bytes", "set", "object"]
)
def test_an_unsupported_type_is_a_type_error_naming_it(bad):
    with pytest.raises(TypeError, match=re.escape(type(bad).__name__)):
        assert_close({"x": [bad]}, {"x": [bad]})


def test_a_numpy_array_of_objects_is_a_type_error():
    with pytest.raises(TypeError, match="dtype object"):
        assert_close(np.array([1, None]), np.array([1, None]))


# --- the failure message -------------------------------------------------------------------------


@pytest.fixture
def three_mismatches():
    """float32 values whose differences are exact in binary: the message numbers are exact."""
    expected = np.ones((10, 10), dtype=np.float32)
    actual = expected.copy()
    expected[1, 1], actual[1, 1] = 0.25, 0.5  # abs 0.25, rel 1.0 (the greatest relative)
    expected[2, 3], actual[2, 3] = 8.0, 8.5  # abs 0.5 (the greatest absolute), rel 0.0625
    actual[4, 4] = 1.0625  # abs 0.0625, rel 0.0625
    return actual, expected


def test_the_message_counts_the_mismatches_and_gives_their_share(three_mismatches):
    assert "Mismatched elements: 3 / 100 (3.0%)" in message_of(*three_mismatches)


def test_the_message_gives_the_greatest_differences_where_they_are_and_what_was_allowed(
    three_mismatches,
):
    assert message_of(*three_mismatches).splitlines() == [
        "Tensor-likes are not close!",
        "",
        "Mismatched elements: 3 / 100 (3.0%)",
        "Greatest absolute difference: 0.5 at index (2, 3) (up to 1e-05 allowed)",
        "Greatest relative difference: 1.0 at index (1, 1) (up to 1.3e-06 allowed)",
        "Tolerance: rtol=1.3e-06, atol=1e-05 (default for float32)",
    ]


def test_given_tolerances_are_reported_as_given(three_mismatches):
    # Loosened to show the report, not to make anything pass.
    message = message_of(*three_mismatches, rtol=0.01, atol=0.1)
    assert "Tolerance: rtol=0.01, atol=0.1 (given)" in message
    assert "Mismatched elements: 2 / 100 (2.0%)" in message  # 1.0625 vs 1 is now close


def test_msg_is_put_before_the_report(three_mismatches):
    message = message_of(*three_mismatches, msg="logits after step 3")
    assert message.startswith("logits after step 3\n\nTensor-likes are not close!")


def test_zero_dimensional_values_get_the_scalar_report():
    assert message_of(torch.tensor(1.0), torch.tensor(1.5)).splitlines() == [
        "Scalars are not close!",
        "",
        "Expected 1.5 but got 1.0.",
        "Absolute difference: 0.5 (up to 1e-05 allowed)",
        "Relative difference: 0.3333333333333333 (up to 1.3e-06 allowed)",
        "Tolerance: rtol=1.3e-06, atol=1e-05 (default for float32)",
    ]


def test_one_dimensional_indices_are_written_as_tuples():
    assert "at index (1,)" in message_of(np.array([0.0, 1.0]), np.array([0.0, 2.0]))


# --- NaN and infinity ----------------------------------------------------------------------------


def test_nan_never_matches_by_default_and_the_message_counts_it():
    nan = float("nan")
    message = message_of(np.array([nan, 1.0, 1.0]), np.array([nan, nan, 1.0]))
    assert "Mismatched elements: 2 / 3" in message
    assert "NaN in mismatched elements: 1 in actual, 2 in expected" in message
    assert "pass equal_nan=True if NaN should match NaN" in message


def test_equal_nan_lets_nan_match_nan_and_nothing_else():
    nan = float("nan")
    assert_close(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]), equal_nan=True)
    for a, e in [(nan, 1.0), (1.0, nan), (nan, float("inf"))]:
        with pytest.raises(AssertionError, match="NaN in mismatched elements"):
            assert_close(np.array([a]), np.array([e]), equal_nan=True)


def test_equal_nan_treats_a_complex_nan_as_nan():
    z = complex(float("nan"), 1.0)
    assert_close(np.array([z]), np.array([z]), equal_nan=True)


def test_infinities_of_the_same_sign_match():
    inf = float("inf")
    assert_close(np.array([inf, -inf, 1.0]), np.array([inf, -inf, 1.0]))


@pytest.mark.parametrize(("a", "e"), [(math.inf, -math.inf), (math.inf, 1e308), (1.0, math.inf)])
def test_an_infinity_matches_only_the_same_infinity_however_loose_the_tolerance(a, e):
    # The loosest possible tolerance: still no finite value is close to an infinity.
    message = message_of(np.array([a, 0.0]), np.array([e, 0.0]), rtol=1e300, atol=1e300)
    assert "Inf in mismatched elements" in message


# --- tolerances, dtypes and shapes ---------------------------------------------------------------


@pytest.mark.parametrize(("given", "missing"), [("rtol", "atol"), ("atol", "rtol")])
def test_one_tolerance_without_the_other_is_an_error(given, missing):
    with pytest.raises(ValueError, match=f"{given} was given without {missing}"):
        assert_close(1.0, 1.0, **{given: 0.1})


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), "0.1"])
def test_a_tolerance_that_is_not_a_nonnegative_number_is_an_error(bad):
    with pytest.raises(ValueError, match=re.escape(f"rtol must be a number >= 0, got {bad!r}")):
        assert_close(1.0, 1.0, rtol=bad, atol=0.0)


def test_a_dtype_mismatch_names_both_dtypes_and_the_way_out():
    message = message_of(torch.ones(2, dtype=torch.float16), torch.ones(2))
    assert message == (
        "dtype mismatch: actual float16, expected float32 "
        "(pass check_dtype=False to compare values only)"
    )


@pytest.mark.parametrize(
    ("actual_shape", "expected_shape"), [((2, 3), (3, 2)), ((3,), (1, 3)), ((), (1,))]
)
def test_a_shape_mismatch_names_both_shapes_and_never_broadcasts(actual_shape, expected_shape):
    message = message_of(np.zeros(actual_shape), np.zeros(expected_shape))
    assert message == f"shape mismatch: actual {actual_shape}, expected {expected_shape}"


def test_without_check_dtype_the_looser_default_applies():
    expected = torch.ones(4)  # float32
    actual = torch.full((4,), 1 + 2**-10, dtype=torch.float16)  # 1 ulp of float16: 9.8e-4
    assert "dtype mismatch" in message_of(actual, expected)
    assert_close(actual, expected, check_dtype=False)  # float16's rtol (1e-3) applies
    message = message_of(torch.full((4,), 1.5, dtype=torch.float16), expected, check_dtype=False)
    assert "rtol=0.001, atol=1e-05 (default: looser of float16 and float32)" in message


def test_without_check_dtype_integers_and_floats_compare_by_value():
    assert_close(np.arange(4), np.arange(4, dtype=np.float32), check_dtype=False)
    assert_close(torch.tensor([True, False]), np.array([1, 0], dtype=np.uint8), check_dtype=False)


def test_a_dtype_without_a_default_needs_explicit_tolerances():
    powers_of_two = torch.ones(2, dtype=torch.float8_e8m0fnu)  # the only values it holds
    with pytest.raises(ValueError, match="no default tolerance for dtype float8_e8m0fnu"):
        assert_close(powers_of_two, powers_of_two.clone())
    assert_close(powers_of_two, powers_of_two.clone(), rtol=0.0, atol=0.0)


# --- integers ------------------------------------------------------------------------------------


def test_int64_values_above_2_to_the_53_compare_exactly():
    big = 2**53  # float64 cannot tell 2**53 from 2**53 + 1
    assert_close(np.array([big + 1]), np.array([big + 1]))
    message = message_of(torch.tensor([big + 1]), np.array([big]))
    assert "Greatest absolute difference: 1 at index (0,)" in message
    assert "Expected 9007199254740992 but got 9007199254740993." in message_of(big + 1, big)


def test_uint64_and_int64_compare_exactly_without_check_dtype():
    top = np.array([2**64 - 1], dtype=np.uint64)
    assert_close(top, top.copy())
    message = message_of(top, np.array([-1]), check_dtype=False)
    assert f"Greatest absolute difference: {2**64} at index (0,)" in message


def test_an_integer_tolerance_when_given_is_honoured():
    assert_close(np.array([10, 20]), np.array([11, 20]), rtol=0.0, atol=1.0)
    message = message_of(np.array([10, 20]), np.array([12, 20]), rtol=0.0, atol=1.0)
    assert "Mismatched elements: 1 / 2" in message


def test_a_python_int_beyond_int64_is_a_value_error():
    with pytest.raises(ValueError, match="does not fit in int64"):
        assert_close(2**64, 2**64)


# --- import cost ---------------------------------------------------------------------------------


def test_the_module_works_without_importing_torch():
    code = (
        "import sys, numpy as np\n"
        "from harness.tolerances import assert_close, rel_error\n"
        "assert_close({'a': np.ones(3)}, {'a': np.ones(3)})\n"
        "assert rel_error(np.ones(2), np.ones(2)) == 0.0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- rel_error -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "value"),
    [
        (np.array([3.0, 5.0]), np.array([3.0, 4.0]), 1 / 5),  # ||(0, 1)|| / ||(3, 4)||
        (np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 2.0]), 2 / 3),  # ||(0, 0, 2)|| / 3
        (np.array([[1.0, 1.0], [1.0, 1.0]]), np.zeros((2, 2)) + 2, 2 / 4),  # sqrt(4) / sqrt(16)
        (1.5, 1.0, 0.5),
        (np.array([3 + 5j]), np.array([3 + 4j]), 1 / 5),  # |1j| / |3 + 4j|
        (np.array([2, 2]), np.array([1, 1]), 1.0),  # integers go through float64
    ],
)
def test_rel_error_matches_hand_computed_values(a, b, value):
    assert rel_error(a, b) == pytest.approx(value, rel=1e-15)


def test_rel_error_takes_bfloat16_tensors_and_mixes_with_numpy():
    a = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 2.0, 2.0], dtype=torch.bfloat16)
    assert rel_error(a, b) == pytest.approx(2 / 3, rel=1e-15)
    assert rel_error(a, np.array([1.0, 2.0, 2.0])) == pytest.approx(2 / 3, rel=1e-15)


def test_rel_error_returns_a_python_float():
    assert type(rel_error(torch.ones(3), torch.ones(3))) is float


def test_rel_error_is_zero_for_identical_inputs():
    x = np.array([1e-300, -5.0, 1e300, math.inf])
    assert rel_error(x, x.copy()) == 0.0


def test_rel_error_against_zero_is_zero_only_for_zero():
    assert rel_error(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_error(np.array([0.0, 1e-30]), np.zeros(2)) == math.inf
    assert rel_error(np.zeros(0), np.zeros(0)) == 0.0


def test_rel_error_with_nan_anywhere_is_nan():
    assert math.isnan(rel_error(np.array([math.nan, 1.0]), np.ones(2)))
    assert math.isnan(rel_error(np.ones(2), np.array([1.0, math.nan])))


def test_rel_error_does_not_overflow_on_huge_values():
    assert rel_error(np.array([3e200, 5e200]), np.array([3e200, 4e200])) == pytest.approx(0.2)


def test_rel_error_does_not_overflow_on_a_difference_beyond_the_float64_range():
    assert rel_error(np.array([1e308]), np.array([-1e308])) == 2.0


def test_rel_error_with_an_unmatched_infinity_is_infinite():
    assert rel_error(np.array([math.inf, 1.0]), np.ones(2)) == math.inf
    assert rel_error(np.ones(2), np.array([math.inf, 1.0])) == math.inf
    assert rel_error(np.array([-math.inf]), np.array([math.inf])) == math.inf


def test_rel_error_needs_one_shape_and_names_both():
    with pytest.raises(ValueError, match=re.escape("got a (2, 3) and b (3, 2)")):
        rel_error(np.zeros((2, 3)), torch.zeros(3, 2))


def test_rel_error_rejects_nested_structures_with_a_type_error():
    with pytest.raises(TypeError, match="list"):
        rel_error([1.0], [1.0])


# --- assert_equal --------------------------------------------------------------------------------


def test_assert_equal_allows_no_difference_at_all():
    assert_equal({"w": [1, 2.5]}, {"w": [1, 2.5]})
    with pytest.raises(AssertionError, match=r"(?s)up to 0.0 allowed.*actual\['w'\]\[1\]"):
        assert_equal({"w": [1, 2.5]}, {"w": [1, 2.5 + 1e-15]})
    with pytest.raises(AssertionError, match="Scalars are not equal"):
        assert_equal(torch.tensor(1.0), torch.tensor(1.0 + 2**-23))  # one float32 ulp


def test_assert_equal_checks_dtypes_unless_told_not_to():
    with pytest.raises(AssertionError, match="dtype"):
        assert_equal(np.ones(2, np.float32), np.ones(2, np.float64))
    assert_equal(np.ones(2, np.float32), np.ones(2, np.float64), check_dtype=False)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (0.0, -0.0),
        (torch.zeros(5), torch.tensor([0.0, 0.0, -0.0, 0.0, 0.0])),
        (np.zeros(3, np.float16), -np.zeros(3, np.float16)),
    ],
)
def test_bitwise_equality_tells_negative_zero_from_zero(a, b):
    assert_equal(a, b)  # equal as values
    with pytest.raises(AssertionError, match="not bitwise equal"):
        assert_equal(a, b, bitwise=True)


def test_bitwise_equality_names_the_first_differing_byte_of_a_tensor():
    a = torch.zeros(10)  # 40 bytes
    b = a.clone()
    b[3] = -0.0  # the sign bit of element 3: byte 15 in little-endian order
    with pytest.raises(AssertionError, match="first differing byte is at offset 15 of 40"):
        assert_equal({"x": [a]}, {"x": [b]}, bitwise=True)


def test_bitwise_equality_matches_nan_only_with_the_same_payload():
    nan = torch.tensor([float("nan")])
    assert_equal(nan, nan.clone(), bitwise=True)
    other = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)  # another NaN
    assert_equal(nan, other, equal_nan=True)
    with pytest.raises(AssertionError, match="not bitwise equal"):
        assert_equal(nan, other, bitwise=True)


def test_a_failure_points_at_the_test_not_inside_the_harness(pytester):
    pytester.makepyfile(
        test_tb="""
        from harness import assert_close, assert_equal

        def test_close():
            assert_close([1.0], [2.0])

        def test_equal():
            assert_equal(0.0, -0.0, bitwise=True)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--harness-deterministic=off")
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    assert "harness/tolerances.py" not in text, "a tolerances.py frame was shown"
    result.stdout.fnmatch_lines(["*assert_close([[]1.0], [[]2.0])*", "*bitwise=True)*"])


# --- what mutation testing found untested --------------------------------------------------------
# Each test below fails on a mutant of harness/tolerances.py that the tests above let survive
# (docs/benchmarks/mutation.md lists them).


def test_assert_equal_does_not_let_nan_match_nan_unless_asked():
    nan = np.array([math.nan, 1.0])
    with pytest.raises(AssertionError, match="pass equal_nan=True if NaN should match NaN"):
        assert_equal(nan, nan.copy())
    assert_equal(nan, nan.copy(), equal_nan=True)


def test_assert_equal_puts_msg_before_the_report():
    with pytest.raises(AssertionError) as info:
        assert_equal([1, 2], [1, 3], msg="token ids")
    assert str(info.value).startswith("token ids\n\nScalars are not equal!")


def test_a_top_level_bitwise_failure_is_reported_whole_without_a_location():
    with pytest.raises(AssertionError) as info:
        assert_equal(0.0, -0.0, bitwise=True)
    assert str(info.value) == (
        "Scalars are not bitwise equal: bytes 0000000000000000 vs 0000000000000080 "
        "(values compare equal; -0.0 vs 0.0 or NaN payloads differ)."
    )


@pytest.mark.parametrize(
    ("actual", "expected", "where"),
    [
        ({"w": 0.0}, {"w": -0.0}, "actual['w']"),
        ([1, (2, 0.0)], [1, (2, -0.0)], "actual[1][1]"),
        (0.0, -0.0, None),
    ],
)
def test_a_bitwise_failure_carries_msg_and_names_its_path(actual, expected, where):
    with pytest.raises(AssertionError) as info:
        assert_equal(actual, expected, bitwise=True, msg="resumed state")
    message = str(info.value)
    assert message.startswith("resumed state\n\nScalars are not bitwise equal: bytes ")
    if where is None:
        assert "The failure occurred" not in message
    else:
        assert message.endswith(f"\n\nThe failure occurred at {where}.")


def test_a_sixteen_byte_leaf_shows_both_bit_patterns():
    # complex128 is 16 bytes: the largest leaf still shown as two bit patterns.
    with pytest.raises(AssertionError) as info:
        assert_equal(complex(0.0, 1.0), complex(-0.0, 1.0), bitwise=True)
    one = "000000000000f03f"  # 1.0 in little-endian float64
    assert str(info.value).startswith(
        f"Scalars are not bitwise equal: bytes 0000000000000000{one} vs 0000000000000080{one} "
    )


def test_a_larger_leaf_names_the_first_differing_byte_instead():
    a = torch.zeros(5)  # 20 bytes
    b = a.clone()
    b[0] = -0.0  # the sign bit of element 0: byte 3 in little-endian order
    with pytest.raises(AssertionError) as info:
        assert_equal(a, b, bitwise=True)
    assert str(info.value) == (
        "Tensors are not bitwise equal: the first differing byte is at offset 3 of 20 "
        "(values compare equal; -0.0 vs 0.0 or NaN payloads differ)."
    )


def test_bitwise_with_dtypes_of_other_sizes_is_a_failure_not_a_crash():
    # check_dtype=False lets an int8 array (17 bytes) equal a float16 one (34 bytes) by value;
    # their bytes cannot be the same. This used to raise ValueError from zip(strict=True).
    with pytest.raises(AssertionError) as info:
        assert_equal(
            np.zeros(17, np.int8), np.zeros(17, np.float16), check_dtype=False, bitwise=True
        )
    assert str(info.value) == (
        "Tensors are not bitwise equal: actual has 17 bytes, expected 34 "
        "(values compare equal; the dtypes differ: int8 and float16)."
    )


def test_bitwise_across_dtypes_compares_the_bytes_as_they_are():
    assert_equal(0, 0.0, check_dtype=False, bitwise=True)  # int64 0 and float64 0.0: all zero
    with pytest.raises(AssertionError) as info:
        assert_equal(True, 1, check_dtype=False, bitwise=True)
    assert str(info.value) == (
        "Scalars are not bitwise equal: bytes 01 vs 0100000000000000 "
        "(values compare equal; the dtypes differ: bool and int64)."
    )


@pytest.mark.parametrize(
    ("zero", "negative_zero"),
    [(complex(0.0, 0.0), complex(-0.0, 0.0)), (0.0, -0.0)],
    ids=["complex", "float"],
)
def test_python_scalars_are_compared_by_their_bits(zero, negative_zero):
    assert_equal([zero, 7, True], [zero, 7, True], bitwise=True)
    with pytest.raises(AssertionError, match="not bitwise equal"):
        assert_equal(zero, negative_zero, bitwise=True)


@pytest.mark.parametrize(
    ("make", "offset"),
    [
        # bfloat16 has no NumPy dtype; element 1's sign bit is its high byte: offset 3.
        (lambda: torch.zeros(10, dtype=torch.bfloat16), 3),
        # NumPy refuses a tensor that requires grad; float32 element 1's high byte: offset 7.
        (lambda: torch.zeros(10, requires_grad=True), 7),
    ],
    ids=["bfloat16", "requires_grad"],
)
def test_bitwise_reads_the_bits_of_tensors_numpy_cannot_take(make, offset):
    a = make()
    assert_equal(a, make(), bitwise=True)
    b = make().detach().clone()
    b[1] = -0.0
    with pytest.raises(AssertionError, match=f"first differing byte is at offset {offset} of"):
        assert_equal(a, b, bitwise=True)


def test_a_type_mismatch_names_a_non_builtin_type_with_its_module():
    message = message_of([1.0], np.zeros(1))
    assert message == "type mismatch: actual is list, expected is numpy.ndarray"


def test_bools_are_reported_as_bools():
    assert message_of(True, False).splitlines()[:3] == [
        "Scalars are not equal!",
        "",
        "Expected False but got True.",
    ]


def test_uint64_and_int64_values_above_2_to_the_53_are_equal_without_check_dtype():
    # float64 cannot tell 2**53 + 1 from 2**53: the comparison must stay in integers.
    big = 2**53 + 1
    assert_close(np.array([big], np.uint64), np.array([big], np.int64), check_dtype=False)
    assert_close(np.array([big], np.int64), np.array([big], np.uint64), check_dtype=False)


@pytest.mark.parametrize("side", ["actual", "expected"])
def test_mixed_integer_dtypes_report_the_exact_difference_above_2_to_the_53(side):
    big, small = np.array([2**53 + 1], np.int64), np.array([0], np.int32)
    actual, expected = (big, small) if side == "actual" else (small, big)
    message = message_of(actual, expected, check_dtype=False)
    assert f"Greatest absolute difference: {2**53 + 1} at index (0,)" in message


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        ("1.0", 1.0, "expected a tensor, array or number, got str (at a)"),
        (1.0, [1.0], "expected a tensor, array or number, got list (at b)"),
    ],
)
def test_rel_error_names_which_argument_has_the_unsupported_type(a, b, message):
    with pytest.raises(TypeError) as info:
        rel_error(a, b)
    assert str(info.value) == message


def test_rel_error_with_nan_against_zero_is_nan_not_infinite():
    assert math.isnan(rel_error(np.array([math.nan, 0.0]), np.zeros(2)))
    assert math.isnan(rel_error(np.zeros(2), np.array([0.0, math.nan])))


def test_rel_error_of_a_difference_whose_norm_passes_the_float64_range_is_finite():
    # ||a - b|| = 1.6e308 * sqrt(2) is past float64's 1.8e308; the ratio is exactly 2.
    # This returned inf while ||a - b|| was formed before dividing.
    a = np.array([8e307, 8e307])
    assert rel_error(a, -a) == 2.0
    assert rel_error(a[:1], -a[:1]) == 2.0


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (complex(math.inf, 0.0), complex(math.inf, 1.0)),  # inf - inf in the real part
        (complex(math.inf, 0.0), complex(1.0, 0.0)),
        (complex(1.0, 0.0), complex(0.0, -math.inf)),
    ],
)
def test_rel_error_with_an_unmatched_complex_infinity_is_infinite(a, b):
    # The first was nan when both real parts were inf; each case made NumPy warn.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rel_error(np.array([a, 1.0]), np.array([b, 1.0])) == math.inf


# --- the passing path ----------------------------------------------------------------------------
# White-box on purpose: the fast path's verdict is invisible from outside (the exact path gives
# the same answer, only slower), so a change that made it decline everything would lose its
# speed silently. These pin that it decides the common passing case and declines what only the
# exact path may decide.


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16"])
def test_clearly_close_tensors_are_decided_by_the_fast_path_in_their_own_precision(name):
    from harness.tolerances import _tensors_all_close

    expected = torch.linspace(-3, 3, 1001, dtype=getattr(torch, name))
    rtol, atol = SPEC[name]
    actual = expected.double().add(0.5 * atol).to(expected.dtype)  # half the bound at most
    assert _tensors_all_close(actual, expected, None, None, False, True)


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_clearly_close_numpy_arrays_are_decided_by_the_fast_path(name):
    from harness.tolerances import _arrays_all_close

    expected = np.linspace(-3, 3, 1001).astype(name)
    assert _arrays_all_close(expected.copy(), expected, None, None, True)


@pytest.mark.parametrize(
    "special",
    [math.nan, math.inf, -math.inf],
)
def test_nan_and_infinities_are_left_to_the_exact_path(special):
    from harness.tolerances import _arrays_all_close, _tensors_all_close

    values = [1.0, special]
    assert not _tensors_all_close(
        torch.tensor(values), torch.tensor(values), None, None, True, True
    )
    assert not _arrays_all_close(np.array(values), np.array(values), None, None, True)
    # ... which still decides them: equal infinities match, NaN only with equal_nan.
    assert_close(torch.tensor(values), torch.tensor(values), equal_nan=True)


def test_a_subnormal_rtol_is_left_to_the_exact_path():
    from harness.tolerances import _arrays_all_close

    x = np.ones(3, np.float32)
    assert not _arrays_all_close(x, x.copy(), 1e-40, 0.0, True)
    assert _arrays_all_close(x, x.copy(), 1e-30, 0.0, True)
