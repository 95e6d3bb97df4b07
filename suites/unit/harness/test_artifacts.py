"""harness.artifacts and `harness artifacts validate`: schemas, checkpoints, metrics logs."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from harness.artifacts import (
    ArtifactError,
    MappingSpec,
    Scalar,
    Schema,
    SchemaError,
    TensorMap,
    TensorSpec,
    Value,
    check,
    load,
    load_schema,
    validate,
)
from harness.cli import main

CHECKPOINT = Schema(
    "checkpoint",
    fields={
        "model": MappingSpec(
            {
                "layer1.weight": TensorSpec(shape=(16, 8), dtype="float32", finite=True),
                "layer1.bias": TensorSpec(shape=(16,), dtype="float32", finite=True),
                "head.weight": TensorSpec(shape=("C", 16), dtype="float32", finite=True),
            }
        ),
        "ema": TensorMap(dtype="float32", finite=True, optional=True),
        "optimizer": Value(dict),
        "batch": TensorSpec(shape=("B", 8), dtype=torch.float32),
        "labels": TensorSpec(shape=("B",), dtype="int64"),
    },
    metadata={"config": dict, "epoch": int, "step": Scalar(int, min=0)},
)


# The first optimizer built in a process pays ~2 s of torch's lazy imports: pay it at collection
# so the per-test times show validation, not torch's start-up.
torch.optim.Adam([torch.zeros(1, requires_grad=True)])


def make_checkpoint() -> dict:
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("layer1", torch.nn.Linear(8, 16))
    model.add_module("head", torch.nn.Linear(16, 3, bias=False))
    opt = torch.optim.Adam(model.parameters())
    return {
        "model": model.state_dict(),
        "ema": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
        "batch": torch.randn(4, 8, generator=gen),
        "labels": torch.zeros(4, dtype=torch.int64),
        "config": {"lr": 1e-3, "layers": [8, 16, 3]},
        "epoch": 2,
        "step": 120,
    }


def saved(tmp_path: Path, obj: object, name: str = "ckpt.pt") -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


def messages(violations) -> list[str]:
    return [str(v) for v in violations]


# --- checkpoints ---------------------------------------------------------------------------


def test_a_real_checkpoint_that_matches_its_schema_passes(tmp_path):
    path = saved(tmp_path, make_checkpoint())
    assert validate(path, CHECKPOINT) == []
    state = check(path, CHECKPOINT)
    assert state["step"] == 120 and state["model"]["layer1.weight"].shape == (16, 8)


def test_a_wrong_shape_is_rejected_naming_the_key_and_both_shapes(tmp_path):
    ckpt = make_checkpoint()
    ckpt["model"]["layer1.weight"] = torch.zeros(16, 9)
    assert messages(validate(saved(tmp_path, ckpt), CHECKPOINT)) == [
        "model.layer1.weight: expected shape (16, 8), got (16, 9)"
    ]


def test_a_wrong_dtype_is_rejected_naming_the_key(tmp_path):
    ckpt = make_checkpoint()
    ckpt["model"]["layer1.bias"] = ckpt["model"]["layer1.bias"].half()
    (violation,) = validate(saved(tmp_path, ckpt), CHECKPOINT)
    assert (violation.path, violation.kind) == ("model.layer1.bias", "dtype")
    assert violation.message == "expected dtype float32, got float16"


def test_nan_and_inf_are_counted_and_rejected(tmp_path):
    ckpt = make_checkpoint()
    ckpt["model"]["layer1.weight"][0, :3] = float("nan")
    ckpt["ema"]["head.weight"][1, 1] = float("-inf")
    assert messages(validate(saved(tmp_path, ckpt), CHECKPOINT)) == [
        "model.layer1.weight: 3 non-finite values of 128 (3 NaN, 0 inf)",
        "ema.head.weight: 1 non-finite value of 48 (0 NaN, 1 inf)",
    ]


def test_a_missing_key_and_an_unexpected_key_are_both_reported(tmp_path):
    ckpt = make_checkpoint()
    del ckpt["model"]["head.weight"]
    ckpt["model"]["layer2.weight"] = torch.zeros(2, 2)
    ckpt["scheduler"] = {}
    found = {(v.path, v.kind) for v in validate(saved(tmp_path, ckpt), CHECKPOINT)}
    assert found == {
        ("model.head.weight", "missing"),
        ("model.layer2.weight", "unexpected"),
        ("scheduler", "unexpected"),
    }


def test_missing_metadata_is_reported_as_metadata(tmp_path):
    ckpt = make_checkpoint()
    del ckpt["config"]
    ckpt["epoch"] = "2"
    assert messages(validate(saved(tmp_path, ckpt), CHECKPOINT)) == [
        "config: missing metadata key (expected dict)",
        "epoch: expected int, got str '2'",
    ]


def test_symbolic_dims_must_agree_across_fields(tmp_path):
    ckpt = make_checkpoint()
    ckpt["labels"] = torch.zeros(5, dtype=torch.int64)
    assert messages(validate(saved(tmp_path, ckpt), CHECKPOINT)) == [
        "labels: expected shape (B,) (B = 4 from batch), got (5,)"
    ]


def test_check_raises_one_error_listing_every_violation(tmp_path):
    ckpt = make_checkpoint()
    ckpt["model"]["layer1.weight"] = torch.zeros(16, 9)
    ckpt["step"] = -1
    path = saved(tmp_path, ckpt)
    with pytest.raises(ArtifactError) as caught:
        check(path, CHECKPOINT)
    text = str(caught.value)
    assert text.startswith(f"{path} does not match schema 'checkpoint' (2 violations)")
    assert "model.layer1.weight: expected shape (16, 8), got (16, 9)" in text
    assert "step: expected >= 0, got -1" in text
    assert len(caught.value.violations) == 2


def test_an_optional_field_may_be_absent_or_none(tmp_path):
    ckpt = make_checkpoint()
    del ckpt["ema"]
    assert validate(ckpt, CHECKPOINT) == []
    ckpt["ema"] = None
    assert validate(ckpt, CHECKPOINT) == []


def test_a_tensor_map_checks_every_value_and_its_key_pattern():
    pattern = r"layers\.\d+\.weight"
    spec = Schema("sd", fields={"sd": TensorMap(keys=pattern, dtype="bfloat16")})
    state = {"layers.0.weight": torch.zeros(2, dtype=torch.bfloat16), "layers.x": torch.zeros(2)}
    assert messages(validate({"sd": state}, spec)) == [
        f"sd.layers.x: unexpected key: does not match {pattern!r}"
    ]
    state["layers.1.weight"] = torch.zeros(2)
    found = {(v.path, v.kind) for v in validate({"sd": state}, spec)}
    assert ("sd.layers.1.weight", "dtype") in found


def test_mapping_patterns_validate_keys_not_spelled_out():
    schema = Schema(
        "m",
        fields={
            "model": MappingSpec(
                patterns={r".*\.bias": TensorSpec(shape=("*",)), r".*": TensorSpec()}
            )
        },
    )
    ok = {"model": {"a.bias": torch.zeros(3), "a.weight": torch.zeros(3, 3)}}
    assert validate(ok, schema) == []
    bad = {"model": {"a.bias": torch.zeros(3, 1)}}
    assert messages(validate(bad, schema)) == ["model.a.bias: expected shape (*,), got (3, 1)"]


def test_a_truncated_checkpoint_gives_an_error_naming_the_file(tmp_path):
    good = saved(tmp_path, make_checkpoint())
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ArtifactError) as caught:
        validate(cut, CHECKPOINT)
    assert str(caught.value).startswith(f"{cut}: not a readable torch checkpoint")
    assert "truncated or corrupt" in str(caught.value)
    assert caught.value.path == cut


def test_an_empty_checkpoint_file_gives_an_error_naming_the_file(tmp_path):
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(ArtifactError, match="empty.ckpt: not a readable torch checkpoint"):
        load(empty)


class Opaque:
    """A class torch.load(weights_only=True) refuses to rebuild."""


def test_a_checkpoint_needing_full_unpickling_is_refused_unless_allowed(tmp_path):
    path = saved(tmp_path, {"thing": Opaque(), "epoch": 1})
    with pytest.raises(ArtifactError) as caught:
        load(path)
    text = str(caught.value)
    assert "Opaque" in text and "allow_pickle=True" in text
    assert isinstance(load(path, allow_pickle=True)["thing"], Opaque)


def test_an_unsupported_extension_is_an_error():
    with pytest.raises(ArtifactError, match="unsupported file type '.bin'"):
        load("model.bin")


# --- npz and json --------------------------------------------------------------------------


def test_npz_arrays_are_validated_and_zero_d_arrays_become_scalars(tmp_path):
    path = tmp_path / "arrays.npz"
    np.savez(path, x=np.zeros((3, 16), np.float32), step=np.int64(7), note="hi")
    schema = Schema("arrays", fields={"x": TensorSpec(shape=("N", 16), dtype="float32")},
                    metadata={"step": int, "note": str})  # fmt: skip
    assert validate(path, schema) == []
    np.savez(path, x=np.full((3, 15), np.nan), step=np.int64(7), note="hi")
    found = {(v.path, v.kind) for v in validate(path, schema)}
    assert found == {("x", "dtype"), ("x", "shape")}
    finite = Schema("arrays", fields={"x": TensorSpec(finite=True)}, allow_extra=True)
    assert messages(validate(path, finite)) == ["x: 45 non-finite values of 45 (45 NaN, 0 inf)"]


def test_a_corrupt_npz_gives_an_error_naming_the_file(tmp_path):
    path = tmp_path / "arrays.npz"
    np.savez(path, x=np.zeros(1000))
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ArtifactError, match=r"arrays\.npz: not a readable \.npz archive"):
        load(path)


def test_invalid_json_gives_an_error_with_its_position(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{"loss": 1.0,')
    with pytest.raises(ArtifactError, match=r"summary\.json: not valid JSON: .* line 1 column"):
        validate(path, Schema("s", allow_extra=True))


# --- metrics logs --------------------------------------------------------------------------

METRICS = Schema(
    "metrics", fields={"step": int, "loss": Scalar(float, finite=True)}, allow_extra=True
)


def test_a_metrics_log_with_good_rows_passes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "loss": 1.0 / (i + 1), "lr": 0.1} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert validate(path, METRICS) == []
    assert check(path, METRICS) == rows


def test_metrics_log_violations_name_their_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 0, "loss": 2.5}\n'
        '{"step": 1, "loss": NaN}\n'
        "\n"
        '{"step": 2.0, "loss": 1}\n'
        "[1, 2]\n"
        '{"loss": 0.5}\n'
        '{"step": 5, "lo'  # the writer was killed mid-line
    )
    assert messages(validate(path, METRICS)) == [
        "line 2: loss: expected a finite number, got nan",
        "line 4: step: expected int, got float 2.0",
        "line 5: expected a JSON object, got list",
        "line 6: step: missing key (expected int)",
        "line 7: not valid JSON: Unterminated string starting at (column 13)",
    ]


def test_an_empty_metrics_log_is_invalid(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    assert messages(validate(path, METRICS)) == ["(top level): no rows"]


def test_rows_in_memory_validate_like_a_log():
    assert messages(validate([{"step": 1, "loss": 0.1}, {"step": True, "loss": 0.1}], METRICS)) == [
        "line 2: step: expected int, got bool True"
    ]


# --- schemas -------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


CHECKPOINT_TOML = """
    name = "checkpoint"
    [fields.model]
    kind = "mapping"
    [fields.model.fields."layer1.weight"]
    kind = "tensor"
    shape = [16, 8]
    dtype = "float32"
    finite = true
    [fields.model.fields."layer1.bias"]
    kind = "tensor"
    shape = [16]
    dtype = "float32"
    [fields.model.fields."head.weight"]
    kind = "tensor"
    shape = ["C", 16]
    [fields.ema]
    kind = "tensor_map"
    dtype = "float32"
    optional = true
    [fields.batch]
    kind = "tensor"
    shape = ["B", "*"]
    [fields.labels]
    kind = "tensor"
    shape = ["B"]
    dtype = ["int64", "int32"]
    [fields]
    optimizer = "dict"
    [metadata]
    config = "dict"
    epoch = "int"
    step = { kind = "scalar", type = "int", min = 0 }
"""


def test_a_toml_schema_validates_like_its_python_twin(tmp_path):
    schema = load_schema(write(tmp_path, "checkpoint.toml", CHECKPOINT_TOML))
    assert schema.name == "checkpoint"
    assert schema.fields["batch"] == TensorSpec(shape=("B", None))
    ckpt = make_checkpoint()
    assert validate(ckpt, schema) == []
    ckpt["model"]["layer1.weight"] = torch.zeros(16, 9)
    del ckpt["epoch"]
    assert (
        messages(validate(ckpt, schema))
        == messages(validate(ckpt, CHECKPOINT))
        == [
            "model.layer1.weight: expected shape (16, 8), got (16, 9)",
            "epoch: missing metadata key (expected int)",
        ]
    )


def test_a_json_schema_file_is_read_too(tmp_path):
    data = {"fields": {"step": "int", "loss": {"kind": "scalar", "type": "float"}}}
    schema = load_schema(write(tmp_path, "metrics.json", json.dumps(data)))
    assert schema.name == "metrics"  # the file's stem
    assert validate([{"step": 1, "loss": 0.5}], schema) == []


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[fields.x]\nkind = "tensor"\nshpe = [1]\n', "fields.x: unknown key(s) shpe"),
        ('[fields.x]\nkind = "tensor"\ndtype = "flaot32"\n', "unknown dtype 'flaot32'"),
        ('[fields]\nx = "integer"\n', "fields.x: unknown type 'integer'"),
        ('[fields.x]\nkind = "scalr"\n', "'kind' must be one of"),
        ("fieldz = {}\n", "unknown key(s) fieldz"),
        ("[fields\n", "cannot read schema"),
    ],
)
def test_a_malformed_schema_file_is_an_error_saying_where(tmp_path, text, error):
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(SchemaError) as caught:
        load_schema(path)
    assert str(caught.value).startswith(str(path))
    assert error in str(caught.value)


def test_a_schema_can_be_named_by_import_path():
    assert load_schema(f"{__name__}:CHECKPOINT") is CHECKPOINT
    with pytest.raises(SchemaError, match="not a harness.artifacts.Schema"):
        load_schema(f"{__name__}:make_checkpoint")
    with pytest.raises(SchemaError, match="has no attribute"):
        load_schema(f"{__name__}:NOPE")


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: TensorSpec(shape=(16, -1)), "must be >= 0"),
        (lambda: TensorSpec(shape="B"), "tuple of dims"),
        (lambda: TensorSpec(dtype="float33"), "unknown dtype"),
        (lambda: TensorSpec(finite="yes"), "finite must be True or False"),
        (lambda: Scalar(dict), "use Value(dict)"),
        (lambda: Scalar(str, finite=True), "int or float only"),
        (lambda: Scalar(float, min=1, max=0), "min must be <= max"),
        (lambda: MappingSpec(patterns={"(": TensorSpec()}), "bad regular expression"),
        (lambda: Schema("s", fields={"a": 3}), "expected a spec"),
        (lambda: Schema("s", fields={"a": int}, metadata={"a": int}), "both fields and metadata"),
        (lambda: Schema(""), "non-empty string"),
    ],
)
def test_specs_are_validated_when_constructed(build, error):
    with pytest.raises(SchemaError, match=error.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_bare_types_and_torch_dtypes_are_normalized():
    schema = Schema("s", fields={"n": int, "d": dict}, metadata={"t": float})
    assert schema.fields == {"n": Scalar(int), "d": Value(dict)}
    assert schema.metadata == {"t": Scalar(float)}
    assert TensorSpec(dtype=torch.bfloat16).dtype == "bfloat16"
    assert TensorSpec(dtype=(torch.float, "half")).dtype == ("float32", "float16")
    assert TensorSpec(dtype=np.float64).dtype == "float64"


# --- `harness artifacts validate` ----------------------------------------------------------


def run_cli(*args: str):
    return CliRunner().invoke(main, ["artifacts", "validate", *args])


def test_cli_exits_0_and_prints_ok_for_valid_files(tmp_path):
    schema = write(tmp_path, "checkpoint.toml", CHECKPOINT_TOML)
    a = saved(tmp_path, make_checkpoint(), "a.pt")
    b = saved(tmp_path, make_checkpoint(), "b.pth")
    result = run_cli(str(a), str(b), "--schema", str(schema))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"OK   {a}", f"OK   {b}"]


def test_cli_exits_1_and_lists_each_violation_of_an_invalid_file(tmp_path):
    schema = write(tmp_path, "checkpoint.toml", CHECKPOINT_TOML)
    ckpt = make_checkpoint()
    ckpt["model"]["layer1.bias"][0] = float("nan")
    ckpt["model"]["layer1.weight"] = torch.zeros(16, 9)
    good = saved(tmp_path, make_checkpoint(), "good.pt")
    bad = saved(tmp_path, ckpt, "bad.pt")
    result = run_cli(str(good), str(bad), "--schema", str(schema))
    assert result.exit_code == 1
    assert f"OK   {good}" in result.output
    assert f"FAIL {bad}" in result.output
    assert "model.layer1.weight: expected shape (16, 8), got (16, 9)" in result.output


def test_cli_exits_1_for_a_truncated_file_naming_it(tmp_path):
    schema = write(tmp_path, "checkpoint.toml", CHECKPOINT_TOML)
    path = saved(tmp_path, make_checkpoint())
    path.write_bytes(path.read_bytes()[:100])
    result = run_cli(str(path), "--schema", str(schema))
    assert result.exit_code == 1
    assert f"FAIL {path}: not a readable torch checkpoint" in result.output
    assert "Traceback" not in result.output


def test_cli_validates_a_metrics_log_against_an_import_path_schema(tmp_path, monkeypatch):
    (tmp_path / "my_schemas.py").write_text(
        "from harness.artifacts import Schema, Scalar\n"
        "METRICS = Schema('metrics', fields={'step': int, 'loss': Scalar(float, finite=True)})\n"
    )
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": Infinity}\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI makes the cwd importable
    result = run_cli("metrics.jsonl", "--schema", "my_schemas:METRICS")
    assert result.exit_code == 1, result.output
    assert "line 2: loss: expected a finite number, got inf" in result.output


@pytest.mark.parametrize(
    "schema_arg",
    ["missing.toml", "no_such_module_xyz:SCHEMA", "not-a-schema-reference"],
)
def test_cli_exits_2_for_a_schema_it_cannot_load(tmp_path, schema_arg):
    path = saved(tmp_path, make_checkpoint())
    result = run_cli(str(path), "--schema", schema_arg)
    assert result.exit_code == 2
    assert "Error:" in result.output


def test_cli_exits_2_for_an_unsupported_file_type(tmp_path):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"\0")
    schema = write(tmp_path, "s.toml", 'name = "s"\n')
    result = run_cli(str(path), "--schema", str(schema))
    assert result.exit_code == 2
    assert "unsupported file type" in result.output


def test_cli_help_shows_an_example_schema():
    result = CliRunner().invoke(main, ["artifacts", "validate", "--help"])
    assert result.exit_code == 0
    assert 'loss = { kind = "scalar", type = "float", finite = true }' in result.output
