"""Bad input to ``python -m reference_impls.async_sgd`` and its public configs: a clear error
naming the value (exit 2), nothing run or written, never a traceback or a silently different
run. Each case here used to pass quietly or crash."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from reference_impls.async_sgd import ProblemConfig, SimConfig, make_policy, speed_profile
from reference_impls.async_sgd.__main__ import main
from reference_impls.async_sgd.analysis import analyze_run
from reference_impls.async_sgd.distributed import TrainConfig

SIM = ["simulate", "--workers", "3", "--updates", "30"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # A worker id past the last one, or half of a death, used to simulate no death at all.
        (["--dies", "7", "--dies-at-ms", "5"], "dies must name a worker in [0, 2], got 7"),
        (["--dies", "1"], "a death needs both the worker and the time"),
        (["--dies-at-ms", "5"], "a death needs both the worker and the time"),
        (["--dies", "1", "--dies-at-ms", "nan"], "dies_at_ms must be a finite number >= 0"),
        # A period of 0, or stalls with no straggler to stall, used to simulate no stalls.
        (["--stragglers", "1", "--stall-every-ms", "0"], "stall_every_ms must be a finite number"),
        (["--stall-every-ms", "50"], "stalls the stragglers, and there are none"),
        (
            ["--stragglers", "1", "--stall-every-ms", "50", "--stall-ms", "inf"],
            "stall_ms must be a finite number > 0, got inf",
        ),
        # numpy's own refusal did not say which value.
        (["--seed", "-1"], "seed must be an int >= 0, got -1"),
        # Refused by the parameter server only after the run directory had been made.
        (["--lr", "0"], "lr must be > 0, got 0.0"),
        (["--lr", "nan"], "lr must be > 0, got nan"),
        (["--control", "--lr", "-1"], "lr must be > 0, got -1.0"),
        # Past float32's range torch refused the step mid-run (a RuntimeError traceback).
        (["--lr", "1e308"], "lr must be > 0, got 1e+308 (at most 3.403e+38"),
        (["--policy", "alpha-over-s", "--alpha", "1e308"], "alpha must be a finite number > 0"),
        (["--stragglers", "1", "--stall-every-ms", "1e308"], "stall_every_ms must be a finite"),
        # Fewer samples than workers: an empty shard, a RuntimeError from torch.randint.
        (["--samples", "2"], "samples must be >= workers (3)"),
    ],
)
def test_bad_simulate_options_are_refused_before_anything_is_written(
    args, message, tmp_path, capsys
):
    out = tmp_path / "run"
    assert main([*SIM, *args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("lr", ["0", "inf"])
def test_bad_train_options_create_no_run_directory(lr, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--workers", "2", "--lr", lr, "--out", str(out)]) == 2
    assert f"lr must be > 0, got {float(lr)!r}" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_an_output_path_that_is_a_file_is_a_usage_error(where, tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("keep me\n")
    out = blocker if where == "file" else blocker / "sub"
    assert main([*SIM, "--out", str(out)]) == 2  # was a FileExistsError traceback
    assert f"cannot use --out {out} as a directory" in capsys.readouterr().err
    assert blocker.read_text() == "keep me\n"


def test_bench_json_that_is_a_directory_is_refused_before_the_benchmark_runs(tmp_path, capsys):
    # The results used to be lost after the whole benchmark: IsADirectoryError at the end.
    assert main(["bench", "--json", str(tmp_path), "--seconds", "1"]) == 2
    assert "is a directory: pass a file name" in capsys.readouterr().err


def test_the_public_configs_refuse_what_the_cli_refuses():
    with pytest.raises(ValueError, match="dies must name a worker in \\[0, 3\\], got 4"):
        speed_profile(4, dies=4, dies_at_ms=1.0)
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -2"):
        ProblemConfig(seed=-2)
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -2"):
        SimConfig(policy=make_policy(), seed=-2)
    with pytest.raises(ValueError, match="comm_ms must be >= 0, got inf"):
        SimConfig(policy=make_policy(), comm_ms=math.inf)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": math.inf}, "lr must be > 0, got inf"),
        ({"slowdown": math.inf}, "slowdown must be >= 1, got inf"),
        ({"max_time_s": math.nan}, "max_time_s must be a finite number > 0, got nan"),
        ({"max_time_s": -1.0}, "max_time_s must be a finite number > 0, got -1.0"),
        ({"dead_after_s": math.inf}, "need 0 < heartbeat_s < dead_after_s (finite)"),
        ({"target_loss": math.nan}, "target_loss must be finite, got nan"),
    ],
)
def test_bad_train_numbers_are_refused_before_a_process_starts(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        TrainConfig(policy=make_policy(), **kwargs)


def test_a_missing_resume_checkpoint_is_refused_before_a_process_starts(tmp_path, capsys):
    # It used to surface inside the server process, after the workers had started.
    missing = tmp_path / "nope.pt"
    args = ["train", "--workers", "2", "--out", str(tmp_path / "run"), "--resume", str(missing)]
    assert main(args) == 2
    assert f"no checkpoint at {missing}: check the --resume path" in capsys.readouterr().err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "run"
    assert (
        main(
            [
                "simulate",
                "--workers",
                "4",
                "--updates",
                "200",
                "--stragglers",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def _copy(run_dir, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(run_dir, dst)
    return dst


@pytest.mark.parametrize("contrast", ["nan", "-1", "0.5"])
def test_a_contrast_that_switches_the_gate_off_is_refused(contrast, run_dir, capsys):
    # The ratio is >= 1 on every run: a bar below 1 or NaN used to pass and disable condition (1).
    assert main(["analyze", str(run_dir), "--no-plots", "--contrast", contrast]) == 2
    assert "contrast must be a finite number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("run.json", b'{"mode": ', "run.json: not valid JSON"),
        ("run.json", b"[1, 2]", "run.json: expected a JSON object, got list"),
        ("staleness.jsonl", b"\xf6\x00garbage", "staleness.jsonl: not a text file (byte 0"),
    ],
    ids=["truncated-summary", "summary-not-object", "binary-log"],
)
def test_a_damaged_run_directory_names_the_file(name, content, message, run_dir, tmp_path, capsys):
    damaged = _copy(run_dir, tmp_path)
    (damaged / name).write_bytes(content)
    assert main(["analyze", str(damaged), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(damaged) in err


def test_a_diverged_run_is_an_error_not_no_correlation(run_dir, tmp_path):
    # NaN losses made r NaN, and "NaN > 0" is False: the analysis used to report "not found".
    diverged = _copy(run_dir, tmp_path)
    lines = (diverged / "staleness.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for r in records[100:]:
        r["server_loss"] = math.nan
    text = "".join(json.dumps(r) + "\n" for r in records)  # json writes NaN as NaN
    (diverged / "staleness.jsonl").write_text(text)
    version = min(r["version"] for r in records[100:] if r["status"] == "applied")
    with pytest.raises(
        ValueError, match=f"not finite \\(nan\\) first at applied update version {version} "
    ):
        analyze_run(diverged, plots=False)


def test_the_run_itself_is_not_its_own_control(run_dir, capsys):
    assert main(["analyze", str(run_dir), "--control", f"{run_dir}/", "--no-plots"]) == 2
    assert "is the run itself" in capsys.readouterr().err
