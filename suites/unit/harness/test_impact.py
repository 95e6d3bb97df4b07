"""harness.impact without recording: which function bodies a change touches, and what a map
says about a changed module (the recording: suites/integration/harness/test_impact_record.py)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from harness import impact
from harness.impact import ImpactError, ImpactMap, changed_units

BASE = textwrap.dedent(
    '''
    """A module."""
    import os

    LIMIT = 3

    def f(x):
        # a comment
        return x + 1

    def g(x, y=LIMIT):
        def inner(z):
            return z * 2
        return inner(x) + y

    class C:
        def m(self):
            return 1

        @property
        def p(self):
            return 2

        @p.setter
        def p(self, value):
            self._p = value

        class Inner:
            def deep(self):
                return os.sep
    '''
)


def _edit(old: str, new: str, source: str = BASE) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


def test_units_are_module_and_class_level_functions_with_their_body_lines() -> None:
    spans = impact.units(BASE)
    assert sorted(spans) == ["C.Inner.deep", "C.m", "C.p", "C.p#2", "f", "g"]
    lines = BASE.splitlines()
    first, last = spans["g"]
    # The body only: the def line (defaults run at import) is the module's.
    assert lines[first - 1].strip() == "def inner(z):"
    assert lines[last - 1].strip() == "return inner(x) + y"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("return x + 1", "return x + 2", {"f"}),
        ("return z * 2", "return z * 3", {"g"}),  # a nested function belongs to its unit
        ("return 1", "return 10", {"C.m"}),
        ("self._p = value", "self._p = -value", {"C.p#2"}),
        ("return os.sep", "return os.pathsep", {"C.Inner.deep"}),
        ("# a comment", "# another comment", set()),
        ("return x + 1", "return  x+1", set()),  # formatting only
    ],
)
def test_a_change_inside_bodies_names_the_units(old: str, new: str, expected: set[str]) -> None:
    assert changed_units(BASE, _edit(old, new)) == expected


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("LIMIT = 3", "LIMIT = 4"),  # module-level code
        ("def g(x, y=LIMIT):", "def g(x, y=LIMIT + 1):"),  # a default runs at import
        ("def f(x):", "def f(x, extra=None):"),  # a signature
        ("    @property\n", "    @staticmethod\n"),  # a decorator
        ('"""A module."""', '"""The module."""'),  # the module's docstring is module code
        ("class C:", "class C(object):"),
        ("import os", "import os\n\ndef added():\n    return 0"),  # a unit added
        ("return x + 1", "return x +"),  # the head does not parse
        # A docstring is read without a call (__doc__, click's --help): the module's.
        ("def f(x):\n", 'def f(x):\n    """Add one."""\n'),
        # A generator returns before its body runs: what a call gives changes.
        ("return x + 1", "yield x + 1"),
    ],
)
def test_anything_outside_bodies_is_a_module_level_change(old: str, new: str) -> None:
    assert changed_units(BASE, _edit(old, new)) is None


def test_a_unit_removed_is_a_module_level_change() -> None:
    removed = _edit("    def m(self):\n        return 1\n\n", "")
    assert changed_units(BASE, removed) is None
    assert changed_units(removed, BASE) is None


def _map(tmp_path: Path, **overrides: object) -> Path:
    payload: dict[str, object] = {
        "version": 1,
        "commit": "a" * 40,
        "clean": True,
        "recorded": "2026-12-02T00:00:00+00:00",
        "test_files": ["suites/unit/test_f.py", "suites/unit/test_g.py"],
        "files": {
            "pkg/mod.py": {
                "sha256": impact._sha256(BASE),
                "units": {
                    "f": {"tests": ["suites/unit/test_f.py"], "ambient": False},
                    "g": {"tests": ["suites/unit/test_g.py"], "ambient": True},
                    "C.m": {"tests": [], "ambient": True},
                },
            }
        },
    }
    payload.update(overrides)
    path = tmp_path / "impact.json"
    path.write_text(json.dumps(payload))
    return path


def test_a_body_change_selects_the_test_files_that_ran_it(tmp_path: Path) -> None:
    found = ImpactMap.load(_map(tmp_path)).module("pkg/mod.py", BASE, _edit("x + 1", "x + 2"))
    assert found.tests == frozenset({"suites/unit/test_f.py"})
    assert "changed f" in found.reason


def test_a_body_change_names_the_benchmarks_that_ran_it_when_they_were_recorded(
    tmp_path: Path,
) -> None:
    table = {
        "bench_m.F.time_f": {"file": "suites/benchmarks/bench_m.py", "ran": True},
        "bench_m.G.time_g": {"file": "suites/benchmarks/bench_m.py", "ran": False},
    }
    units = {
        "f": {
            "tests": ["suites/unit/test_f.py"],
            "ambient": False,
            "benchmarks": ["bench_m.F.time_f"],
        },
        "C.m": {"tests": ["suites/unit/test_f.py"], "ambient": False},
    }
    files = {"pkg/mod.py": {"sha256": impact._sha256(BASE), "units": units}}
    loaded = ImpactMap.load(_map(tmp_path, files=files, benchmarks=table))
    assert loaded.module("pkg/mod.py", BASE, _edit("x + 1", "x + 2")).benchmarks == {
        "bench_m.F.time_f"
    }
    # Run by a test and by no benchmark: no benchmark re-timed for it (an empty set, not None).
    assert loaded.module("pkg/mod.py", BASE, _edit("return 1", "return 3")).benchmarks == set()
    assert loaded.benchmarks_not_run("suites/benchmarks/bench_m.py") == {"bench_m.G.time_g"}
    assert loaded.benchmark_file_seen("suites/benchmarks/bench_m.py")
    assert not loaded.benchmark_file_seen("suites/benchmarks/bench_new.py")
    # A map recorded without benchmarks says nothing about them: None, the import graph decides.
    plain = ImpactMap.load(_map(tmp_path, files=files))
    assert plain.module("pkg/mod.py", BASE, _edit("x + 1", "x + 2")).benchmarks is None


def test_building_a_map_credits_each_benchmark_and_every_sharer_of_a_cache(
    tmp_path: Path,
) -> None:
    coverage = pytest.importorskip("coverage")
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    source = "def a():\n    return 1\n\n\ndef b():\n    return 2\n\n\ndef c():\n    return 3\n"
    mod = root / "pkg" / "mod.py"
    mod.write_text(source)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data = coverage.CoverageData(basename=str(data_dir / "cov"), suffix="1")
    for context, line in [
        ("asv:bench_x.T.time_t", 2),
        ("asv-cache:0", 6),
        ("suites/unit/test_m.py::test_c", 10),
        ("suites/unit/test_m.py::test_c", 2),
    ]:
        data.set_context(context)
        data.add_lines({str(mod): [line]})
    data.write()
    side = {
        "benchmarks": {
            "bench_x.T.time_t": {"file": "suites/benchmarks/bench_x.py", "ran": True},
            "bench_x.A.time_a": {"file": "suites/benchmarks/bench_x.py", "ran": True},
            "bench_x.B.time_b": {"file": "suites/benchmarks/bench_x.py", "ran": False},
        },
        "caches": {"asv-cache:0": ["bench_x.A.time_a", "bench_x.B.time_b"]},
    }
    payload = impact.build(root, data_dir, side)
    units = payload["files"]["pkg/mod.py"]["units"]
    assert units["a"] == {
        "tests": ["suites/unit/test_m.py"],
        "ambient": False,
        "benchmarks": ["bench_x.T.time_t"],
    }
    assert units["b"] == {
        "tests": [],
        "ambient": False,
        "benchmarks": ["bench_x.A.time_a", "bench_x.B.time_b"],
    }
    assert units["c"] == {"tests": ["suites/unit/test_m.py"], "ambient": False}
    assert payload["test_files"] == ["suites/unit/test_m.py"]  # no benchmark among them
    assert payload["benchmarks"]["bench_x.B.time_b"] == {
        "file": "suites/benchmarks/bench_x.py",
        "ran": False,
    }


def test_a_comment_only_change_selects_no_test_file(tmp_path: Path) -> None:
    found = ImpactMap.load(_map(tmp_path)).module("pkg/mod.py", BASE, _edit("a comment", "b"))
    assert found.tests == frozenset()


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("return z * 2", "return z * 3", "also runs outside tests"),  # g: ambient too
        ("return 1", "return 10", "runs outside tests only"),  # C.m: only ambient
        ("return os.sep", "return os.pathsep", "no recorded test runs C.Inner.deep"),
        ("LIMIT = 3", "LIMIT = 4", "code outside function bodies changed"),
    ],
)
def test_what_the_map_cannot_narrow_goes_back_to_the_import_graph(
    tmp_path: Path, old: str, new: str, why: str
) -> None:
    found = ImpactMap.load(_map(tmp_path)).module("pkg/mod.py", BASE, _edit(old, new))
    assert found.tests is None
    assert why in found.reason


def test_a_base_that_is_not_the_recorded_version_is_not_narrowed(tmp_path: Path) -> None:
    other = _edit("LIMIT = 3", "LIMIT = 5")
    found = ImpactMap.load(_map(tmp_path)).module("pkg/mod.py", other, _edit("x + 1", "x + 2"))
    assert found.tests is None
    assert "not the one recorded" in found.reason


def test_a_file_no_test_ran_or_one_added_or_deleted_is_not_narrowed(tmp_path: Path) -> None:
    loaded = ImpactMap.load(_map(tmp_path))
    assert loaded.module("pkg/other.py", "x = 1\n", "x = 2\n").tests is None
    assert loaded.module("pkg/mod.py", None, BASE).tests is None
    assert loaded.module("pkg/mod.py", BASE, None).tests is None


def test_the_map_is_used_only_at_its_own_commit_from_a_clean_tree(tmp_path: Path) -> None:
    loaded = ImpactMap.load(_map(tmp_path))
    assert loaded.usable_for("a" * 40) is None
    assert "not at the base bbbbbbbbbb" in str(loaded.usable_for("b" * 40))
    dirty = ImpactMap.load(_map(tmp_path, clean=False))
    assert "uncommitted changes" in str(dirty.usable_for("a" * 40))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"version": 99}', "found 99"),
        ("[1, 2]", "found 'list'"),
        ('{"version": 1, "commit": "x"}', "damaged impact map"),
        (
            '{"version": 1, "commit": "x", "clean": true, "recorded": "", "test_files": [], '
            '"files": {"a.py": {"sha256": 1, "units": {}}}}',
            "damaged impact map (at a.py)",
        ),
        (
            '{"version": 1, "commit": "x", "clean": true, "recorded": "", "test_files": [], '
            '"files": {"a.py": {"sha256": "h", "units": {"f": {"tests": "t.py", '
            '"ambient": false}}}}}',
            "damaged impact map (at a.py: f)",
        ),
        (
            '{"version": 1, "commit": "x", "clean": true, "recorded": "", "test_files": [], '
            '"files": {"a.py": {"sha256": "h", "units": {"f": {"tests": [], '
            '"ambient": false, "benchmarks": "bench_a.T.time_t"}}}}}',
            "damaged impact map (at a.py: f)",
        ),
        (
            '{"version": 1, "commit": "x", "clean": true, "recorded": "", "test_files": [], '
            '"files": {}, "benchmarks": {"bench_a.T.time_t": {"file": 1, "ran": true}}}',
            "damaged impact map (at benchmarks: bench_a.T.time_t)",
        ),
        (
            '{"version": 1, "commit": "x", "clean": true, "recorded": "", "test_files": [], '
            '"files": {}, "benchmarks": []}',
            "damaged impact map (at benchmarks)",
        ),
        ("[" * 100_000, "invalid JSON"),
    ],
)
def test_a_bad_map_is_an_error_naming_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "impact.json"
    path.write_text(content)
    with pytest.raises(ImpactError, match=re.escape(message)) as info:
        ImpactMap.load(path)
    assert str(path) in str(info.value)


def test_a_missing_map_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ImpactError, match="cannot read the impact map"):
        ImpactMap.load(tmp_path / "nope.json")


def test_the_recording_configuration_reads_the_test_id_from_the_environment(
    tmp_path: Path,
) -> None:
    from coverage.config import read_coverage_config

    rc = tmp_path / "coveragerc"
    rc.write_text(impact.rcfile_text(tmp_path, tmp_path / "data" / "cov"))
    env = impact.environment(rc, base={"PATH": "/bin", "COVERAGE_PROCESS_CONFIG": "x"})
    assert env["COVERAGE_PROCESS_START"] == str(rc)
    assert "COVERAGE_PROCESS_CONFIG" not in env
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(impact.CONTEXT_ENV, "suites/unit/test_x.py::test_y")
        config = read_coverage_config(config_file=str(rc), warn=lambda msg, **_: None)
    assert config.context == "suites/unit/test_x.py::test_y"
    assert config.parallel is True
    assert str(tmp_path / ".venv") + "/*" in config.run_omit


IMPORT_TIME = textwrap.dedent(
    """
    import json
    from pkg import mod

    def f():
        return k()

    def k():
        return 1

    def g():
        return 2

    def h(x):
        return x

    def register(fn):
        return fn

    def load():
        return 3

    class C:
        def m(self):
            return 4

    class D:
        def n(self):
            return 5

        def __init_subclass__(cls):
            pass

    X = f()
    Y = list(map(h, [1]))
    DATA = json.load(open("x")) if False else None
    mod.setup()
    c = C()

    @register
    def decorated():
        return g

    @functools.cache
    def table():
        return helper()

    def helper():
        return 6

    _STATE = None

    def setter():
        global _STATE
        _STATE = 7
    """
)


def test_what_may_run_at_import_is_found_by_name() -> None:
    import ast

    names = impact.names_run_at_import([ast.parse(IMPORT_TIME)], tops=["pkg"])
    at_import = {u for u in impact.units(IMPORT_TIME) if impact._at_import(u, names)}
    # f is called, k through f's body, h handed to map, register as a decorator, C built
    # (its methods may run), D's class-creation hook; json.load is not this module's load.
    # Once per process too: a cached function and what it calls, one that sets a global.
    assert at_import == {
        *("f", "k", "h", "register", "C.m", "D.__init_subclass__"),
        *("table", "helper", "setter"),
    }
    assert "setup" in names  # mod.setup(): a project module's function, by name


def test_a_function_that_may_run_at_import_is_not_narrowed(tmp_path: Path) -> None:
    found = ImpactMap.load(_map(tmp_path)).module(
        "pkg/mod.py", BASE, _edit("x + 1", "x + 2"), at_import={"f"}
    )
    assert found.tests is None
    assert "f may run once per process" in found.reason
