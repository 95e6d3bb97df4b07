"""`harness artifacts`: validate checkpoints, arrays and metrics logs against a schema."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harness import artifacts as lib
from harness.cli.errors import UsageProblem


@click.group(name="artifacts")
def artifacts() -> None:
    """Validate what runs produce (checkpoints, .npz arrays, JSON, JSON-lines metrics logs)
    against a schema: keys, shapes, dtypes, finiteness, required metadata.

    \b
    Examples:
      harness artifacts validate runs/latest.pt --schema schemas/checkpoint.toml
      harness artifacts validate runs/metrics.jsonl --schema schemas/metrics.toml
      harness artifacts validate ckpt.pt --schema mypkg.schemas:CHECKPOINT
    """


@artifacts.command(name="validate")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--schema",
    "schema_ref",
    required=True,
    metavar="SCHEMA",
    help="A .toml or .json schema file, or an import path 'package.module:NAME' of a "
    "harness.artifacts.Schema (the current directory is importable).",
)
@click.option(
    "--allow-pickle",
    is_flag=True,
    help="Fully unpickle .pt files (and object arrays in .npz) that torch.load(weights_only=True) "
    "refuses. Unpickling runs code named by the file: only for files you trust.",
)
def validate(files: tuple[Path, ...], schema_ref: str, allow_pickle: bool) -> None:
    """Validate each FILE against SCHEMA; print OK or every violation, file by file.

    Files are read by extension: .pt .pth .ckpt (torch.load, weights only), .npz, .json, and
    .jsonl (a metrics log: the schema describes each line's object).

    Exit status: 0 every file is valid, 1 a file is invalid or unreadable, 2 a usage problem
    (bad schema, unsupported file type).

    \b
    Example schema (schemas/metrics.toml) for a metrics log:
      name = "metrics"
      allow_extra = true          # other keys (lr, grad_norm, ...) are fine
      [fields]
      step = "int"
      loss = { kind = "scalar", type = "float", finite = true }

    \b
    Example schema for a checkpoint:
      name = "checkpoint"
      [fields.model]
      kind = "tensor_map"         # a state_dict: every value a float32 tensor
      dtype = "float32"
      finite = true
      [fields.optimizer]
      kind = "value"
      type = "dict"
      [metadata]
      config = "dict"
      epoch = "int"
      step = "int"

    \b
    Tensor fields: { kind = "tensor", shape = ["B", 16], dtype = "float32", finite = true }:
    int dims are exact, names must agree across the file, "*" is any size. The full format is
    in the docstring of the harness.artifacts package.
    """
    unsupported = [str(f) for f in files if f.suffix.lower() not in lib.SUPPORTED_SUFFIXES]
    if unsupported:
        raise UsageProblem(
            f"unsupported file type: {', '.join(unsupported)}; "
            f"supported: {' '.join(lib.SUPPORTED_SUFFIXES)}"
        )
    # Like `python -m`: a schema given as 'suites.schemas:CHECKPOINT' resolves from here.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        schema = lib.load_schema(schema_ref)
    except lib.SchemaError as exc:
        raise UsageProblem(str(exc)) from None

    invalid = 0
    for path in files:
        try:
            violations = lib.validate(path, schema, allow_pickle=allow_pickle)
        except lib.ArtifactError as exc:
            invalid += 1
            click.echo(f"FAIL {exc}")  # the message starts with the path
            continue
        if not violations:
            click.echo(f"OK   {path}")
            continue
        invalid += 1
        click.echo(f"FAIL {path}: {len(violations)} violation(s) of schema {schema.name!r}")
        for violation in violations:
            click.echo(f"     {violation}")
    if invalid:
        click.echo(f"{invalid} of {len(files)} file(s) invalid", err=True)
        raise SystemExit(1)
