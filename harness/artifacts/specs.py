"""The field specs (``TensorSpec``, ``TensorMap``, ``MappingSpec``, ``Scalar``, ``Value``) and
``Schema``: what one artifact holds, and how a value is checked against it."""

from __future__ import annotations

import math
import numbers
import re
import types
from collections import abc
from dataclasses import KW_ONLY, dataclass, field
from typing import cast

from harness.artifacts._values import (
    _SCALAR_TYPES,
    Dim,
    _array_info,
    _compile,
    _dtype_text,
    _dtype_tuple,
    _is_bool,
    _is_scalar,
    _join,
    _normalize_dtypes,
    _normalize_shape,
    _shape_text,
    _type_name,
    _type_tuple,
    _value_text,
)
from harness.artifacts.errors import SchemaError, Violation

# --------------------------------------------------------------------------------------------
# Specs


# The specs accept shorthands (a bare type for its spec, a union for a tuple of types) and
# replace them in __post_init__; these give the normalized attributes their normalized type.
def _specs(specs: abc.Mapping[str, _Spec | type]) -> dict[str, _Spec]:
    return cast(dict[str, _Spec], specs)


def _types(accepted: type | tuple[type, ...] | types.UnionType) -> tuple[type, ...]:
    return cast(tuple[type, ...], accepted)


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
class TensorSpec(_Spec):
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
        object.__setattr__(self, "dtype", TensorSpec(dtype=self.dtype).dtype)

    def describe(self) -> str:
        dtype = f"{_dtype_text(self.dtype)} " if self.dtype else ""
        return f"mapping of {dtype}tensors" + (", finite" if self.finite else "")

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        if not isinstance(value, abc.Mapping):
            ctx.add(path, "type", f"expected {self.describe()}, got {_type_name(value)}")
            return
        element = TensorSpec(dtype=self.dtype, finite=self.finite)
        for key, item in value.items():
            child = _join(path, key)
            if self.keys is not None and not re.fullmatch(self.keys, str(key)):
                ctx.add(child, "unexpected", f"unexpected key: does not match {self.keys!r}")
            else:
                element._validate(item, child, ctx)


@dataclass(frozen=True)
class MappingSpec(_Spec):
    """A nested dict: the keys in ``fields``, plus keys matching ``patterns``."""

    fields: abc.Mapping[str, _Spec | type] = field(default_factory=dict)
    _: KW_ONLY
    patterns: abc.Mapping[str, _Spec | type] = field(default_factory=dict)
    """``{regex: spec}`` for keys not in ``fields``; the first pattern that fully matches wins."""
    allow_extra: bool = False
    """Accept keys that are neither in ``fields`` nor match a pattern."""
    optional: bool = False

    def __post_init__(self) -> None:
        self._check_flags("allow_extra")
        object.__setattr__(self, "fields", _normalize_specs(self.fields, "MappingSpec.fields"))
        object.__setattr__(self, "patterns", _normalize_patterns(self.patterns, "MappingSpec"))

    def describe(self) -> str:
        return "mapping"

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        _validate_mapping(
            value,
            path,
            ctx,
            fields=_specs(self.fields),
            patterns=_specs(self.patterns),
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
        parts = [" | ".join(_SCALAR_TYPES[t] for t in _types(self.type))]
        parts += ["finite"] if self.finite else []
        parts += [f">= {self.min}"] if self.min is not None else []
        parts += [f"<= {self.max}"] if self.max is not None else []
        return ", ".join(parts)

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        if not any(_is_scalar(value, t) for t in _types(self.type)):
            ctx.add(path, "type", f"expected {self.describe()}, got {_value_text(value)}")
            return
        if not isinstance(value, numbers.Real) or _is_bool(value):
            return
        # Compared as it is (no float(): a huge int would overflow); every Real orders with float.
        value = cast(float, value)
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
        return " | ".join(t.__name__ for t in _types(self.type)) if self.type else "any value"

    def _validate(self, value: object, path: str, ctx: _Context) -> None:
        if self.type and not isinstance(value, self.type):
            ctx.add(path, "type", f"expected {self.describe()}, got {_type_name(value)}")


@dataclass(frozen=True)
class Schema:
    """What one artifact (or one row of a metrics log) holds."""

    name: str
    fields: abc.Mapping[str, _Spec | type] = field(default_factory=dict)
    _: KW_ONLY
    metadata: abc.Mapping[str, _Spec | type] = field(default_factory=dict)
    """Required top-level metadata keys (``config``, ``epoch``, ``step``) and their types."""
    patterns: abc.Mapping[str, _Spec | type] = field(default_factory=dict)
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
            fields={**_specs(self.fields), **_specs(self.metadata)},
            patterns=_specs(self.patterns),
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
        matched = next((s for p, s in patterns.items() if re.fullmatch(p, key)), None)
        if matched is not None:
            matched._validate(item, _join(path, key), ctx)
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
        f"{where}: expected a spec (TensorSpec, TensorMap, MappingSpec, Scalar, Value) or a type, "
        f"got {spec!r}"
    )


def _check_shape(
    expected: tuple[Dim, ...], actual: tuple[int, ...], path: str, ctx: _Context
) -> None:
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
