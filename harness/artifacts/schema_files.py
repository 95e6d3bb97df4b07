"""Schemas from TOML/JSON files and import paths (``load_schema``, ``schema_from_dict``).

The keys each ``kind`` takes are the fields of its spec dataclass, so the file format cannot
drift from the specs."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import tomllib
from pathlib import Path

from harness.artifacts._values import _type_name
from harness.artifacts.errors import SchemaError
from harness.artifacts.loading import _TOO_DEEP
from harness.artifacts.specs import (
    MappingSpec,
    Scalar,
    Schema,
    TensorMap,
    TensorSpec,
    Value,
    _as_spec,
    _Spec,
)

# Names a schema file may use for Python types.
_TYPE_NAMES = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list}


# --------------------------------------------------------------------------------------------
# Schemas from files and import paths

# The spec class of each ``kind``; the keys a kind takes are its dataclass fields.
_KINDS: dict[str, type[_Spec]] = {
    "tensor": TensorSpec,
    "tensor_map": TensorMap,
    "mapping": MappingSpec,
    "scalar": Scalar,
    "value": Value,
}


def _field_names(cls: type) -> set[str]:
    """The keyword names of a spec dataclass (``_`` is its ``KW_ONLY`` marker, no key)."""
    return {f.name for f in dataclasses.fields(cls) if f.name != "_"}


_KIND_KEYS = {kind: _field_names(cls) for kind, cls in _KINDS.items()}
_SCHEMA_KEYS = _field_names(Schema)


def load_schema(ref: str | os.PathLike[str]) -> Schema:
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
            return TensorSpec()
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
    cls = _KINDS[kind]
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
    return tuple(_TYPE_NAMES[str(n)] for n in names)


def _refuse_unknown(data: dict[str, object], allowed: set[str], source: str, where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SchemaError(
            f"{source}: {where}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
