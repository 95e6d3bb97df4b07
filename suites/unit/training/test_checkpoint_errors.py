"""The checkpoint store's errors, word for word, and its edge cases, without a training run.

Each damaged or wrong file must be refused with an error that names the file (``.path``) and
says what is wrong (``.problem``), since that message is all a user has to decide whether to
restore a copy, start afresh or fix a config. The training-level behaviour (fallback to an
older generation, resume) is in test_checkpoint_files.py.
"""

from __future__ import annotations

import datetime as dt
import io
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from reference_impls.training import checkpoint as ck


def minimal_state(number: int = 0, size: int = 8) -> dict:
    """The keys load_checkpoint requires; ``size``: elements of the one weight tensor."""
    return {
        "format": ck.FORMAT, "model": {"w": torch.full((size,), float(number))}, "optimizer": {},
        "scheduler": {}, "epoch": number, "step": number, "position": {"epoch": 0, "batch": 0},
        "early_stopping": {}, "val_loss": 1.0, "stop_reason": None, "rng": {}, "world_size": 1,
        "config": {"model": {"d": 8}},
    }  # fmt: skip


def corrupt_error(path: Path) -> ck.CheckpointCorruptError:
    with pytest.raises(ck.CheckpointCorruptError) as info:
        ck.load_checkpoint(path)
    assert info.value.path == path
    assert str(info.value) == f"checkpoint {path} is unusable: {info.value.problem}"
    return info.value


# --- the container ---------------------------------------------------------------------------


def test_an_empty_zip_archive_is_refused_as_having_no_records(tmp_path):
    path = tmp_path / "latest.pt"
    zipfile.ZipFile(path, "w").close()
    assert corrupt_error(path).problem == "a zip archive without records"


def test_a_truncated_file_is_refused_with_its_size(tmp_path):
    path = tmp_path / "latest.pt"
    torch.save(minimal_state(), path)
    path.write_bytes(path.read_bytes()[:300])
    assert corrupt_error(path).problem == (
        "truncated, or not a torch.save file (300 bytes, no zip end-of-archive record)"
    )


def test_a_damaged_central_directory_is_named_as_such_not_as_truncation(tmp_path):
    path = tmp_path / "latest.pt"
    torch.save(minimal_state(), path)
    data = bytearray(path.read_bytes())
    central = data.rfind(b"PK\x01\x02")  # a central directory entry's signature
    data[central : central + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    problem = corrupt_error(path).problem
    assert problem.startswith("damaged zip container (") and problem.endswith(")")


def test_a_path_that_cannot_be_read_is_refused_naming_the_os_error(tmp_path):
    path = tmp_path / "latest.pt"
    path.mkdir()  # is_file() is False: "does not exist"; verify itself says "cannot read it"
    with pytest.raises(ck.CheckpointCorruptError) as info:
        ck.verify_checkpoint_file(path)
    assert info.value.path == path
    assert info.value.problem.startswith("cannot read it: [Errno 21] Is a directory")


def test_a_flipped_byte_is_reported_with_the_record_and_the_likely_cause(tmp_path):
    path = tmp_path / "latest.pt"
    torch.save(minimal_state(), path)
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)  # the tensor's bytes
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_len + extra_len] ^= 0xFF
    path.write_bytes(bytes(data))
    assert corrupt_error(path).problem == (
        f"CRC-32 mismatch in record {info.filename}: its bytes changed after they were written "
        "(disk or copy damage)"
    )


def _zip_with(tmp_path: Path, records: list[tuple[str, bytes, int]]) -> Path:
    path = tmp_path / "archive.pt"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data, compression in records:
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=compression)
    return path


def test_compressed_records_are_checked_too_and_do_not_stop_the_check(tmp_path):
    # torch.save stores records uncompressed; another writer may deflate them.
    payload = bytes(range(256)) * 64
    path = _zip_with(
        tmp_path,
        [("a/deflated", payload, zipfile.ZIP_DEFLATED), ("a/stored", payload, zipfile.ZIP_STORED)],
    )
    ck.verify_checkpoint_file(path)  # a good deflated record passes

    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        stored = archive.getinfo("a/stored")
    name_len, extra_len = struct.unpack_from("<HH", data, stored.header_offset + 26)
    data[stored.header_offset + 30 + name_len + extra_len + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointCorruptError, match="CRC-32 mismatch in record a/stored"):
        ck.verify_checkpoint_file(path)  # found after the deflated record was read


def test_a_damaged_compressed_record_is_named(tmp_path):
    payload = b"x" * 5000 + bytes(range(256))
    path = _zip_with(tmp_path, [("a/deflated", payload, zipfile.ZIP_DEFLATED)])
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("a/deflated")
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.compress_size - 3] ^= 0x01  # near the end of the deflated stream
    path.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointCorruptError, match="in record a/deflated"):
        ck.verify_checkpoint_file(path)


# --- load_checkpoint -------------------------------------------------------------------------


def test_a_missing_checkpoint_is_named(tmp_path):
    path = tmp_path / "latest.pt"
    with pytest.raises(ck.CheckpointError) as info:
        ck.load_checkpoint(path)
    assert str(info.value) == f"checkpoint {path} does not exist" and info.value.path == path


def test_torch_loads_failure_is_reported_by_its_first_line(tmp_path):
    path = _zip_with(tmp_path, [("a/data.pkl", b"not a pickle", zipfile.ZIP_STORED)])
    with pytest.raises(Exception) as raw:
        torch.load(path, weights_only=True)
    first = str(raw.value).strip().splitlines()[0]
    assert corrupt_error(path).problem == f"torch.load failed: {first}"


def test_a_checkpoint_holding_arbitrary_python_objects_is_not_unpickled(tmp_path):
    # weights_only=True: a checkpoint from elsewhere must not run code or build objects on load.
    path = tmp_path / "latest.pt"
    torch.save({**minimal_state(), "saved_by": dt.date(2026, 1, 1)}, path)
    assert corrupt_error(path).problem.startswith("torch.load failed: Weights only load failed")


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ([1, 2], "expected a dict, got list"),
        ({"format": "other/2"}, "format is 'other/2', expected 'reference_impls.training/1'"),
        (
            {**minimal_state(), "step": "3", "epoch": True, "world_size": 1.0},
            "'epoch' is a bool; 'step' is a str; 'world_size' is a float",
        ),
    ],
    ids=["not a dict", "other format", "wrong types"],
)
def test_a_file_of_the_wrong_structure_names_every_problem(tmp_path, state, problem):
    path = tmp_path / "latest.pt"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(buffer.getvalue())
    assert corrupt_error(path).problem == f"not a training checkpoint: {problem}"


# --- configs ---------------------------------------------------------------------------------


def test_config_differences_name_keys_present_on_one_side_only():
    assert ck.config_differences({"m": {"d": 8, "old": 1}}, {"m": {"d": 16, "new": 2}}) == [
        "m.d: checkpoint 8, this run 16",
        "m.new: checkpoint (absent), this run 2",
        "m.old: checkpoint 1, this run (absent)",
    ]
    # None is a value, not absence.
    assert ck.config_differences({"a": None}, {}) == ["a: checkpoint None, this run (absent)"]
    assert ck.config_differences({}, {"a": None}) == ["a: checkpoint (absent), this run None"]


def test_a_checkpoint_for_another_model_is_refused_listing_the_differences(tmp_path):
    path = tmp_path / "latest.pt"
    with pytest.raises(ck.CheckpointMismatchError) as info:
        ck.check_model_config(minimal_state(), path, {"d": 16, "n": 2})
    assert info.value.path == path
    assert str(info.value) == (
        f"refusing to load {path}: it was written for a different model config (model.d: "
        "checkpoint 8, this run 16; model.n: checkpoint (absent), this run 2). Use the config "
        "it was written with, or a new run directory for the new model."
    )


def test_a_checkpoint_without_a_model_config_differs_in_every_key(tmp_path):
    state = {**minimal_state(), "config": {}}
    with pytest.raises(ck.CheckpointMismatchError, match=r"\(model.d: checkpoint \(absent\), "):
        ck.check_model_config(state, tmp_path / "latest.pt", {"d": 8})


# --- the run directory and the store ---------------------------------------------------------


def test_an_empty_run_directory_name_is_refused():
    with pytest.raises(ck.RunDirError) as info:
        ck.check_run_dir("")
    assert info.value.path is None
    assert str(info.value) == (
        'run directory is an empty string: give a path ("." for the working directory)'
    )


def test_a_run_directory_that_is_a_file_or_under_one_is_refused_naming_it(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ck.RunDirError) as info:
        ck.check_run_dir(afile)
    assert info.value.path == afile
    assert str(info.value) == (
        f"run directory {afile} is a file, not a directory: give a directory (a missing one "
        "is created)"
    )
    under = afile / "run"
    with pytest.raises(ck.RunDirError) as info:
        ck.check_run_dir(under)
    assert info.value.path == under
    assert str(info.value) == (
        f"cannot create run directory {under}: {afile} is a file, not a directory"
    )


def test_missing_parents_of_the_run_directory_and_the_store_are_created(tmp_path):
    ck.check_run_dir(tmp_path / "a" / "b" / "run")
    assert (tmp_path / "a" / "b" / "run").is_dir()
    store = ck.CheckpointStore(tmp_path / "c" / "d" / "run")
    store.save(minimal_state(), best=False)
    assert ck.load_checkpoint(store.latest)["step"] == 0


def test_damaged_checkpoints_set_aside_keep_every_earlier_one(tmp_path):
    store = ck.CheckpointStore(tmp_path)
    names = []
    for number in range(3):
        store.latest.write_bytes(f"damaged {number}".encode())
        names.append(store.set_aside(store.latest).name)
    assert names == ["latest.pt.corrupt", "latest.pt.corrupt.1", "latest.pt.corrupt.2"]
    assert [(tmp_path / n).read_text() for n in names] == [f"damaged {i}" for i in range(3)]
    assert not store.latest.exists()


def test_a_run_directory_name_over_the_length_limit_is_a_run_dir_error_not_an_oserror(tmp_path):
    # stat() of such a name raises ENAMETOOLONG rather than reporting it missing.
    path = tmp_path / ("x" * 300) / "run"
    with pytest.raises(ck.RunDirError) as info:
        ck.check_run_dir(path)
    assert info.value.path == path
    assert str(info.value) == (
        f"cannot create run directory {path}: File name too long (in {tmp_path}); choose a "
        "directory this user may write"
    )


def _flip_tensor_byte(path: Path) -> None:
    """Damage the largest record so that only the CRC check notices (torch.load does not)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_len + extra_len] ^= 0xFF
    path.write_bytes(bytes(data))


def test_resume_checks_crcs_by_default_and_falls_back_past_a_damaged_latest(tmp_path):
    store = ck.CheckpointStore(tmp_path)
    for number in range(3):  # 1000 floats: the tensor is the largest record, not the pickle
        store.save(minimal_state(number, size=1000), best=False)
    _flip_tensor_byte(store.latest)
    torch.load(store.latest, weights_only=True)  # loads fine: only the CRC check catches it

    point = store.find_resume({"d": 8})

    assert point is not None and point.path == store.previous[0]
    assert point.state["step"] == 1
    assert [e.path for e in point.skipped] == [store.latest]


def test_resume_with_every_generation_damaged_lists_them_all_and_says_what_to_do(tmp_path):
    store = ck.CheckpointStore(tmp_path)
    for number in range(3):
        store.save(minimal_state(number), best=False)
    for path in (store.latest, *store.previous):
        path.write_bytes(b"garbage")

    with pytest.raises(ck.CheckpointError) as info:
        store.find_resume()

    assert info.value.path == tmp_path
    lines = str(info.value).splitlines()
    assert lines[0] == f"no usable checkpoint to resume from in {tmp_path}:"
    assert [line.split(" is unusable")[0] for line in lines[1:4]] == [
        f"  checkpoint {p}" for p in (store.latest, *store.previous)
    ]
    assert lines[4] == (
        "Start a fresh run in a new directory, or restore a good copy of one of them."
    )


def test_resume_without_latest_takes_the_newest_older_generation(tmp_path):
    store = ck.CheckpointStore(tmp_path)
    for number in range(3):
        store.save(minimal_state(number), best=False)
    store.latest.unlink()  # e.g. set aside by hand
    point = store.find_resume()
    assert point is not None and point.path == store.previous[0] and point.skipped == []


def test_resume_without_verification_skips_the_crc_pass(tmp_path):
    # verify=False trades the CRC pass for speed: a flipped tensor byte then goes unnoticed.
    store = ck.CheckpointStore(tmp_path)
    store.save(minimal_state(0, size=1000), best=False)
    _flip_tensor_byte(store.latest)
    point = store.find_resume(verify=False)
    assert point is not None and point.path == store.latest
