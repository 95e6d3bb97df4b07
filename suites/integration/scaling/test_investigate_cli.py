"""``python -m reference_impls.scaling investigate`` end to end on gloo at 1 and 2 ranks, and the
ways a run goes wrong (a loader that raises, a rank that hangs)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from reference_impls.scaling.investigate import InvestigateConfig, investigate

LOADER_SLEEP_MS = 20.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def slow_loader_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("investigate")
    cmd = [
        sys.executable, "-m", "reference_impls.scaling", "investigate",
        "--world-sizes", "1,2", "--out", str(out),
        "--global-batch", "16", "--per-rank-batch", "16", "--hidden", "32",
        "--in-features", "16", "--steps", "6", "--warmup", "2", "--overhead-blocks", "1",
        "--loader-sleep-ms", str(LOADER_SLEEP_MS), "--timeout-s", "120",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, json.loads((out / "scaling.json").read_text())


def test_the_report_files_are_written(slow_loader_run):
    out, stdout, _ = slow_loader_run
    for name in ("breakdown.png", "efficiency.png", "step_times.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    md = (out / "report.md").read_text()
    for heading in (
        "## Verdict",
        "## Speedup and efficiency",
        "## Step breakdown",
        "## Projection",
    ):
        assert heading in md
    assert "[world 2]" in stdout and "verdict:" in stdout  # progress and the verdict on stdout
    names = sorted(p.name for p in (out / "records").glob("w2-*.jsonl"))
    assert names == [f"w2-{case}-rank{r}.jsonl" for case in ("strong", "weak") for r in (0, 1)]


def test_a_slow_loader_makes_data_wait_dominant_and_the_verdict_says_so(slow_loader_run):
    _, _, report = slow_loader_run
    for mode in ("strong", "weak"):
        v = report["verdict"]["modes"][mode]
        assert v["dominant"] == "data", v
        assert "dominated by data wait" in v["text"]
        assert any("the loader alone delivers" in e for e in v["evidence"])
    # Strong scaling halves the batch per rank, not the loader's sleep per batch: the data
    # wait that does not shrink is where the efficiency goes.
    assert report["verdict"]["modes"]["strong"]["lost_to"] == "data"


def test_speedup_efficiency_and_loader_throughput_follow_from_the_measurements(slow_loader_run):
    _, _, report = slow_loader_run
    rows = {(s["mode"], s["world"]): s for s in report["scaling"]}
    assert set(rows) == {(m, w) for m in ("strong", "weak") for w in (1, 2)}
    for mode in ("strong", "weak"):
        one, two = rows[(mode, 1)], rows[(mode, 2)]
        assert two["speedup"] == pytest.approx(
            two["samples_per_s"] / one["samples_per_s"], rel=1e-12
        )
        assert two["efficiency"] == pytest.approx(two["speedup"] / 2, rel=1e-12)
        # samples/s is the global batch over the mean step (float arithmetic only)
        assert two["samples_per_s"] == pytest.approx(
            two["global_batch"] / (two["step_ms"] / 1e3), rel=1e-12
        )
        # The loader alone sleeps 20 ms a batch, so it cannot beat batch / 20 ms per rank.
        bound = two["per_rank_batch"] * 2 / (LOADER_SLEEP_MS / 1e3)
        assert 0 < two["loader_only_samples_per_s"] <= bound
    assert rows[("strong", 2)]["global_batch"] == 16 and rows[("weak", 2)]["global_batch"] == 32


def test_the_breakdown_rows_add_up_and_stay_small(slow_loader_run):
    _, _, report = slow_loader_run
    for row in report["rows"]:
        total = sum(row["parts_ms"].values())
        assert total == pytest.approx(row["step_ms"], rel=1e-9)  # means add up by construction
        assert row["record_bytes_max"] <= 1024
        assert 0.95 <= row["breakdown_vs_loop_clock"] <= 1.0 + 1e-9
        assert row["overhead"]["relative_median"] is not None


def test_the_projection_states_its_assumptions_and_its_error_at_the_measured_sizes(slow_loader_run):
    _, _, report = slow_loader_run
    proj = report["projection"]
    assert proj["assumptions"] and proj["link"]["beta_Bps"] > 0
    assert {(c["mode"], c["world"]) for c in proj["check"]} == {
        (m, w) for m in ("strong", "weak") for w in (1, 2)
    }
    worlds = [p["world"] for p in next(iter(proj["projections"].values()))]
    assert worlds == [1, 2, 8, 64, 512]


def test_a_loader_that_raises_fails_the_run_with_its_message(tmp_path):
    cfg = InvestigateConfig(
        world_sizes=(1,), steps=4, warmup=1, overhead_blocks=0, loader_fail_at=3, timeout_s=60
    )
    report = investigate(cfg, tmp_path, log=lambda _: None)
    assert report["ok"] is False
    (rank0,) = report["failures"]["1"]["ranks"].values()
    assert rank0["kind"] == "raised"
    assert rank0["error"] == "LoaderError: injected loader failure at batch 3"
    assert "world 1" in (tmp_path / "report.md").read_text()


def test_a_hanging_rank_is_killed_and_the_report_says_where_it_stopped(tmp_path):
    # The launch's time limit counts from the rank's process start, so it must cover the
    # rank's start-up (a fresh interpreter importing torch: 10-11 s alone, niced, at load 12 on
    # the 2 cores) and the steps before the hang. A fixed 15 s (what this test used to
    # give) leaves ~4 s for those at that load. So the limit is derived from the same work
    # measured now: a run that stops at the same point (its loader raises at batch 3) is
    # timed, and the hanging run gets twice that (the probe also writes its failure report
    # after that point, so 2x of it is more than 2x of what the hang needs; three probes in a
    # row at load 11 took 16-21 s), and never less than the 15 s that suffice when idle.
    probe = InvestigateConfig(
        world_sizes=(1,), steps=6, warmup=1, overhead_blocks=0, loader_fail_at=3, timeout_s=120
    )
    (tmp_path / "probe").mkdir()
    started = time.monotonic()
    assert investigate(probe, tmp_path / "probe", log=lambda _: None)["ok"] is False
    probe_s = time.monotonic() - started
    timeout_s = max(15.0, 2 * probe_s)
    print(f"start-up and 3 batches: {probe_s:.1f} s; the hanging run's limit: {timeout_s:.1f} s")
    # warm-up 1, then timed steps 0, 1, ...: the rank blocks before its 4th step (timed step 2).
    cfg = InvestigateConfig(
        world_sizes=(1,), steps=6, warmup=1, overhead_blocks=0, hang_at_step=3, timeout_s=timeout_s
    )
    report = investigate(cfg, tmp_path, log=lambda _: None)
    assert report["ok"] is False
    (rank0,) = report["failures"]["1"]["ranks"].values()
    # The whole record on failure: once (2026-12-03, under coverage) it read "exited", and the
    # exit code and last recorded step are what would say why.
    assert rank0["kind"] == "timeout", rank0
    assert rank0["last_recorded"] == {"case": "strong", "last_step": 1}
    assert any("_step" in frame and "workload.py" in frame for frame in rank0["stack_top"]), rank0
    assert "rank 0 timeout after step 1 of strong" in report["failures"]["1"]["summary"]
