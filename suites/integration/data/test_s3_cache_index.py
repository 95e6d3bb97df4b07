"""The cache's sample index with an S3 source (SeaweedFS on loopback): a shard streamed from
S3 enters the cache with its index, and later epochs read it through the index (no tar
parsing) with exactly the samples of the streamed epoch, also through DataLoader workers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import reference_impls.data.dataset as dataset_module
from reference_impls.data import DatasetConfig, ShardedDataset
from reference_impls.data.cache import ShardCache, index_path
from reference_impls.data.shardindex import ShardIndex


def test_shards_streamed_from_s3_are_read_back_through_their_index(
    bucket, s3_config, make_dataset, tmp_path, monkeypatch
):
    url = f"s3://{bucket}/train"
    manifest, _ = make_dataset(url, 240, s3=s3_config)
    cache_dir = tmp_path / "cache"
    config = DatasetConfig(seed=4, s3=s3_config, cache_dir=str(cache_dir), cache_max_bytes=10 << 20)
    ds = ShardedDataset(url, config)
    streamed = [list(s.items()) for s in ds]
    assert ds.metrics.cache_misses == len(manifest.shards)
    cache = ShardCache(cache_dir, 10 << 20)
    for shard in manifest.shards:
        path = cache.path_for(shard)
        assert path is not None and index_path(path).exists()
        admitted = cache.load_index(path, shard)
        assert admitted == ShardIndex.scan(path.read_bytes(), shard.name)

    parsed: list[int] = []
    real = dataset_module.iter_samples
    monkeypatch.setattr(
        dataset_module, "iter_samples", lambda *a, **k: parsed.append(1) or real(*a, **k)
    )
    ds.metrics.reset()
    again = [list(s.items()) for s in ds]  # the same epoch again: the same order
    assert ds.metrics.cache_hits == len(manifest.shards) and ds.metrics.bytes_network == 0
    assert ds.metrics.cache_index_rebuilds == 0 and not parsed
    assert again == streamed


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataloader_workers_read_the_cache_through_the_index(
    bucket, s3_config, make_dataset, tmp_path
):
    url = f"s3://{bucket}/train"
    manifest, samples = make_dataset(url, 240, s3=s3_config)
    config = DatasetConfig(
        seed=8,
        s3=s3_config,
        shuffle_buffer=16,
        cache_dir=str(tmp_path / "c"),
        cache_max_bytes=10 << 20,
    )

    def epoch() -> list[dict[str, Any]]:
        ds = ShardedDataset(url, config)
        out = []
        for batch in DataLoader(ds, batch_size=8, num_workers=2):
            for i in range(len(batch["__key__"])):
                out.append(
                    {
                        k: (v[i].item() if isinstance(v, torch.Tensor) else v[i])
                        for k, v in batch.items()
                    }
                )
        return out

    first = epoch()  # fills the cache (both workers write into it)
    second = epoch()  # served from it, through the indexes
    assert len(list((tmp_path / "c").glob("*.idx"))) == len(manifest.shards)
    assert second == first
    assert sorted(s["__key__"] for s in second) == sorted(samples)
    for s in second:
        assert s["bin"] == samples[s["__key__"]]["bin"] and s["cls"] == samples[s["__key__"]]["cls"]
