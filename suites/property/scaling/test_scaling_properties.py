"""Invariants of the breakdown under random timings, and of the cost model under random
parameters."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_impls.scaling import PARTS, Part, StepRecord, attribute, mean_parts
from reference_impls.scaling.breakdown import attribute_steps
from reference_impls.scaling.costmodel import Interconnect, Workload, project, ring_allreduce_s

seconds = st.floats(min_value=0.0, max_value=1.0, allow_nan=False, allow_infinity=False)


@st.composite
def step_records(draw, step=0, world=None):
    world = world or draw(st.integers(1, 8))
    out = []
    for rank in range(world):
        phases = draw(st.lists(seconds, min_size=5, max_size=5))
        other = draw(seconds)
        wall = sum(phases) + other
        data, fwd, bwd, opt, comm = phases
        out.append(
            StepRecord(
                step=step,
                rank=rank,
                wall=wall,
                data=data,
                forward=fwd,
                backward=bwd,
                optimizer=opt,
                comm=comm,
                comm_overlapped=draw(seconds),
            )
        )
    return out


@given(step_records())
def test_parts_add_up_to_the_wall_and_none_is_negative(records):
    for a in attribute(records):
        # float sums of up to 7 numbers <= 1 s: the remainder is exact to a few ulps
        assert sum(a.parts.values()) == pytest.approx(a.wall, rel=1e-9, abs=1e-12)
        assert all(v >= 0 for v in a.parts.values())


@given(step_records())
def test_every_rank_pays_the_same_transfer_and_one_rank_waits_for_nobody(records):
    attributed = attribute(records)
    assert len({a.parts[Part.COMM_TRANSFER] for a in attributed}) == 1
    assert min(a.parts[Part.COMM_WAIT] for a in attributed) == 0.0
    for a, r in zip(attributed, sorted(records, key=lambda r: r.rank), strict=True):
        # transfer + wait is exactly what the rank measured as exposed communication
        assert a.parts[Part.COMM_TRANSFER] + a.parts[Part.COMM_WAIT] == pytest.approx(
            r.comm, abs=1e-15
        )


@given(st.integers(1, 4).flatmap(lambda w: st.lists(step_records(world=w), min_size=1, max_size=5)))
def test_means_add_up_over_many_steps(steps):
    records = [dataclasses.replace(r, step=k) for k, recs in enumerate(steps) for r in recs]
    means = mean_parts(attribute_steps(records))
    assert sum(means[str(p)] for p in PARTS) == pytest.approx(means["wall"], rel=1e-9, abs=1e-12)


alphas = st.floats(0, 1e-3)
betas = st.floats(1e6, 1e12)
sizes = st.integers(1, 10**10)


@given(st.integers(2, 1024), sizes, alphas, betas, st.integers(1, 100))
def test_comm_time_grows_with_ranks_bytes_latency_and_falls_with_bandwidth(n, nbytes, a, b, k):
    t = ring_allreduce_s(n, nbytes, alpha_s=a, beta_Bps=b, buckets=k)
    assert ring_allreduce_s(n + 1, nbytes, alpha_s=a, beta_Bps=b, buckets=k) >= t
    assert ring_allreduce_s(n, nbytes * 2, alpha_s=a, beta_Bps=b, buckets=k) >= t
    assert ring_allreduce_s(n, nbytes, alpha_s=a * 2, beta_Bps=b, buckets=k) >= t
    assert ring_allreduce_s(n, nbytes, alpha_s=a, beta_Bps=b * 2, buckets=k) <= t


@given(
    st.floats(0, 1),
    st.floats(1e-7, 1e-2),
    sizes,
    st.integers(1, 64),
    st.floats(0, 1),
    st.sampled_from(["strong", "weak"]),
    st.integers(1, 4096),
    alphas,
    betas,
)
def test_projection_invariants(fixed, per, nbytes, k, bwd, mode, batch, a, b):
    work = Workload(
        fixed_s=fixed,
        per_sample_s=per,
        grad_bytes=nbytes,
        buckets=k,
        backward_fraction=bwd,
        scaling=mode,
        batch=batch,
    )
    link = Interconnect(alpha_s=a, beta_Bps=b)
    worlds = (1, 2, 8, 64, 512)
    with_overlap = project(work, link, worlds, overlap=True)
    without = project(work, link, worlds, overlap=False)
    for p, q in zip(with_overlap, without, strict=True):
        assert 0 <= p.exposed_comm_s <= p.comm_s * (1 + 1e-12)  # hidden, never created
        assert p.step_s <= q.step_s * (1 + 1e-12)  # overlap never slows a step
        assert 0 <= p.comm_share <= 1
        assert p.efficiency <= 1 + 1e-9  # no superlinear speedup in this model
    shares = [q.comm_share for q in without]
    if mode == "strong":  # compute shrinks, communication does not: the share only grows
        assert all(x <= y + 1e-9 for x, y in zip(shares, shares[1:], strict=False))
