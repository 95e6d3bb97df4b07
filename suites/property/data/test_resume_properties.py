"""Mid-epoch resume through real DataLoader workers (hypothesis): after ``record()``-ing any
prefix of what a loader delivered, a new dataset loaded with ``state_dict()`` yields exactly the
samples not yet recorded, none twice, none lost, for any world size, number of loader workers,
dataset size and shard layout.

The DataLoader interleaves its workers' streams, so the recorded prefix is a different count
per worker; a worker may have delivered its whole share while another has not (the case that
once replayed the finished worker's share). Local shards, written per example, keep it fast.
"""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from reference_impls.data import DatasetConfig, ShardedDataset, ShardWriter, WriterConfig


def write_dataset(root: Path, samples: int, payload: int, shard_bytes: int) -> int:
    """``samples`` samples of ``payload`` bytes, shards cut at ``shard_bytes``; the shard count."""
    with ShardWriter(root, WriterConfig(target_shard_bytes=shard_bytes)) as writer:
        for i in range(samples):
            writer.write({"__key__": f"k{i:04d}", "bin": bytes([i % 251]) * payload})
    return len(ShardedDataset(root).manifest.shards)


def identity(sample):
    return sample


def ids(samples) -> collections.Counter[tuple[str, bool]]:
    # A padded sample repeats a real one's key: count (key, pad) pairs, not keys.
    return collections.Counter((s["__key__"], bool(s["__pad__"])) for s in samples)


@settings(max_examples=30, deadline=None)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@given(
    samples=st.integers(1, 60),
    # 1 to ~40 samples per shard: from one shard per sample to a single shard.
    payload=st.sampled_from([1, 500, 2000, 5000]),
    shard_bytes=st.sampled_from([10_240, 20_480, 40_960]),
    world_size=st.integers(1, 4),
    workers=st.integers(0, 3),
    shuffle_buffer=st.sampled_from([0, 10]),
    data=st.data(),
)
def test_a_resume_yields_exactly_the_samples_not_yet_recorded(
    samples, payload, shard_bytes, world_size, workers, shuffle_buffer, data
):
    rank = data.draw(st.integers(0, world_size - 1), label="rank")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ds"
        shards = write_dataset(root, samples, payload, shard_bytes)
        config = DatasetConfig(
            seed=1, shuffle_buffer=shuffle_buffer, rank=rank, world_size=world_size
        )
        first = ShardedDataset(root, config)
        stop = data.draw(st.integers(0, len(first)), label="stop")
        delivered, state = [], None
        loader = DataLoader(first, batch_size=None, num_workers=workers, collate_fn=identity)
        for sample in loader:
            if len(delivered) < stop:
                first.record(sample)
            delivered.append(sample)
            if len(delivered) == stop:
                state = first.state_dict()
        if stop == 0:
            state = first.state_dict()
        assert len(delivered) == len(first), f"{shards} shards"

        resumed = ShardedDataset(root, config)
        resumed.load_state_dict(state)
        rest = list(DataLoader(resumed, batch_size=None, num_workers=workers, collate_fn=identity))

    if stop == len(delivered):  # the whole epoch was consumed: iterating again starts over
        assert ids(rest) == ids(delivered)
    else:
        assert ids(rest) == ids(delivered) - ids(delivered[:stop]), f"{shards} shards"
