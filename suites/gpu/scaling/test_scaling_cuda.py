"""The breakdown and the investigation on CUDA: events instead of the host clock, NCCL instead
of gloo, NCCL's own log for the transport. Skips (with the reason) without 2 CUDA devices.

Run on a 2-GPU machine:
``NCCL_NVLS_ENABLE=0 python -m pytest suites/gpu/scaling -q``.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from reference_impls.collectives import LaunchConfig, launch
from reference_impls.collectives.launcher import MULTICAST_OFF_ENV
from reference_impls.scaling import (
    Part,
    StepProfiler,
    StepRecord,
    attribute_steps,
    straggler_scores,
)
from reference_impls.scaling.investigate import InvestigateConfig, investigate
from reference_impls.scaling.workload import RankConfig, run_rank

pytestmark = pytest.mark.needs("cuda:2")

SLOW_MS = 5.0


def test_cuda_events_time_the_phases_and_add_up_to_the_synchronized_step():
    dev = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=dev)
    prof = StepProfiler(device=dev)
    host = []
    for _ in range(5):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        with prof.step():
            with prof.phase("forward"):
                b = a @ a
            with prof.phase("backward"):
                c = b @ a
            with prof.phase("optimizer"):
                a.add_(c, alpha=1e-9)
        torch.cuda.synchronize(dev)
        host.append(time.perf_counter() - t0)
    prof.flush()  # waits for the last steps' events
    assert len(prof.records) == 5
    for r in prof.records:
        assert r.forward > 0 and r.backward > 0 and r.optimizer > 0
        assert r.measured <= r.wall + 1e-6
    # The GPU's step and the host's synchronized step agree within 5% (median; the host adds
    # launch latency and the synchronization itself, tens of microseconds on a ~1 ms step).
    ratio = statistics.median(r.wall for r in prof.records) / statistics.median(host)
    assert 0.9 <= ratio <= 1.05, (ratio, prof.records)


@pytest.fixture(scope="module")
def nccl_straggler():
    cfg = RankConfig(
        device="cuda",
        in_features=1024,
        hidden=(4096, 4096),
        batches=(("c", 256),),
        steps=20,
        warmup=5,
        overhead_blocks=0,
        slow_rank=1,
        slow_ms=SLOW_MS,
    )
    return launch(
        run_rank,
        cfg,
        config=LaunchConfig(world_size=2, backend="nccl", timeout_s=300, env=MULTICAST_OFF_ENV),
    )


def test_on_nccl_the_fast_rank_waits_for_the_straggler_and_it_is_named(nccl_straggler):
    records = [StepRecord(**r) for res in nccl_straggler for r in res["cases"]["c"]["records"]]
    attributed = attribute_steps(records)
    wait0 = statistics.median(a.parts[Part.COMM_WAIT] for a in attributed if a.rank == 0)
    wait1 = statistics.median(a.parts[Part.COMM_WAIT] for a in attributed if a.rank == 1)
    # Rank 1 sleeps 5 ms on the host before launching its forward: its GPU starts 5 ms late
    # and rank 0's all-reduce kernel waits for it (allowing 1.5 ms for launch jitter).
    assert wait0 >= 3.5e-3 and wait1 < 1e-3, (wait0, wait1)
    assert [s.rank for s in straggler_scores(records) if s.straggler] == [1]


def test_the_investigation_runs_on_two_gpus_and_reports_the_nccl_transport(tmp_path):
    cfg = InvestigateConfig(
        world_sizes=(1, 2),
        device="cuda",
        global_batch=512,
        per_rank_batch=512,
        in_features=1024,
        hidden=(4096, 4096),
        steps=20,
        warmup=5,
        timeout_s=300,
    )
    report = investigate(cfg, tmp_path, log=print)
    assert report["ok"], report.get("failures")
    for row in report["rows"]:
        assert sum(row["parts_ms"].values()) == pytest.approx(row["step_ms"], rel=1e-9)
        assert 0.95 <= row["breakdown_vs_loop_clock"] <= 1.0 + 1e-6
        assert row["record_bytes_max"] <= 1024
    transport = report["transport"]
    assert transport["counts"].get("P2P", 0) > 0, transport  # two GPUs of one host: P2P
    assert (tmp_path / "report.md").exists() and (tmp_path / "breakdown.png").exists()
