"""Schemas for what runs produce (checkpoints, arrays, metrics logs) and their validation.

A schema says which keys an artifact has, what each holds (tensors with shape, dtype and
finiteness; nested mappings such as a ``state_dict``; scalars) and which metadata it must
carry (``config``, ``epoch``, ``step``)::

    from harness.artifacts import Mapping, Scalar, Schema, Tensor, TensorMap, Value, check

    CHECKPOINT = Schema(
        "checkpoint",
        fields={
            "model": Mapping({
                "embed.weight": Tensor(shape=("V", "D"), dtype="float32", finite=True),
                "head.weight": Tensor(shape=("V", "D"), dtype="float32", finite=True),
                "head.bias": Tensor(shape=("V",), dtype="float32", finite=True),
            }),
            "optimizer": Value(dict),
            "ema": TensorMap(dtype="float32", finite=True, optional=True),
        },
        metadata={"config": dict, "epoch": int, "step": int, "best_loss": Scalar(float)},
    )
    state = check("runs/latest.pt", CHECKPOINT)   # raises ArtifactError listing every violation

Specs (keyword-only dataclasses, validated when constructed; each takes ``optional=True`` for a
key that may be absent or None):

- ``Tensor(shape=..., dtype=..., finite=False)``: a torch tensor or NumPy array. ``shape`` is a
  tuple of dims: an int is exact, a string is a symbol that must take the same value wherever
  it appears in one artifact (``("B", 16)`` and ``("B",)`` share ``B``), None (or ``"*"``) is
  any size; ``shape=None`` accepts any shape. ``dtype`` is a name (``"float32"``,
  ``"bfloat16"``, torch's ``"float"``/``"half"``, a ``torch.dtype`` or NumPy dtype) or a tuple
  of them. ``finite=True`` rejects NaN and inf (the violation counts them).
- ``TensorMap(keys=REGEX, dtype=..., finite=False)``: a mapping whose every value is a tensor,
  e.g. a ``state_dict`` whose keys are not spelled out; ``keys`` (optional) must match each key.
- ``Mapping(fields, patterns={REGEX: spec}, allow_extra=False)``: a nested dict with the given
  keys; keys not given must fully match one of ``patterns`` or are unexpected.
- ``Scalar(type, finite=False, min=None, max=None)``: ``int``, ``float``, ``str`` or ``bool`` (or
  a union such as ``int | float``). ``float`` accepts ints; ``int`` refuses ``True``.
- ``Value(type=None)``: any value that is present, or one of the given Python types.

In ``fields``, ``patterns`` and ``metadata`` a bare type stands for its spec: ``int`` is
``Scalar(int)``, ``dict`` is ``Value(dict)``. ``fields`` and ``metadata`` are both top-level keys
of the artifact; metadata is reported as such when missing.

Files are read by extension (:func:`load`): ``.pt``/``.pth``/``.ckpt`` with
``torch.load(weights_only=True)`` onto the CPU (a file that needs full unpickling is refused
with an explanation unless ``allow_pickle=True``: unpickling can run arbitrary code),
``.npz`` (0-d arrays become scalars), ``.json``, and ``.jsonl``: a metrics log, one JSON object
per line, where the schema describes each row (``step`` int, ``loss`` finite float) and
violations name their line. An unreadable, truncated or corrupt file raises
:class:`ArtifactError` naming the file and what failed.

Schema files (for ``harness artifacts validate --schema FILE``), TOML or JSON with the same
structure::

    name = "metrics"               # default: the file's stem
    description = "one row per optimizer step"
    allow_extra = true             # unknown top-level keys are allowed

    [fields]
    step = "int"                                         # shorthand: int float str bool dict
    loss = { kind = "scalar", type = "float", finite = true }     # list any tensor
    lr = { kind = "scalar", type = ["float", "int"], min = 0 }

    [fields.model]
    kind = "mapping"
    patterns = { '.*\\.bias' = { kind = "tensor", shape = ["*"] } }
    [fields.model.fields."embed.weight"]
    kind = "tensor"
    shape = ["V", 64]              # ints exact, strings symbols, "*" (JSON: null too) any
    dtype = "float32"              # or a list of names
    finite = true

    [metadata]
    epoch = "int"
    config = { kind = "value", type = "dict" }

Kinds and their keys: ``tensor`` (shape, dtype, finite), ``tensor_map`` (keys, dtype,
finite), ``mapping`` (fields, patterns, allow_extra), ``scalar`` (type, finite, min, max),
``value`` (type); each also takes ``optional``. Unknown keys are errors. A schema can also be
named by import path, ``package.module:NAME`` (:func:`load_schema`).

This module knows nothing of click or pytest and imports torch only to read ``.pt`` files.
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import os
import re
import sys
import tomllib
import types
from collections import abc
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

__all__ = [
    "SUPPORTED_SUFFIXES",
    "ArtifactError",
    "Mapping",
    "Scalar",
    "Schema",
    "SchemaError",
    "Tensor",
    "TensorMap",
    "Value",
    "Violation",
    "check",
    "load",
    "load_schema",
    "schema_from_dict",
    "validate",
]

SUPPORTED_SUFFIXES = (".pt", ".pth", ".ckpt", ".npz", ".json", ".jsonl")
_TORCH_SUFFIXES = (".pt", ".pth", ".ckpt")

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
# Names a schema file may use for Python types.
_TYPE_NAMES = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list}

Dim = int | str | None


class SchemaError(ValueError):
    """A schema is malformed: a bad spec, an unknown key in a schema file, a bad import path."""


@dataclass(frozen=True)
class Violation:
    """One way an artifact differs from its schema.

    ``path`` is the dotted key path (``model.layer1.weight``; empty for the artifact itself),
    ``kind`` one of ``missing``, ``unexpected``, ``type``, ``shape``, ``dtype``, ``non_finite``,
    ``value``, ``parse``; ``line`` is the 1-based row of a metrics log, else None.
    """

    path: str
    message: str
    kind: str
    line: int | None = None

    def __str__(self) -> str:
        where = ": ".join(p for p in (f"line {self.line}" if self.line else "", self.path) if p)
        return f"{where or '(top level)'}: {self.message}"


class ArtifactError(Exception):
    """An artifact cannot be read, or does not match its schema (``violations`` says how)."""

    def __init__(
        self, message: str, *, path: Path | None = None, violations: abc.Iterable[Violation] = ()
    ) -> None:
        super().__init__(message)
        self.path = path
        self.violations = list(violations)


# --------------------------------------------------------------------------------------------
# Specs


@dataclass
class _Context:
    """State of one validation: the violations so far and the symbolic dims bound so far."""

    violations: list[Violation] = field(default_factory=list)
    line: int | None = None
    dims: dict[str, tuple[int, str]] = field(default_factory=dict)  # symbol -> (size, where)

    def add(self, path: str, kind: str, message: str) -> None:
        self.violations.append(Violation(path, message, kind, self.line))


class _Spec:
    """Base of the field specs: ``optional``, ``describe()`` and ``_validate()``."""

    optional: bool

    def describe(self) -> str:
        raise NotImplementedError

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        raise NotImplementedError

    def _check_flags(self, *names: str) -> None:
        for name in ("optional", *names):
            if not isinstance(getattr(self, name), bool):
                raise SchemaError(
                    f"{type(self).__name__}.{name} must be True or False, "
                    f"got {getattr(self, name)!r}"
                )


@dataclass(frozen=True, kw_only=True)
class Tensor(_Spec):
    """A torch tensor or NumPy array with, optionally, a shape, a dtype and finite values."""

    shape: tuple[Dim, ...] | None = None
    """Dims: int exact, str a symbol shared across the artifact, None or "*" any; None: any."""
    dtype: str | tuple[str, ...] | None = None
    """A dtype name or a tuple of accepted ones; None: any."""
    finite: bool = False
    """Reject NaN and inf."""
    optional: bool = False
    """The key may be absent or None."""

    def __post_init__(self) -> None:
        self._check_flags("finite")
        if self.shape is not None:
            object.__setattr__(self, "shape", _normalize_shape(self.shape))
        if self.dtype is not None:
            object.__setattr__(self, "dtype", _normalize_dtypes(self.dtype))

    def describe(self) -> str:
        text = f"{_dtype_text(self.dtype)} tensor" if self.dtype else "tensor"
        if self.shape is not None:
            text += f" of shape {_shape_text(self.shape)}"
        return text + (", finite" if self.finite else "")

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        array = _array_info(value)
        if array is None:
            ctx.add(path, "type", f"expected {self.describe()}, got {_type_name(value)}")
            return
        shape, dtype, count_non_finite = array
        if self.dtype is not None and dtype not in _dtype_tuple(self.dtype):
            ctx.add(path, "dtype", f"expected dtype {_dtype_text(self.dtype)}, got {dtype}")
        if self.shape is not None:
            _check_shape(self.shape, shape, path, ctx)
        if self.finite:
            nan, inf = count_non_finite()
            if nan or inf:
                total = math.prod(shape)
                bad = nan + inf
                message = f"{bad} non-finite value{'s' if bad > 1 else ''} of {total} "
                message += f"({nan} NaN, {inf} inf)"
                ctx.add(path, "non_finite", message)


@dataclass(frozen=True, kw_only=True)
class TensorMap(_Spec):
    """A mapping (a ``state_dict``) whose every value is a tensor of ``dtype``."""

    keys: str | None = None
    """A regular expression every key must fully match; None: any key."""
    dtype: str | tuple[str, ...] | None = None
    finite: bool = False
    optional: bool = False

    def __post_init__(self) -> None:
        self._check_flags("finite")
        if self.keys is not None:
            _compile(self.keys, "TensorMap.keys")
        # The element spec validates dtype names once, here.
        object.__setattr__(self, "dtype", Tensor(dtype=self.dtype).dtype)

    def describe(self) -> str:
        dtype = f"{_dtype_text(self.dtype)} " if self.dtype else ""
        return f"mapping of {dtype}tensors" + (", finite" if self.finite else "")

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        if not isinstance(value, abc.Mapping):
            ctx.add(path, "type", f"expected {self.describe()}, got {_type_name(value)}")
            return
        element = Tensor(dtype=self.dtype, finite=self.finite)
        for key, item in value.items():
            child = _join(path, key)
            if self.keys is not None and not re.fullmatch(self.keys, str(key)):
                ctx.add(child, "unexpected", f"unexpected key: does not match {self.keys!r}")
            else:
                element._validate(item, child, ctx)


@dataclass(frozen=True)
class Mapping(_Spec):
    """A nested dict: the keys in ``fields``, plus keys matching ``patterns``."""

    fields: dict[str, _Spec | type] = field(default_factory=dict)
    _: KW_ONLY
    patterns: dict[str, _Spec | type] = field(default_factory=dict)
    """``{regex: spec}`` for keys not in ``fields``; the first pattern that fully matches wins."""
    allow_extra: bool = False
    """Accept keys that are neither in ``fields`` nor match a pattern."""
    optional: bool = False

    def __post_init__(self) -> None:
        self._check_flags("allow_extra")
        object.__setattr__(self, "fields", _normalize_specs(self.fields, "Mapping.fields"))
        object.__setattr__(self, "patterns", _normalize_patterns(self.patterns, "Mapping"))

    def describe(self) -> str:
        return "mapping"

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        _validate_mapping(
            value,
            path,
            ctx,
            fields=self.fields,
            patterns=self.patterns,
            allow_extra=self.allow_extra,
        )


@dataclass(frozen=True)
class Scalar(_Spec):
    """A Python (or NumPy) int, float, str or bool, optionally finite and within bounds."""

    type: type | tuple[type, ...] | types.UnionType
    _: KW_ONLY
    finite: bool = False
    """Reject NaN and inf (numbers only)."""
    min: float | None = None
    """Smallest accepted value, inclusive (numbers only)."""
    max: float | None = None
    """Largest accepted value, inclusive (numbers only)."""
    optional: bool = False

    def __post_init__(self) -> None:
        self._check_flags("finite")
        accepted = _type_tuple(self.type, "Scalar")
        for t in accepted:
            if t not in _SCALAR_TYPES:
                raise SchemaError(
                    f"Scalar types are int, float, str and bool, got {t.__name__}; "
                    f"use Value({t.__name__}) for other types"
                )
        object.__setattr__(self, "type", accepted)
        numeric = int in accepted or float in accepted
        for bound in ("min", "max"):
            limit = getattr(self, bound)
            if limit is not None and (
                not isinstance(limit, numbers.Real) or isinstance(limit, bool)
            ):
                raise SchemaError(f"Scalar.{bound} must be a number, got {limit!r}")
            if limit is not None and not math.isfinite(limit):
                # NaN compares false with everything, so `value < nan` never fails; an
                # infinite bound is no bound. Either would make the check unable to fail.
                raise SchemaError(
                    f"Scalar.{bound} must be a finite number, got {limit!r}; leave {bound} "
                    "out for no bound"
                )
        if (self.finite or self.min is not None or self.max is not None) and not numeric:
            raise SchemaError("Scalar finite/min/max apply to int or float only")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise SchemaError(f"Scalar min must be <= max, got min={self.min}, max={self.max}")

    def describe(self) -> str:
        parts = [" | ".join(_SCALAR_TYPES[t] for t in self.type)]
        parts += ["finite"] if self.finite else []
        parts += [f">= {self.min}"] if self.min is not None else []
        parts += [f"<= {self.max}"] if self.max is not None else []
        return ", ".join(parts)

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        if not any(_is_scalar(value, t) for t in self.type):
            ctx.add(path, "type", f"expected {self.describe()}, got {_value_text(value)}")
            return
        if not isinstance(value, numbers.Real) or _is_bool(value):
            return
        if self.finite and not math.isfinite(value):
            ctx.add(path, "non_finite", f"expected a finite number, got {value}")
        elif self.min is not None and value < self.min:
            ctx.add(path, "value", f"expected >= {self.min}, got {value}")
        elif self.max is not None and value > self.max:
            ctx.add(path, "value", f"expected <= {self.max}, got {value}")


@dataclass(frozen=True)
class Value(_Spec):
    """Any value that is present, or, given ``type``, an instance of it (``Value(dict)``)."""

    type: type | tuple[type, ...] | types.UnionType | None = None
    _: KW_ONLY
    optional: bool = False

    def __post_init__(self) -> None:
        self._check_flags()
        if self.type is not None:
            object.__setattr__(self, "type", _type_tuple(self.type, "Value"))

    def describe(self) -> str:
        return " | ".join(t.__name__ for t in self.type) if self.type else "any value"

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        if self.type and not isinstance(value, self.type):
            ctx.add(path, "type", f"expected {self.describe()}, got {_type_name(value)}")


@dataclass(frozen=True)
class Schema:
    """What one artifact (or one row of a metrics log) holds."""

    name: str
    fields: dict[str, _Spec | type] = field(default_factory=dict)
    _: KW_ONLY
    metadata: dict[str, _Spec | type] = field(default_factory=dict)
    """Required top-level metadata keys (``config``, ``epoch``, ``step``) and their types."""
    patterns: dict[str, _Spec | type] = field(default_factory=dict)
    """``{regex: spec}`` for top-level keys in neither ``fields`` nor ``metadata``."""
    allow_extra: bool = False
    """Accept top-level keys that are not described."""
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"Schema name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.allow_extra, bool):
            raise SchemaError(f"Schema.allow_extra must be True or False, got {self.allow_extra!r}")
        object.__setattr__(self, "fields", _normalize_specs(self.fields, f"{self.name}.fields"))
        object.__setattr__(
            self, "metadata", _normalize_specs(self.metadata, f"{self.name}.metadata")
        )
        object.__setattr__(self, "patterns", _normalize_patterns(self.patterns, self.name))
        both = sorted(set(self.fields) & set(self.metadata))
        if both:
            raise SchemaError(f"schema {self.name!r}: keys in both fields and metadata: {both}")

    def _validate(self, value: object, ctx: _Context) -> None:
        _validate_mapping(
            value,
            "",
            ctx,
            fields={**self.fields, **self.metadata},
            patterns=self.patterns,
            allow_extra=self.allow_extra,
            metadata=frozenset(self.metadata),
        )


def _validate_mapping(
    value: object,
    path: str,
    ctx: _Context,
    *,
    fields: dict[str, _Spec],
    patterns: dict[str, _Spec],
    allow_extra: bool,
    metadata: frozenset[str] = frozenset(),
) -> None:
    if not isinstance(value, abc.Mapping):
        ctx.add(path, "type", f"expected a mapping, got {_type_name(value)}")
        return
    # Keys are matched as text: optimizer state is keyed by parameter index (0, 1, ...).
    by_key = {str(k): v for k, v in value.items()}
    for key, spec in fields.items():
        child = _join(path, key)
        if key not in by_key:
            if not spec.optional:
                what = "metadata key" if key in metadata else "key"
                ctx.add(child, "missing", f"missing {what} (expected {spec.describe()})")
        elif not (spec.optional and by_key[key] is None):
            spec._validate(by_key[key], child, ctx)
    for key, item in by_key.items():
        if key in fields:
            continue
        spec = next((s for p, s in patterns.items() if re.fullmatch(p, key)), None)
        if spec is not None:
            spec._validate(item, _join(path, key), ctx)
        elif not allow_extra:
            ctx.add(_join(path, key), "unexpected", f"unexpected key ({_type_name(item)})")


# --------------------------------------------------------------------------------------------
# Spec helpers


def _normalize_specs(specs: object, where: str) -> dict[str, _Spec]:
    if not isinstance(specs, abc.Mapping):
        raise SchemaError(f"{where} must be a dict of key -> spec, got {_type_name(specs)}")
    out = {}
    for key, spec in specs.items():
        if not isinstance(key, str) or not key:
            raise SchemaError(f"{where}: keys must be non-empty strings, got {key!r}")
        out[key] = _as_spec(spec, f"{where}[{key!r}]")
    return out


def _normalize_patterns(patterns: object, where: str) -> dict[str, _Spec]:
    out = _normalize_specs(patterns, f"{where}.patterns")
    for pattern in out:
        _compile(pattern, f"{where}.patterns")
    return out


def _as_spec(spec: object, where: str) -> _Spec:
    if isinstance(spec, _Spec):
        return spec
    if isinstance(spec, type):
        return Scalar(spec) if spec in _SCALAR_TYPES else Value(spec)
    raise SchemaError(
        f"{where}: expected a spec (Tensor, TensorMap, Mapping, Scalar, Value) or a type, "
        f"got {spec!r}"
    )


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
        raise SchemaError(f"Tensor shape must be a tuple of dims, got {shape!r}")
    dims: list[Dim] = []
    for dim in shape:
        if dim is None or dim == "*":
            dims.append(None)
        elif isinstance(dim, bool) or not isinstance(dim, (int, str)):
            raise SchemaError(f"shape dims are ints, names or None; got {dim!r} in {shape!r}")
        elif isinstance(dim, int) and dim < 0:
            raise SchemaError(f"Tensor shape dims must be >= 0, got {dim} in {shape!r}")
        elif isinstance(dim, str) and not dim.isidentifier():
            raise SchemaError(f"a symbolic dim must be a name like 'B', got {dim!r} in {shape!r}")
        else:
            dims.append(dim)
    return tuple(dims)


def _normalize_dtypes(dtype: object) -> str | tuple[str, ...]:
    many = isinstance(dtype, (tuple, list))
    names = tuple(_dtype_name(d) for d in (dtype if many else (dtype,)))
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


def _shape_text(shape: tuple) -> str:
    dims = ["*" if d is None else str(d) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _check_shape(expected: tuple[Dim, ...], actual: tuple, path: str, ctx: _Context) -> None:
    wrong = len(expected) != len(actual)
    notes = []
    if not wrong:
        for want, got in zip(expected, actual, strict=True):
            if isinstance(want, int):
                wrong |= want != got
            elif isinstance(want, str):
                bound = ctx.dims.setdefault(want, (got, path))
                if bound[0] != got:
                    wrong = True
                    notes.append(f"{want} = {bound[0]} from {bound[1] or '(top level)'}")
    if wrong:
        note = f" ({'; '.join(notes)})" if notes else ""
        ctx.add(
            path,
            "shape",
            f"expected shape {_shape_text(expected)}{note}, got {_shape_text(actual)}",
        )


def _array_info(value: object):
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


# --------------------------------------------------------------------------------------------
# Validation


@dataclass(frozen=True)
class _Rows:
    """The rows of a metrics log: ``(line number, row)``."""

    items: list[tuple[int, object]]


def validate(obj_or_path: object, schema: Schema, *, allow_pickle: bool = False) -> list[Violation]:
    """Every way ``obj_or_path`` differs from ``schema``; empty when it matches.

    ``obj_or_path`` is a loaded artifact (a dict), a list of rows (a metrics log), or a path
    read with :func:`load` (``.jsonl`` lines that are not JSON objects are violations). Raises
    :class:`ArtifactError` when a file cannot be read at all.
    """
    _, violations = _load_and_validate(obj_or_path, schema, allow_pickle)
    return violations


def check(obj_or_path: object, schema: Schema, *, allow_pickle: bool = False) -> object:
    """Like :func:`validate`, but raise :class:`ArtifactError` listing every violation.

    Returns the artifact (for a path, what :func:`load` returns), so a loader can read and
    check in one step: ``state = check(path, CHECKPOINT)``.
    """
    obj, violations = _load_and_validate(obj_or_path, schema, allow_pickle)
    if violations:
        is_path = isinstance(obj_or_path, (str, os.PathLike))
        what = str(obj_or_path) if is_path else "artifact"
        raise ArtifactError(
            f"{what} does not match schema {schema.name!r} ({len(violations)} "
            f"violation{'s' if len(violations) != 1 else ''}):\n{_listed(violations)}",
            path=Path(obj_or_path) if is_path else None,
            violations=violations,
        )
    return obj


def _load_and_validate(
    obj_or_path: object, schema: Schema, allow_pickle: bool
) -> tuple[object, list[Violation]]:
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a harness.artifacts.Schema, got {_type_name(schema)}")
    violations: list[Violation] = []
    obj = obj_or_path
    if isinstance(obj_or_path, (str, os.PathLike)):
        path = Path(obj_or_path)
        if path.suffix.lower() == ".jsonl":
            rows, violations = _read_jsonl(path)
            obj = _Rows(rows)
        else:
            obj = load(path, allow_pickle=allow_pickle)
    elif isinstance(obj_or_path, list):
        obj = _Rows(list(enumerate(obj_or_path, start=1)))

    if isinstance(obj, _Rows):
        for number, row in obj.items:
            ctx = _Context(line=number)  # symbolic dims bind per row
            schema._validate(row, ctx)
            violations.extend(ctx.violations)
        if not obj.items and not violations:
            violations.append(Violation("", "no rows", "missing"))
        violations.sort(key=lambda v: v.line or 0)  # stable: a row's violations keep their order
        return [row for _, row in obj.items], violations
    ctx = _Context()
    schema._validate(obj, ctx)
    return obj, ctx.violations


# --------------------------------------------------------------------------------------------
# Loading


def load(path: str | os.PathLike, *, allow_pickle: bool = False) -> object:
    """Read an artifact by its extension (see the module docstring).

    ``.jsonl`` gives the list of rows. Raises :class:`ArtifactError` naming the file and what
    failed for a missing, unsupported, truncated or corrupt file.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise ArtifactError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; "
            f"supported: {' '.join(SUPPORTED_SUFFIXES)}",
            path=path,
        )
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file", path=path)
    if suffix in _TORCH_SUFFIXES:
        return _load_torch(path, allow_pickle)
    if suffix == ".npz":
        return _load_npz(path, allow_pickle)
    if suffix == ".json":
        try:
            return json.loads(_read_text(path))
        except RecursionError:
            raise _fail(path, _TOO_DEEP) from None
        except json.JSONDecodeError as exc:
            raise ArtifactError(
                f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                path=path,
            ) from None
    rows, bad = _read_jsonl(path)
    if bad:
        raise ArtifactError(
            f"{path}: not a JSON-lines file:\n{_listed(bad)}", path=path, violations=bad
        )
    return [row for _, row in rows]


_TOO_DEEP = (
    f"nested too deeply to read (Python's recursion limit, about {sys.getrecursionlimit()} "
    "levels of arrays or objects); no artifact of this harness nests like that"
)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None


def _read_jsonl(path: Path) -> tuple[list[tuple[int, object]], list[Violation]]:
    rows, bad = [], []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            bad.append(Violation("", _TOO_DEEP, "parse", number))
            continue
        except json.JSONDecodeError as exc:
            # Typically the last line of a log whose writer was killed mid-write.
            message = f"not valid JSON: {exc.msg} (column {exc.colno})"
            bad.append(Violation("", message, "parse", number))
            continue
        if not isinstance(row, dict):
            message = f"expected a JSON object, got {_type_name(row)}"
            bad.append(Violation("", message, "parse", number))
            continue
        rows.append((number, row))
    return rows, bad


def _load_torch(path: Path, allow_pickle: bool) -> object:
    try:
        import torch  # noqa: PLC0415 - slow; only needed for checkpoints
    except ImportError:
        raise _fail(path, f"reading {path.suffix} files needs torch: pip install torch") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        # torch words it "Unsupported global: GLOBAL mod.name was not an allowed global" or
        # "Trying to load unsupported GLOBAL mod.name whose module mod is blocked".
        unsafe = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if unsafe is None:
            raise _fail(path, f"not a readable torch checkpoint: {_reason(exc, path)}") from None
        if not allow_pickle:
            raise ArtifactError(
                f"{path}: torch.load(weights_only=True) refused the global {unsafe.group(1)} it "
                "holds, which only full unpickling can rebuild, and unpickling runs whatever code "
                "the file names. If you trust the file, pass allow_pickle=True "
                "(harness artifacts validate --allow-pickle).",
                path=path,
            ) from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # e.g. the class it names cannot be imported here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _fail(path, f"full unpickling (allow_pickle=True) failed: {first}") from None


def _load_npz(path: Path, allow_pickle: bool) -> dict[str, object]:
    import numpy as np  # noqa: PLC0415

    with path.open("rb") as f:
        magic = f.read(4)
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # zip local header / empty-archive record
        raise ArtifactError(f"{path}: not an .npz archive (not a zip file)", path=path)
    key = None
    try:
        with np.load(path, allow_pickle=allow_pickle) as archive:
            out = {}
            for key in archive.files:
                array = archive[key]
                out[key] = array[()] if array.ndim == 0 else array
            return out
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise ArtifactError(
                f"{path}: array {key!r} holds Python objects, which only unpickling can rebuild "
                "(it can run arbitrary code). If you trust the file, pass allow_pickle=True.",
                path=path,
            ) from None
        raise _fail(path, f"not a readable .npz archive: {_reason(exc, path)}") from None
    except Exception as exc:
        where = f" (array {key!r})" if key is not None else ""
        raise ArtifactError(
            f"{path}: not a readable .npz archive{where}: {_reason(exc, path)}", path=path
        ) from None


def _listed(violations: list[Violation]) -> str:
    return "\n".join(f"  {v}" for v in violations)


def _fail(path: Path, problem: str) -> ArtifactError:
    return ArtifactError(f"{path}: {problem}", path=path)


def _reason(exc: BaseException, path: Path) -> str:
    """The first sentence of the error, and the file's size: torch's messages run to paragraphs
    and an empty or cut-off file is the usual cause."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = line.split(". ", 1)[0].rstrip(".")
    if not line:
        line = "unexpected end of file" if isinstance(exc, EOFError) else type(exc).__name__
    if len(line) > 200:
        line = line[:197] + "..."
    return f"{line} (file of {path.stat().st_size} bytes; truncated or corrupt?)"


# --------------------------------------------------------------------------------------------
# Schemas from files and import paths

_KIND_KEYS = {
    "tensor": {"shape", "dtype", "finite", "optional"},
    "tensor_map": {"keys", "dtype", "finite", "optional"},
    "mapping": {"fields", "patterns", "allow_extra", "optional"},
    "scalar": {"type", "finite", "min", "max", "optional"},
    "value": {"type", "optional"},
}
_SCHEMA_KEYS = {"name", "description", "fields", "metadata", "patterns", "allow_extra"}


def load_schema(ref: str | os.PathLike) -> Schema:
    """A schema from a ``.toml``/``.json`` file or an import path ``package.module:NAME``.

    Raises :class:`SchemaError` saying what is wrong with the file or the import path.
    """
    text = str(ref)
    path = Path(text)
    suffix = path.suffix.lower()
    if suffix in (".toml", ".json"):
        if not path.is_file():
            raise SchemaError(f"schema file {path} does not exist")
        try:
            raw = path.read_text(encoding="utf-8")
            data = tomllib.loads(raw) if suffix == ".toml" else json.loads(raw)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise SchemaError(f"{path}: cannot read schema: {exc}") from None
        except RecursionError:
            raise SchemaError(f"{path}: cannot read schema: {_TOO_DEEP}") from None
        try:
            return schema_from_dict(data, source=str(path))
        except RecursionError:
            raise SchemaError(f"{path}: schema {_TOO_DEEP}") from None

    module_name, colon, attribute = text.partition(":")
    if not (colon and module_name and attribute):
        raise SchemaError(
            f"{text!r} is neither a .toml/.json schema file nor an import path "
            "'package.module:NAME'"
        )
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # the module's own import errors, whatever they are
        raise SchemaError(f"cannot import {module_name!r} for schema {text!r}: {exc}") from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SchemaError(f"{module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(obj, Schema):
        raise SchemaError(f"{text} is a {_type_name(obj)}, not a harness.artifacts.Schema")
    return obj


def schema_from_dict(data: object, *, source: str = "<schema>") -> Schema:
    """A :class:`Schema` from parsed TOML/JSON (the format in the module docstring).

    ``source`` names the origin in error messages; its stem is the default schema name.
    """
    if not isinstance(data, dict):
        raise SchemaError(f"{source}: a schema is a table/object, got {_type_name(data)}")
    _refuse_unknown(data, _SCHEMA_KEYS, source, "schema")
    try:
        return Schema(
            data.get("name", Path(source).stem),
            _specs_from_data(data.get("fields", {}), "fields", source),
            metadata=_specs_from_data(data.get("metadata", {}), "metadata", source),
            patterns=_specs_from_data(data.get("patterns", {}), "patterns", source),
            allow_extra=data.get("allow_extra", False),
            description=data.get("description", ""),
        )
    except SchemaError as exc:
        if str(exc).startswith(source):
            raise
        raise SchemaError(f"{source}: {exc}") from None


def _specs_from_data(data: object, where: str, source: str) -> dict[str, _Spec]:
    if not isinstance(data, dict):
        raise SchemaError(
            f"{source}: {where} must be a table of key -> spec, got {_type_name(data)}"
        )
    return {key: _spec_from_data(value, f"{where}.{key}", source) for key, value in data.items()}


def _spec_from_data(data: object, where: str, source: str) -> _Spec:
    if isinstance(data, str):
        if data in _TYPE_NAMES:
            return _as_spec(_TYPE_NAMES[data], where)
        if data == "any":
            return Value()
        if data == "tensor":
            return Tensor()
        raise SchemaError(
            f"{source}: {where}: unknown type {data!r}; use one of "
            f"{', '.join([*_TYPE_NAMES, 'any', 'tensor'])} or a table with a 'kind'"
        )
    if not isinstance(data, dict):
        raise SchemaError(f"{source}: {where}: expected a type name or a table, got {data!r}")
    kind = data.get("kind")
    if kind not in _KIND_KEYS:
        raise SchemaError(
            f"{source}: {where}: 'kind' must be one of {', '.join(_KIND_KEYS)}, got {kind!r}"
        )
    _refuse_unknown(data, _KIND_KEYS[kind] | {"kind"}, source, where)
    kwargs = {k: v for k, v in data.items() if k != "kind"}
    if "type" in kwargs:
        kwargs["type"] = _types_from_data(kwargs["type"], where, source)
    if "shape" in kwargs and isinstance(kwargs["shape"], list):
        kwargs["shape"] = tuple(kwargs["shape"])
    if "dtype" in kwargs and isinstance(kwargs["dtype"], list):
        kwargs["dtype"] = tuple(kwargs["dtype"])
    for key in ("fields", "patterns"):
        if key in kwargs:
            kwargs[key] = _specs_from_data(kwargs[key], f"{where}.{key}", source)
    if kind == "scalar" and "type" not in kwargs:
        raise SchemaError(f"{source}: {where}: a scalar needs a 'type' (int, float, str, bool)")
    cls = {"tensor": Tensor, "tensor_map": TensorMap, "mapping": Mapping, "scalar": Scalar}.get(
        kind, Value
    )
    try:
        return cls(**kwargs)
    except SchemaError as exc:
        raise SchemaError(f"{source}: {where}: {exc}") from None


def _types_from_data(data: object, where: str, source: str) -> tuple[type, ...]:
    names = data if isinstance(data, list) else [data]
    unknown = [n for n in names if n not in _TYPE_NAMES]
    if unknown or not names:
        raise SchemaError(
            f"{source}: {where}: unknown type {unknown or data!r}; use {', '.join(_TYPE_NAMES)}"
        )
    return tuple(_TYPE_NAMES[n] for n in names)


def _refuse_unknown(data: dict, allowed: set[str], source: str, where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SchemaError(
            f"{source}: {where}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
