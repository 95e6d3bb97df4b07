"""ShardedDataset's bookkeeping over a small local dataset: record/state_dict/load_state_dict,
refusals of mismatched resumes, pickling for DataLoader workers, local-source errors."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from reference_impls.data import (
    DatasetConfig,
    ManifestError,
    ManifestMismatchError,
    ShardedDataset,
    ShardWriter,
    WriterConfig,
)


@pytest.fixture
def local(tmp_path):
    root = tmp_path / "ds"
    with ShardWriter(root, WriterConfig(target_shard_bytes=10_240)) as w:
        for i in range(60):
            w.write({"__key__": f"k{i:03d}", "txt": f"sample {i}" + "." * (i * 20)})
    return root


def test_record_accepts_single_samples_and_collated_batches(local):
    ds = ShardedDataset(local, DatasetConfig(shuffle_buffer=8))
    it = iter(ds)
    ds.record(next(it))
    batch = {
        "__index__": torch.tensor([1, 2, 3]),
        "__worker__": torch.tensor([0, 0, 0]),
        "__num_workers__": torch.tensor([1, 1, 1]),
    }
    ds.record(batch)
    ds.record({"__index__": [2], "__worker__": [0], "__num_workers__": [1]})  # idempotent
    assert ds.state_dict()["consumed"] == [4]
    it.close()


def test_record_without_the_position_entries_says_what_is_missing(local):
    ds = ShardedDataset(local)
    with pytest.raises(ValueError, match=r"needs the '__index__' entry"):
        ds.record({"__key__": "k000"})


def test_a_state_from_another_worker_count_is_refused_when_iterating(local):
    ds = ShardedDataset(local)
    ds.record({"__index__": [3, 5], "__worker__": [0, 1], "__num_workers__": [2, 2]})
    resumed = ShardedDataset(local)
    resumed.load_state_dict(ds.state_dict())
    with pytest.raises(
        ValueError, match=r"recorded with 2 DataLoader worker\(s\), this loader has 1"
    ):
        next(iter(resumed))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 1}, r"saved with seed=0, this dataset has seed=1"),
        ({"shuffle_buffer": 5}, r"shuffle_buffer=1000, this dataset has shuffle_buffer=5"),
        ({"uneven": "drop"}, r"uneven='pad', this dataset has uneven='drop'"),
    ],
)
def test_a_state_saved_under_other_settings_is_refused_naming_the_setting(local, change, message):
    state = ShardedDataset(local).state_dict()
    with pytest.raises(ValueError, match=message):
        ShardedDataset(local, DatasetConfig(**change)).load_state_dict(state)


def test_a_state_of_another_dataset_is_refused(local, tmp_path):
    other = tmp_path / "other"
    with ShardWriter(other) as w:
        w.write({"__key__": "x", "txt": "y"})
    with pytest.raises(ValueError, match=r"state is for a different dataset"):
        ShardedDataset(other).load_state_dict(ShardedDataset(local).state_dict())


def test_a_new_epoch_starts_unconsumed_and_a_finished_one_starts_over(local):
    ds = ShardedDataset(local, DatasetConfig(shuffle_buffer=4))
    first = []
    for sample in ds:
        first.append(sample["__key__"])
        ds.record(sample)
    assert [s["__key__"] for s in ds] == first  # finished: iterating again starts over
    ds.set_epoch(1)
    assert ds.state_dict()["consumed"] == []
    assert sorted(s["__key__"] for s in ds) == sorted(first)


def test_the_dataset_pickles_for_spawned_workers(local):
    ds = ShardedDataset(local, DatasetConfig(seed=3))
    ds.set_epoch(2)
    copy = pickle.loads(pickle.dumps(ds))
    assert [s["__key__"] for s in copy] == [s["__key__"] for s in ds]


def test_len_is_the_per_rank_length(local):
    assert len(ShardedDataset(local, DatasetConfig(rank=0, world_size=7))) == 9  # ceil(60 / 7)
    assert len(ShardedDataset(local, DatasetConfig(rank=6, world_size=7, uneven="drop"))) == 8


def test_a_local_directory_without_a_manifest_says_how_to_make_one(tmp_path):
    tmp_path.joinpath("a.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(ManifestError, match=r"no manifest.json in .*build_manifest"):
        ShardedDataset(tmp_path)


def test_a_local_shard_shorter_than_the_manifest_says_is_an_error_naming_it(local):
    ds = ShardedDataset(local, DatasetConfig(shuffle_shards=False))
    victim = ds.manifest.shards[1]
    path = local / victim.name
    path.write_bytes(path.read_bytes()[:-512])
    with pytest.raises(
        ManifestMismatchError, match=rf"{victim.name} has {victim.size - 512} bytes"
    ):
        list(ds)


def test_a_cache_inside_the_dataset_directory_is_refused(local):
    config = DatasetConfig(cache_dir=str(local / "cache"), cache_max_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"lies inside the dataset directory"):
        list(ShardedDataset(local, config))


def test_a_worker_that_finished_its_share_yields_nothing_after_a_resume(tmp_path):
    # 100 samples of 500 B in 20 KB shards; 99 recorded through a DataLoader: with 2 workers,
    # worker 0 has delivered all of its 50 and worker 1 49 of its 50. Only 1 sample is left.
    root = tmp_path / "ds"
    with ShardWriter(root, WriterConfig(target_shard_bytes=20_000)) as w:
        for i in range(100):
            w.write({"__key__": f"k{i:03d}", "bin": bytes([i]) * 500})
    config = DatasetConfig(seed=1, shuffle_buffer=10)
    ds = ShardedDataset(root, config)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    recorded = []
    for sample in loader:
        ds.record(sample)
        recorded.append(sample["__key__"])
        if len(recorded) == 99:
            break
    assert ds.state_dict()["consumed"] == [50, 49]

    resumed = ShardedDataset(root, config)
    resumed.load_state_dict(ds.state_dict())
    rest = [s["__key__"] for s in DataLoader(resumed, batch_size=None, num_workers=2)]

    assert sorted(recorded + rest) == [f"k{i:03d}" for i in range(100)]
