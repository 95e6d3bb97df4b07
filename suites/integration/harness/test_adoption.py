"""Another team's repository from the outside: a flat ``tests/`` folder, a ``master`` branch,
``harness init`` run in it; ``harness ci`` then selects there and never passes by running
nothing, and plain pytest (with or without the plugin) keeps working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from click.testing import CliRunner
from tiny_asv_project import git

from harness.cli import main

FLAT = {
    "mylib/__init__.py": "",
    "mylib/core.py": "def f():\n    return 1\n",
    "mylib/extra.py": "def g():\n    return 2\n",
    "mylib/untested.py": "def h():\n    return 3\n",
    "tests/test_core.py": "from mylib.core import f\n\ndef test_f():\n    assert f() == 1\n",
    "tests/test_extra.py": "from mylib.extra import g\n\ndef test_g():\n    assert g() == 2\n",
    "pyproject.toml": "[project]\nname = 'mylib'\n\n[tool.pytest.ini_options]\naddopts = '-ra'\n",
    ".gitignore": "r/\nstdout\nstderr\n__pycache__/\n.pytest_cache/\n",
}


PASSING = "def test_ok():\n    pass\n"


def _init(root: Path, monkeypatch) -> None:
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["init"], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _ci(pytester):
    result = pytester.run(
        sys.executable, "-m", "harness.cli", "ci", "--no-perf", "--workers", "0",
        "--report-dir", "r", timeout=300,
    )  # fmt: skip
    selection = json.loads((pytester.path / "r" / "selection.json").read_text())
    return result, selection


def test_a_flat_tests_layout_on_master_runs_what_a_change_reaches_and_all_for_untested_code(
    project, pytester, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    root = project(FLAT)
    _init(root, monkeypatch)  # harness init: [tool.harness] over tests/, quarantine.toml
    git(root, "init", "-q", "-b", "master")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "feature")

    # A change to a library module that breaks its test: that test runs (the base branch is
    # found without --changed-since) and the run fails.
    (root / "mylib/core.py").write_text("def f():\n    return 2\n")
    result, selection = _ci(pytester)
    assert selection["base_ref"] == "master", selection
    # The project keeps no lock file: the env check says so and does not fail the run.
    result.stdout.fnmatch_lines(["*env check: skipped*no lock file at*"])
    assert selection["tests"] == ["tests/test_core.py"], selection
    assert result.ret == 1, result.stdout.str()
    cpu = json.loads((root / "r" / "cpu" / "report.json").read_text())
    assert [t["nodeid"] for t in cpu["tests"]] == ["tests/test_core.py::test_f"]
    (root / "mylib/core.py").write_text("def f():\n    return 1\n")

    # A change to a module no test imports: said so, and every test runs.
    (root / "mylib/untested.py").write_text("def h():\n    return 4\n")
    result, selection = _ci(pytester)
    assert result.ret == 0, result.stdout.str()
    assert selection["everything"], selection
    result.stdout.fnmatch_lines(["*mylib/untested.py changed, and no test file imports it*"])
    cpu = json.loads((root / "r" / "cpu" / "report.json").read_text())
    assert len(cpu["tests"]) == 2


def test_after_init_pytest_runs_the_tiers_and_without_the_plugin_warns_of_nothing(
    project, pytester, monkeypatch
):
    root = project(
        {
            "pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = ['tests']\n",
            "tests/test_a.py": PASSING,
            "tests/unit/test_u.py": PASSING,
            "tests/goldens_test.py": (
                "def test_g(golden):\n    golden.check('x', 1.0, rtol=0, atol=0)\n"
            ),
        }
    )
    _init(root, monkeypatch)
    result = pytester.runpytest_subprocess("--tier", "tests")
    result.assert_outcomes(passed=2)
    # Goldens sit next to the configured suites, not in a suites/ folder the project lacks.
    assert (root / "tests/goldens/goldens_test.json").is_file()
    assert not (root / "suites").exists()
    bare = pytester.runpytest_subprocess(
        "-p", "no:harness", "-W", "error::pytest.PytestConfigWarning"
    )
    bare.assert_outcomes(passed=2, errors=1)  # the golden fixture is the plugin's own
    assert "Unknown config option" not in bare.stdout.str()


REPO = Path(__file__).resolve().parents[3]


def test_the_built_wheel_installed_in_a_fresh_venv_sets_up_and_gates_a_flat_project(
    project, pytester, tmp_path_factory
):
    """What it proves: the wheel carries everything the adoption path runs (the package, the
    ``harness`` script, the ``pytest11`` plugin entry point), and works outside this source
    tree. What it leaves to pip: resolving the dependencies, which the fresh venv borrows from
    this one (a .pth file) instead of downloading them (``--no-deps``)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_bytes((REPO / name).read_bytes())
    for name in ("harness", "reference_impls"):
        subprocess.run(["cp", "-r", str(REPO / name), str(src / name)], check=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = work.glob("ml_harness-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [*pip, "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    root = project(FLAT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_STEP_SUMMARY")}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / argv[0]), *argv[1:]],
            cwd=root, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    where = run("python", "-c", "import harness; print(harness.__file__)")
    assert where.stdout.startswith(str(venv)), where  # the wheel's copy, not this tree's
    assert run("harness", "init").returncode == 0
    git(root, "init", "-q", "-b", "master")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "feature")
    (root / "mylib/extra.py").write_text("def g():\n    return 3\n")  # breaks test_extra
    ci = run("harness", "ci", "--no-perf", "--workers", "0", "--report-dir", "r")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    selection = json.loads((root / "r" / "selection.json").read_text())
    assert selection["tests"] == ["tests/test_extra.py"]
    cpu = json.loads((root / "r" / "cpu" / "report.json").read_text())
    assert [(t["nodeid"], t["outcome"]) for t in cpu["tests"]] == [
        ("tests/test_extra.py::test_g", "failed")
    ]
