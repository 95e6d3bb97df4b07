"""Properties of the streaming dataset over generated inputs (hypothesis).

Exactly-once coverage and equal lengths for random shard counts (empty shards included),
world sizes and worker counts; the shuffle schedule's resume equivalence; tar round trips
under any chunking; and a resumed epoch (real files, the real reader) yielding exactly the
unconsumed rest in the uninterrupted order.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impls.data import DatasetConfig, ShardedDataset, ShardWriter, WriterConfig
from reference_impls.data.assignment import ShuffleSchedule, plan_worker, rank_length
from reference_impls.data.tario import END_OF_ARCHIVE, iter_samples, sample_bytes

shard_counts = st.lists(st.integers(0, 40), min_size=1, max_size=25).filter(lambda c: sum(c) > 0)


@given(
    counts=shard_counts,
    world_size=st.integers(1, 12),
    workers=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 50),
    uneven=st.sampled_from(["pad", "drop"]),
)
def test_every_sample_is_read_once_and_ranks_have_equal_lengths(
    counts, world_size, workers, seed, epoch, uneven
):
    total = sum(counts)
    if uneven == "drop" and total < world_size:
        with pytest.raises(ValueError, match="gives every rank 0 samples"):
            plan_worker(
                counts, seed=seed, epoch=epoch, rank=0, world_size=world_size, uneven=uneven
            )
        return
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    pads = 0
    length = rank_length(total, world_size, uneven)
    for rank in range(world_size):
        rank_items = 0
        for worker in range(workers):
            for seg in plan_worker(
                counts,
                seed=seed,
                epoch=epoch,
                rank=rank,
                world_size=world_size,
                worker=worker,
                num_workers=workers,
                uneven=uneven,
            ):
                assert 0 <= seg.start < seg.stop <= counts[seg.shard]
                rank_items += len(seg)
                if seg.pad:
                    pads += len(seg)
                else:
                    seen.update((seg.shard, i) for i in range(seg.start, seg.stop))
        assert rank_items == length
    assert max(seen.values()) == 1
    if uneven == "pad":
        assert len(seen) == total and pads == length * world_size - total < world_size
    else:
        assert pads == 0 and total - len(seen) == total % world_size < world_size


@given(n=st.integers(0, 400), buffer_size=st.integers(0, 64), data=st.data())
def test_a_shuffle_schedule_resumed_after_any_prefix_continues_the_same_order(n, buffer_size, data):
    full = list(ShuffleSchedule(n, buffer_size, "k"))
    assert sorted(full) == list(range(n))
    consumed = data.draw(st.integers(0, n))
    resumed = ShuffleSchedule(n, buffer_size, "k")
    resumed.advance(consumed)
    assert list(resumed) == full[consumed:]


samples_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "bin": st.binary(max_size=1500),
            "txt": st.text(max_size=30).map(str.encode),
        }
    ),
    min_size=0,
    max_size=12,
)


@given(samples=samples_strategy, chunk=st.integers(1, 2000), skip=st.integers(0, 13))
def test_tar_samples_round_trip_under_any_chunking(samples, chunk, skip):
    parts = []
    for i, fields in enumerate(samples):
        parts += sample_bytes(f"k{i}", fields)
    data = b"".join(parts) + END_OF_ARCHIVE
    counts = [-1]
    got = list(
        iter_samples(
            [data[i : i + chunk] for i in range(0, len(data), chunk)],
            "s.tar",
            skip=skip,
            counts=counts,
        )
    )
    assert got == [{"__key__": f"k{i}", **f} for i, f in enumerate(samples)][skip:]
    assert counts == [len(samples)]


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ds")
    with ShardWriter(root, WriterConfig(target_shard_bytes=12_000)) as w:
        for i in range(150):
            w.write({"__key__": f"k{i:04d}", "txt": f"sample {i} " + "x" * (i % 700)})
    return root


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(buffer_size=st.integers(0, 40), world_size=st.integers(1, 4), data=st.data())
def test_a_resumed_epoch_yields_exactly_the_unconsumed_rest_in_order(
    local_dataset, buffer_size, world_size, data
):
    rank = data.draw(st.integers(0, world_size - 1))
    config = DatasetConfig(
        seed=7, shuffle_buffer=buffer_size, rank=rank, world_size=world_size, prefetch_depth=1
    )
    full_ds = ShardedDataset(local_dataset, config)
    full_ds.set_epoch(2)
    full = [s["__key__"] for s in full_ds]
    consumed = data.draw(st.integers(0, len(full)))
    first = ShardedDataset(local_dataset, config)
    first.set_epoch(2)
    for _, sample in zip(range(consumed), first, strict=False):
        first.record(sample)
    resumed = ShardedDataset(local_dataset, config)
    resumed.load_state_dict(first.state_dict())
    rest = [s["__key__"] for s in resumed]
    if consumed == len(full):
        assert rest == full  # a finished epoch iterated again starts over
    else:
        assert rest == full[consumed:]
