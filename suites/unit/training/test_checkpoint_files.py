"""Checkpoint files of reference_impls.training: atomic durable writes, older generations kept
(the oldest reused for the next write), damaged files refused with the file named and a
fallback on resume, a different model config refused, and the declared schema (checked with
harness.artifacts)."""

from __future__ import annotations

import json
import logging
import os
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from harness import assert_equal
from harness.artifacts import ArtifactError, check, load_schema
from reference_impls.training import (
    BatchOrder,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointStore,
    ConfigError,
    TrainConfig,
    Trainer,
    checkpoint_io,
    load_checkpoint,
    save_checkpoint,
)
from reference_impls.training import checkpoint as checkpoint_module

PACKAGE = Path(checkpoint_module.__file__).parent
CHECKPOINT_SCHEMA = load_schema(PACKAGE / "checkpoint_schema.toml")
METRICS_SCHEMA = load_schema(PACKAGE / "metrics_schema.toml")


def small_config(seed: int, **changes) -> TrainConfig:
    data = {
        "seed": seed,
        "max_epochs": 3,
        "progress": False,
        "num_threads": 1,
        "model": {"in_features": 4, "hidden": [8, 8], "dropout": 0.1},
        "data": {"num_train": 16, "num_val": 8, "batch_size": 4},
    }
    config = TrainConfig.from_dict(data)
    return config.replace(changes) if changes else config


def train(run_dir: Path, seed: int, **changes):
    return Trainer(small_config(seed, **changes), run_dir).run()


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "latest.pt")["model"]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert_equal(a[key], b[key], bitwise=True, msg=key)  # the same computation


# --------------------------------------------------------------------------- writing


def test_a_saved_checkpoint_reads_back_equal_and_leaves_no_temporary_file(tmp_path):
    state = {"format": "x", "w": torch.arange(6.0).reshape(2, 3), "meta": {"step": 3}}

    save_checkpoint(state, tmp_path / "latest.pt")

    loaded = torch.load(tmp_path / "latest.pt", weights_only=True)
    assert_equal(loaded["w"], state["w"], bitwise=True)
    assert loaded["meta"] == {"step": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]


def test_every_save_moves_the_older_generations_down_one_name(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed)  # 3 epochs: 3 validations, 3 writes of latest.pt

    names = ("latest.pt", "latest.prev.pt", "latest.prev2.pt")
    assert [load_checkpoint(run_dir / name)["epoch"] for name in names] == [2, 1, 0]


def save_generations(directory: Path, count: int, start: int = 0) -> None:
    previous = [directory / "latest.prev.pt", directory / "latest.prev2.pt"]
    for number in range(start, start + count):
        save_checkpoint(minimal_checkpoint(number), directory / "latest.pt", previous=previous)


def minimal_checkpoint(number: int) -> dict:
    """The keys load_checkpoint requires, and a generation number."""
    return {
        "format": checkpoint_module.FORMAT, "generation": number,
        "model": {"w": torch.full((1000,), float(number))}, "optimizer": {}, "scheduler": {},
        "epoch": number, "step": number, "position": {"epoch": number, "batch": 0},
        "early_stopping": {}, "val_loss": 1.0, "stop_reason": None, "rng": {}, "world_size": 1,
        "config": {},
    }  # fmt: skip


def generation(path: Path) -> int:
    return torch.load(path, weights_only=True)["generation"]


def test_the_new_file_is_synced_before_any_name_moves_and_the_directory_after(
    tmp_path, monkeypatch
):
    save_generations(tmp_path, 3)
    reused = (tmp_path / "latest.prev2.pt").stat().st_ino
    events = []
    real_fdatasync, real_fsync, real_replace = checkpoint_io._fdatasync, os.fsync, os.replace

    def fdatasync(fd):
        events.append("sync file")
        return real_fdatasync(fd)

    def fsync(fd):
        events.append("sync dir" if Path(f"/proc/self/fd/{fd}").resolve().is_dir() else "sync file")
        return real_fsync(fd)

    def replace(src, dst):
        name = Path(dst).name
        events.append(f"rename to {'the temporary file' if '.tmp-' in name else name}")
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint_io, "_fdatasync", fdatasync)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(
        {"generation": 3},
        tmp_path / "latest.pt",
        previous=[tmp_path / "latest.prev.pt", tmp_path / "latest.prev2.pt"],
        also=[tmp_path / "best.pt"],
    )

    assert events == [
        "rename to the temporary file",  # the oldest generation's file, to be reused
        "sync file",  # the new generation is on disk before any name points to it
        "rename to best.pt",
        "rename to latest.prev2.pt",  # every older generation keeps a name throughout
        "rename to latest.prev.pt",
        "rename to latest.pt",
        "sync dir",  # the renames themselves made durable
    ]
    names = ("latest.pt", "latest.prev.pt", "latest.prev2.pt", "best.pt")
    assert [generation(tmp_path / name) for name in names] == [3, 2, 1, 3]
    assert (tmp_path / "latest.pt").stat().st_ino == reused
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_a_generation_that_best_pt_also_names_is_never_overwritten(tmp_path):
    save_checkpoint({"generation": -1}, tmp_path / "latest.pt", also=[tmp_path / "best.pt"])
    save_generations(tmp_path, 4)  # generation -1 moves down past latest.prev2.pt and out

    assert generation(tmp_path / "best.pt") == -1
    checkpoint_module.verify_checkpoint_file(tmp_path / "best.pt")


def test_after_a_fallback_the_only_good_generation_is_not_reused_for_the_next_write(tmp_path):
    save_generations(tmp_path, 3)
    store = CheckpointStore(tmp_path)
    for name in ("latest.pt", "latest.prev.pt"):
        (tmp_path / name).write_bytes(b"damaged")
    point = store.find_resume()
    assert point.path == tmp_path / "latest.prev2.pt"
    for problem in point.skipped:
        store.set_aside(problem.path)

    save_generations(tmp_path, 1, start=3)

    assert generation(tmp_path / "latest.prev2.pt") == 0  # still there, not rewritten
    assert generation(tmp_path / "latest.pt") == 3


def test_a_write_that_fails_midway_leaves_the_previous_latest_intact(tmp_path, monkeypatch):
    save_checkpoint({"w": torch.ones(1000)}, tmp_path / "latest.pt")
    real_write_all = checkpoint_io._DurableWriter._write_all

    def disk_full_after_the_first_write(self, view):
        if self._written > 0:
            raise OSError(28, "No space left on device")
        return real_write_all(self, view)

    monkeypatch.setattr(checkpoint_io, "_SMALL_WRITE", 16)  # so that there are several writes
    monkeypatch.setattr(checkpoint_io._DurableWriter, "_write_all", disk_full_after_the_first_write)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(
            {"w": torch.zeros(1000)}, tmp_path / "latest.pt", previous=[tmp_path / "latest.prev.pt"]
        )

    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]
    assert_equal(torch.load(tmp_path / "latest.pt", weights_only=True)["w"], torch.ones(1000))


# --------------------------------------------------------------------------- damaged files


@pytest.fixture
def checkpoint_file(tmp_path, seed) -> Path:
    run_dir = tmp_path / "run"
    train(run_dir, seed, max_epochs=1)
    return run_dir / "latest.pt"


def test_a_truncated_checkpoint_is_refused_with_an_error_naming_the_file(checkpoint_file):
    data = checkpoint_file.read_bytes()
    checkpoint_file.write_bytes(data[: len(data) // 2])

    with pytest.raises(CheckpointCorruptError, match="truncated") as info:
        load_checkpoint(checkpoint_file)

    assert str(checkpoint_file) in str(info.value)
    assert info.value.path == checkpoint_file


def test_a_flipped_byte_in_tensor_data_is_caught_by_the_crc_check(checkpoint_file):
    with zipfile.ZipFile(checkpoint_file) as archive:  # the largest tensor record
        info = max(archive.infolist(), key=lambda i: i.file_size)
    data = bytearray(checkpoint_file.read_bytes())
    # The record's bytes follow its local header: 30 bytes, the name, the extra field.
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0xFF
    checkpoint_file.write_bytes(bytes(data))
    # torch.load alone reads the damaged tensor without complaint: the reason for the CRC check.
    torch.load(checkpoint_file, weights_only=True)

    with pytest.raises(CheckpointCorruptError, match="CRC-32 mismatch") as info_:
        load_checkpoint(checkpoint_file)

    assert str(checkpoint_file) in str(info_.value) and info.filename in str(info_.value)


def test_a_file_that_is_not_a_training_checkpoint_is_refused_naming_what_is_missing(tmp_path):
    path = tmp_path / "latest.pt"
    torch.save({"format": "reference_impls.training/1", "model": {}}, path)

    with pytest.raises(CheckpointCorruptError, match="missing key 'optimizer'") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)

    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointCorruptError, match=str(path)):
        load_checkpoint(path)


def test_resume_falls_back_to_the_previous_generation_when_latest_is_truncated(
    tmp_path, seed, caplog
):
    reference, damaged = tmp_path / "reference", tmp_path / "damaged"
    train(reference, seed)
    train(damaged, seed, max_epochs=2)
    latest = damaged / "latest.pt"
    latest.write_bytes(latest.read_bytes()[:1000])

    with caplog.at_level(logging.WARNING, logger="reference_impls.training"):
        result = train(damaged, seed)

    assert result.resumed_from == str(damaged / "latest.prev.pt")
    assert str(latest) in result.skipped_checkpoints[0]
    messages = [r.getMessage() for r in caplog.records]
    assert any(str(latest) in m and "latest.prev.pt" in m for m in messages)
    assert (damaged / "latest.pt.corrupt").exists()  # kept for inspection, out of the rotation
    # Resuming from one generation earlier redoes that epoch and lands where an
    # uninterrupted run lands.
    assert_same_weights(final_weights(damaged), final_weights(reference))


def test_resume_fails_clearly_when_every_generation_is_damaged(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed, max_epochs=2)
    for name in ("latest.pt", "latest.prev.pt"):
        (run_dir / name).write_bytes(b"\0" * 100)

    with pytest.raises(CheckpointError, match="no usable checkpoint") as info:
        train(run_dir, seed)

    assert str(run_dir / "latest.pt") in str(info.value)
    assert str(run_dir / "latest.prev.pt") in str(info.value)


def test_temporary_files_of_an_interrupted_write_are_ignored_and_removed_on_resume(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed, max_epochs=1)
    leftover = run_dir / ".latest.pt.tmp-12345-abcd"
    leftover.write_bytes(b"half a checkpoint")

    result = train(run_dir, seed, max_epochs=2)

    assert result.resumed_from == str(run_dir / "latest.pt")
    assert not leftover.exists()


# --------------------------------------------------------------------------- config checks


def test_a_checkpoint_from_a_different_model_config_is_refused(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed, max_epochs=1)
    before = (run_dir / "latest.pt").read_bytes()

    with pytest.raises(CheckpointMismatchError) as info:
        Trainer(small_config(seed, **{"model.hidden": [16]}), run_dir).run()

    message = str(info.value)
    assert str(run_dir / "latest.pt") in message
    assert "model.hidden: checkpoint [8, 8], this run [16]" in message
    assert (run_dir / "latest.pt").read_bytes() == before  # refused, not overwritten


def test_resume_never_refuses_a_run_directory_that_holds_checkpoints(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed, max_epochs=1)

    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        Trainer(small_config(seed), run_dir).run(resume="never")


def test_an_unknown_config_key_is_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"early_stopping\.paitence"):
        TrainConfig.from_dict({"early_stopping": {"paitence": 3}})
    with pytest.raises(ConfigError, match=r"data\.batch_size must be int, got .8."):
        TrainConfig.from_dict({"data": {"batch_size": "8"}})


def test_a_global_batch_that_does_not_split_over_the_ranks_is_refused():
    with pytest.raises(ConfigError, match="10 is not divisible by world size 4"):
        BatchOrder(100, 10, seed=0, rank=0, world_size=4)


# --------------------------------------------------------------------------- schemas


def test_latest_and_best_checkpoints_match_the_declared_schema(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed)

    for name in ("latest.pt", "latest.prev.pt", "best.pt"):
        state = check(run_dir / name, CHECKPOINT_SCHEMA)
        assert set(state["rng"]) == {"rank0"}


def test_a_checkpoint_with_a_nan_weight_fails_schema_validation(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed, max_epochs=1)
    state = load_checkpoint(run_dir / "latest.pt")
    state["model"]["layers.0.weight"][0, 0] = float("nan")
    del state["rng"]["rank0"]["numpy"]
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)

    with pytest.raises(ArtifactError) as info:
        check(bad, CHECKPOINT_SCHEMA)

    problems = {(v.path, v.kind) for v in info.value.violations}
    assert problems == {("model.layers.0.weight", "non_finite"), ("rng.rank0.numpy", "missing")}


def test_the_metrics_log_matches_its_schema_and_holds_every_step(tmp_path, seed):
    run_dir = tmp_path / "run"
    train(run_dir, seed)  # 16 examples / 4 per batch: 4 steps per epoch, 3 epochs

    rows = check(run_dir / "metrics.jsonl", METRICS_SCHEMA)

    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 13))
    assert [r["step"] for r in rows if r["kind"] == "val"] == [4, 8, 12]
    assert json.loads((run_dir / "result.json").read_text())["step"] == 12
