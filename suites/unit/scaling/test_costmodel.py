"""The alpha-beta step-time model: the ring's cost, fits, the seeds' 8 -> 64 GPU example."""

from __future__ import annotations

import pytest

from reference_impls.collectives import ring_cost
from reference_impls.scaling.costmodel import (
    Interconnect,
    Workload,
    fit_alpha_beta,
    fit_compute,
    project,
    ring_allreduce_s,
    seeds_example,
)


def test_ring_time_is_latency_per_step_plus_bus_bytes_over_bandwidth():
    # 4 ranks: 2(N-1) = 6 ring steps; 2(N-1)/N = 1.5 of the bytes over each link.
    t = ring_allreduce_s(4, 1_000_000, alpha_s=1e-5, beta_Bps=1e9, buckets=2)
    assert t == pytest.approx(2 * 6 * 1e-5 + 1.5 * 1e6 / 1e9, rel=1e-12)
    assert ring_cost(4, 1, 1).messages_per_worker == 6  # the collectives package's own count
    assert ring_allreduce_s(1, 10**9, alpha_s=1, beta_Bps=1) == 0.0


def test_the_seeds_example_gives_2x_from_8_to_64_gpus_with_comm_share_10_to_60_percent():
    work, link = seeds_example()
    p8, p64 = project(work, link, (8, 64), overlap=False)
    # Within 2 percentage points / 0.1x of the story's round numbers.
    assert p8.comm_share == pytest.approx(0.10, abs=0.02)
    assert p64.comm_share == pytest.approx(0.60, abs=0.02)
    assert p64.throughput / p8.throughput == pytest.approx(2.0, abs=0.1)


def test_overlap_hides_communication_behind_backward_but_not_the_last_bucket():
    work, link = seeds_example()
    (with_overlap,) = project(work, link, (8,), overlap=True)
    (without,) = project(work, link, (8,), overlap=False)
    assert with_overlap.exposed_comm_s < without.exposed_comm_s
    assert with_overlap.exposed_comm_s >= without.comm_s / work.buckets - 1e-12


def test_past_one_node_the_ring_runs_at_the_networks_speed():
    link = Interconnect(
        alpha_s=5e-6, beta_Bps=300e9, gpus_per_node=8, inter_alpha_s=2e-5, inter_beta_Bps=25e9
    )
    assert link.link(8) == (5e-6, 300e9)
    assert link.link(16) == (2e-5, 25e9)
    work = Workload(fixed_s=0.0, per_sample_s=1e-4, grad_bytes=10**9, batch=1024)
    p8, p16 = project(work, link, (8, 16), overlap=False)
    assert p16.comm_s > 5 * p8.comm_s


def test_fit_alpha_beta_recovers_the_parameters_that_made_the_times():
    alpha, beta = 3e-5, 2e9
    sizes = [2**10, 2**16, 2**22]
    times = [ring_allreduce_s(2, s, alpha_s=alpha, beta_Bps=beta) for s in sizes]
    got_alpha, got_beta = fit_alpha_beta(2, sizes, times)
    assert got_alpha == pytest.approx(alpha, rel=1e-9)  # exact data: only float rounding
    assert got_beta == pytest.approx(beta, rel=1e-9)


def test_fit_alpha_beta_refuses_times_that_do_not_grow_with_size():
    with pytest.raises(ValueError, match="do not grow with the sizes"):
        fit_alpha_beta(2, [100, 10_000], [1e-3, 5e-4])
    with pytest.raises(ValueError, match=">= 2 distinct sizes"):
        fit_alpha_beta(2, [100], [1e-3])
    with pytest.raises(ValueError, match=">= 2 ranks"):
        fit_alpha_beta(1, [1, 2], [1, 2])


def test_fit_compute_separates_fixed_and_per_sample_cost():
    fixed, per = fit_compute([16, 32, 64], [0.005 + 16e-4, 0.005 + 32e-4, 0.005 + 64e-4])
    assert fixed == pytest.approx(0.005, rel=1e-9)
    assert per == pytest.approx(1e-4, rel=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fixed_s": -1.0}, "fixed_s and per_sample_s must be finite and >= 0"),
        ({"per_sample_s": float("nan")}, "fixed_s and per_sample_s must be finite and >= 0"),
        ({"buckets": 0}, "buckets >= 1"),
        ({"backward_fraction": 1.5}, "backward_fraction must be in"),
        ({"scaling": "diagonal"}, "scaling must be 'strong' or 'weak'"),
    ],
)
def test_bad_workloads_are_named(kwargs, message):
    base = {"fixed_s": 0.0, "per_sample_s": 1e-4, "grad_bytes": 10, "batch": 8}
    with pytest.raises(ValueError, match=message):
        Workload(**{**base, **kwargs})


def test_bad_links_and_world_sizes_are_named():
    with pytest.raises(ValueError, match="beta_Bps must be a finite number of bytes/s > 0"):
        Interconnect(alpha_s=0, beta_Bps=0)
    with pytest.raises(ValueError, match="inter_beta_Bps must be a finite number of bytes/s > 0"):
        Interconnect(alpha_s=0, beta_Bps=1, inter_alpha_s=1e-5, inter_beta_Bps=float("inf"))
    with pytest.raises(ValueError, match="both inter_alpha_s and inter_beta_Bps"):
        Interconnect(alpha_s=0, beta_Bps=1, inter_alpha_s=1e-5)
    work, link = seeds_example()
    with pytest.raises(ValueError, match="world sizes must be >= 1"):
        project(work, link, (0, 8))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((4, -10), {}, "nbytes must be an integer >= 0, got -10"),
        ((4, 10), {"beta_Bps": 0.0}, "beta_Bps must be a finite number of bytes/s > 0, got 0.0"),
        ((4, 10), {"alpha_s": float("nan")}, "alpha_s must be a finite number of s >= 0"),
        ((4, 10), {"alpha_s": -1e-6}, "alpha_s must be a finite number of s >= 0"),
        ((4, 10), {"buckets": 0}, "buckets must be an integer >= 1, got 0"),
        ((0, 10), {}, "world sizes must be >= 1"),
        ((2**53 + 1, 10), {}, "at most 2[*][*]53"),
    ],
)
def test_ring_time_refuses_what_no_link_or_message_has(args, kwargs, message):
    # A negative size used to give a negative time, beta 0 a ZeroDivisionError.
    with pytest.raises(ValueError, match=message):
        ring_allreduce_s(*args, **{"alpha_s": 1e-5, "beta_Bps": 1e9, **kwargs})


def test_a_trillion_ranks_cost_the_same_as_eight():
    # The per-rank chunk arrays of the collectives' cost model made this a 7 TiB allocation.
    world = 10**12
    t = ring_allreduce_s(world, 2**30, alpha_s=1e-5, beta_Bps=1e10, buckets=40)
    assert t == pytest.approx(40 * 2 * (world - 1) * 1e-5 + 2 * (world - 1) / world * 2**30 / 1e10)
    work, link = seeds_example()
    p8, big = project(work, link, (8, world))
    assert big.world == world and big.comm_s > p8.comm_s and 0 < big.efficiency < p8.efficiency
    big_buckets = Workload(
        fixed_s=0.1, per_sample_s=1e-3, grad_bytes=2**30, buckets=10**15, batch=8
    )
    (p,) = project(big_buckets, link, (8,))  # one loop iteration per bucket used to run here
    assert p.exposed_comm_s <= p.comm_s
