"""Bad input to ``python -m reference_impls.scaling``: a clear error naming the value, exit 2,
nothing launched."""

from __future__ import annotations

import pytest

from reference_impls.scaling.__main__ import main


def run(args):
    """main()'s exit status, whether argparse exits or main returns."""
    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-sizes", "1,x"], "expected comma-separated integers like 1,2,4; got '1,x'"),
        (["--world-sizes", "0,1"], "world sizes must be integers >= 1, got [0, 1]"),
        (["--world-sizes", "2,4"], "lack 1: speedup and efficiency are measured against one rank"),
        (["--world-sizes", "1,2,2"], "world sizes repeat"),
        (["--world-sizes", "1,3", "--global-batch", "64"], "pick a multiple of 3"),
        (["--modes", "strong,diagonal"], "modes are strong and/or weak"),
        (["--steps", "2"], "steps must be >= 3"),
        (["--slow-rank", "5"], "slow_rank 5 does not exist at world sizes [1, 2]"),
        (["--link-alpha-us", "5"], "give both --link-alpha-us and --link-beta-GBps"),
        # Each of these used to pass validation: an empty item was dropped, the rest reached
        # the ranks (a traceback per rank, exit 1) or the report (a projection to 0 ranks).
        (["--world-sizes", "1,,2"], "with no empty items; got '1,,2'"),
        (["--world-sizes", "1,2,"], "with no empty items; got '1,2,'"),
        (["--hidden", "0"], "hidden widths must be integers >= 1, got [0]"),
        (["--loader-sleep-ms", "nan"], "loader-sleep-ms must be a finite number of ms >= 0"),
        (["--loader-sleep-ms", "-1"], "loader-sleep-ms must be a finite number of ms >= 0"),
        (["--slow-rank", "1", "--slow-ms", "-5"], "slow-ms must be a finite number of ms >= 0"),
        (["--slow-rank", "1", "--slow-ms", "inf"], "slow-ms must be a finite number of ms >= 0"),
        (["--slow-ms", "5"], "slow-ms 5.0 needs --slow-rank"),
        (["--slow-rank", "-1"], "slow_rank -1 does not exist at world sizes [1, 2]"),
        (["--warmup", "-1"], "warmup must be >= 0, got -1"),
        (["--seed", "-3"], "seed must be >= 0, got -3"),
        (["--hang-at-step", "-2"], "hang_at_step must be >= 0, got -2"),
        (["--timeout-s", "inf"], "timeout_s must be a finite number > 0, got inf"),
        (["--project-worlds", "0,8"], "project worlds must be integers >= 1, got [0, 8]"),
        (["--project-worlds", f"8,{2**60}"], f"got [8, {2**60}] (at most 2**53"),
        (["--gpus-per-node", "0"], "gpus-per-node must be >= 1, got 0"),
        (
            ["--link-alpha-us", "5", "--link-beta-GBps", "-1"],
            "bandwidth must be finite and > 0, got -1.0 GB/s",
        ),
        (
            ["--link-alpha-us", "nan", "--link-beta-GBps", "10"],
            "latency must be finite and >= 0, got nan us",
        ),
        (["--inter-alpha-us", "5"], "give both --inter-alpha-us and --inter-beta-GBps"),
        (["--world-sizes", "1,100000", "--modes", "weak"], "would start 100000 gloo processes"),
        # A model of 10**12 weights passed every check and died in the ranks (MemoryError).
        (["--in-features", "1000000", "--hidden", "1000000"], "GiB at world size 2; this machine"),
        (["--global-batch", str(2**40)], "GiB at world size 2; this machine"),
    ],
)
def test_bad_investigate_input_is_refused_before_anything_runs(args, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(["investigate", "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # nothing was started or written


def test_more_ranks_than_cuda_devices_is_refused(tmp_path, capsys):
    import torch

    count = torch.cuda.device_count()
    too_many = count + 1
    worlds = "1" if count == 0 else f"1,{too_many}"  # one rank already needs a device
    out = tmp_path / "out"
    args = ["investigate", "--out", str(out), "--device", "cuda", "--world-sizes", worlds]
    assert run([*args, "--global-batch", str(64 * too_many)]) == 2
    assert f"world size {too_many} needs {too_many} CUDA devices" in capsys.readouterr().err
    assert not out.exists()


def test_project_needs_its_numbers_and_names_the_missing_ones(capsys):
    assert main(["project", "--grad-bytes", "100"]) == 2
    err = capsys.readouterr().err
    assert "--per-sample-us" in err and "--alpha-us" in err and "--seeds-example" in err


def test_project_prints_the_seeds_example(capsys):
    assert main(["project", "--seeds-example", "--no-overlap", "--worlds", "8,64"]) == 0
    out = capsys.readouterr().out
    assert "| 8 |" in out and "| 64 |" in out and "assumptions:" in out


def test_project_rejects_a_bad_workload(capsys):
    args = ["--per-sample-us", "1", "--grad-bytes", "10", "--batch", "8", "--alpha-us", "1"]
    assert main(["project", *args, "--beta-GBps", "0"]) == 2
    assert "beta_Bps must be a finite number of bytes/s > 0, got 0.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        # NaN compared False with every bound, so the table used to print NaN with exit 0.
        ("--fixed-ms", "nan", "fixed_s and per_sample_s must be finite and >= 0, got nan"),
        ("--per-sample-us", "inf", "fixed_s and per_sample_s must be finite and >= 0"),
        ("--beta-GBps", "inf", "beta_Bps must be a finite number of bytes/s > 0, got inf"),
        ("--alpha-us", "nan", "alpha_s must be a finite number of s >= 0, got nan"),
        ("--backward-fraction", "nan", "backward_fraction must be in [0, 1], got nan"),
    ],
)
def test_project_rejects_non_finite_numbers(flag, value, message, capsys):
    numbers = {
        "--fixed-ms": "1",
        "--per-sample-us": "1",
        "--grad-bytes": "10",
        "--batch": "8",
        "--alpha-us": "1",
        "--beta-GBps": "1",
        flag: value,
    }
    assert main(["project", *(x for kv in numbers.items() for x in kv)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "nan" not in captured.out  # no table of NaNs


def test_project_refuses_an_empty_world_item(capsys):
    assert run(["project", "--seeds-example", "--worlds", "1,,8"]) == 2
    assert "no empty items; got '1,,8'" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_an_output_path_that_is_a_file_is_a_usage_error(where, tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("keep me\n")
    out = blocker if where == "file" else blocker / "sub"
    assert run(["investigate", "--world-sizes", "1", "--out", str(out)]) == 2
    assert f"cannot use --out {out} as the output directory" in capsys.readouterr().err
    assert blocker.read_text() == "keep me\n"  # nothing lost


def test_unknown_arguments_are_refused(capsys):
    assert run(["investigate", "--out", "x", "--bogus"]) == 2
    assert "--bogus" in capsys.readouterr().err
