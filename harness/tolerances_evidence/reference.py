"""Expected values from float64, bounds from the reference's own error (torch._dynamo's
``same()`` idea).

A low-precision kernel compared with a low-precision reference under a fixed ``rtol`` mixes
two errors, and the bound has to be hand-picked wide enough for both. Instead:

1. compute the expected value with the reference implementation in **float64** (its rounding
   error is then about 1e-16, negligible against float32, float16 or bfloat16);
2. run the same reference at the candidate's **own precision**: its distance from the float64
   value is what an honest implementation at that precision errs by, on these inputs;
3. require the candidate to err by at most ``multiplier`` times that, plus a floor of the
   precision's unit roundoff (a reference that happens to be exact must not demand exactness).

The bound so adapts to the inputs and shapes (a longer reduction errs more, for the reference
too) and no per-dtype constant is chosen by hand. Prefer it where a kernel is compared with a
plain implementation of the same maths; keep :func:`harness.assert_close` for values known
exactly, goldens and comparisons of two runs of one implementation.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.tolerances import rel_error

__all__ = ["assert_close_to_reference", "unit_roundoff"]

_UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}


def unit_roundoff(dtype_name: str) -> float:
    """Half the gap between 1 and the next number in ``dtype_name`` (``float16``: 2**-11)."""
    try:
        return _UNIT_ROUNDOFF[dtype_name]
    except KeyError:
        raise ValueError(
            f"no unit roundoff for dtype {dtype_name!r}; known: {', '.join(_UNIT_ROUNDOFF)}"
        ) from None


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")


def _to_float64(x: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64)
    if isinstance(x, np.ndarray | np.generic):
        return np.asarray(x, dtype=np.float64)
    return x  # ints, flags and other arguments pass through unchanged


def assert_close_to_reference(
    candidate: Any,
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    multiplier: float = 2.0,
    floor: float | None = None,
    msg: str | None = None,
) -> None:
    """Assert that ``candidate`` errs from the float64 reference by at most ``multiplier``
    times what ``reference`` itself errs by at the candidate's precision, plus ``floor``.

    Args:
        candidate: the result under test (a tensor or array), or a callable that computes it
            from ``inputs``.
        reference: a plain implementation of the same maths, run twice: on ``inputs`` as
            they are (the baseline at the low precision) and on float64 copies of them (the
            expected value; tensors and arrays are converted, other arguments pass as given).
        inputs: the positional arguments, in the low precision under test.
        multiplier: how many times the baseline's error the candidate may have (``same()``
            uses 2 for fp16/bf16 kernels).
        floor: added to the bound; default the unit roundoff of the candidate's dtype.
        msg: prepended to the failure message.

    Errors are :func:`harness.rel_error` (norm-wise relative). Raises ``AssertionError`` with
    both errors and the bound; ``ValueError`` for a multiplier below 1 or a negative floor.

    Examples::

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> a, b = (rng.standard_normal((64, 64)).astype(np.float16) for _ in range(2))
        >>> assert_close_to_reference(np.matmul(a, b), np.matmul, [a, b])
    """
    __tracebackhide__ = True
    if not multiplier >= 1:
        raise ValueError(f"multiplier must be >= 1 (the reference's own error), got {multiplier}")
    result = candidate(*inputs) if callable(candidate) else candidate
    baseline = reference(*inputs)
    expected = reference(*[_to_float64(x) for x in inputs])
    dtype = _dtype_name(result)
    if floor is None:
        floor = unit_roundoff(dtype)
    if not floor >= 0:
        raise ValueError(f"floor must be >= 0, got {floor}")
    ref_err = rel_error(baseline, expected)
    err = rel_error(result, expected)
    bound = multiplier * ref_err + floor
    if err <= bound:
        return
    text = (
        f"candidate is further from the float64 reference than the reference itself at "
        f"{dtype}:\n"
        f"relative error of the candidate: {err:.3g}\n"
        f"relative error of the reference at {_dtype_name(baseline)}: {ref_err:.3g}\n"
        f"allowed: {multiplier:g} x {ref_err:.3g} + {floor:.3g} = {bound:.3g} "
        f"({err / bound:.3g}x over)"
    )
    raise AssertionError(f"{msg}\n\n{text}" if msg else text)
