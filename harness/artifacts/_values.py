"""Dtype names, shapes and value descriptions shared by the specs and the loaders."""

from __future__ import annotations

import numbers
import re
import sys
import types
from collections import abc

from harness.artifacts.errors import SchemaError

# A dim of a shape: an exact size, a symbol bound once per artifact, or None for any size.
Dim = int | str | None

# torch's and NumPy's dtype names agree on these; bfloat16 and float8 exist in torch only.
_DTYPES = frozenset(
    {
        "bool",
        "uint8", "uint16", "uint32", "uint64",
        "int8", "int16", "int32", "int64",
        "float16", "bfloat16", "float32", "float64",
        "complex32", "complex64", "complex128",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    }
)  # fmt: skip
# torch's aliases (torch.float is float32, torch.int is int32, ...).
_DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "short": "int16",
    "int": "int32",
    "long": "int64",
    "cfloat": "complex64",
    "cdouble": "complex128",
}
_SCALAR_TYPES = {int: "int", float: "float", str: "str", bool: "bool"}


def _compile(pattern: object, where: str) -> None:
    if not isinstance(pattern, str):
        raise SchemaError(f"{where}: a pattern must be a string, got {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise SchemaError(f"{where}: bad regular expression {pattern!r}: {exc}") from None


def _type_tuple(value: object, owner: str) -> tuple[type, ...]:
    if isinstance(value, types.UnionType):
        value = value.__args__
    accepted = value if isinstance(value, tuple) else (value,)
    if not accepted or not all(isinstance(t, type) for t in accepted):
        raise SchemaError(f"{owner} type must be a type or a tuple of types, got {value!r}")
    return accepted


def _normalize_shape(shape: object) -> tuple[Dim, ...]:
    if isinstance(shape, (str, bytes, int)) or not isinstance(shape, abc.Iterable):
        raise SchemaError(f"TensorSpec shape must be a tuple of dims, got {shape!r}")
    dims: list[Dim] = []
    for dim in shape:
        if dim is None or dim == "*":
            dims.append(None)
        elif isinstance(dim, bool) or not isinstance(dim, (int, str)):
            raise SchemaError(f"shape dims are ints, names or None; got {dim!r} in {shape!r}")
        elif isinstance(dim, int) and dim < 0:
            raise SchemaError(f"TensorSpec shape dims must be >= 0, got {dim} in {shape!r}")
        elif isinstance(dim, str) and not dim.isidentifier():
            raise SchemaError(f"a symbolic dim must be a name like 'B', got {dim!r} in {shape!r}")
        else:
            dims.append(dim)
    return tuple(dims)


def _normalize_dtypes(dtype: object) -> str | tuple[str, ...]:
    many = isinstance(dtype, (tuple, list))
    given: abc.Iterable[object] = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
    names = tuple(_dtype_name(d) for d in given)
    for name in names:
        if name not in _DTYPES:
            raise SchemaError(f"unknown dtype {name!r}; known: {', '.join(sorted(_DTYPES))}")
    return names if many else names[0]


def _dtype_name(dtype: object) -> str:
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, type):  # numpy.float32, the class
        name = dtype.__name__
    else:  # torch.float32 -> "torch.float32", numpy.dtype("float32") -> "float32"
        name = str(dtype)
    name = name.removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def _dtype_tuple(dtype: str | tuple[str, ...]) -> tuple[str, ...]:
    return dtype if isinstance(dtype, tuple) else (dtype,)


def _dtype_text(dtype: str | tuple[str, ...]) -> str:
    return " or ".join(_dtype_tuple(dtype))


def _shape_text(shape: tuple[object, ...]) -> str:
    dims = ["*" if d is None else str(d) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _array_info(
    value: object,
) -> tuple[tuple[int, ...], str, abc.Callable[[], tuple[int, int]]] | None:
    """(shape, dtype name, non-finite counter) of a torch tensor or NumPy array, else None.

    Looks torch and NumPy up in sys.modules: a value of either type means it is imported.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):

        def count_torch() -> tuple[int, int]:
            if not (value.is_floating_point() or value.is_complex()):
                return 0, 0
            return int(torch.isnan(value).sum()), int(torch.isinf(value).sum())

        return tuple(value.shape), _dtype_name(value.dtype), count_torch
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)

        def count_numpy() -> tuple[int, int]:
            if array.dtype.kind not in "fc":
                return 0, 0
            return int(np.isnan(array).sum()), int(np.isinf(array).sum())

        return tuple(array.shape), array.dtype.name, count_numpy
    return None


def _is_bool(value: object) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy.bool_


def _is_scalar(value: object, t: type) -> bool:
    if t is bool:
        return _is_bool(value)
    if t is str:
        return isinstance(value, str)
    if _is_bool(value):
        return False  # True is an int to Python, never to a schema
    return isinstance(value, numbers.Integral if t is int else numbers.Real)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _value_text(value: object) -> str:
    text = repr(value)
    return f"{_type_name(value)} {text if len(text) <= 40 else text[:37] + '...'}"
