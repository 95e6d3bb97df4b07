"""Real desyncs on real gloo processes over loopback, and the reports the tracer writes.

Each scenario (reference_impls/distributed_debug/scenarios.py, validate.py) runs on 2 or 4
ranks under the tracer with a 1 s stall threshold; after the report every rank exits with code
17, so a test takes seconds, not the group timeout. The report must classify the first
divergence, name the rank and the real source lines (found here by the comments on them), and
arrive within half the process group's timeout (60 s) of the incident (the first call that
stayed pending or raised). Not a speed claim (on a quiet machine it takes the stall threshold
and a second): a bound that catches a report waiting for the group timeout, wide enough that a
busy machine cannot reach it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reference_impls.collectives import LaunchConfig, LaunchError, launch
from reference_impls.distributed_debug import TraceConfig, scenarios, validate
from reference_impls.distributed_debug.scenarios import (
    ddp_steps,
    healthy_mixed,
    run_scenario,
    traced_healthy,
    uneven_steps,
)

STALL_S = 1.0
PG_TIMEOUT_S = 60
EXIT = 17
SCENARIOS_PY = Path(scenarios.__file__)
VALIDATE_PY = Path(validate.__file__)


def line(path: Path, comment: str) -> str:
    """'file.py:N' of the line ending with ``# comment``."""
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {comment}"):
            return f"{path.name}:{n}"
    raise AssertionError(f"no line ending with '# {comment}' in {path}")


def config(tmp_path: Path, **kw) -> TraceConfig:
    return TraceConfig(
        stall_s=STALL_S,
        heartbeat_s=0.25,
        dead_after_s=1.0,
        collect_s=0.5,
        report_dir=tmp_path,
        exit_code_after_report=EXIT,
        **kw,
    )


def run_to_report(name: str, world: int, tmp_path: Path) -> tuple[dict, str, dict[int, int | None]]:
    """(report.json, report.txt, exit code by rank) of one traced scenario."""
    with pytest.raises(LaunchError) as info:
        launch(
            run_scenario,
            name,
            config(tmp_path),
            config=LaunchConfig(
                world_size=world, pg_timeout_s=PG_TIMEOUT_S, timeout_s=120, grace_s=20
            ),
        )
    codes = {r: f.exitcode for r, f in info.value.failures.items()}
    assert (tmp_path / "report.json").exists(), f"no report; ranks ended with {info.value}"
    report = json.loads((tmp_path / "report.json").read_text())
    text = (tmp_path / "report.txt").read_text()
    assert report["reported_at"] - report["stall_began"] <= PG_TIMEOUT_S / 2, text
    return report, text, codes


def test_a_different_ops_on_two_ranks(tmp_path):
    report, text, codes = run_to_report("op_mismatch", 2, tmp_path)
    f = report["findings"][0]
    assert (f["letter"], f["seq"], f["ranks"], f["others"]) == ("a", 1, [1], [0]), text
    assert line(SCENARIOS_PY, "branch B") in f["callsites"]["1"]
    assert line(SCENARIOS_PY, "branch A") in f["callsites"]["0"]
    assert codes == {0: EXIT, 1: EXIT}


def test_b_a_size_mismatch_that_gloo_aborts_is_still_reported_as_the_first_divergence(tmp_path):
    report, text, codes = run_to_report("argument_mismatch", 2, tmp_path)
    f = report["findings"][0]
    assert (f["letter"], f["seq"]) == ("b", 1), text
    assert "different shapes" in f["summary"] and "[8]" in f["summary"] and "[4]" in f["summary"]
    where = line(SCENARIOS_PY, "sized by local data")
    assert where in f["callsites"]["0"] and where in f["callsites"]["1"]
    # gloo aborted the rank that received more than it expected (SIGABRT): reported dead.
    aborted = [r for r, c in codes.items() if c == -6]
    assert len(aborted) == 1, codes
    assert any(g["letter"] == "e" and g["ranks"] == aborted for g in report["findings"]), text


def test_c_a_skipped_call_in_a_loop(tmp_path):
    report, text, _ = run_to_report("skipped", 2, tmp_path)
    f = report["findings"][0]
    assert (f["letter"], f["seq"], f["ranks"]) == ("c", 3, [1]), text
    assert line(SCENARIOS_PY, "after the loop") in f["callsites"]["1"]
    assert line(SCENARIOS_PY, "per-item sync") in f["callsites"]["0"]


def test_c_the_seed_scenario_names_rank_3_at_sequence_6_with_both_lines_and_batch_counts(tmp_path):
    report, text, codes = run_to_report("seed", 4, tmp_path)
    f = report["findings"][0]
    assert (f["letter"], f["seq"], f["ranks"], f["others"]) == ("c", 6, [3], [0, 1, 2]), text
    assert f["group"] == "0" and "on the default group" in f["summary"]
    assert line(VALIDATE_PY, "epoch totals") in f["callsites"]["3"]
    for r in range(3):
        assert line(VALIDATE_PY, "per-batch metric") in f["callsites"][str(r)]
    assert "rank 3 ran 2 iterations" in f["summary"] and "ranks 0-2 ran 3" in f["summary"]
    assert set(codes.values()) == {EXIT}


def test_d_a_straggler_is_named_with_the_waits(tmp_path):
    report, text, _ = run_to_report("straggler", 2, tmp_path)
    f = report["findings"][0]
    assert (f["letter"], f["seq"], f["ranks"], f["others"]) == ("d", 1, [1], [0]), text
    assert "rank 1 is not in any call" in f["summary"] and "rank 0 1." in f["summary"]


def test_e_a_rank_killed_with_sigkill_mid_collective_is_reported_dead_with_its_last_call(tmp_path):
    report, text, codes = run_to_report("dead_rank", 2, tmp_path)
    assert codes[1] == -9 and codes[0] == EXIT, codes
    f = report["findings"][0]
    assert (f["letter"], f["ranks"], f["seq"]) == ("e", [1], 1), text
    assert line(SCENARIOS_PY, "issued, the others not there yet") in f["callsites"]["1"]
    assert "no heartbeat for" in f["summary"] and "pending" in f["summary"]


def test_f_a_send_whose_receive_comes_after_a_collective(tmp_path):
    report, text, _ = run_to_report("unmatched_p2p", 2, tmp_path)
    f = report["findings"][0]
    assert (f["letter"], f["ranks"], f["others"]) == ("f", [0], [1]), text
    assert line(SCENARIOS_PY, "hand-off to rank 1") in f["callsites"]["0"]
    assert line(SCENARIOS_PY, "step, then the receive") in f["summary"]


def test_the_seed_scenario_without_the_tracer_hangs_until_the_group_timeout(tmp_path):
    # The control: the hang is real, and only the group timeout (3 s here) ends it.
    with pytest.raises(LaunchError) as info:
        launch(
            run_scenario,
            "seed",
            None,
            False,
            config=LaunchConfig(world_size=4, pg_timeout_s=3, timeout_s=120, grace_s=20),
        )
    messages = [f.message for f in info.value.failures.values()]
    assert any("Timed out" in m for m in messages), messages
    assert not (tmp_path / "report.json").exists()


def test_a_healthy_run_of_2000_mixed_calls_gives_no_report_and_bit_identical_results(tmp_path):
    # 4 ranks, 112 rounds of 18 calls (14 collectives of every traced kind, send/recv and a
    # batch_isend_irecv pair): 2,016 calls per rank. A record left pending by mistake would
    # trigger a false report after 5 s (the run takes longer) and shows in the pending count.
    rounds = 112
    cfg = TraceConfig(stall_s=5.0, report_dir=tmp_path)
    launch_cfg = LaunchConfig(world_size=4, pg_timeout_s=60, timeout_s=300)
    traced = launch(traced_healthy, cfg, rounds, config=launch_cfg)
    plain = launch(healthy_mixed, rounds, config=launch_cfg)
    assert [t[0] for t in traced] == plain
    assert len(set(plain)) == 4  # the digest covers rank-specific data: a real comparison
    assert [t[1:] for t in traced] == [(18 * rounds + 1, 0)] * 4  # + the closing barrier
    assert not (tmp_path / "report.json").exists()


def test_ddp_gradient_buckets_are_traced_and_training_is_unchanged(tmp_path):
    cfg = TraceConfig(stall_s=10.0, report_dir=tmp_path)
    for plain, traced, ops in launch(
        ddp_steps, cfg, config=LaunchConfig(world_size=2, timeout_s=180)
    ):
        assert traced == plain  # the same weights, bit for bit
        # One bucket (the model is tiny) per step, each completed.
        assert ops == ["ddp_bucket_all_reduce:True"] * 3, ops


def test_check_equal_steps_names_every_ranks_count_on_every_rank():
    messages = launch(uneven_steps, config=LaunchConfig(world_size=4, timeout_s=120))
    for m in messages:
        assert "validation batches 2: ranks [3]; validation batches 3: ranks [0, 1, 2]" in m


@pytest.mark.parametrize("fix", validate.FIXES)
def test_each_fix_of_the_seed_finishes_with_the_exact_metric_on_every_rank(fix):
    results = launch(validate.run, fix, 1, config=LaunchConfig(world_size=4, timeout_s=120))
    exact = validate.expected_mean()
    for per_rank in results:
        mean, _running = per_rank[0]
        # Sums of at most 35 float64 values k/7: differences from the order of addition stay
        # within a few ulps of the mean.
        assert mean == pytest.approx(exact, rel=1e-12), (fix, per_rank)


def test_the_demo_under_torchrun_prints_the_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            "-m",
            "reference_impls.distributed_debug",
            "demo",
            "--scenario",
            "seed",
            "--stall-s",
            "1",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "(c) rank 3 skipped 1 collective at sequence 6 on the default group" in proc.stderr, (
        proc.stderr[-4000:]
    )
    assert (tmp_path / "records" / "rank3.json").exists()
    # The offline analysis of what the reporter saved gives the same first divergence.
    offline = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference_impls.distributed_debug",
            "analyze",
            str(tmp_path / "records"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert offline.returncode == 1
    assert "(c) rank 3 skipped 1 collective at sequence 6" in offline.stdout
