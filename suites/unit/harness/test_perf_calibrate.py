"""`harness perf calibrate` (harness/perf/calibrate.py) on synthetic measurements, and the gate
refusing a factor the calibration says a benchmark cannot support.

The measurement is injected: seeded A/B pairs with a per-process difference between blocks
(what real worker pairs show, docs/perf.md), judged by the gate's own sequential rule. Nothing
here times anything.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_perf_decision import MACHINE, noisy, two_commits, write_results  # noqa: F401

from harness import perf
from harness.cli import main
from harness.perf.calibrate import read
from harness.perf.sequential import AB_BLOCK, SamplingPlan, sample_until_decided


def synthetic(offsets: dict[str, float], seed: int = 0):
    """A Measure: each benchmark's blocks differ by exp(N(0, offset)) (a fresh process pair
    each), samples jitter 1%, and head does `extra` more work. Sequential, as the gate samples."""
    rng = random.Random(seed)

    def measure(names: Sequence[str], extra: float) -> dict[str, perf.ABResult]:
        out = {}
        for name in names:
            shift = [1.0]

            def pair(i: int, name: str = name, shift: list[float] = shift):
                if i % AB_BLOCK == 0:
                    shift[0] = math.exp(rng.gauss(0, offsets[name]))
                (b,) = noisy(rng, 1e-3, 1)
                (h,) = noisy(rng, (1 + extra) * shift[0] * 1e-3, 1)
                return b, h

            got = sample_until_decided(pair, 1.1, SamplingPlan(first=60, max_pairs=300))
            out[name] = perf.ABResult(
                name, got.base, got.head, comparison=got.comparison, stopped=got.stopped
            )
        return out

    return measure


def test_a_quiet_benchmark_passes_a_a_and_its_smallest_caught_slowdown_is_found():
    seen: list[str] = []
    (record,) = perf.calibrate(
        ["b.time_quiet"],
        synthetic({"b.time_quiet": 0.01}),
        factor=1.1,
        trials=20,
        slowdowns=(0.02, 0.25, 0.05),
        progress=seen.append,
    )
    assert record.pass_rate == 1.0 and record.false_alarm_rate == 0.0
    # At factor 1.1 a 2% or 5% slowdown is "unchanged" by design; 25% is always caught.
    assert record.caught == {"0.02": 0.0, "0.05": 0.0, "0.25": 1.0}
    assert record.smallest_caught == 0.25
    assert record.cv == pytest.approx(0.01, rel=0.3)  # the 1% jitter, from 20 trials' samples
    assert record.block_cv is not None and record.block_cv < 0.03
    assert len(seen) == 20 * 4 and seen[0] == "trial 1/20, extra work 0%"


def test_a_benchmark_whose_processes_differ_a_lot_fails_a_a_and_is_said_to():
    # 20% per-process differences at factor 1.1: the blocks' interval cannot fit the band.
    (record,) = perf.calibrate(
        ["b.time_noisy"], synthetic({"b.time_noisy": 0.2}, seed=1), factor=1.1, trials=10
    )
    assert record.pass_rate < 0.95 and not record.supports_factor
    assert record.undecided_rate > 0 and record.false_alarm_rate <= 0.1
    assert record.block_cv is not None and record.block_cv > 0.1


def test_a_failed_measurement_is_recorded_not_counted_as_a_pass():
    def broken(names, extra):
        return {n: perf.ABResult(n, [], [], error="head: ImportError: x") for n in names}

    (record,) = perf.calibrate(["b.time_x"], broken, factor=1.2, trials=2, slowdowns=(0.1,))
    assert record.pass_rate == 0.0 and record.caught == {"0.1": 0.0}
    assert record.errors == [
        "trial 1, +0%: head: ImportError: x",
        "trial 1, +10%: head: ImportError: x",
        "trial 2, +0%: head: ImportError: x",
        "trial 2, +10%: head: ImportError: x",
    ]


@pytest.mark.parametrize("bad", [0, -0.05, math.inf, math.nan, 11])
def test_a_slowdown_that_is_not_a_fraction_of_extra_work_is_refused_naming_it(bad):
    with pytest.raises(perf.PerfError, match=f"--slowdown {bad!r}"):
        perf.check_slowdowns([0.05, bad])


# --------------------------------------------------------------------------------------------
# The gate reads the record


def calibrated(repo: Path, factor: float, pass_rate: float, name: str = "bench.time_x") -> Path:
    record = perf.BenchmarkCalibration(
        name, 20, 0.01, 0.05, pass_rate, 0.1, 1 - pass_rate - 0.1, {"0.1": 1.0}, 0.1
    )
    return perf.calibration_save(
        perf.Project.load(repo),
        MACHINE,
        factor,
        [record],
        env="env",
        slowdowns=[0.1],
        load=(4.0, 3.0, 2.0),
    )


def test_the_gate_refuses_a_factor_the_calibration_found_unsupported_and_names_it(
    two_commits,  # noqa: F811
    monkeypatch,
):
    repo, base, head = two_commits
    rng = random.Random(3)
    write_results(repo, base, noisy(rng, 1e-3, 30))
    write_results(repo, head, noisy(rng, 1e-3, 30))
    path = calibrated(repo, 1.1, pass_rate=0.7)
    calibrated(repo, 1.3, pass_rate=1.0)
    monkeypatch.chdir(repo)
    from click.testing import CliRunner

    from harness.cli.perf import perf as perf_cli

    result = CliRunner().invoke(
        perf_cli, ["gate", base, head, "--machine", MACHINE, "--factor", "1.05"]
    )
    assert result.exit_code == 2, result.output
    assert "factor 1.05 refused" in result.output and str(path) in result.output
    assert "`bench.time_x`: calibrated at factor 1.1" in result.output
    assert "passed in only 70% of 20 trials" in result.output
    assert "it passed at factor 1.3" in result.output
    # At a factor no failing calibration is at or above, the gate runs (and decides).
    result = CliRunner().invoke(
        perf_cli, ["gate", base, head, "--machine", MACHINE, "--factor", "1.2"]
    )
    assert result.exit_code == 0, result.output


def test_calibrations_at_several_factors_are_kept_side_by_side(tmp_path):
    (tmp_path / "asv.conf.json").write_text("{}")
    calibrated(tmp_path, 1.1, 0.5)
    calibrated(tmp_path, 1.2, 1.0)
    data = read(perf.Project.load(tmp_path), MACHINE)
    assert sorted(data["factors"]) == ["1.1", "1.2"]
    assert data["factors"]["1.1"]["bench.time_x"]["load"] == [4.0, 3.0, 2.0]


def test_a_damaged_calibration_file_is_an_error_naming_it_not_no_calibration(tmp_path):
    (tmp_path / "asv.conf.json").write_text("{}")
    project = perf.Project.load(tmp_path)
    path = perf.calibration_path(project, MACHINE)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(perf.PerfError, match=f"{path}.*delete it"):
        perf.check_factor_supported(project, MACHINE, 1.2, ["b.time_x"])
    path.write_text(json.dumps({"factors": []}))
    with pytest.raises(perf.PerfError, match="cannot be read"):
        perf.check_factor_supported(project, MACHINE, 1.2, ["b.time_x"])


def test_shards_cover_every_benchmark_once_in_name_order():
    names = [f"b.C.time_{c}" for c in "gfedcba"]
    shards = [perf.calibration_shard(names, f"{k}/3") for k in range(3)]
    assert shards[0] == ["b.C.time_a", "b.C.time_d", "b.C.time_g"]
    assert sorted(n for s in shards for n in s) == sorted(names)
    assert perf.calibration_shard(names, "0/1") == sorted(names)


@pytest.mark.parametrize("spec", ["3/3", "-1/3", "1/0", "1", "a/b", "1/2/3", ""])
def test_a_shard_that_is_not_k_of_n_is_refused_by_name_before_any_work(spec):
    with pytest.raises(perf.PerfError, match=re.escape(repr(spec))):
        perf.calibration_shard(["b.C.time_x"], spec)
    result = CliRunner().invoke(
        main, ["perf", "calibrate", "--shard", spec], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert "--shard" in result.output
