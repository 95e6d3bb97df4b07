"""Schemas for what runs produce (checkpoints, arrays, metrics logs) and their validation.

A schema says which keys an artifact has, what each holds (tensors with shape, dtype and
finiteness; nested mappings such as a ``state_dict``; scalars) and which metadata it must
carry (``config``, ``epoch``, ``step``)::

    from harness.artifacts import MappingSpec, Scalar, Schema, TensorSpec, TensorMap, Value, check

    CHECKPOINT = Schema(
        "checkpoint",
        fields={
            "model": MappingSpec({
                "embed.weight": TensorSpec(shape=("V", "D"), dtype="float32", finite=True),
                "head.weight": TensorSpec(shape=("V", "D"), dtype="float32", finite=True),
                "head.bias": TensorSpec(shape=("V",), dtype="float32", finite=True),
            }),
            "optimizer": Value(dict),
            "ema": TensorMap(dtype="float32", finite=True, optional=True),
        },
        metadata={"config": dict, "epoch": int, "step": int, "best_loss": Scalar(float)},
    )
    state = check("runs/latest.pt", CHECKPOINT)   # raises ArtifactError listing every violation

Specs (keyword-only dataclasses, validated when constructed; each takes ``optional=True`` for a
key that may be absent or None):

- ``TensorSpec(shape=..., dtype=..., finite=False)``: a torch tensor or NumPy array. ``shape`` is a
  tuple of dims: an int is exact, a string is a symbol that must take the same value wherever
  it appears in one artifact (``("B", 16)`` and ``("B",)`` share ``B``), None (or ``"*"``) is
  any size; ``shape=None`` accepts any shape. ``dtype`` is a name (``"float32"``,
  ``"bfloat16"``, torch's ``"float"``/``"half"``, a ``torch.dtype`` or NumPy dtype) or a tuple
  of them. ``finite=True`` rejects NaN and inf (the violation counts them).
- ``TensorMap(keys=REGEX, dtype=..., finite=False)``: a mapping whose every value is a tensor,
  e.g. a ``state_dict`` whose keys are not spelled out; ``keys`` (optional) must match each key.
- ``MappingSpec(fields, patterns={REGEX: spec}, allow_extra=False)``: a nested dict with the given
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

The package: ``specs`` (the spec dataclasses and ``Schema``), ``loading`` (reading files,
``validate``/``check``), ``schema_files`` (TOML/JSON schemas), ``errors``. It knows nothing of
click or pytest and imports torch only to read ``.pt`` files.
"""

from __future__ import annotations

from harness.artifacts.errors import ArtifactError, SchemaError, Violation
from harness.artifacts.loading import SUPPORTED_SUFFIXES, check, load, validate
from harness.artifacts.schema_files import load_schema, schema_from_dict
from harness.artifacts.specs import MappingSpec, Scalar, Schema, TensorMap, TensorSpec, Value

__all__ = [
    "SUPPORTED_SUFFIXES",
    "ArtifactError",
    "MappingSpec",
    "Scalar",
    "Schema",
    "SchemaError",
    "TensorMap",
    "TensorSpec",
    "Value",
    "Violation",
    "check",
    "load",
    "load_schema",
    "schema_from_dict",
    "validate",
]
