"""harness.mutation's internals: the scratch folder the tests run in, mutmut's results.

mutmut runs the tests inside ``mutants/`` of the scratch folder, so a test that reads a file of
the repository (a lock file under ``requirements/``, a page under ``docs/``) fails there, on
every mutant alike, unless that file was copied: mutmut then stops before mutating anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import tomlkit

from harness import mutation

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")

FILES = {
    "pkg/__init__.py": "",
    "pkg/mod.py": "X = 1\n",
    "suites/unit/test_mod.py": "from pkg.mod import X\n",
    "requirements/cpu.lock": "torch==2.13.0\n",
    "docs/page.md": "# page\n",
    "pyproject.toml": "[project]\nname = 'x'\n",
    ".gitignore": "build/\n",
    "build/out.txt": "ignored\n",
}


def _project(root: Path) -> Path:
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_a_git_checkouts_files_are_all_copied_and_listed_for_mutmut_to_copy(tmp_path):
    root = _project(tmp_path / "repo")
    _git(root, "init", "-q")
    _git(root, "add", "pkg", "suites", "requirements", "pyproject.toml", ".gitignore")
    # docs/ is untracked but not ignored (a page not yet committed): copied too.
    work = tmp_path / "work"

    also_copy = mutation._prepare(root, "pkg/mod.py", ["suites/unit/test_mod.py"], work)

    assert (work / "requirements/cpu.lock").read_text() == "torch==2.13.0\n"
    assert (work / "docs/page.md").is_file()
    assert not (work / "build").exists()  # ignored by git: not part of the project
    assert not (work / ".git").exists()
    assert also_copy == [".gitignore", "docs", "pyproject.toml", "requirements", "suites"]
    table = tomlkit.parse((work / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert table["also_copy"] == also_copy
    assert table["only_mutate"] == ["pkg/mod.py"]
    assert table["source_paths"] == ["pkg"]


def test_a_file_deleted_but_still_in_gits_index_is_skipped_not_an_error(tmp_path):
    root = _project(tmp_path / "repo")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    (root / "docs/page.md").unlink()

    mutation._prepare(root, "pkg/mod.py", ["suites/unit/test_mod.py"], tmp_path / "work")

    assert not (tmp_path / "work/docs/page.md").exists()
    assert (tmp_path / "work/pkg/mod.py").is_file()


def test_outside_a_git_checkout_the_package_suites_and_config_are_copied(tmp_path):
    root = _project(tmp_path / "plain")
    work = tmp_path / "work"

    also_copy = mutation._prepare(root, "pkg/mod.py", ["suites/unit/test_mod.py"], work)

    assert sorted(p.name for p in work.iterdir()) == ["pkg", "pyproject.toml", "suites"]
    assert also_copy == ["pyproject.toml", "suites"]


# --- a failed `mutmut run` ---------------------------------------------------------------------

RESULTS = """
    pkg.mod.x_f__mutmut_1: killed
    pkg.mod.x_f__mutmut_2: survived
    pkg.mod.x_f__mutmut_3: timeout
    pkg.mod.x_g__mutmut_1: no tests
"""


def test_results_are_read_per_mutant():
    assert mutation._parse_results(RESULTS) == {
        "pkg.mod.x_f__mutmut_1": mutation.Status.KILLED,
        "pkg.mod.x_f__mutmut_2": mutation.Status.SURVIVED,
        "pkg.mod.x_f__mutmut_3": mutation.Status.TIMEOUT,
        "pkg.mod.x_g__mutmut_1": mutation.Status.NO_TESTS,
    }


def test_a_failed_run_that_checked_every_mutant_keeps_its_statuses():
    error = mutation.MutationError("`mutmut run` exited 1")
    mutation._use_results_despite(error, mutation._parse_results(RESULTS))  # no raise


@pytest.mark.parametrize(
    "text", ["", RESULTS + "    pkg.mod.x_g__mutmut_2: not checked\n"], ids=["none", "unfinished"]
)
def test_a_failed_run_that_left_mutants_unchecked_is_an_error_not_a_score(text):
    error = mutation.MutationError("`mutmut run` exited 1")
    unchecked = r"exited 1\n\d+ of \d+ mutant\(s\) not checked"
    with pytest.raises(mutation.MutationError, match=unchecked):
        mutation._use_results_despite(error, mutation._parse_results(text))


# --- mutmut 3.8.1's statuses, and output this harness cannot read -----------------------------


def test_every_status_mutmut_can_report_is_mapped_explicitly():
    # mutmut's own table, read from the installed mutmut (not imported by harness itself): a
    # new status in a new mutmut fails here instead of being filed away silently.
    from mutmut import stats

    assert set(stats.status_by_exit_code.values()) | {stats.status_by_exit_code[999]} <= {
        str(s) for s in mutation.Status
    }


def test_timeout_segfault_and_type_check_count_as_killed_suspicious_does_not():
    counts = {
        "killed": 1,
        "timeout": 2,
        "segfault": 3,
        "caught by type check": 4,
        "suspicious": 5,
        "survived": 6,
        "skipped": 100,
    }
    result = mutation.ModuleResult(
        path="pkg/mod.py", tests=[], counts=counts, survivors=[], seconds=0, work_dir=""
    )
    assert (result.killed, result.total) == (10, 21)  # skipped ones count neither way
    table = mutation.render_markdown([result], {})
    assert "| 10 (2 timeout, 3 segfault, 4 caught by type check) | 6 | 0 | 5 | 21 |" in table


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ("    pkg.mod.x_f__mutmut_1: eaten by a grue", "unknown status 'eaten by a grue'"),
        ("pkg.mod.x_f__mutmut_1 -> killed", "not a `NAME: STATUS` row"),
    ],
    ids=["unknown-status", "new-format"],
)
def test_output_that_cannot_be_read_is_an_error_naming_mutmut_and_the_line(row, why):
    with pytest.raises(mutation.UnreadableOutput) as caught:
        mutation._parse_results(RESULTS + row + "\n")
    message = str(caught.value)
    assert f"mutmut {mutation.mutmut_version()}" in message
    assert why in message and repr(row) in message


def test_a_show_without_a_changed_line_is_an_error_not_a_survivor_at_line_question_mark():
    with pytest.raises(mutation.UnreadableOutput, match=r"no `@@` hunk.*'# new diff format'"):
        mutation._parse_show("# new diff format\nsomething else\n")


@pytest.mark.parametrize(
    ("statuses", "message"),
    [
        ({}, "reported no mutant"),
        ({"m1": mutation.Status.SKIPPED}, "all 1 mutant.s. skipped"),
        (
            {"m1": mutation.Status.KILLED, "m2": mutation.Status.INTERRUPTED},
            "1 of 2 mutant.s. not checked although `mutmut run` exited 0",
        ),
    ],
    ids=["no-mutants", "all-skipped", "interrupted"],
)
def test_a_run_with_nothing_measured_is_an_error_not_a_score(statuses, message):
    with pytest.raises(mutation.MutationError, match=message):
        mutation._check_complete("pkg/mod.py", statuses)


# --- --tests: the test files named explicitly -----------------------------------------------


def test_named_tests_expand_globs_relative_to_the_project_and_drop_duplicates(tmp_path):
    root = _project(tmp_path / "repo")
    (root / "suites/unit/test_mod_more.py").write_text("")

    named = mutation.named_tests(
        root, ["suites/unit/test_mod*.py", str(root / "suites/unit/test_mod.py")]
    )

    assert named == ["suites/unit/test_mod.py", "suites/unit/test_mod_more.py"]


def test_a_node_id_keeps_its_test_and_its_file_is_checked_like_a_path(tmp_path):
    root = _project(tmp_path / "repo")

    named = mutation.named_tests(root, ["suites/unit/test_mod.py::test_a[x-1]"])

    assert named == ["suites/unit/test_mod.py::test_a[x-1]"]
    with pytest.raises(mutation.MutationError, match="test_gone.py::test_a: no such file"):
        mutation.named_tests(root, ["suites/unit/test_gone.py::test_a"])


def test_function_patterns_are_mutmuts_names_and_select_only_those_statuses(tmp_path):
    root = _project(tmp_path / "repo")
    (root / "pkg/mod.py").write_text(
        "def f():\n    pass\nclass C:\n    def m(self):\n        pass\n"
    )

    patterns = mutation.function_patterns(root, "pkg/mod.py", ["f", "C.m"])

    assert patterns == ["pkg.mod.x_f__mutmut_*", "pkg.mod.xǁCǁm__mutmut_*"]
    statuses = {
        "pkg.mod.x_f__mutmut_1": mutation.Status.KILLED,
        "pkg.mod.x_ff__mutmut_1": mutation.Status.NOT_CHECKED,  # another function, f's prefix
        "pkg.mod.xǁCǁm__mutmut_2": mutation.Status.SURVIVED,
    }
    assert list(mutation._selected(statuses, patterns)) == [
        "pkg.mod.x_f__mutmut_1",
        "pkg.mod.xǁCǁm__mutmut_2",
    ]
    assert mutation._selected(statuses, []) == statuses


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("suites/unit/test_gone.py", "--tests suites/unit/test_gone.py: no such file"),
        ("suites/unit/test_z*.py", "--tests suites/unit/test_z\\*.py: the pattern matches no file"),
        ("../outside/test_x.py", "--tests ../outside/test_x.py: .* is outside the project"),
        ("pkg/mod.py", "--tests pkg/mod.py: pkg/mod.py is not a test file"),
        ("docs/page.md", "--tests docs/page.md: docs/page.md is not a test file"),
        ("", "--tests: an empty path"),
    ],
    ids=["missing", "glob-no-match", "outside", "a-module", "not-python", "empty"],
)
def test_a_bad_tests_path_is_an_error_naming_it(tmp_path, given, message):
    root = _project(tmp_path / "repo")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/test_x.py").write_text("")
    with pytest.raises(mutation.MutationError, match=message):
        mutation.named_tests(root, ["suites/unit/test_mod.py", given])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pkg/mod.py", "--tests", "suites/unit/test_nope.py"], "suites/unit/test_nope.py"),
        # The shell expanded an unquoted glob: the second file became a PATH.
        (["--tests", "suites/unit/test_mod.py", "suites/unit/test_mod2.py"], "unquoted --tests"),
    ],
    ids=["bad-tests", "unquoted-glob"],
)
def test_the_command_exits_2_on_a_bad_tests_path_before_running_mutmut(
    tmp_path, monkeypatch, args, message
):
    from click.testing import CliRunner

    from harness.cli.mutate import mutate_command

    root = _project(tmp_path / "repo")
    (root / "suites/unit/test_mod2.py").write_text("")
    monkeypatch.chdir(root)
    result = CliRunner().invoke(mutate_command, [*args, "--report-dir", "out"])

    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (root / "out").exists()  # nothing ran, nothing written
