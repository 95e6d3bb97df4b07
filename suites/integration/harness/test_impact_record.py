"""`harness impact record` on a small git project, end to end: coverage.py in the pytest
workers and in a subprocess a test starts, a session fixture's work marked ambient, and what
pull-request mode then selects for a change inside one function (harness.impact)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_asv_project import git

from harness import prmode

pytest.importorskip("xdist")

# The env check step of harness ci compares this venv with the repository's lock.
LOCK = Path(__file__).resolve().parents[3] / "requirements" / "cpu.lock"
pytest.importorskip("coverage")

MODULE = """
    def direct(x):
        return x + 1


    def in_subprocess(x):
        return x * 2


    def shared(x):
        return x - 1


    def unused(x):
        return x


    def timed(x):
        return x * 5


    def cached(x):
        return x + 7


    def memo(x):
        return x - 3


    def in_clean_child(x):
        return x + 9


    def once(x):
        return x * 7
"""

# Benchmarks (asv's conventions): one runs `timed` itself, one runs `in_subprocess` in a
# process it starts, two classes share a setup_cache that runs `cached`, and one skips itself
# in setup (as a GPU benchmark does on a CPU machine), so the recording cannot see into it.
BENCHMARKS = """
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pkg import mod


    class Timed:
        def time_timed(self):
            mod.timed(3)


    class Sub:
        def time_sub(self):
            # asv runs benchmarks in a temporary folder: the project is named, not the cwd.
            root = Path(__file__).resolve().parents[2]
            code = "import pkg.mod as m; m.in_subprocess(2)"
            subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


    class _Shared:
        def setup_cache(self):
            Path("cache-was-here").write_text("")  # in asv's folder, never the repository
            return mod.cached(1)


    class A(_Shared):
        def time_a(self, value):
            assert value == 8 and os.path.exists("cache-was-here")


    class B(_Shared):
        def time_b(self, value):
            assert value == 8


    class Gpu:
        def setup(self):
            raise NotImplementedError("no GPU here")

        def time_gpu(self):
            mod.timed(1)


    # Built once per process and kept (as bench_data's shards are): each benchmark runs in a
    # process of its own, as under asv, so both are seen building it.
    _MEMO = {}


    def _built():
        if not _MEMO:
            _MEMO["v"] = mod.memo(4)
        return _MEMO["v"]


    class Memo1:
        def setup(self):
            self.v = _built()

        def time_m1(self):
            assert self.v == 1


    class Memo2:
        def setup(self):
            self.v = _built()

        def time_m2(self):
            assert self.v == 1


    # number = 1: asv runs setup before every call (a training loop that refuses to overwrite
    # its checkpoints is such a benchmark); the recording's second call must do the same.
    class Once:
        number = 1

        def setup(self):
            self.used = False

        def time_once(self):
            assert not self.used, "called twice after one setup"
            self.used = True
            mod.once(1)


    class CleanChild:
        def time_clean(self):
            # An environment without coverage's start-up variable: what the child runs is
            # unseen, so the benchmark is not counted as seen.
            root = Path(__file__).resolve().parents[2]
            code = "import pkg.mod as m; m.in_clean_child(1)"
            env = {"PATH": os.environ["PATH"]}
            subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True)
"""

ASV_CONF = {
    "version": 1,
    "project": "impact",
    "repo": ".",
    "branches": ["HEAD"],
    "environment_type": "existing",
    "benchmark_dir": "suites/benchmarks",
    "results_dir": ".asv/results",
    "html_dir": ".asv/html",
}

FILES = {
    "pkg/__init__.py": "",
    "pkg/mod.py": MODULE,
    "suites/conftest.py": """
        import pytest
        from pkg import mod

        @pytest.fixture(scope="session")
        def server():
            return mod.shared(1)
    """,
    "suites/unit/test_direct.py": """
        from pkg import mod

        def test_direct():
            assert mod.direct(1) == 2
    """,
    # No import of pkg in this file: only the subprocess runs it.
    "suites/unit/test_sub.py": """
        import subprocess, sys

        def test_sub():
            code = "import pkg.mod as m; print(m.in_subprocess(2))"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            assert out.stdout.strip() == "4", out.stderr
    """,
    "suites/unit/test_fixture.py": """
        def test_uses_server(server):
            assert server == 0
    """,
    "suites/unit/test_timed.py": """
        from pkg import mod

        def test_timed_and_cached():
            assert mod.timed(1) == 5 and mod.cached(1) == 8
            assert mod.memo(4) == 1 and mod.in_clean_child(1) == 10 and mod.once(1) == 7
    """,
    "asv.conf.json": json.dumps(ASV_CONF),
    ".gitignore": ".asv/\n__pycache__/\n",
    "suites/benchmarks/__init__.py": "",
    "suites/benchmarks/bench_mod.py": BENCHMARKS,
}


# The outer run's settings must not leak into the recorded project's runs (as the project
# fixture of suites/conftest.py does for pytester runs).
_OUTER = ("CI", "HARNESS_SEED", "HYPOTHESIS_PROFILE", "HARNESS_HISTORY_DB", "GITHUB_ACTIONS")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _OUTER}


def _run(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the project, without the outer run's settings."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=root,
        env=_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _record(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(root, "-m", "harness.cli", "impact", "record", *args)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    return root


@pytest.fixture(scope="module")
def recorded_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One recording (every process under coverage: the slow part), copied per test."""
    root = _write(tmp_path_factory.mktemp("impact") / "project", FILES)
    proc = _record(root, "--workers", "2", "--", "-p", "no:cacheprovider")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.fixture
def recorded(recorded_once: Path, tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(recorded_once, root)
    return root


def test_the_map_names_the_test_file_that_ran_each_function_in_any_process(recorded) -> None:
    payload = json.loads((recorded / ".harness" / "impact.json").read_text())
    assert payload["commit"] == git(recorded, "rev-parse", "HEAD")
    assert payload["clean"] is True
    units = payload["files"]["pkg/mod.py"]["units"]
    assert units["direct"] == {"tests": ["suites/unit/test_direct.py"], "ambient": False}
    # Run only in the subprocess test_sub starts: its coverage is labelled with the test.
    assert units["in_subprocess"]["tests"] == ["suites/unit/test_sub.py"]
    assert units["in_subprocess"]["ambient"] is False
    # A session fixture is shared by every test that asks for it: ambient, not one test's.
    assert units["shared"] == {"tests": [], "ambient": True}
    assert "unused" not in units
    # Every test file ran its own test function (test files are measured too).
    assert payload["test_files"] == [
        "suites/unit/test_direct.py",
        "suites/unit/test_fixture.py",
        "suites/unit/test_sub.py",
        "suites/unit/test_timed.py",
    ]


def test_the_map_names_the_benchmarks_that_ran_each_function(recorded) -> None:
    payload = json.loads((recorded / ".harness" / "impact.json").read_text())
    units = payload["files"]["pkg/mod.py"]["units"]
    assert units["timed"]["benchmarks"] == ["bench_mod.Timed.time_timed"]
    # In a process the benchmark started: labelled through the environment, as for tests.
    assert units["in_subprocess"] == {
        "tests": ["suites/unit/test_sub.py"],
        "ambient": False,
        "benchmarks": ["bench_mod.Sub.time_sub"],
    }
    # One setup_cache run, shared by two classes: both are credited with it.
    assert units["cached"]["benchmarks"] == ["bench_mod.A.time_a", "bench_mod.B.time_b"]
    assert "benchmarks" not in units["direct"]
    # Kept in a module-level dict by whichever benchmark came first: both are credited.
    assert units["memo"]["benchmarks"] == ["bench_mod.Memo1.time_m1", "bench_mod.Memo2.time_m2"]
    ran = {name: b["ran"] for name, b in payload["benchmarks"].items()}
    assert ran == {
        "bench_mod.A.time_a": True,
        "bench_mod.B.time_b": True,
        "bench_mod.CleanChild.time_clean": False,
        "bench_mod.Gpu.time_gpu": False,
        "bench_mod.Memo1.time_m1": True,
        "bench_mod.Memo2.time_m2": True,
        "bench_mod.Once.time_once": True,
        "bench_mod.Sub.time_sub": True,
        "bench_mod.Timed.time_timed": True,
    }
    assert {b["file"] for b in payload["benchmarks"].values()} == {"suites/benchmarks/bench_mod.py"}
    # They ran in temporary folders, as asv runs them: nothing written into the repository.
    assert not list(recorded.rglob("cache-was-here"))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # The benchmark that ran it, and those the recording could not see into: one skipped
        # itself here (what it runs on a GPU machine is unknown), one started a process
        # coverage could not follow.
        (
            "return x * 5",
            "return x * 6",
            [
                "bench_mod.CleanChild.time_clean",
                "bench_mod.Gpu.time_gpu",
                "bench_mod.Timed.time_timed",
            ],
        ),
        (
            "return x + 7",
            "return x + 8",
            [
                "bench_mod.A.time_a",
                "bench_mod.B.time_b",
                "bench_mod.CleanChild.time_clean",
                "bench_mod.Gpu.time_gpu",
            ],
        ),
        # Run by no benchmark: only those whose code is unknown.
        (
            "return x + 1",
            "return x + 2",
            ["bench_mod.CleanChild.time_clean", "bench_mod.Gpu.time_gpu"],
        ),
        # Not imported by the benchmark that runs it: found through the process it starts.
        (
            "return x * 2",
            "return x * 3",
            ["bench_mod.CleanChild.time_clean", "bench_mod.Gpu.time_gpu", "bench_mod.Sub.time_sub"],
        ),
        # Kept by whichever benchmark came first, under asv as here: each in its own process.
        (
            "return x - 3",
            "return x - 4",
            [
                "bench_mod.CleanChild.time_clean",
                "bench_mod.Gpu.time_gpu",
                "bench_mod.Memo1.time_m1",
                "bench_mod.Memo2.time_m2",
            ],
        ),
    ],
)
def test_a_change_inside_a_function_re_times_only_the_benchmarks_that_ran_it(
    recorded: Path, old: str, new: str, expected: list[str]
) -> None:
    mod = recorded / "pkg" / "mod.py"
    mod.write_text(mod.read_text().replace(old, new))
    plan = prmode.plan(recorded, base_ref="main", workers="0")
    assert plan.selection is not None and not plan.selection.everything
    assert plan.selection.benchmarks == ()  # no whole file
    assert list(plan.selection.benchmark_names) == expected
    regex = re.compile(plan.bench or "(?!)")
    every = [
        "bench_mod.A.time_a",
        "bench_mod.B.time_b",
        "bench_mod.CleanChild.time_clean",
        "bench_mod.Gpu.time_gpu",
    ]
    every += ["bench_mod.Memo1.time_m1", "bench_mod.Memo2.time_m2", "bench_mod.Once.time_once"]
    every += ["bench_mod.Sub.time_sub"]
    every += ["bench_mod.Timed.time_timed"]
    assert [n for n in every if regex.search(n)] == expected
    assert plan.skip_perf is None

    # A benchmark file the recording found nothing in (it failed to import then): whole.
    path = recorded / ".harness" / "impact.json"
    payload = json.loads(path.read_text())
    payload["benchmarks"] = {"bench_other.X.time_x": {"file": "elsewhere.py", "ran": True}}
    path.write_text(json.dumps(payload))
    unseen = prmode.plan(recorded, base_ref="main", workers="0")
    assert unseen.selection is not None
    assert unseen.selection.benchmarks == ("bench_mod",)
    assert unseen.selection.benchmark_names == ()  # its benchmarks are in the whole file

    # Without the benchmark table (a map recorded with --no-benchmarks): the whole file.
    del payload["benchmarks"]
    path.write_text(json.dumps(payload))
    wide = prmode.plan(recorded, base_ref="main", workers="0")
    assert wide.selection is not None
    assert wide.selection.benchmarks == ("bench_mod",) and wide.selection.benchmark_names == ()


def test_a_change_inside_a_function_selects_only_the_test_files_that_ran_it(recorded) -> None:
    mod = recorded / "pkg" / "mod.py"
    mod.write_text(mod.read_text().replace("return x * 2", "return x * 3"))
    plan = prmode.plan(recorded, base_ref="main", workers="0")
    assert plan.selection is not None and not plan.selection.everything
    assert plan.selection.tests == ("suites/unit/test_sub.py",)
    assert any("changed in_subprocess" in note for note in plan.selection.impact)

    # harness ci itself: the note names the function, selection.json keeps it, and it runs.
    reports = recorded.parent / "reports"  # outside the project: not a change of its own
    proc = _run(
        recorded,
        *("-m", "harness.cli", "ci", "--no-perf", "--changed-since", "main", "--workers", "0"),
        *("--lock", str(LOCK), "--report-dir", str(reports)),
    )
    # The change breaks test_sub (in_subprocess(2) is 6 now): the one test selected catches it.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED suites/unit/test_sub.py::test_sub" in proc.stdout
    note = (
        "[impact map: pkg/mod.py: changed in_subprocess: run by 1 test file(s) and 1 benchmark(s)]"
    )
    assert note in " ".join(proc.stdout.split())
    selection = json.loads((reports / "selection.json").read_text())
    assert selection["tests"] == ["suites/unit/test_sub.py"]
    assert selection["impact"] == [
        "pkg/mod.py: changed in_subprocess: run by 1 test file(s) and 1 benchmark(s)"
    ]

    # The same change without the map: every test file the import graph reaches.
    (recorded / ".harness" / "impact.json").unlink()
    wide = prmode.plan(recorded, base_ref="main", workers="0")
    assert wide.selection is not None and wide.selection.impact == ()
    assert "suites/unit/test_direct.py" in wide.selection.tests


def test_what_the_map_cannot_narrow_is_selected_on_the_import_graph(recorded) -> None:
    mod = recorded / "pkg" / "mod.py"
    # A session fixture's code, then module-level code: both reach tests the map cannot name.
    mod.write_text(mod.read_text().replace("return x - 1", "return x - 2"))
    plan = prmode.plan(recorded, base_ref="main", workers="0")
    assert plan.selection is not None
    assert {"suites/unit/test_direct.py", "suites/unit/test_fixture.py"} <= set(
        plan.selection.tests
    )
    assert any("shared runs outside tests only" in note for note in plan.selection.impact)

    git(recorded, "checkout", "-q", "--", "pkg/mod.py")
    mod.write_text(mod.read_text() + "\nLIMIT = 3\n")
    plan = prmode.plan(recorded, base_ref="main", workers="0")
    assert plan.selection is not None
    assert "suites/unit/test_fixture.py" in plan.selection.tests
    assert any("outside function bodies" in note for note in plan.selection.impact)


def test_a_recorded_test_file_that_is_not_there_is_not_trusted(recorded) -> None:
    # As a map whose test ids are relative to a rootdir below the repository's top would be.
    path = recorded / ".harness" / "impact.json"
    path.write_text(path.read_text().replace('"suites/unit/test_sub.py"', '"test_sub.py"'))
    mod = recorded / "pkg" / "mod.py"
    mod.write_text(mod.read_text().replace("return x * 2", "return x * 3"))
    plan = prmode.plan(recorded, base_ref="main", workers="0")
    assert plan.selection is not None and plan.selection.tests  # never an empty selection
    assert any("test file test_sub.py is not here" in note for note in plan.selection.impact)


def test_a_map_from_another_commit_is_not_used_and_says_why(recorded) -> None:
    (recorded / "README.md").write_text("later\n")
    git(recorded, "add", "-A")
    git(recorded, "commit", "-q", "-m", "later")
    mod = recorded / "pkg" / "mod.py"
    mod.write_text(mod.read_text().replace("return x * 2", "return x * 3"))
    plan = prmode.plan(recorded, base_ref="main", workers="0")
    assert plan.selection is not None
    assert "suites/unit/test_direct.py" in plan.selection.tests
    assert any("not at the base" in note for note in plan.selection.impact)


def test_a_failing_run_writes_no_map_and_a_bad_map_is_a_usage_error(tmp_path: Path) -> None:
    failing = {**FILES, "suites/unit/test_fail.py": "def test_fail():\n    assert False\n"}
    root = _write(tmp_path / "project", failing)
    proc = _record(root, "--workers", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no map written" in proc.stdout
    assert not (root / ".harness" / "impact.json").exists()

    bad = root / "bad.json"
    bad.write_text("{")
    ci = _run(root, "-m", "harness.cli", "ci", "--no-perf", "--impact-map", str(bad))
    assert ci.returncode == 2, ci.stdout + ci.stderr
    assert f"--impact-map: {bad}: not an impact map" in ci.stdout + ci.stderr
    assert "Traceback" not in ci.stdout + ci.stderr


def test_a_benchmark_file_that_does_not_import_is_left_out_and_runs_whole(
    tmp_path: Path,
) -> None:
    broken = "from pkg import mod\nimport no_such_module_here\n"
    root = _write(tmp_path / "project", {**FILES, "suites/benchmarks/bench_broken.py": broken})
    proc = _record(root, "--workers", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = json.loads((root / ".harness" / "impact.json").read_text())
    assert "bench_mod.Timed.time_timed" in payload["benchmarks"]  # the other file's are there
    assert not any(name.startswith("bench_broken") for name in payload["benchmarks"])
    mod = root / "pkg" / "mod.py"
    mod.write_text(mod.read_text().replace("return x * 5", "return x * 6"))
    plan = prmode.plan(root, base_ref="main", workers="0")
    assert plan.selection is not None
    assert plan.selection.benchmarks == ("bench_broken",)
    assert set(plan.selection.benchmark_names) == {
        "bench_mod.CleanChild.time_clean",
        "bench_mod.Gpu.time_gpu",
        "bench_mod.Timed.time_timed",
    }


FORKSERVER_FILES = {
    "pkg/__init__.py": "",
    "pkg/work.py": """
        def rank_work(n):
            return n + 1


        def other_work(n):
            return n + 2
    """,
    # As reference_impls/collectives/launcher.py starts ranks: from multiprocessing's
    # forkserver, one per process, started by whichever test needs it first.
    "pkg/launch.py": """
        import multiprocessing


        def run(fn, n):
            process = multiprocessing.get_context("forkserver").Process(target=fn, args=(n,))
            process.start()
            process.join()
            assert process.exitcode == 0
    """,
    "suites/unit/test_a.py": """
        from pkg import launch, work

        def test_a():
            launch.run(work.other_work, 1)
    """,
    "suites/unit/test_b.py": """
        from pkg import launch, work

        def test_b():
            launch.run(work.rank_work, 1)
    """,
}


def test_processes_a_forkserver_starts_carry_the_label_of_the_test_that_asked(
    tmp_path: Path,
) -> None:
    # The forkserver forks from its own state: started by test_a, it would hand test_a's label
    # to the rank test_b starts, and a change to rank_work would select test_a only.
    root = _write(tmp_path / "project", FORKSERVER_FILES)
    proc = _record(root, "--workers", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = json.loads((root / ".harness" / "impact.json").read_text())
    units = payload["files"]["pkg/work.py"]["units"]
    assert units["rank_work"]["tests"] == ["suites/unit/test_b.py"]
    assert units["other_work"]["tests"] == ["suites/unit/test_a.py"]


def test_the_recorder_plugin_without_coverage_is_a_usage_error(tmp_path: Path) -> None:
    root = _write(tmp_path / "project", FILES)
    env = {k: v for k, v in _env().items() if not k.startswith("COVERAGE_PROCESS")}
    proc = _run(root, "-m", "pytest", "-p", "harness.impact.recorder", "suites/unit", env=env)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "coverage is not measuring this process" in proc.stdout + proc.stderr
