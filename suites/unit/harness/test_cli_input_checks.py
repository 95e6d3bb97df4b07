"""Every command refuses bad input up front: exit 2, a message naming the bad value, and no
report left saying an earlier run's verdict. In-process through click's CliRunner (nothing
here reaches pytest or a subprocess: each refusal happens before one would start)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import flaky
from harness import quarantine as q
from harness.cli import main

EVIL = "--junitxml=../outside/evil.py::test_y"


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with one real test, as the current directory; ``../outside`` beside it."""
    root = tmp_path / "proj"
    (root / "suites/unit").mkdir(parents=True)
    (root / "suites/unit/test_x.py").write_text(
        "class TestK:\n    def test_m(self):\n        pass\n\ndef test_y():\n    pass\n"
    )
    (root / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "outside").mkdir()
    monkeypatch.chdir(root)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return root


def harness(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def add(*args: str):
    return harness("quarantine", "add", "--reason", "flaky", "--issue", "https://x.org/i/1", *args)


# --------------------------------------------------------------------------- quarantine ids


@pytest.mark.parametrize(
    "test_id, words",
    [
        (EVIL, "starts with '-', which pytest would read as an option"),
        ("../outside/evil.py::test_y", "has the path part '..'"),
        ("suites/../suites/unit/test_x.py::test_y", "has the path part '..'"),
        ("./suites/unit/test_x.py::test_y", "has the path part '.'"),
        ("suites//unit/test_x.py::test_y", "has the path part ''"),
        ("/etc/passwd.py::test_y", "is an absolute path"),
        ("suites/unit/test_x.py::test_y\n", "control character '\\n'"),
        ("suites/unit/test_x.py::test_y[a\x1bb]", "control character '\\x1b'"),
        ("suites/unit/test_x.py", "must be a pytest node id"),
        ("suites/unit/test_x.py::", "must be a pytest node id"),
    ],
)
def test_quarantine_add_refuses_an_id_that_is_not_a_plain_node_id(proj, test_id, words):
    result = add("--", test_id)
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert repr(test_id) in result.output
    assert not (proj / "quarantine.toml").exists()
    assert list((proj.parent / "outside").iterdir()) == []


@pytest.mark.parametrize(
    "test_id, words",
    [
        ("suites/unit/test_nope.py::test_y", "file suites/unit/test_nope.py does not exist"),
        ("suites/unit/test_x.py::test_nope", "no test test_nope in suites/unit/test_x.py"),
        ("suites/unit/test_x.py::TestK::test_nope", "no test TestK::test_nope"),
    ],
)
def test_quarantine_add_refuses_a_test_that_does_not_exist(proj, test_id, words):
    result = add(test_id)
    assert result.exit_code == 2, result.output
    assert f"cannot quarantine {test_id!r}" in result.output and words in result.output
    assert not (proj / "quarantine.toml").exists()


def test_quarantine_add_refuses_a_file_that_a_symlink_puts_outside_the_project(proj):
    (proj.parent / "outside/test_far.py").write_text("def test_far():\n    pass\n")
    (proj / "suites/unit/far").symlink_to(proj.parent / "outside")
    result = add("suites/unit/far/test_far.py::test_far")
    assert result.exit_code == 2
    assert "outside the project" in result.output


@pytest.mark.parametrize(
    "test_id", ["suites/unit/test_x.py::test_y", "suites/unit/test_x.py::TestK::test_m[p-1]"]
)
def test_quarantine_add_accepts_an_existing_test(proj, test_id):
    result = add(test_id)
    assert result.exit_code == 0, result.output
    assert [e.test for e in q.load(proj / "quarantine.toml")] == [test_id]


def _hand_edited(path: Path, test_id: str) -> None:
    today = datetime.date.today()
    path.write_text(
        "[[quarantine]]\n"
        f"test = {json.dumps(test_id)}\n"
        'reason = "r"\nissue = "https://x.org/i/1"\n'
        f"added = {today}\nexpires = {today + datetime.timedelta(days=3)}\n"
    )


@pytest.mark.parametrize("command", [["quarantine", "list"], ["flaky", "--quarantined"]])
def test_a_hand_edited_entry_that_is_an_option_is_refused_at_load(proj, command):
    _hand_edited(proj / "quarantine.toml", EVIL)
    result = harness(*command)
    assert result.exit_code == 2, result.output
    assert "quarantine.toml:2:" in result.output and "starts with '-'" in result.output
    assert list((proj.parent / "outside").iterdir()) == []


def test_a_quarantine_file_that_is_a_directory_is_an_error(proj):
    result = harness("quarantine", "list", "--file", "suites")
    assert result.exit_code == 2
    assert "is a directory" in result.output


# --------------------------------------------------------------------------- harness run / ci


def _earlier_passing_reports(report_dir: Path) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "junit.xml").write_text('<testsuites><testsuite tests="1"/></testsuites>\n')
    (report_dir / "report.json").write_text('{"exit_status": 0, "status": "passed"}\n')
    (report_dir / "summary.md").write_text("## ml-harness run: ✅ passed\n")


def _says_aborted(report_dir: Path) -> None:
    assert json.loads((report_dir / "report.json").read_text())["status"] == "aborted"
    assert "❌ aborted" in (report_dir / "summary.md").read_text()
    junit = (report_dir / "junit.xml").read_text()
    assert 'errors="1"' in junit and 'name="run aborted"' in junit


@pytest.mark.parametrize(
    "args, words",
    [
        (["--seed", "banana"], "--seed: a seed is a decimal integer in [0, 2**32), got 'banana'"),
        (["--seed", "4294967296"], "got 4294967296"),
        (["--seed", " 7"], "got ' 7'"),
        (["--tier", ",,,"], "--tier ',,,' has an empty tier name"),
        (["--tier", "unit,"], "--tier 'unit,' has an empty tier name"),
        (["--tier", "unti"], "unknown tier(s) 'unti'; known tiers: unit, property"),
        (["--", "--junitxml=../outside/x.xml"], "'--junitxml=../outside/x.xml' cannot be passed"),
        (["--", "-p", "no:harness"], "'-p' cannot be passed through"),
        (["--", "--harness-json", "x.json"], "'--harness-json' cannot be passed"),
    ],
)
def test_harness_run_refuses_bad_input_and_leaves_reports_that_say_aborted(proj, args, words):
    _earlier_passing_reports(proj / "reports")
    result = harness("run", *args)
    assert result.exit_code == 2, result.output
    assert words in result.output
    _says_aborted(proj / "reports")
    assert "usage error, nothing ran" in (proj / "reports/summary.md").read_text()


def test_harness_ci_refuses_a_bad_seed_before_any_step_and_says_aborted(proj):
    _earlier_passing_reports(proj / "reports/cpu")
    (proj / "reports/summary.md").write_text("# harness ci: ✅ passed\n")
    (proj / "reports/perf").mkdir()
    (proj / "reports/perf/perf.md").write_text("### Performance: passed\n")
    result = harness("ci", "--seed", "banana", "--no-perf")
    assert result.exit_code == 2
    assert "got 'banana'" in result.output
    assert "❌ aborted" in (proj / "reports/summary.md").read_text()
    _says_aborted(proj / "reports/cpu")
    assert not (proj / "reports/perf/perf.md").exists()


@pytest.mark.parametrize("command", ["run", "ci"])
def test_a_report_dir_that_cannot_be_created_is_a_usage_error(proj, command):
    (proj / "blocker").write_text("a file\n")
    result = harness(command, "--report-dir", "blocker/reports")
    assert result.exit_code == 2
    assert "--report-dir 'blocker/reports' cannot be created" in result.output


# --------------------------------------------------------------------------- harness flaky


@pytest.mark.parametrize(
    "args, words",
    [
        (["--timeout", "-5"], "--timeout must be a finite number of seconds > 0, got -5.0"),
        (["--timeout", "0"], "got 0.0"),
        (["--timeout", "nan"], "got nan"),
        (["--timeout", "inf"], "got inf"),
        (["--seed", "banana"], "--seed: a seed is a decimal integer"),
        (["--seed", "-1"], "got '-1'"),
        (["--seeds", "1,,2"], "--seeds '1,,2': a seed is a decimal integer in [0, 2**32), got ''"),
        (["--seeds", "3,3"], "--seeds '3,3' repeats [3]"),
        (["--seeds", "5000000000"], "got 5000000000"),
    ],
)
def test_harness_flaky_refuses_bad_numbers_naming_them(proj, args, words):
    result = harness("flaky", "suites/unit/test_x.py::test_y", *args)
    assert result.exit_code == 2, result.output
    assert words in result.output


@pytest.mark.parametrize(
    "args", [[], ["suites/unit/test_x.py::test_y", "--quarantined"]], ids=["neither", "both"]
)
def test_harness_flaky_needs_exactly_one_of_a_test_and_quarantined(proj, args):
    result = harness("flaky", *args)
    assert result.exit_code == 2, result.output
    assert "Error: give either a TEST node id or --quarantined" in result.output


def test_harness_flaky_refuses_a_test_id_that_is_an_option(proj):
    result = harness("flaky", "--", EVIL)
    assert result.exit_code == 2
    assert "starts with '-'" in result.output


def test_the_flake_hunter_never_hands_pytest_an_id_that_reads_as_an_option(proj):
    # Python 3.11's argparse ignores "--" in pytest's intermixed parsing: "--" alone would let
    # this id write a JUnit file outside the project.
    with pytest.raises(ValueError, match="starts with '-'"):
        flaky.run_once("--junitxml=../outside/evil.xml", 1, cwd=proj, timeout_s=60)
    assert list((proj.parent / "outside").iterdir()) == []


# --------------------------------------------------------------------------- env, artifacts


@pytest.mark.parametrize(
    "lock",
    ["", "# only comments\n", "numpy==1.0 ; python_version < '3'\n"],
    ids=["empty", "comments", "no-pin-for-this-python"],
)
def test_env_check_with_a_lock_that_pins_nothing_fails_even_with_allow_extra(tmp_path, lock):
    path = tmp_path / "cpu.lock"
    path.write_text(lock)
    result = harness("env", "check", "--lock", str(path), "--allow-extra")
    assert result.exit_code == 2
    assert f"lock file {path} pins no package for this interpreter" in result.output


@pytest.mark.parametrize("bound", ["min = nan", "max = inf", "min = -inf"])
def test_a_schema_bound_that_can_never_fail_is_refused(tmp_path, bound):
    schema = tmp_path / "s.toml"
    schema.write_text(
        f'name = "m"\n[fields]\nloss = {{ kind = "scalar", type = "float", {bound} }}\n'
    )
    (tmp_path / "m.json").write_text('{"loss": 1.0}\n')
    result = harness("artifacts", "validate", str(tmp_path / "m.json"), "--schema", str(schema))
    assert result.exit_code == 2
    name, value = bound.split(" = ")
    assert f"Scalar.{name} must be a finite number, got {float(value)!r}" in result.output


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_a_json_artifact_nested_200000_deep_is_reported_not_a_traceback(tmp_path, suffix):
    schema = tmp_path / "s.toml"
    schema.write_text('name = "m"\nallow_extra = true\n')
    path = tmp_path / f"deep{suffix}"
    path.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    result = harness("artifacts", "validate", str(path), "--schema", str(schema))
    assert result.exit_code == 1
    assert "nested too deeply to read" in result.output


def test_a_schema_nested_too_deeply_is_a_usage_error(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text('{"fields": ' * 100_000 + "{}" + "}" * 100_000)
    (tmp_path / "m.json").write_text("{}\n")
    result = harness("artifacts", "validate", str(tmp_path / "m.json"), "--schema", str(schema))
    assert result.exit_code == 2
    assert "nested too deeply" in result.output


def test_the_pickle_refusal_names_the_global_it_refused(tmp_path):
    torch = pytest.importorskip("torch")
    import os

    path = tmp_path / "ckpt.pt"
    # A function is a global only full unpickling rebuilds (pickled as posix.getcwd).
    torch.save({"w": torch.zeros(2), "f": os.getcwd}, path)
    schema = tmp_path / "s.toml"
    schema.write_text('name = "c"\nallow_extra = true\n')
    result = harness("artifacts", "validate", str(path), "--schema", str(schema))
    assert result.exit_code == 1
    assert f"refused the global {os.getcwd.__module__}.getcwd it holds" in result.output
    assert "truncated or corrupt" not in result.output


# --------------------------------------------------------------------------- missing extras


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):
    """Make the named modules look uninstalled to the up-front checks (harness.extras)."""
    from harness import extras

    def hide(*modules: str) -> None:
        real = extras._importable
        monkeypatch.setattr(extras, "_importable", lambda m: m not in modules and real(m))

    return hide


@pytest.mark.parametrize(
    "module, args, words",
    [
        ("xdist", ["ci", "--no-perf"], "--workers auto needs pytest-xdist"),
        ("xdist", ["ci", "--no-perf", "--workers", "3"], "pip install 'ml-harness[ci]'"),
        ("asv", ["ci", "--workers", "0"], "the perf gate needs asv, which is not installed"),
        ("pytest_split", ["run", "--shard", "1/2"], "--shard needs pytest-split"),
        ("mutmut", ["mutate", "harness/x.py"], "pip install 'ml-harness[mutate]'"),
    ],
)
def test_a_missing_extra_stops_the_command_before_any_work_with_the_install_line(
    proj, without, module, args, words
):
    without(module)
    result = harness(*args)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())
    assert not (proj / "reports/cpu").exists()


def test_the_perf_gate_without_an_asv_project_is_refused_up_front(proj):
    pytest.importorskip("asv")
    result = harness("ci", "--workers", "0")
    assert result.exit_code == 2
    assert "asv.conf.json not found" in result.output and "--no-perf" in result.output


def test_full_runs_and_zero_workers_need_no_xdist(proj, without):
    without("xdist")
    # The extras are checked first: reaching the seed check means they passed.
    for args in (["--full"], ["--workers", "0"]):
        result = harness("ci", "--no-perf", "--seed", "banana", *args)
        assert "got 'banana'" in result.output, result.output


def test_a_worker_count_that_is_not_a_number_is_refused(proj):
    result = harness("ci", "--no-perf", "--workers", "lots")
    assert result.exit_code == 2 and "--workers 'lots'" in result.output
