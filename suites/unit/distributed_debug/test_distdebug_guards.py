"""The padded even sampler and check_equal_steps' argument checks (the cross-rank behaviour is
in the distributed tier)."""

from __future__ import annotations

import pytest

from reference_impls.distributed_debug import PaddedEvenSampler, check_equal_steps
from reference_impls.distributed_debug.validate import BATCH, N_VAL, batches, shard


@pytest.mark.parametrize(("length", "world"), [(35, 4), (8, 4), (1, 3), (100, 7), (5, 8)])
def test_every_rank_gets_the_same_count_and_every_sample_exactly_once_unpadded(length, world):
    samplers = [PaddedEvenSampler(length, world, r) for r in range(world)]
    assert {len(s) for s in samplers} == {-(-length // world)}
    real = sorted(i for s in samplers for i, pad in zip(s, s.is_padding, strict=True) if not pad)
    assert real == list(range(length))
    n_pad = sum(sum(s.is_padding) for s in samplers)
    assert n_pad == len(samplers[0]) * world - length < world


def test_the_seed_split_is_uneven_and_the_padded_one_is_not():
    assert [len(batches(shard(r, 4))) for r in range(4)] == [3, 3, 3, 2]
    assert [len(batches(PaddedEvenSampler(N_VAL, 4, r).indices, BATCH)) for r in range(4)] == [
        3
    ] * 4


@pytest.mark.parametrize("bad", [-1, 2.5, True, "3"])
def test_check_equal_steps_refuses_a_count_that_is_not_a_non_negative_int(bad):
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        check_equal_steps(bad)


def test_the_sampler_refuses_a_rank_outside_the_world():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\), got 4"):
        PaddedEvenSampler(10, 4, 4)
