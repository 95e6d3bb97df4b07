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
