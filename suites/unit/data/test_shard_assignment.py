"""Shard assignment, equal lengths and the shuffle schedule: pure logic, no I/O.

The epoch's global order is the shards in a seeded per-epoch order, ranks take contiguous
ranges of it, workers contiguous slices of their rank's range (reference_impls/data/
assignment.py). These tests enumerate what each (rank, worker) would read, as
(shard, sample index, pad) triples, and check the promises on them.
"""

from __future__ import annotations

import collections
import random

import pytest

from reference_impls.data.assignment import (
    Segment,
    ShuffleSchedule,
    epoch_shard_order,
    plan_worker,
    rank_length,
    worker_lengths,
)


def items(segments: list[Segment]) -> list[tuple[int, int, bool]]:
    return [(s.shard, i, s.pad) for s in segments for i in range(s.start, s.stop)]


def read_all(counts, *, world_size, workers, uneven="pad", seed=0, epoch=0):
    """{(rank, worker): items} for every reader of one epoch."""
    return {
        (r, w): items(
            plan_worker(
                counts,
                seed=seed,
                epoch=epoch,
                rank=r,
                world_size=world_size,
                worker=w,
                num_workers=workers,
                uneven=uneven,
            )
        )
        for r in range(world_size)
        for w in range(workers)
    }


COUNTS = [37, 0, 12, 50, 1, 29, 33, 8, 41, 20]  # 231 samples, an empty shard among them


@pytest.mark.parametrize(
    ("world_size", "workers"), [(1, 1), (1, 4), (2, 3), (4, 2), (7, 1), (8, 4)]
)
def test_every_sample_goes_to_exactly_one_reader_per_epoch(world_size, workers):
    plan = read_all(COUNTS, world_size=world_size, workers=workers)
    real = collections.Counter((s, i) for its in plan.values() for s, i, pad in its if not pad)
    expected = {(s, i) for s, n in enumerate(COUNTS) for i in range(n)}
    assert set(real) == expected
    assert max(real.values()) == 1


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize("world_size", [2, 3, 7, 8, 16])
def test_every_rank_yields_the_same_number_of_samples(world_size, uneven):
    plan = read_all(COUNTS, world_size=world_size, workers=3, uneven=uneven)
    per_rank = [sum(len(plan[r, w]) for w in range(3)) for r in range(world_size)]
    assert per_rank == [rank_length(sum(COUNTS), world_size, uneven)] * world_size


def test_padding_repeats_fewer_than_world_size_samples_and_flags_them():
    total, world_size = sum(COUNTS), 7  # 231 = 7 * 33: no padding needed
    assert not any(p for its in read_all(COUNTS, world_size=7, workers=2).values() for *_, p in its)
    world_size = 8  # 231 = 8 * 28 + 7: one rank is short by one
    plan = read_all(COUNTS, world_size=world_size, workers=2)
    pads = [(s, i) for its in plan.values() for s, i, pad in its if pad]
    assert len(pads) == rank_length(total, world_size) * world_size - total == 1
    real = {(s, i) for its in plan.values() for s, i, pad in its if not pad}
    assert set(pads) <= real  # a pad sample is a repeat of a real one


def test_dropping_leaves_out_fewer_than_world_size_samples():
    plan = read_all(COUNTS, world_size=8, workers=2, uneven="drop")
    seen = [(s, i) for its in plan.values() for s, i, pad in its]
    assert len(seen) == len(set(seen)) == 8 * 28  # 7 of 231 dropped
    assert not any(pad for its in plan.values() for *_, pad in its)


def test_more_ranks_than_samples_pads_every_rank_to_one_sample():
    plan = read_all([2, 1], world_size=5, workers=1)
    assert all(len(its) == 1 for its in plan.values())
    real = [(s, i) for its in plan.values() for s, i, pad in its if not pad]
    assert sorted(real) == [(0, 0), (0, 1), (1, 0)]
    assert sum(pad for its in plan.values() for *_, pad in its) == 2


def test_drop_with_exactly_one_sample_per_rank_gives_each_rank_one():
    plans = [
        plan_worker([2, 1], seed=0, epoch=0, rank=r, world_size=3, uneven="drop") for r in range(3)
    ]
    assert [sum(len(s) for s in plan) for plan in plans] == [1, 1, 1]


def test_drop_with_fewer_samples_than_ranks_is_an_error_naming_both_numbers():
    with pytest.raises(ValueError, match=r"3 samples and world_size 5"):
        plan_worker([2, 1], seed=0, epoch=0, rank=0, world_size=5, uneven="drop")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 4, "world_size": 4}, r"rank must be in \[0, 4\), got 4"),
        ({"world_size": 0}, r"world_size must be >= 1, got 0"),
        ({"worker": 2, "num_workers": 2}, r"worker must be in \[0, 2\), got 2"),
        ({"num_workers": 0}, r"^num_workers must be >= 1, got 0$"),
        ({"uneven": "wrap"}, r"uneven must be one of .*got 'wrap'"),
    ],
)
def test_bad_reader_coordinates_are_rejected_with_the_bad_value(kwargs, message):
    args = {"seed": 0, "epoch": 0, "rank": 0, "world_size": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        plan_worker(COUNTS, **args)


def test_a_dataset_without_samples_is_rejected():
    with pytest.raises(ValueError) as info:
        plan_worker([0, 0], seed=0, epoch=0, rank=0, world_size=1)
    assert str(info.value) == "the dataset has no samples: every shard in the manifest is empty"


def test_a_rank_reads_each_of_its_shards_in_one_piece():
    """Contiguous ranges: a rank never needs the same shard at two separate places (which
    would download it twice), apart from its pad repeats."""
    for world_size in (2, 3, 5):
        for r in range(world_size):
            segs = [
                s
                for w in range(2)
                for s in plan_worker(
                    COUNTS, seed=4, epoch=1, rank=r, world_size=world_size, worker=w, num_workers=2
                )
                if not s.pad
            ]
            by_shard = collections.defaultdict(list)
            for s in segs:
                by_shard[s.shard].append(s)
            for shard, pieces in by_shard.items():
                # At most two pieces (split between this rank's two workers), and adjacent.
                assert len(pieces) <= 2
                if len(pieces) == 2:
                    assert pieces[0].stop == pieces[1].start, (shard, pieces)


def test_the_plan_depends_only_on_seed_epoch_rank_and_worker():
    def plan(seed, epoch):
        return [
            plan_worker(
                COUNTS, seed=seed, epoch=epoch, rank=1, world_size=3, worker=1, num_workers=2
            )
        ]

    assert plan(5, 2) == plan(5, 2)
    assert plan(5, 2) != plan(5, 3)
    assert plan(5, 2) != plan(6, 2)


def test_the_shard_order_is_a_permutation_reshuffled_each_epoch():
    orders = [epoch_shard_order(50, seed=1, epoch=e) for e in range(5)]
    for order in orders:
        assert sorted(order) == list(range(50))
    assert len({tuple(o) for o in orders}) == 5
    assert epoch_shard_order(50, seed=1, epoch=0, shuffle=False) == list(range(50))
    # A string seed hashes with SHA-512: these values are stable across processes/versions.
    assert epoch_shard_order(6, seed=0, epoch=0) == epoch_shard_order(6, seed=0, epoch=0)


def test_worker_lengths_split_a_rank_evenly():
    assert worker_lengths(10, 3) == [3, 3, 4]
    assert worker_lengths(2, 4) == [0, 1, 0, 1]
    assert sum(worker_lengths(1001, 7)) == 1001


# --------------------------------------------------------------------------- shuffle buffer
@pytest.mark.parametrize(("n", "buffer_size"), [(0, 10), (1, 10), (100, 1), (100, 10), (100, 500)])
def test_the_shuffle_schedule_emits_every_position_once(n, buffer_size):
    out = list(ShuffleSchedule(n, buffer_size, "k"))
    assert sorted(out) == list(range(n))


def test_the_shuffle_schedule_without_a_buffer_keeps_stored_order():
    assert list(ShuffleSchedule(20, 0, "k")) == list(range(20))
    assert list(ShuffleSchedule(20, 1, "k")) == list(range(20))


def test_the_shuffle_buffer_never_holds_more_than_its_size():
    """Output k can only be a position the buffer has read: < k + buffer_size."""
    out = list(ShuffleSchedule(1000, 16, "k"))
    assert all(p < k + 16 for k, p in enumerate(out))
    assert out != sorted(out)


def test_a_shuffle_schedule_advanced_past_consumed_outputs_continues_the_same_order():
    full = list(ShuffleSchedule(300, 32, "key"))
    for consumed in (0, 1, 31, 32, 150, 299, 300):
        resumed = ShuffleSchedule(300, 32, "key")
        resumed.advance(consumed)
        buffered, next_input = resumed.pending()
        # What a resumed reader must still read: the buffer and everything after it.
        assert set(buffered) | set(range(next_input, 300)) == set(full[consumed:])
        assert list(resumed) == full[consumed:]


def test_skipping_more_outputs_than_remain_is_an_error():
    schedule = ShuffleSchedule(5, 2, "k")
    with pytest.raises(ValueError, match="cannot skip 6 samples: only 5 remain"):
        schedule.advance(6)


def test_shuffle_orders_differ_between_keys(seed):
    rng = random.Random(seed)
    a, b = rng.random(), rng.random()
    assert list(ShuffleSchedule(100, 20, f"{a}")) != list(ShuffleSchedule(100, 20, f"{b}"))


def test_a_buffer_of_two_already_shuffles():
    # The smallest real shuffle: 1 is no shuffle, 2 can swap neighbours. 49 coin flips all
    # landing on "keep the order" has p = 2**-49; the key fixes which flips these are.
    out = list(ShuffleSchedule(50, 2, "k"))
    assert sorted(out) == list(range(50)) and out != list(range(50))


@pytest.mark.parametrize("buffer_size", [0, 1, 2])
def test_skipping_counts_what_was_already_read_with_or_without_a_buffer(buffer_size):
    schedule = ShuffleSchedule(5, buffer_size, "k")
    first = [next(schedule) for _ in range(3)]
    with pytest.raises(ValueError, match=r"^cannot skip 3 samples: only 2 remain in this stream$"):
        schedule.advance(3)
    schedule.advance(2)
    assert schedule.emitted == 5 and list(schedule) == []
    if buffer_size <= 1:
        assert first == [0, 1, 2]  # no buffer: stored order


@pytest.mark.parametrize(("n", "buffer_size"), [(-1, 4), (4, -1)])
def test_a_negative_length_or_buffer_is_refused_naming_both(n, buffer_size):
    with pytest.raises(
        ValueError, match=rf"^n and buffer_size must be >= 0, got {n} and {buffer_size}$"
    ):
        ShuffleSchedule(n, buffer_size, "k")


def test_by_default_one_worker_reads_the_whole_rank_in_shuffled_shard_order():
    counts = [3, 4, 2, 5]
    plan = plan_worker(counts, seed=1, epoch=0, rank=0, world_size=1)
    assert sum(len(s) for s in plan) == 14  # num_workers defaults to 1: nothing left out
    assert [s.shard for s in plan] == epoch_shard_order(4, 1, 0)


def test_without_shard_shuffling_shards_are_read_in_manifest_order():
    counts = [3, 4, 2, 5]
    for epoch in range(3):  # every epoch, where the shuffled order changes
        plan = plan_worker(counts, seed=1, epoch=epoch, rank=0, world_size=1, shuffle_shards=False)
        assert [(s.shard, s.start, s.stop) for s in plan] == [
            (0, 0, 3),
            (1, 0, 4),
            (2, 0, 2),
            (3, 0, 5),
        ]
