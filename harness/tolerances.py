"""Numeric comparison for tests: one ``assert_close`` with a per-dtype tolerance table.

Modelled on ``torch.testing.assert_close``: per-dtype default ``(rtol, atol)`` pairs kept in one
table, both tolerances or neither, dtype and shape checked by default, and a failure message
that says how many elements are off, by how much, where, and what was allowed. Unlike torch's
version it takes torch tensors, NumPy arrays and Python scalars interchangeably, and it does
not import torch: tensors are recognised only when the caller has already imported torch, so
the module works (and imports fast) where torch is not installed.

Examples::

    >>> import numpy as np
    >>> assert_close(np.float32(1.0) + np.float32(1e-6), np.float32(1.0))
    >>> assert_close([1.0, {"b": 2}], [1.0, {"b": 2}])
    >>> assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    Traceback (most recent call last):
    ...
    AssertionError: Tensor-likes are not close!
    <BLANKLINE>
    Mismatched elements: 1 / 2 (50.0%)
    Greatest absolute difference: 0.5 at index (1,) (up to 1e-07 allowed)
    Greatest relative difference: 0.2 at index (1,) (up to 1e-07 allowed)
    Tolerance: rtol=1e-07, atol=1e-07 (default for float64)
    >>> rel_error(np.array([3.0, 5.0]), np.array([3.0, 4.0]))
    0.2

Over 500 lines, one concern: comparing numbers. Below the public functions (``assert_close``,
``assert_equal``, ``rel_error``) is only their leaf conversion and failure message.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import numpy as np

__all__ = [
    "DEFAULT_TOLERANCES",
    "Observer",
    "assert_close",
    "assert_equal",
    "assert_within",
    "get_observer",
    "rel_error",
    "set_observer",
]

Observer = Callable[[str, Any, Any, float | None, float | None, bool], tuple[float, float] | None]
"""``observer(kind, actual, expected, rtol, atol, check_dtype)``, called before every check is
decided: it may record how close the check comes to its bound and may return ``(rtol, atol)``
to check against instead (a per-call-site override). Installed by the pytest plugin's
``--harness-record-errors`` mode (harness.tolerances_evidence.recording)."""

_observer: Observer | None = None


def set_observer(observer: Observer | None) -> Observer | None:
    """Install ``observer`` (None: none) for every later check; returns the previous one."""
    global _observer
    previous, _observer = _observer, observer
    return previous


def get_observer() -> Observer | None:
    """The installed observer, or None (the default: nothing recorded, nothing overridden)."""
    return _observer


_EXACT = (0.0, 0.0)

#: Default ``(rtol, atol)`` per dtype name, used when neither tolerance is given.
#: float16/bfloat16/float32/float64 and the complex types are torch.testing's values.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    # float8 has no torch.testing default (torch compares it exactly, which no float8 kernel
    # passes). rtol is one unit in the last place at 1.0: e4m3 keeps 3 mantissa bits, so
    # 2**-3 = 0.125; e5m2 keeps 2, so 2**-2 = 0.25. atol is a floor for values near zero,
    # where float8's few exponent steps flush small results to 0 or the smallest subnormal.
    "float8_e4m3fn": (0.125, 1e-3),
    "float8_e4m3fnuz": (0.125, 1e-3),
    "float8_e5m2": (0.25, 1e-3),
    "float8_e5m2fnuz": (0.25, 1e-3),
    # Complex values are compared by modulus of the difference, with the precision of their
    # component type (complex32 is torch's half-precision complex).
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
    "bool": _EXACT,
    "int8": _EXACT,
    "int16": _EXACT,
    "int32": _EXACT,
    "int64": _EXACT,
    "uint8": _EXACT,
    "uint16": _EXACT,
    "uint32": _EXACT,
    "uint64": _EXACT,
}

# Floating dtypes NumPy holds natively; any other torch floating dtype (bfloat16, float8,
# complex32) is widened by torch before crossing over.
_NUMPY_NATIVE_INEXACT = {"float16", "float32", "float64", "complex64", "complex128"}

_SUPPORTED = (
    "torch.Tensor, numpy.ndarray, numpy scalars, int, float, bool, complex, None, "
    "and lists, tuples and dicts of these"
)


def assert_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
    check_dtype: bool = True,
    msg: str | None = None,
) -> None:
    """Assert that ``actual`` and ``expected`` are close: ``|a - e| <= atol + rtol * |e|``.

    Leaves may be torch tensors (any device; compared on the CPU), NumPy arrays or scalars,
    or Python ``int``/``float``/``bool``/``complex``; ``None`` matches only ``None``. Lists,
    tuples and dicts are compared item by item: same keys, same lengths, and a failure names
    the path to the bad leaf (``actual['layer1'][2]``). A list and a tuple compare as equals.

    Without ``rtol``/``atol`` the defaults come from :data:`DEFAULT_TOLERANCES` by dtype
    (Python ``float`` is float64, ``int`` is int64). Integer and bool leaves must match
    exactly and are compared as integers, so int64 values above 2**53 do not lose bits.
    Everything else is compared in float64 (complex128), bfloat16 and float8 widened by torch.
    Infinities match only the same infinity; NaN matches nothing unless ``equal_nan`` (then
    it matches only NaN).

    Args:
        rtol, atol: give both or neither; a loosened tolerance in a test should carry a
            comment saying why.
        equal_nan: let NaN match NaN.
        check_dtype: require the same dtype name (``torch.float32`` and ``np.float32`` are
            the same). When False, values of any dtypes are compared and the looser of the
            two defaults applies (the larger rtol and the larger atol).
        msg: prepended to the failure message.

    Raises:
        AssertionError: values, dtypes, shapes or structure differ.
        ValueError: only one of ``rtol``/``atol`` given, a negative tolerance, or a dtype
            with no default tolerance and none given.
        TypeError: a leaf of an unsupported type.

    Examples::

        >>> import numpy as np
        >>> assert_close(np.ones(3, np.float16), np.ones(3, np.float16) + np.float16(1e-3))
        >>> assert_close({"w": [1, 2]}, {"w": [1, 3]})
        Traceback (most recent call last):
        ...
        AssertionError: Scalars are not equal!
        <BLANKLINE>
        Expected 3 but got 2.
        Absolute difference: 1 (up to 0.0 allowed)
        Relative difference: 0.3333333333333333 (up to 0.0 allowed)
        Tolerance: rtol=0.0, atol=0.0 (default for int64)
        <BLANKLINE>
        The failure occurred at actual['w'][1].
        >>> assert_close(1.0, 1.1, rtol=0.1, atol=0.0)  # a loose bound: say why in real tests
    """
    __tracebackhide__ = True  # a failure points at the test's line, not at this module
    if (rtol is None) != (atol is None):
        given, missing = ("rtol", "atol") if atol is None else ("atol", "rtol")
        raise ValueError(
            f"{given} was given without {missing}: pass both rtol and atol, or neither to use "
            f"the per-dtype defaults"
        )
    if rtol is not None and atol is not None:
        _check_tolerance("rtol", rtol)
        _check_tolerance("atol", atol)
        rtol, atol = float(rtol), float(atol)
    if _observer is not None:  # the one flag check recording costs when it is off
        override = _observer("assert_close", actual, expected, rtol, atol, check_dtype)
        if override is not None:
            rtol, atol = override
    _compare(actual, expected, "actual", rtol, atol, equal_nan, check_dtype, msg)


def assert_equal(
    actual: Any,
    expected: Any,
    *,
    bitwise: bool = False,
    equal_nan: bool = False,
    check_dtype: bool = True,
    msg: str | None = None,
) -> None:
    """Assert exact equality: :func:`assert_close` with ``rtol=0, atol=0``.

    The one spelling of "these must be equal" in the suites (as torch.testing recommends
    ``functools.partial(assert_close, rtol=0, atol=0)`` over a second idiom), with the same
    structure walk and failure report.

    Args:
        bitwise: also require the same bits in every leaf, where bits are the claim
            (bit-identical resume, a deterministic kernel): ``-0.0`` differs from ``0.0``
            and NaN matches only a NaN with the same payload. Implies ``equal_nan``. With
            ``check_dtype=False``, leaves of two dtypes pass only if their bytes are the same
            (int64 ``0`` and float64 ``0.0`` do; ``1`` and ``1.0`` do not).
        equal_nan: let NaN match NaN.
        check_dtype, msg: as for :func:`assert_close`.

    Examples::

        >>> assert_equal([1, 2.5], [1, 2.5])
        >>> assert_equal(0.0, -0.0)
        >>> assert_equal(0.0, -0.0, bitwise=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: Scalars are not bitwise equal: bytes 0000000000000000 vs 00000000000000...
    """
    __tracebackhide__ = True
    assert_close(
        actual,
        expected,
        rtol=0.0,
        atol=0.0,
        equal_nan=equal_nan or bitwise,
        check_dtype=check_dtype,
        msg=msg,
    )
    if bitwise:
        _compare_bits(actual, expected, "actual", msg)


def assert_within(error: Any, bound: Any, *, msg: str | None = None) -> None:
    """Assert ``error <= bound`` elementwise, for a bound the test computes itself.

    For checks that are not ``|a - e| <= atol + rtol |e|``: a norm-wise error against a
    per-dtype constant (``assert_within(rel_error(out, ref), FWD_TOL[dtype])``) or an
    elementwise rounding-error bound (``assert_within(np.abs(result - exact), bound)``).
    Unlike a bare ``assert``, the share of the bound used is recorded under
    ``--harness-record-errors``, so ``harness tolerances propose`` can judge the bound.
    ``bound`` broadcasts against ``error``; NaN in either never passes.

    Examples::

        >>> assert_within(rel_error(np.array([1.0, 2.0]), np.array([1.0, 2.001])), 1e-3)
        >>> assert_within(np.array([0.1, 0.3]), np.array([0.2, 0.2]))
        Traceback (most recent call last):
        ...
        AssertionError: error exceeds its bound at 1 of 2 elements: the worst is 0.3 > 0.2 \
at index (1,) (1.5x the bound)
    """
    __tracebackhide__ = True
    if _observer is not None:
        given = _observer("within", error, bound, None, None, False)
        if given is not None:
            bound = np.asarray(bound, dtype=np.float64) * given[1]
    err = np.asarray(error, dtype=np.float64)
    lim = np.broadcast_to(np.asarray(bound, dtype=np.float64), err.shape)
    with np.errstate(invalid="ignore"):
        bad = ~(err <= lim)
    if not bad.any():
        return
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(np.isnan(err) | np.isnan(lim), np.inf, err / lim)
    idx = np.unravel_index(int(np.argmax(np.where(bad, ratio, -np.inf))), err.shape)
    where = f" at index {tuple(int(i) for i in idx)}" if err.ndim else ""
    text = (
        f"error exceeds its bound at {int(bad.sum())} of {bad.size} elements: the worst is "
        f"{float(err[idx])!r} > {float(lim[idx])!r}{where} ({float(ratio[idx]):.3g}x the bound)"
    )
    raise AssertionError(f"{msg}\n\n{text}" if msg else text)


def _compare_bits(actual: Any, expected: Any, path: str, msg: str | None) -> None:
    # Called after assert_close passed: both sides have the same structure and shapes, and the
    # same dtypes unless check_dtype=False.
    __tracebackhide__ = True
    kind = _kind(actual, path)
    if kind == "mapping":
        for key in expected:
            _compare_bits(actual[key], expected[key], f"{path}[{key!r}]", msg)
    elif kind == "sequence":
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _compare_bits(a, e, f"{path}[{i}]", msg)
    elif kind == "leaf":
        a_bytes, e_bytes = _leaf_bytes(actual), _leaf_bytes(expected)
        if a_bytes == e_bytes:
            return
        if len(a_bytes) <= 16:  # a scalar: show both bit patterns
            line = f"Scalars are not bitwise equal: bytes {a_bytes.hex()} vs {e_bytes.hex()}"
        elif len(a_bytes) != len(e_bytes):  # check_dtype=False with dtypes of other sizes
            line = (
                f"Tensors are not bitwise equal: actual has {len(a_bytes)} bytes, "
                f"expected {len(e_bytes)}"
            )
        else:
            pairs = zip(a_bytes, e_bytes, strict=True)
            first = next(i for i, (x, y) in enumerate(pairs) if x != y)
            line = (
                "Tensors are not bitwise equal: the first differing byte is at offset "
                f"{first} of {len(a_bytes)}"
            )
        a_dtype, e_dtype = _to_leaf(actual, path)[1], _to_leaf(expected, path)[1]
        if a_dtype == e_dtype:
            why = "-0.0 vs 0.0 or NaN payloads differ"
        else:
            why = f"the dtypes differ: {a_dtype} and {e_dtype}"
        _fail([f"{line} (values compare equal; {why})."], path, msg)


def _leaf_bytes(x: Any) -> bytes:
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(x, tensor):
        import torch

        flat = x.detach().to("cpu").contiguous().reshape(-1)
        return bytes(flat.view(torch.uint8).numpy().tobytes())
    if isinstance(x, float):
        return np.float64(x).tobytes()
    if isinstance(x, complex):
        return np.complex128(x).tobytes()
    if isinstance(x, bool):
        return np.bool_(x).tobytes()
    if isinstance(x, int):
        return np.int64(x).tobytes()
    return bytes(np.ascontiguousarray(x).tobytes())


def rel_error(a: Any, b: Any) -> float:
    """Relative error ``||a - b||_2 / ||b||_2`` over all elements, computed in float64.

    The relative-norm check used for kernels: an attention or matmul kernel's output is
    compared to a reference by this single number against a per-dtype bound (FlashAttention's
    tests, for example, require the kernel's error to be within a small multiple of the
    error of a plain PyTorch implementation in the same low precision). Unlike an elementwise
    check, it tolerates the occasional large relative error on an element near zero.

    ``a`` and ``b`` are tensors (any dtype, bfloat16 and float8 included), arrays or scalars
    of one shape. ``b`` is the reference. When ``||b|| == 0`` the result is 0.0 if ``a`` is
    zero too, else inf. Any NaN gives nan. Infinities that match exactly count as no error
    (and are left out of ``||b||``, which they would make infinite); any other infinity gives
    inf.

    Examples::

        >>> import numpy as np
        >>> rel_error(np.array([3.0, 5.0]), np.array([3.0, 4.0]))  # ||(0, 1)|| / ||(3, 4)||
        0.2
        >>> rel_error(0.0, 0.0), rel_error(1e-30, 0.0)
        (0.0, inf)
    """
    x = _as_inexact(_to_leaf(a, "a")[0])
    y = _as_inexact(_to_leaf(b, "b")[0])
    if x.shape != y.shape:
        raise ValueError(f"rel_error needs inputs of one shape, got a {x.shape} and b {y.shape}")
    if np.isnan(x).any() or np.isnan(y).any():
        return math.nan
    same_inf = np.isinf(y) & (x == y)
    if same_inf.any():
        x, y = x[~same_inf], y[~same_inf]
    if np.isinf(x).any() or np.isinf(y).any():  # a complex one may be inf in one part only
        return math.inf
    if max(_peak(x), _peak(y)) > np.finfo(np.float64).max / 2:
        # x - y could overflow. The ratio does not change when both are halved, which is
        # exact at these magnitudes.
        x, y = x / 2, y / 2
    # Each norm as peak * root, so that neither is formed: ||x - y|| alone can pass the
    # float64 range (two elements of 1.6e308) when the ratio does not.
    (num_peak, num_root), (den_peak, den_root) = _norm2_parts(x - y), _norm2_parts(y)
    if den_peak == 0.0:
        return 0.0 if num_peak == 0.0 else math.inf
    return float(num_peak / den_peak * (num_root / den_root))


# ---------------------------------------------------------------------------------------------
# Structure


def _compare(
    actual: Any,
    expected: Any,
    path: str,
    rtol: float | None,
    atol: float | None,
    equal_nan: bool,
    check_dtype: bool,
    msg: str | None,
) -> None:
    __tracebackhide__ = True
    # Classify both sides before comparing kinds, so an unsupported leaf is reported as a
    # TypeError (a bug in the test) rather than as a mismatch (a bug in the code under test).
    expected_path = path.replace("actual", "expected", 1)
    kind_a, kind_e = _kind(actual, path), _kind(expected, expected_path)
    if kind_a != kind_e:
        kinds = f"actual is {_type_name(actual)}, expected is {_type_name(expected)}"
        _fail([f"type mismatch: {kinds}"], path, msg)
    if kind_a == "none":
        return
    if kind_a == "mapping":
        missing = [k for k in expected if k not in actual]
        extra = [k for k in actual if k not in expected]
        if missing or extra:
            _fail(
                [f"dict keys differ: missing from actual {missing}, not expected {extra}"],
                path,
                msg,
            )
        for key in expected:
            _compare(
                actual[key],
                expected[key],
                f"{path}[{key!r}]",
                rtol,
                atol,
                equal_nan,
                check_dtype,
                msg,
            )
        return
    if kind_a == "sequence":
        if len(actual) != len(expected):
            _fail(
                [f"length mismatch: actual has {len(actual)} items, expected {len(expected)}"],
                path,
                msg,
            )
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _compare(a, e, f"{path}[{i}]", rtol, atol, equal_nan, check_dtype, msg)
        return
    if _tensors_all_close(actual, expected, rtol, atol, equal_nan, check_dtype):
        return
    if _arrays_all_close(actual, expected, rtol, atol, check_dtype):
        return
    lines = _compare_leaves(
        _to_leaf(actual, path),
        _to_leaf(expected, expected_path),
        rtol,
        atol,
        equal_nan,
        check_dtype,
    )
    if lines:
        _fail(lines, path, msg)


def _kind(x: Any, path: str) -> str:
    if x is None:
        return "none"
    if _is_leaf(x):
        return "leaf"
    if isinstance(x, Mapping):
        return "mapping"
    if isinstance(x, (list, tuple)):
        return "sequence"
    raise TypeError(
        f"assert_close does not support {_type_name(x)} (at {path}); it compares {_SUPPORTED}"
    )


def _fail(lines: list[str], path: str, msg: str | None) -> NoReturn:
    __tracebackhide__ = True
    if path != "actual":  # only nested leaves need a location
        lines = [*lines, "", f"The failure occurred at {path}."]
    text = "\n".join(lines)
    raise AssertionError(f"{msg}\n\n{text}" if msg else text)


def _type_name(x: Any) -> str:
    cls = type(x)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _check_tolerance(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Leaves: everything becomes a NumPy array plus the dtype name it came with


def _torch_tensor_type() -> Any:
    # torch costs ~1.5 s to import. If the caller has not imported it, no tensor can exist,
    # so looking it up in sys.modules is both cheap and exact.
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def _is_leaf(x: Any) -> bool:
    tensor = _torch_tensor_type()
    return isinstance(x, (np.ndarray, np.generic, bool, int, float, complex)) or (
        tensor is not None and isinstance(x, tensor)
    )


def _to_leaf(x: Any, path: str) -> tuple[np.ndarray, str]:
    """Return ``(values, dtype name)``; values keep their dtype unless NumPy lacks it."""
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(x, tensor):
        return _tensor_to_numpy(x, path)
    if isinstance(x, bool):  # before int: bool is an int subclass
        return np.asarray(x, dtype=np.bool_), "bool"
    if isinstance(x, int):
        try:
            return np.asarray(x, dtype=np.int64), "int64"
        except OverflowError:
            raise ValueError(
                f"the Python int {x} (at {path}) does not fit in int64; "
                f"compare it as a float or an int64 array"
            ) from None
    if isinstance(x, float):
        return np.asarray(x, dtype=np.float64), "float64"
    if isinstance(x, complex):
        return np.asarray(x, dtype=np.complex128), "complex128"
    if isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
        if arr.dtype.kind in "biufc":
            return arr, arr.dtype.name
        if arr.dtype.name in DEFAULT_TOLERANCES:  # ml_dtypes' bfloat16/float8 arrays
            return arr.astype(np.float64), arr.dtype.name
        raise TypeError(
            f"assert_close does not support numpy arrays of dtype {arr.dtype} (at {path})"
        )
    raise TypeError(f"expected a tensor, array or number, got {_type_name(x)} (at {path})")


def _tensor_to_numpy(t: Any, path: str) -> tuple[np.ndarray, str]:
    torch = sys.modules["torch"]
    name = str(t.dtype).removeprefix("torch.")
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    # Conjugate and negative views are lazy bits that .numpy() refuses; materialise them.
    t = t.cpu().resolve_conj().resolve_neg()
    if (t.dtype.is_floating_point or t.dtype.is_complex) and name not in _NUMPY_NATIVE_INEXACT:
        # Widening is exact for every narrower float, and values are compared in float64 anyway.
        t = t.to(torch.complex128 if t.dtype.is_complex else torch.float64)
    try:
        return t.numpy(), name
    except (TypeError, RuntimeError) as err:
        raise TypeError(
            f"assert_close does not support tensors of dtype {name} (at {path}): {err}"
        ) from None


def _as_inexact(values: np.ndarray) -> np.ndarray:
    return values.astype(np.complex128 if values.dtype.kind == "c" else np.float64, copy=False)


def _peak(x: np.ndarray) -> float:
    return float(np.abs(x).max(initial=0.0))


def _norm2_parts(x: np.ndarray) -> tuple[float, float]:
    """``(peak, root)`` with ``||x||_2 == peak * root`` and ``1 <= root <= sqrt(x.size)``.

    ``x`` is finite. Scaled by the largest magnitude first: squaring values above ~1e154 would
    overflow to inf, and the product itself can pass the float64 range.
    """
    peak = _peak(x)
    if peak == 0.0:
        return 0.0, 1.0
    return peak, float(np.sqrt(np.sum(np.square(np.abs(x) / peak))))


# ---------------------------------------------------------------------------------------------
# Comparing two leaves


def _tensors_all_close(
    a: Any, e: Any, rtol: float | None, atol: float | None, equal_nan: bool, check_dtype: bool
) -> bool:
    """Fast path: True when two dense real torch tensors on one device are close everywhere.

    Decided where the tensors live (a CUDA comparison never leaves the GPU), in their own
    precision, with a margin that makes a True as certain as the exact rule of :func:`_isclose`
    in float64 (:func:`_proof_margin`). False means "not shown close here", never "not close":
    the NumPy path then decides and writes the message, so a failure is reported the same way,
    and pairs within a few units of rounding of the bound are decided there too.
    """
    tensor = _torch_tensor_type()
    if tensor is None or not (isinstance(a, tensor) and isinstance(e, tensor)):
        return False
    import torch

    if (
        a.layout != torch.strided
        or e.layout != torch.strided
        or a.device != e.device
        or a.shape != e.shape
        or a.is_complex()
        or e.is_complex()
    ):
        return False
    a_dtype, e_dtype = (str(t.dtype).removeprefix("torch.") for t in (a, e))
    if check_dtype and a_dtype != e_dtype:
        return False
    if not (a.is_floating_point() and e.is_floating_point()):
        return False  # integers and bools: exactness rules live in the NumPy path
    try:
        rtol, atol, _ = _tolerances(a_dtype, e_dtype, rtol, atol)
    except ValueError:
        return False
    # Computed in the inputs' own precision (at least float32, where bfloat16 and float16 widen
    # exactly): a float64 copy of both sides would cost more than the comparison itself.
    # (torch refuses to promote float8 types; every float type but float64 widens into float32.)
    dtype = torch.float64 if torch.float64 in (a.dtype, e.dtype) else torch.float32
    finfo = torch.finfo(dtype)
    margin = _proof_margin(rtol, atol, finfo.eps, finfo.tiny)
    if margin is None or a.numel() == 0:
        return False
    shrunk_rtol, limit = margin
    a, e = a.detach().to(dtype), e.detach().to(dtype)
    excess = torch.sub(a, e).abs_()  # |a - e|
    excess.sub_(e.abs().mul_(shrunk_rtol))  # |a - e| - rtol' |e|; NaN stays NaN
    return _within(float(excess.max()), limit)


def _arrays_all_close(
    a: Any, e: Any, rtol: float | None, atol: float | None, check_dtype: bool
) -> bool:
    """Fast path for two real NumPy float arrays of one shape: True when close everywhere.

    The NumPy twin of :func:`_tensors_all_close`, with the same contract: False only means
    "not shown close here" and sends the comparison down the exact path.
    """
    if not (isinstance(a, np.ndarray) and isinstance(e, np.ndarray)):
        return False
    if a.shape != e.shape or a.size == 0:
        return False
    # Not longdouble: the exact path compares in float64, and a proof in a wider format could
    # disagree with it on values that float64 rounds.
    if not {a.dtype.name, e.dtype.name} <= {"float16", "float32", "float64"}:
        return False
    if check_dtype and a.dtype != e.dtype:
        return False
    try:
        rtol, atol, _ = _tolerances(a.dtype.name, e.dtype.name, rtol, atol)
    except ValueError:
        return False
    dtype = np.promote_types(np.promote_types(a.dtype, e.dtype), np.float32)
    finfo = np.finfo(dtype)
    margin = _proof_margin(rtol, atol, float(finfo.eps), float(finfo.tiny))
    if margin is None:
        return False
    shrunk_rtol, limit = margin
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.subtract(a, e, dtype=dtype)
        np.abs(excess, out=excess)
        scaled = np.abs(e).astype(dtype, copy=False)  # a fresh array either way
        scaled *= dtype.type(shrunk_rtol)
        excess -= scaled
        return _within(float(excess.max()), limit)


def _proof_margin(rtol: float, atol: float, eps: float, tiny: float) -> tuple[float, float] | None:
    """``(rtol', limit)`` such that ``max(|a - e| - rtol' |e|) <= limit``, computed in a float
    format with machine epsilon ``eps`` and smallest normal ``tiny``, proves
    ``|a - e| <= atol + rtol |e|`` for every element in exact arithmetic (and so in the float64
    arithmetic of the exact path); None where no such proof is offered.

    Each rounded operation (the subtraction, the product, the conversion of rtol, the final
    subtraction) errs by at most eps/2 relative, or by half the smallest subnormal
    ``tiny * eps`` absolute near zero. Shrinking both tolerances by 64 such units and taking
    eight subnormals off the limit covers all of them with room to spare; a pair that close to
    the bound (a few parts per million in float32) is left to the exact path.
    """
    # Overflow needs no guard: where rtol' |e| rounds to inf, the true bound is past the
    # format's largest value, which no finite |a - e| computed here exceeds (an infinite one
    # gives inf - inf = NaN, which is never within). A subnormal rtol would lose its relative
    # precision in the conversion: not worth a proof, the exact path takes it.
    if 0.0 < rtol < tiny:
        return None
    shrink = 1.0 - 32.0 * eps  # 64 units of eps/2
    return rtol * shrink, atol * shrink - 8.0 * tiny * eps


def _within(worst_excess: float, limit: float) -> bool:
    # NaN (from a NaN or from inf - inf) is never within: the exact path decides those.
    return worst_excess <= limit


def _compare_leaves(
    a: Any, e: Any, rtol: float | None, atol: float | None, equal_nan: bool, check_dtype: bool
) -> list[str] | None:
    (av, a_dtype), (ev, e_dtype) = a, e
    if av.shape != ev.shape:  # never broadcast: (3,) against (1, 3) is a bug worth seeing
        return [f"shape mismatch: actual {av.shape}, expected {ev.shape}"]
    if check_dtype and a_dtype != e_dtype:
        return [
            f"dtype mismatch: actual {a_dtype}, expected {e_dtype} "
            f"(pass check_dtype=False to compare values only)"
        ]
    rtol, atol, source = _tolerances(a_dtype, e_dtype, rtol, atol)

    integral = av.dtype.kind in "biu" and ev.dtype.kind in "biu"
    if integral:
        av, ev = _common_integer(av, ev)
        matches = av == ev
        if rtol or atol:
            # Equal values already passed exactly; the tolerance test itself may round above
            # 2**53, which matters only for a bound that fine on numbers that large.
            matches |= _isclose(av.astype(np.float64), ev.astype(np.float64), rtol, atol, False)
    else:
        av, ev = _as_inexact(av), _as_inexact(ev)
        matches = _isclose(av, ev, rtol, atol, equal_nan)
    if matches.all():
        return None

    header = "Scalars" if av.ndim == 0 else "Tensor-likes"
    lines = [f"{header} are not {'equal' if rtol == atol == 0 else 'close'}!", ""]
    lines += _difference_lines(av, ev, ~matches, rtol, atol, integral)
    if not integral:
        lines += _special_value_lines(av, ev, ~matches, equal_nan)
    lines.append(f"Tolerance: rtol={rtol!r}, atol={atol!r} ({source})")
    return lines


def _tolerances(
    a_dtype: str, e_dtype: str, rtol: float | None, atol: float | None
) -> tuple[float, float, str]:
    if rtol is not None and atol is not None:  # given together or not at all (assert_close)
        return rtol, atol, "given"
    for name in (a_dtype, e_dtype):
        if name not in DEFAULT_TOLERANCES:
            raise ValueError(
                f"no default tolerance for dtype {name}: pass rtol= and atol= "
                f"(defaults exist for {', '.join(DEFAULT_TOLERANCES)})"
            )
    if a_dtype == e_dtype:
        return (*DEFAULT_TOLERANCES[a_dtype], f"default for {a_dtype}")
    (ra, aa), (re, ae) = DEFAULT_TOLERANCES[a_dtype], DEFAULT_TOLERANCES[e_dtype]
    return max(ra, re), max(aa, ae), f"default: looser of {a_dtype} and {e_dtype}"


def _common_integer(a: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.dtype == e.dtype:
        return a, e
    # NumPy promotes int64 with uint64 to float64, which would round; Python ints do not.
    if np.dtype(np.uint64) in (a.dtype, e.dtype):
        return a.astype(object), e.astype(object)
    return a.astype(np.int64), e.astype(np.int64)


def _isclose(a: np.ndarray, e: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    # Same rule as torch.isclose: exact equality first (so inf matches only the same inf),
    # then the tolerance test for finite pairs only (inf - inf is nan, inf vs 1e308 is never
    # close however loose the tolerance).
    with np.errstate(invalid="ignore", over="ignore"):
        close = a == e
        if equal_nan:
            close |= np.isnan(a) & np.isnan(e)
        finite = np.isfinite(a) & np.isfinite(e)
        close |= finite & (np.abs(a - e) <= atol + rtol * np.abs(e))
    return np.asarray(close)


def _difference_lines(
    a: np.ndarray, e: np.ndarray, bad: np.ndarray, rtol: float, atol: float, integral: bool
) -> list[str]:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if integral:  # only to find where; the reported values are exact below
            abs_diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
        else:
            abs_diff = np.abs(a - e)
        rel_diff = abs_diff / np.abs(e.astype(np.float64) if integral else e)

    def worst(diff: np.ndarray) -> tuple[Any, ...] | None:
        # The largest difference among mismatched elements. NaN differences (from NaN inputs,
        # or inf against inf) are left out here and counted by _special_value_lines.
        candidates = np.asarray(bad & ~np.isnan(diff))
        if not candidates.any():
            return None
        return np.unravel_index(int(np.argmax(np.where(candidates, diff, -np.inf))), diff.shape)

    def value(kind: str, idx: Any) -> Any:
        if idx is None:
            return math.nan
        if not integral:
            return float((abs_diff if kind == "absolute" else rel_diff)[idx])
        d = abs(int(a[idx]) - int(e[idx]))  # exact, even above 2**53
        return d if kind == "absolute" else (d / abs(int(e[idx])) if int(e[idx]) else math.inf)

    i_abs, i_rel = worst(abs_diff), worst(rel_diff)
    if a.ndim == 0:
        a_item, e_item = a.item(), e.item()
        return [
            f"Expected {e_item!r} but got {a_item!r}.",
            f"Absolute difference: {value('absolute', i_abs)!r} (up to {atol!r} allowed)",
            f"Relative difference: {value('relative', i_rel)!r} (up to {rtol!r} allowed)",
        ]

    def at(idx: Any) -> str:
        return "" if idx is None else f" at index {tuple(int(i) for i in idx)}"

    n_bad, n = int(bad.sum()), bad.size
    return [
        f"Mismatched elements: {n_bad} / {n} ({n_bad / n:.1%})",
        f"Greatest absolute difference: {value('absolute', i_abs)!r}{at(i_abs)} "
        f"(up to {atol!r} allowed)",
        f"Greatest relative difference: {value('relative', i_rel)!r}{at(i_rel)} "
        f"(up to {rtol!r} allowed)",
    ]


def _special_value_lines(
    a: np.ndarray, e: np.ndarray, bad: np.ndarray, equal_nan: bool
) -> list[str]:
    lines = []
    for label, test in (("NaN", np.isnan), ("Inf", np.isinf)):
        in_a, in_e = int((bad & test(a)).sum()), int((bad & test(e)).sum())
        if in_a or in_e:
            lines.append(f"{label} in mismatched elements: {in_a} in actual, {in_e} in expected")
    both_nan = int((bad & np.isnan(a) & np.isnan(e)).sum())
    if both_nan and not equal_nan:
        lines.append(
            f"{both_nan} of them are NaN on both sides: pass equal_nan=True if NaN should match NaN"
        )
    return lines
