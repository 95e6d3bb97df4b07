"""`harness perf` refuses bad input before any work: exit 2, the bad value named, nothing written.

A machine name becomes a folder under the results directory, refs and regexes become asv and
git arguments, the factor decides whether the gate can fail at all: each is checked when the
command line is parsed (or, for $HARNESS_PERF_MACHINE, first thing in the command), so none of
these needs asv to run. Exit 1 is kept for "a regression" and "a benchmark failed".
"""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from harness import perf
from harness.cli.perf import perf as perf_cli

ASV_CONF = {
    "version": 1,
    "project": "tiny",
    "repo": ".",
    "dvcs": "git",
    "environment_type": "existing",
    "branches": ["HEAD"],
    "benchmark_dir": "benchmarks",
    "results_dir": ".asv/results",
    "html_dir": ".asv/html",
}


@pytest.fixture
def project_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An asv project three folders deep in tmp_path (so '../../../x' lands inside tmp_path),
    the current directory; no machine name from the environment."""
    root = tmp_path / "a" / "b" / "proj"
    root.mkdir(parents=True)
    (root / "asv.conf.json").write_text(json.dumps(ASV_CONF))
    monkeypatch.chdir(root)
    monkeypatch.delenv(perf.MACHINE_ENV_VAR, raising=False)
    monkeypatch.delenv("HARNESS_PERF_BASE_REF", raising=False)
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    return root


def invoke(*args: str):
    return CliRunner().invoke(perf_cli, list(args))


def files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "machine", ["../../../x", "..", "a/b", "/tmp/x", ".hidden", "", "x\n", "-rf", "a" * 65]
)
@pytest.mark.parametrize("command", [["run"], ["gate", "HEAD~1", "HEAD"], ["ci"]])
def test_a_machine_that_is_not_a_plain_name_exits_2_naming_it_and_writes_nothing(
    project_dir: Path, tmp_path: Path, machine: str, command: list[str]
):
    before = files_under(tmp_path)
    result = invoke(*command, "--machine", machine)
    assert result.exit_code == 2, result.output
    assert repr(machine) in result.output and "not a machine name" in result.output
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("command", [["run"], ["gate", "HEAD~1", "HEAD"], ["ci"]])
def test_harness_perf_machine_from_the_environment_is_checked_like_the_option(
    project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
):
    monkeypatch.setenv(perf.MACHINE_ENV_VAR, "../../../x")
    before = files_under(tmp_path)
    result = invoke(*command)
    assert result.exit_code == 2, result.output
    assert "$HARNESS_PERF_MACHINE '../../../x' is not a machine name" in result.output
    assert files_under(tmp_path) == before


@given(st.text(alphabet=string.printable + "é/\\\x00", max_size=70))
def test_an_accepted_machine_name_is_one_path_component_that_cannot_climb(name: str):
    try:
        perf.check_machine(name)
    except perf.PerfError as exc:
        assert repr(name) in str(exc)
        return
    assert Path(name).name == name and name not in (".", "..")
    assert not name.startswith(("-", ".")) and len(name) <= 64
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


@pytest.mark.parametrize("factor", ["inf", "-inf", "nan", "1", "1.0", "0.5", "0", "-2", "11"])
@pytest.mark.parametrize("command", [["gate", "HEAD~1", "HEAD"], ["ci"]])
def test_a_factor_with_which_the_gate_cannot_fail_sensibly_exits_2_naming_it(
    project_dir: Path, factor: str, command: list[str]
):
    result = invoke(*command, "--factor", factor)
    assert result.exit_code == 2, result.output
    assert f"--factor {float(factor)!r} cannot gate" in result.output


def test_the_library_refuses_those_factors_too(project_dir: Path):
    for factor in (math.inf, math.nan, 1.0, -1.0, 100.0):
        with pytest.raises(perf.PerfError, match="cannot gate"):
            perf.gate(project_dir, "HEAD", "HEAD", factor=factor)
        with pytest.raises(perf.PerfError, match="cannot gate"):
            perf.ci_step(
                project_dir, project_dir / "reports", perf.PerfStepConfig(factor=factor), echo=None
            )
    assert not (project_dir / "reports").exists()  # refused before any work


@pytest.mark.parametrize(
    "args",
    [
        ["gate", "--", "--output=x", "HEAD"],
        ["gate", "--", "HEAD", "-x"],
        ["run", "--commit=--output=../x"],
        ["run", "--commit", "HEAD", "--commit=-h"],
        ["ci", "--base-ref=--upload-pack=touch x"],
        ["gate", "HEAD\nmain", "HEAD"],
    ],
)
def test_a_ref_that_git_or_asv_would_read_as_an_option_exits_2_naming_it(
    project_dir: Path, args: list[str]
):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "is not a commit reference" in result.output


def test_a_base_ref_from_the_environment_that_looks_like_an_option_is_refused(
    project_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HARNESS_PERF_BASE_REF", "--output=x")
    with pytest.raises(perf.PerfError, match=r"\$HARNESS_PERF_BASE_REF '--output=x'"):
        perf.default_branch_refs(project_dir)


@pytest.mark.parametrize("command", [["run"], ["ci"]])
def test_a_bench_regex_that_does_not_compile_exits_2_naming_it(
    project_dir: Path, command: list[str]
):
    result = invoke(*command, "--bench", "time_(close")
    assert result.exit_code == 2, result.output
    assert "'time_(close' is not a valid regular expression" in result.output


def test_gate_json_into_a_missing_folder_exits_2_before_any_work(project_dir: Path):
    # No results and no git here: had the gate run first, its error would be the output.
    result = invoke("gate", "HEAD~1", "HEAD", "--json", "missing/dir/gate.json")
    assert result.exit_code == 2, result.output
    assert "folder 'missing/dir' does not exist" in result.output
    assert "mkdir -p missing/dir" in result.output
    assert not (project_dir / "missing").exists()


def test_passes_beyond_the_limit_exit_2(project_dir: Path):
    result = invoke("ci", "--passes", str(perf.MAX_PASSES + 1))
    assert result.exit_code == 2, result.output
    assert "--passes" in result.output


def test_ci_with_a_report_dir_that_cannot_be_created_exits_2_saying_which(
    project_dir: Path,
):
    (project_dir / "afile").write_text("not a folder\n")
    result = invoke("ci", "--report-dir", "afile/reports")
    assert result.exit_code == 2, result.output
    assert "report directory 'afile/reports' cannot be created" in result.output


def test_ci_with_an_unknown_measure_base_exits_2_naming_it(project_dir: Path):
    result = invoke("ci", "--measure-base", "sometimes")
    assert result.exit_code == 2, result.output
    assert "'sometimes' is not one of 'never', 'missing', 'always'" in result.output
    assert not (project_dir / "reports").exists()  # refused before any work


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"measure_base": "sometimes"}, "--measure-base 'sometimes' is not a choice"),
        ({"passes": 0}, "--passes must be between 1 and"),
        ({"ab_pairs": -1}, "--ab-pairs must be between 0 and"),
        ({"group": "tpu"}, "--group 'tpu' is not a benchmark group"),
        ({"bench": "time_(x"}, "'time_(x' is not a valid regular expression"),
        ({"base_ref": "--upload-pack=x"}, "--base-ref '--upload-pack=x' is not a commit"),
        ({"machine": "../x"}, "--machine '../x' is not a machine name"),
        ({"ab_budget_s": 0}, "--ab-budget 0 is not a time budget"),
        ({"ab_budget_s": math.inf}, "--ab-budget inf is not a time budget"),
        ({"ab_budget_s": math.nan}, "--ab-budget nan is not a time budget"),
        ({"ab_start": "spawn"}, "--ab-start 'spawn' is not a choice"),
    ],
)
def test_the_perf_step_config_refuses_a_bad_setting_naming_it(setting: dict, named: str):
    with pytest.raises(perf.PerfError) as info:
        perf.PerfStepConfig(**setting)
    assert named in str(info.value)


@pytest.mark.parametrize("budget", ["0", "-5", "nan", "inf", "3601", "soon"])
def test_an_ab_budget_that_is_no_time_budget_exits_2_naming_it(project_dir: Path, budget: str):
    result = invoke("ci", "--ab-budget", budget)
    assert result.exit_code == 2, result.output
    assert "--ab-budget" in result.output and budget in result.output
    assert not (project_dir / "reports").exists()  # refused before any work


@pytest.mark.parametrize("command", ["ci", "calibrate"])
def test_an_ab_start_that_is_not_a_choice_exits_2_naming_it(project_dir: Path, command: str):
    result = invoke(command, "--ab-start", "spawn")
    assert result.exit_code == 2, result.output
    assert "--ab-start" in result.output and "spawn" in result.output
    assert not (project_dir / "reports").exists()  # refused before any work


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--slowdown", "0"], "--slowdown 0.0 is not a fraction of extra work"),
        (["--slowdown", "-0.1"], "--slowdown -0.1 is not a fraction of extra work"),
        (["--trials", "0"], "--trials"),
        (["--factor", "1"], "--factor"),
        (["--group", "gpu"], "--group gpu cannot be calibrated with A/B pairs"),
    ],
)
def test_calibrate_refuses_bad_settings_naming_them_before_any_work(
    project_dir: Path, args: list[str], named: str
):
    before = files_under(project_dir)
    result = invoke("calibrate", *args)
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert files_under(project_dir) == before
