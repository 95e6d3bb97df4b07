"""`harness mutate` when one module's run goes wrong: stopped at --timeout, killed, a crash of
the harness, mutmut output it cannot read. Each must be an error in the reports (named, with
the reason), every other module still reported, and the command must exit non-zero.

A stand-in for mutmut (a script run in its own process, as mutmut is) behaves per module as
its name says, so each failure happens on demand and in seconds; the real mutmut runs in
test_mutate.py. Here, not in the unit tier: the timeout case waits out a deadline of seconds.
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from harness import mutation
from harness.cli.mutate import mutate_command

FAKE_MUTMUT = r"""
import os, signal, sys, time, tomllib
module = tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]["only_mutate"][0]
name = module[:-3].replace("/", ".")
command = sys.argv[1]
if command == "run":
    open("run_args.txt", "w").write("\n".join(sys.argv[2:]))
    open("run_env.txt", "w").write(str(os.environ.get("OMP_NUM_THREADS")))
    if name.endswith("hang"):
        time.sleep(600)  # ended by the harness's --timeout, long before this
    if name.endswith("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)
if command == "results":
    if name.endswith("newformat"):
        print(f"{name}.x_f__mutmut_1 -> killed")
    elif not name.endswith("crash"):
        print(f"    {name}.x_f__mutmut_1: killed\n    {name}.x_f__mutmut_2: survived")
    if name.endswith("two"):  # g's mutants, as mutmut lists them when only f's were run
        print(f"    {name}.x_g__mutmut_1: not checked\n    {name}.xǁCǁm__mutmut_1: not checked")
    sys.exit(0)
if command == "show":
    print(f"# {sys.argv[2]}: survived\n--- a\n+++ b\n@@ -1,2 +1,2 @@\n def f(x):")
    print("-    return x + 1\n+    return x - 1")
"""


@pytest.fixture
def fake_project(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    modules = ("good", "hang", "crash", "newformat", "other", "two")
    files = {"pkg/__init__.py": "", "pyproject.toml": "[project]\nname = 'x'\n"}
    for m in modules:
        files[f"pkg/{m}.py"] = "def f(x):\n    return x + 1\n"
        files[f"suites/unit/test_{m}.py"] = f"from pkg.{m} import f\n"
    files["pkg/two.py"] += "def g(x):\n    return x - 1\nclass C:\n    def m(self):\n        pass\n"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    fake = tmp_path / "fake_mutmut.py"
    fake.write_text(FAKE_MUTMUT)
    monkeypatch.setattr(mutation, "_MUTMUT", [sys.executable, str(fake)])
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(root)
    return root


def _mutate(*args: str):
    return CliRunner().invoke(mutate_command, [*args, "--report-dir", "out"])


def test_a_module_stopped_at_the_timeout_or_crashing_is_an_error_and_every_report_is_written(
    fake_project,
):
    # 5 s: the stand-in's good runs take well under a second even on a loaded machine, and
    # the hanging one would sleep 600 s.
    result = _mutate("pkg/good.py", "pkg/hang.py", "pkg/crash.py", "pkg/other.py", "--timeout", "5")

    assert result.exit_code == 1, result.output
    report = json.loads((fake_project / "out/mutation.json").read_text())
    assert [m["path"] for m in report["modules"]] == ["pkg/good.py", "pkg/other.py"]
    assert report["modules"][0]["score"] == 0.5
    assert set(report["errors"]) == {"pkg/hang.py", "pkg/crash.py"}
    assert "stopped at its time limit of 5 s" in report["errors"]["pkg/hang.py"]
    assert "exited -9" in report["errors"]["pkg/crash.py"]
    table = (fake_project / "out/mutation.md").read_text()
    assert "| `pkg/hang.py` | **error**: `mutmut run --max-children 2`" in table


def test_a_crash_of_the_harness_itself_on_one_module_is_recorded_and_the_rest_reported(
    fake_project, monkeypatch
):
    def broken(*_args: object) -> None:
        raise ValueError("a bug in reading the diff")

    monkeypatch.setattr(mutation, "_file_line", broken)
    result = _mutate("pkg/good.py")

    assert result.exit_code == 1, result.output
    report = json.loads((fake_project / "out/mutation.json").read_text())
    assert report["errors"] == {"pkg/good.py": "crashed: ValueError: a bug in reading the diff"}


def test_results_in_a_new_format_fail_the_command_even_without_min_score(fake_project):
    result = _mutate("pkg/newformat.py")

    assert result.exit_code == 1, result.output
    error = json.loads((fake_project / "out/mutation.json").read_text())["errors"]
    assert f"mutmut {mutation.mutmut_version()}" in error["pkg/newformat.py"]
    assert "'pkg.newformat.x_f__mutmut_1 -> killed'" in error["pkg/newformat.py"]


def test_tests_named_with_tests_are_the_ones_given_to_mutmut(fake_project, tmp_path):
    result = CliRunner().invoke(
        mutate_command,
        ["pkg/good.py", "--tests", "suites/unit/test_o*.py", "--work-dir", str(tmp_path / "w")],
    )

    assert result.exit_code == 0, result.output
    report = json.loads((fake_project / "reports/mutation/mutation.json").read_text())
    assert report["modules"][0]["tests"] == ["suites/unit/test_other.py"]
    pyproject = (tmp_path / "w/pkg__good.py/pyproject.toml").read_text()
    assert 'pytest_add_cli_args_test_selection = ["suites/unit/test_other.py"]' in pyproject


def test_with_no_path_a_core_module_runs_against_its_own_tests_and_a_gone_one_is_an_error(
    fake_project, monkeypatch, tmp_path
):
    monkeypatch.setattr(mutation, "CORE_MODULES", ("pkg/good.py", "pkg/other.py"))
    monkeypatch.setattr(
        mutation,
        "CORE_MODULE_TESTS",
        {"pkg/good.py": ("suites/unit/test_o*.py",), "pkg/other.py": ("suites/gone/test_*.py",)},
    )
    result = CliRunner().invoke(
        mutate_command, ["--work-dir", str(tmp_path / "w"), "--report-dir", "out"]
    )

    # good ran against the named file, not the one that imports it; other's named tests are
    # gone: an error (never hours of the import graph's selection in its place), exit 1.
    assert result.exit_code == 1, result.output
    report = json.loads((fake_project / "out/mutation.json").read_text())
    assert [m["path"] for m in report["modules"]] == ["pkg/good.py"]
    assert report["modules"][0]["tests"] == ["suites/unit/test_other.py"]
    assert "its own tests (suites/gone/test_*.py) are gone" in report["errors"]["pkg/other.py"]


def test_function_runs_and_counts_only_that_functions_mutants_against_a_named_test(
    fake_project, tmp_path, monkeypatch
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = CliRunner().invoke(
        mutate_command,
        [
            "pkg/two.py",
            "--function",
            "f",
            "--tests",
            "suites/unit/test_two.py::test_it",
            "--work-dir",
            str(tmp_path / "w"),
        ],
    )

    assert result.exit_code == 0, result.output
    work = tmp_path / "w/pkg__two.py"
    # One OpenMP thread: a pool started before mutmut forks a worker hangs in the worker.
    assert (work / "run_env.txt").read_text() == "1"
    assert (work / "run_args.txt").read_text().splitlines() == [
        "--max-children",
        "2",
        "pkg.two.x_f__mutmut_*",
    ]
    assert (
        'test_selection = ["suites/unit/test_two.py::test_it"]'
        in (work / "pyproject.toml").read_text()
    )
    module = json.loads((fake_project / "reports/mutation/mutation.json").read_text())["modules"][0]
    # g's and C.m's mutants, listed "not checked", are not this run's: 1 of 2, not an error.
    assert (module["killed"], module["total"], module["functions"]) == (1, 2, ["f"])
    table = (fake_project / "reports/mutation/mutation.md").read_text()
    assert "| `pkg/two.py` (f only) | 50.0% |" in table


def test_without_function_the_unchecked_mutants_of_other_functions_are_an_error(fake_project):
    result = _mutate("pkg/two.py")

    assert result.exit_code == 1, result.output
    error = json.loads((fake_project / "out/mutation.json").read_text())["errors"]["pkg/two.py"]
    assert "2 of 4 mutant(s) not checked" in error


def test_a_method_is_named_class_dot_method(fake_project, tmp_path):
    result = CliRunner().invoke(
        mutate_command,
        ["pkg/two.py", "--function", "C.m", "--function", "g", "--work-dir", str(tmp_path / "w")],
    )

    # Only "not checked" mutants were listed for them (the stand-in runs nothing): an error.
    assert result.exit_code == 1, result.output
    assert (tmp_path / "w/pkg__two.py/run_args.txt").read_text().splitlines()[2:] == [
        "pkg.two.xǁCǁm__mutmut_*",
        "pkg.two.x_g__mutmut_*",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pkg/two.py", "--function", "h"], "--function h: pkg/two.py defines no such function"),
        (["pkg/two.py", "--function", "C.f"], "defines no such function or method (it has: C.m, f"),
        (["pkg/two.py", "pkg/good.py", "--function", "f"], "--function needs exactly one PATH"),
        (["pkg/two.py", "--tests", "suites/unit/test_two.py::"], "nothing after '::'"),
    ],
    ids=["unknown", "not-a-method", "two-paths", "empty-test-name"],
)
def test_a_bad_function_or_node_id_exits_2_before_running_mutmut(fake_project, args, message):
    result = _mutate(*args)

    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (fake_project / "out").exists()
