"""harness.selection: which test files a change reaches through the import graph."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from harness import selection

PROJECT = {
    "harness/__init__.py": "",
    "harness/tolerances.py": "X = 1\n",
    "harness/plugin.py": "from harness import tolerances\n",
    "comp/__init__.py": "",
    "comp/ring/__init__.py": "from .schedule import plan\n",
    "comp/ring/schedule.py": "from comp.ring import simulation\n\ndef plan():\n    pass\n",
    "comp/ring/simulation.py": "STEPS = 3\n",
    "comp/ring/presets.toml": "steps = 3\n",
    "comp/data/__init__.py": "",
    "comp/data/tario.py": "def read():\n    pass\n",
    "comp/data/launcher.py": (
        "import subprocess, sys\n"
        "def launch():\n"
        "    # named in a string, imported by the child process\n"
        "    subprocess.run([sys.executable, '-m', 'comp.ring.simulation'])\n"
    ),
    "suites/conftest.py": "",
    "suites/unit/ring/test_schedule.py": "from comp.ring import plan\n",
    "suites/unit/ring/test_presets.py": "def test_it():\n    import comp.ring\n",
    "suites/unit/data/test_tario.py": "from comp.data.tario import read\n",
    "suites/unit/data/test_launch.py": "from comp.data import launcher\n",
    "suites/unit/data/helpers.py": "from comp.data import tario\n",
    "suites/unit/data/test_uses_helper.py": "import helpers\n",
    "suites/unit/data/fixture.json": "{}\n",
    "suites/unit/harness/test_tol.py": "from harness import tolerances\n",
    "suites/goldens/unit/ring/test_schedule.json": "{}\n",
    "suites/benchmarks/__init__.py": "",
    "suites/benchmarks/bench_ring.py": "from comp.ring import simulation\n",
    "suites/benchmarks/bench_data.py": "from comp.data import tario\n",
    "docs/ring.md": "# ring\n",
    "pyproject.toml": "",
}


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _write(tmp_path, PROJECT)
    return tmp_path


def test_a_change_selects_the_tests_that_reach_it_transitively_and_nothing_else(root):
    sel = selection.select(root, ["comp/ring/simulation.py"])
    assert not sel.everything
    # schedule imports simulation; the package imports schedule; the launcher names the
    # module in a string; test_presets imports the package inside a function.
    assert sel.tests == (
        "suites/unit/data/test_launch.py",
        "suites/unit/ring/test_presets.py",
        "suites/unit/ring/test_schedule.py",
    )
    assert sel.benchmarks == ("bench_ring",)
    assert selection.bench_regex(sel.benchmarks) == r"^(bench_ring)\."


def test_a_bare_import_of_a_helper_beside_the_test_is_followed(root):
    sel = selection.select(root, ["comp/data/tario.py"])
    assert sel.tests == ("suites/unit/data/test_tario.py", "suites/unit/data/test_uses_helper.py")
    assert sel.benchmarks == ("bench_data",)


def test_data_files_select_their_package_their_folder_or_their_golden_owner(root):
    assert selection.select(root, ["comp/ring/presets.toml"]).tests == (
        "suites/unit/data/test_launch.py",
        "suites/unit/ring/test_presets.py",
        "suites/unit/ring/test_schedule.py",
    )
    assert selection.select(root, ["suites/unit/data/fixture.json"]).tests == (
        "suites/unit/data/test_launch.py",
        "suites/unit/data/test_tario.py",
        "suites/unit/data/test_uses_helper.py",
    )
    golden = selection.select(root, ["suites/goldens/unit/ring/test_schedule.json"])
    assert golden.tests == ("suites/unit/ring/test_schedule.py",)


@pytest.mark.parametrize(
    "path",
    [
        "harness/plugin.py",
        "suites/conftest.py",
        "suites/unit/ring/conftest.py",
        "pyproject.toml",
        "requirements/cpu.lock",
        "quarantine.toml",
        "Makefile",  # no import reaches it: it may matter to any test
        ".github/workflows/ci.yml",
    ],
)
def test_changes_that_can_reach_every_test_select_everything(root, path):
    sel = selection.select(root, ["comp/data/tario.py", path])
    assert sel.everything and sel.tests == ()
    assert path in sel.reason
    assert selection.bench_regex(sel.benchmarks) is None  # every benchmark


def test_documentation_and_no_change_select_nothing(root):
    for changed in ([], ["docs/ring.md"], ["README.md"]):
        sel = selection.select(root, changed)
        assert not sel.everything and sel.tests == () and sel.benchmarks == ()


def test_a_deleted_module_still_selects_its_importers(root):
    (root / "comp/data/tario.py").unlink()
    assert "suites/unit/data/test_tario.py" in selection.select(root, ["comp/data/tario.py"]).tests


def test_changed_files_sees_commits_staged_unstaged_and_untracked_files(root):
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-qm", "base")
    git("checkout", "-qb", "feature")
    (root / "comp/ring/simulation.py").write_text("STEPS = 4\n")
    git("commit", "-qam", "one line")
    (root / "comp/data/tario.py").write_text("def read():\n    return 1\n")  # unstaged
    (root / "comp/data/new.py").write_text("")  # untracked
    git("mv", "docs/ring.md", "docs/allreduce.md")  # staged rename: both paths listed
    base = selection.merge_base(root, "main")
    assert selection.changed_files(root, base) == [
        "comp/data/new.py",
        "comp/data/tario.py",
        "comp/ring/simulation.py",
        "docs/allreduce.md",
        "docs/ring.md",
    ]
    with pytest.raises(selection.SelectionError, match="'no-such-branch'.*--changed-since"):
        selection.merge_base(root, "no-such-branch")


def test_a_module_that_only_a_conftest_imports_selects_the_tests_under_that_conftest(root):
    # A server fixture's helper: the tests reach it only through their folder's conftest.py,
    # which pytest loads for every test below it (and only for those).
    files = {
        "comp/server.py": "def start():\n    pass\n",
        "suites/integration/store/conftest.py": "from comp.server import start\n",
        "suites/integration/store/test_put.py": "def test_put(server):\n    pass\n",
        "suites/integration/store/deep/test_get.py": "def test_get(server):\n    pass\n",
        "suites/integration/other/test_x.py": "def test_x():\n    pass\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    sel = selection.select(root, ["comp/server.py"])
    assert not sel.everything
    assert sel.tests == (
        "suites/integration/store/deep/test_get.py",
        "suites/integration/store/test_put.py",
    )


# A harness of its own: the plugin imports one module, a library function takes a parameter
# named like a fixture, and the tests run pytest in each of the ways a test can.
PLUGIN_PROJECT = {
    "harness/__init__.py": "",
    "harness/plugin.py": "from harness import quarantine\n",
    "harness/quarantine.py": "X = 1\n",
    "harness/merge.py": "X = 1\n",
    "comp/__init__.py": "",
    "comp/store.py": "def open_store(project):\n    return project\n",
    # pytest loads this for every test below suites/: a fixture built on pytester.
    "suites/conftest.py": "import pytest\n\n@pytest.fixture\ndef project(pytester):\n"
    "    return pytester\n",
    "suites/unit/test_pytester.py": "def test_it(pytester):\n    pass\n",
    "suites/unit/test_project_fixture.py": "def test_it(project):\n    pass\n",
    "suites/integration/test_child_pytest.py": (
        "import subprocess, sys\n"
        "def test_it():\n"
        "    subprocess.run([sys.executable, '-m', 'pytest', 'x'], check=False)\n"
    ),
    "suites/unit/test_imports_merge.py": "from harness import merge\n",
    # Reads pytest's configuration section: names "pytest", runs nothing (harness/layout.py).
    "harness/config.py": (
        "def section(toml):\n"
        "    return toml.get('tool', {}).get('pytest', {}), {'pytest.ini': 'pytest'}\n"
    ),
    "suites/unit/test_imports_config.py": "from harness import config\n",
    # Runs pytest through something the graph cannot see (act running a workflow), and says so.
    "suites/integration/test_declared.py": (
        "RUNS_PYTEST = True  # act runs the workflow, whose steps run harness\n"
        "def test_it():\n    pass\n"
    ),
    "suites/unit/test_store.py": "from comp import store\n",
    "suites/unit/test_plain.py": "def test_it():\n    pass\n",
    # A helper's parameter named like the fixture is not a request for it.
    "suites/unit/test_helper_param.py": (
        "def make(project='p'):\n    return project\n\ndef test_it():\n    assert make()\n"
    ),
    "suites/unit/test_fixture_on_project.py": (
        "import pytest\n\n@pytest.fixture\ndef inner(project):\n    return project\n\n"
        "def test_it(inner):\n    pass\n"
    ),
}


def test_a_harness_module_selects_the_tests_that_import_it_or_run_the_plugin_on_a_project(
    tmp_path,
):
    root = _write(tmp_path, PLUGIN_PROJECT)
    sel = selection.select(root, ["harness/quarantine.py"])
    assert not sel.everything, sel.reason
    # The plugin imports quarantine; these five run pytest, so the plugin, themselves (one
    # says so: RUNS_PYTEST). A test
    # merely run under the plugin is not selected, nor one whose library or helper takes a
    # `project` parameter.
    assert sel.tests == (
        "suites/integration/test_child_pytest.py",
        "suites/integration/test_declared.py",
        "suites/unit/test_fixture_on_project.py",
        "suites/unit/test_project_fixture.py",
        "suites/unit/test_pytester.py",
    )
    assert selection.select(root, ["harness/merge.py"]).tests == (
        "suites/unit/test_imports_merge.py",
    )
    # A module that names "pytest" only as a configuration section runs no pytest: importing
    # it does not reach the plugin (nor so quarantine), only the module itself.
    assert "suites/unit/test_imports_config.py" not in sel.tests
    assert selection.select(root, ["harness/config.py"]).tests == (
        "suites/unit/test_imports_config.py",
    )
    plugin = selection.select(root, ["harness/plugin.py"])
    assert plugin.everything and "harness/plugin.py" in plugin.reason


def test_the_plugin_entry_module_is_not_special_in_a_project_that_only_installs_the_harness(
    tmp_path,
):
    # No harness/ in the project: its tests run the installed plugin, which no change here can
    # touch, so running pytest adds no edge (and a `project` parameter selects nothing).
    files = {k: v for k, v in PLUGIN_PROJECT.items() if not k.startswith("harness/")}
    root = _write(tmp_path, files)
    assert selection.select(root, ["comp/store.py"]).tests == ("suites/unit/test_store.py",)


@pytest.mark.parametrize("ref", ["--fork-point", "-h", "--octopus"])
def test_a_base_ref_that_git_would_read_as_an_option_is_refused(root, ref):
    # `git merge-base --fork-point HEAD` answers with a commit: the option would choose the
    # base of the change instead of naming it.
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    with pytest.raises(selection.SelectionError, match=f"{ref!r}.*cannot start with '-'"):
        selection.merge_base(root, ref)


def test_a_package_run_with_python_m_by_a_string_reaches_its_main_module(root):
    # `python -m comp.ring` runs comp/ring/__main__.py, which nothing imports.
    (root / "comp/ring/__main__.py").write_text("from comp.ring import plan\nplan()\n")
    (root / "suites/integration/ring").mkdir(parents=True)
    (root / "suites/integration/ring/test_cli.py").write_text(
        "import subprocess, sys\n"
        "def test_cli():\n"
        "    subprocess.run([sys.executable, '-m', 'comp.ring'], check=True)\n"
    )
    sel = selection.select(root, ["comp/ring/__main__.py"])
    assert sel.tests == ("suites/integration/ring/test_cli.py",)


def test_a_deleted_helper_beside_a_test_still_selects_the_test_that_imports_it(root):
    # Deleted without updating its importer: the test now fails to import, so it must run.
    (root / "suites/unit/data/helpers.py").unlink()
    changed = ["suites/unit/data/helpers.py"]
    assert "suites/unit/data/test_uses_helper.py" in selection.select(root, changed).tests


def test_a_changed_module_that_no_test_imports_selects_everything_and_says_which(root):
    # A new module nothing imports yet: a selection without it would pass untested code.
    _write(root, {"comp/data/unused.py": "X = 1\n"})
    sel = selection.select(root, ["comp/data/tario.py", "comp/data/unused.py"])
    assert sel.everything
    assert sel.reason.startswith("comp/data/unused.py changed, and no test file imports it")
    # A benchmark-only module is the perf step's: it does not force every test.
    assert not selection.select(root, ["suites/benchmarks/bench_data.py"]).everything


# A team's project: tests in a flat tests/ folder, the layout in [tool.harness].
FLAT_PROJECT = {
    "mylib/__init__.py": "",
    "mylib/core.py": "def f():\n    return 1\n",
    "mylib/extra.py": "def g():\n    return 2\n",
    "tests/test_core.py": "from mylib.core import f\n",
    "tests/test_extra.py": "from mylib import extra\n",
    "tests/data/sample.json": "{}\n",
    "tests/goldens/test_core.json": "{}\n",
    "tests/benchmarks/bench_core.py": "from mylib.core import f\n",
    "pyproject.toml": "[tool.harness]\nsuites_dir = 'tests'\n",
}


@pytest.mark.parametrize(
    ("changed", "tests"),
    [
        (["mylib/core.py"], ("tests/test_core.py",)),
        (["tests/test_extra.py"], ("tests/test_extra.py",)),
        # No test file in tests/data/: the nearest folder above that has some.
        (["tests/data/sample.json"], ("tests/test_core.py", "tests/test_extra.py")),
        (["tests/goldens/test_core.json"], ("tests/test_core.py",)),
    ],
)
def test_a_flat_tests_folder_configured_in_pyproject_is_where_tests_are_selected(
    tmp_path, changed, tests
):
    root = _write(tmp_path, FLAT_PROJECT)
    sel = selection.select(root, changed)
    assert (sel.everything, sel.tests) == (False, tests), sel.reason


def test_the_flat_layout_times_only_the_benchmarks_the_change_reaches(tmp_path):
    root = _write(tmp_path, FLAT_PROJECT)
    assert selection.select(root, ["mylib/core.py"]).benchmarks == ("bench_core",)
    assert selection.select(root, ["mylib/extra.py"]).benchmarks == ()


def test_the_flat_layout_configured_in_setup_cfg_or_tox_ini_is_read_too(tmp_path):
    files = {k: v for k, v in FLAT_PROJECT.items() if k != "pyproject.toml"}
    for name, text in [
        ("setup.cfg", "[tool:pytest]\nharness_suites_dir = tests\n"),
        ("tox.ini", "[harness]\nsuites_dir = tests\n"),
    ]:
        root = _write(tmp_path / name, {**files, name: text})
        assert selection.select(root, ["mylib/core.py"]).tests == ("tests/test_core.py",)


def test_without_the_layout_a_flat_tests_folder_never_selects_nothing(tmp_path):
    # The default suites folder does not exist here: the change reaches no test file the
    # selection knows, so every test runs rather than none.
    files = {k: v for k, v in FLAT_PROJECT.items() if k != "pyproject.toml"}
    root = _write(tmp_path, files)
    sel = selection.select(root, ["mylib/core.py"])
    assert sel.everything and "no test file imports it" in sel.reason


# The benchmarks' graph follows names through a package's re-exports: a benchmark times the
# code it calls, so a change to a sibling module the package merely re-exports does not
# re-run it (the tests still run: an import error there breaks them).
BENCH_PROJECT = {
    "pkg/__init__.py": (
        "from pkg.launcher import launch\n"
        "from pkg.sim import simulate\n"
        "from pkg.sub import deep\n"
        "from pkg.core import setup\n"
        "VERSION = 3\n"
        "setup()\n"  # used by the package's own code: a real dependency of the package
        "__all__ = ['launch', 'simulate', 'deep', 'VERSION']\n"
    ),
    "pkg/launcher.py": "def launch():\n    pass\n",
    "pkg/sim.py": "def simulate():\n    pass\n",
    "pkg/core.py": "def setup():\n    pass\n",
    "pkg/table.toml": "n = 1\n",
    "pkg/sub/__init__.py": "from pkg.sub.impl import deep\n",
    "pkg/sub/impl.py": "def deep():\n    pass\n",
    "pkg/sub/other.py": "def other():\n    pass\n",
    "suites/unit/test_launch.py": "from pkg import launch\n",
    "suites/unit/test_other.py": "from pkg.sub import other\n",
    "suites/benchmarks/__init__.py": "",
    "suites/benchmarks/bench_launch.py": "from pkg import launch\n",
    "suites/benchmarks/bench_sim.py": "from pkg import simulate\n",
    "suites/benchmarks/bench_deep.py": "from pkg import deep\n",
    "suites/benchmarks/bench_version.py": "from pkg import VERSION\n",
    "suites/benchmarks/bench_whole.py": "import pkg\n",
    "suites/benchmarks/bench_by_string.py": "MODULE = 'pkg'\n",
}


@pytest.fixture
def bench_root(tmp_path: Path) -> Path:
    return _write(tmp_path, BENCH_PROJECT)


# What imports the whole package: every change below the package reaches these.
WHOLE = ("bench_by_string", "bench_whole")


@pytest.mark.parametrize(
    ("changed", "benchmarks"),
    [
        # A module re-exported by the package: only the benchmarks that use its names.
        ("pkg/sim.py", ("bench_sim", *WHOLE)),
        ("pkg/launcher.py", ("bench_launch", *WHOLE)),
        # Followed through a sub-package's own re-export to the defining module.
        ("pkg/sub/impl.py", ("bench_deep", *WHOLE)),
        ("pkg/sub/other.py", ()),
        # The package's own code (VERSION, the setup() call) runs for every name taken from it.
        ("pkg/__init__.py", ("bench_deep", "bench_launch", "bench_sim", "bench_version", *WHOLE)),
        ("pkg/core.py", ("bench_deep", "bench_launch", "bench_sim", "bench_version", *WHOLE)),
        # A data file: any module of the package may read it.
        ("pkg/table.toml", ("bench_deep", "bench_launch", "bench_sim", "bench_version", *WHOLE)),
    ],
)
def test_benchmarks_follow_the_names_they_import_through_package_re_exports(
    bench_root, changed, benchmarks
):
    sel = selection.select(bench_root, [changed])
    assert sel.benchmarks == tuple(sorted(benchmarks))


def test_a_re_exported_module_still_selects_every_test_that_imports_its_package(bench_root):
    # Tests keep the package-level graph: pkg/__init__ imports pkg.sim, so an import error
    # there fails test_launch even though launch itself does not use it.
    sel = selection.select(bench_root, ["pkg/sim.py"])
    assert sel.tests == ("suites/unit/test_launch.py", "suites/unit/test_other.py")
    assert "bench_launch" not in sel.benchmarks


# What importing a module of a package runs of the package: its ``__init__``'s top level, not
# the functions defined there (nor what they import when called); and a one-word string that
# tags data is not an import of the package it happens to spell.
LAZY_PROJECT = {
    "pkg/__init__.py": "def record():\n    from pkg.heavy import go\n    go()\n",
    "pkg/heavy.py": "def go():\n    pass\n",
    "pkg/records.py": "def make(source=None):\n    pass\n",
    "suites/unit/test_records.py": "from pkg.records import make\n",
    "suites/benchmarks/__init__.py": "",
    "suites/benchmarks/bench_records.py": (
        "from pkg.records import make\n\n"
        "def time_make():\n"
        "    if make(source='pkg') == 'pkg':\n"
        "        return {'pkg': 'pkg'}\n"
    ),
    "suites/benchmarks/bench_record.py": "from pkg import record\n",
    "suites/benchmarks/bench_import_module.py": (
        "import importlib\n\nimportlib.import_module(name='pkg')\n"
    ),
    "suites/benchmarks/bench_argv.py": "ARGV = ['-m', 'pkg']\n",
    # ``import pkg`` gives all of it, whatever else the file takes from pkg afterwards.
    "suites/benchmarks/bench_mixed.py": "import pkg\nfrom pkg import records\n",
}


@pytest.mark.parametrize(
    ("changed", "benchmarks"),
    [
        # Called only from a function of the package's __init__: the benchmarks that take
        # that function (or the whole package) are re-timed, not one that imports a sibling.
        ("pkg/heavy.py", ("bench_argv", "bench_import_module", "bench_mixed", "bench_record")),
        ("pkg/records.py", ("bench_mixed", "bench_records")),
        # The __init__'s own top level runs under every import of the package.
        (
            "pkg/__init__.py",
            ("bench_argv", "bench_import_module", "bench_mixed", "bench_record", "bench_records"),
        ),
    ],
)
def test_a_benchmark_times_a_parent_package_only_by_its_import_time_code(
    tmp_path, changed, benchmarks
):
    sel = selection.select(_write(tmp_path, LAZY_PROJECT), [changed])
    assert sel.benchmarks == benchmarks


def test_tests_still_depend_on_the_whole_parent_package(tmp_path):
    # An import error in pkg/heavy.py fails nothing at import, but the tests' graph keeps
    # every edge of the package: a test of pkg.records runs when anything of pkg changes.
    sel = selection.select(_write(tmp_path, LAZY_PROJECT), ["pkg/heavy.py"])
    assert sel.tests == ("suites/unit/test_records.py",)


def test_a_selection_of_gpu_benchmarks_only_skips_the_cpu_perf_step_saying_so() -> None:
    from harness import prmode

    def sel(files: tuple[str, ...], names: tuple[str, ...]) -> selection.Selection:
        return selection.Selection(
            base="b",
            changed=(),
            everything=False,
            reason="",
            benchmarks=files,
            benchmark_names=names,
        )

    gpu = ("bench_h.GpuAssertClose.time_assert_close", "bench_a.AttentionGPU.time_forward")
    why = prmode._skip_perf(sel((), gpu))
    assert why is not None and "all in the GPU group" in why
    assert prmode._skip_perf(sel((), (*gpu, "bench_h.AssertClose.time_assert_close"))) is None
    assert prmode._skip_perf(sel(("bench_h",), gpu)) is None  # a whole file: its CPU ones too
    assert prmode._skip_perf(sel((), ())) == "no benchmark file reaches the change"


def test_whole_benchmark_files_in_a_subfolder_are_named_as_asv_names_them() -> None:
    regex = selection.bench_regex(["sub.bench_s", "bench_a"], ["bench_b.X.time_x"])
    assert regex is not None
    assert re.search(regex, "sub.bench_s.S.time_s")
    assert re.search(regex, "bench_a.A.time_a(1, 2)")
    assert re.search(regex, "bench_b.X.time_x")
    assert not re.search(regex, "subXbench_s.S.time_s")  # the dot is a dot
    assert not re.search(regex, "bench_b.X.time_xy")
    assert selection._asv_module("suites/benchmarks/sub/bench_s.py", ["suites/benchmarks"]) == (
        "sub.bench_s"
    )
