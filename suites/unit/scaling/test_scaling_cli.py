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
        (["--link-alpha-us", "5"], "give both --link-alpha-s and --link-beta-Bps"),
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
    assert "beta_Bps must be > 0" in capsys.readouterr().err


def test_unknown_arguments_are_refused(capsys):
    assert run(["investigate", "--out", "x", "--bogus"]) == 2
    assert "--bogus" in capsys.readouterr().err
