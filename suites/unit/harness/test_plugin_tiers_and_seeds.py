"""The plugin's tiers, seeds and determinism, tested from the outside with pytester."""

from __future__ import annotations

import json
import re
import shlex

import pytest

# Inner in-process runs import numpy and torch. pytester drops the modules first imported
# inside a run, and torch cannot be imported twice in one process: import both here first.
numpy = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

TWO_TIERS = {
    "suites/unit/test_u.py": """
        def test_u():
            pass
    """,
    "suites/property/test_p.py": """
        def test_p():
            pass
    """,
    "suites/integration/test_i.py": """
        def test_i():
            pass
    """,
}


def test_each_test_is_marked_with_its_folders_tier(project, pytester):
    project(TWO_TIERS)
    result = pytester.runpytest("-m", "property", "-q")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*1 passed, 2 deselected*"])


def test_tier_option_selects_only_the_named_tiers(project, pytester):
    project(TWO_TIERS)
    result = pytester.runpytest("--tier", "unit,property", "-v")
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(["*test_p.py::test_p PASSED*", "*test_u.py::test_u PASSED*"])
    assert "test_i" not in result.stdout.str()


def test_a_test_file_outside_the_tier_folders_is_a_collection_error_not_a_deselection(
    project, pytester
):
    project({**TWO_TIERS, "tools/test_loose.py": "def test_loose():\n    assert False\n"})
    result = pytester.runpytest("--tier", "unit", "suites", "tools")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1, deselected=2)
    result.stdout.fnmatch_lines(["*tools/test_loose.py is not in a tier folder*"])


def test_an_unknown_tier_is_a_usage_error_listing_the_known_ones(project, pytester):
    project(TWO_TIERS)
    result = pytester.runpytest("--tier", "unti")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*unknown tier(s) unti; known tiers: unit, property, integration, distributed, gpu*"]
    )


def test_a_tier_with_a_missing_need_is_skipped_with_the_reason_shown(project, pytester):
    project(
        {
            **TWO_TIERS,
            "pyproject.toml": """
                [tool.harness.tiers.integration]
                needs = ["env:HARNESS_TEST_NEVER_SET"]
            """,
        }
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED*test_i.py*tier integration skipped: needs env:HARNESS_TEST_NEVER_SET: "
            "environment variable HARNESS_TEST_NEVER_SET is not set"
        ]
    )


def test_a_tier_whose_needs_are_met_runs(project, pytester, monkeypatch):
    monkeypatch.setenv("HARNESS_TEST_SET", "1")
    project(
        {
            **TWO_TIERS,
            "pyproject.toml": """
                [tool.harness.tiers.integration]
                needs = ["env:HARNESS_TEST_SET", "module:json", "exe:sh"]
            """,
        }
    )
    pytester.runpytest().assert_outcomes(passed=3)


def test_the_gpu_tier_skips_on_a_machine_without_cuda_saying_why(project, pytester):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the gpu tier runs here")
    project({"suites/gpu/test_g.py": "def test_g():\n    pass\n"})
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*tier gpu skipped: needs cuda: torch * sees no CUDA device*"])


def test_a_malformed_tier_table_is_a_usage_error(project, pytester):
    project({**TWO_TIERS, "pyproject.toml": "[tool.harness.tiers.unit]\nbudget = 3\n"})
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown key(s) ?'budget'?; known keys are*"])


def test_the_needs_marker_skips_one_test_with_its_reason(project, pytester):
    project(
        {
            "suites/unit/test_n.py": """
                import pytest

                @pytest.mark.needs("exe:surely-not-an-executable-xyz")
                def test_needs_tool():
                    pass

                def test_plain():
                    pass
            """
        }
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs exe:surely-not-an-executable-xyz*is not on PATH nor in*"])


def test_an_executable_next_to_the_running_python_meets_an_exe_need(project, pytester, monkeypatch):
    import sys
    from pathlib import Path

    beside = sorted(
        p.name for p in Path(sys.executable).parent.iterdir() if p.name.startswith("pip")
    )
    assert beside, "expected pip next to the interpreter"
    monkeypatch.setenv("PATH", "/nonexistent")
    project(
        {
            "suites/unit/test_n.py": f"""
        import pytest

        @pytest.mark.needs("exe:{beside[0]}")
        def test_needs_pip():
            pass
    """
        }
    )
    pytester.runpytest().assert_outcomes(passed=1)


# The budget tests' margins: a body that only passes must stay under the budget even when a
# loaded runner deschedules it (tens of milliseconds at load 7 on 2 cores), so the budget is
# 0.5 s, 10x that; what must be over it sleeps longer (load only makes a sleep longer). Not
# more: the fixture's two sleeps count in this test's own time, against the unit tier's 2 s.
BUDGET = "[tool.harness.tiers.unit]\nbudget_s = 0.5\n"


def test_a_unit_test_over_its_budget_is_reported_in_the_summary(project, pytester):
    project(
        {
            "pyproject.toml": BUDGET,
            "suites/unit/test_slow.py": """
                import time

                def test_slow():
                    time.sleep(0.75)

                def test_fast():
                    pass
            """,
        }
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)  # reported, not failed
    result.stdout.fnmatch_lines(
        [
            "*harness: 1 test(s) over their tier's time budget*",
            "*s > 0.5s  suites/unit/test_slow.py::test_slow",
        ]
    )
    assert "test_fast" not in result.stdout.str().split("time budget")[1]


def test_the_budget_is_checked_against_the_call_not_shared_fixtures(project, pytester):
    # A module-scoped fixture's set-up and tear-down land on the first and last test of the
    # module; neither test's own body is slow, so neither is over the budget.
    project(
        {
            "pyproject.toml": BUDGET,
            "suites/unit/test_shared.py": """
                import time
                import pytest

                @pytest.fixture(scope="module")
                def server():
                    time.sleep(0.6)
                    yield
                    time.sleep(0.6)

                def test_first(server):
                    pass

                def test_last(server):
                    pass
            """,
        }
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
    assert "over their tier's time budget" not in result.stdout.str()


DRAWS = {
    "suites/unit/test_draws.py": """
        import json, os, random

        import numpy as np
        import torch

        def test_draw(seed):
            with open(os.environ["DRAWS_OUT"], "a") as f:
                f.write(json.dumps({"seed": seed, "random": random.random(),
                                    "numpy": float(np.random.rand()),
                                    "torch": float(torch.rand(1))}) + "\\n")
    """
}


def _draws(pytester, monkeypatch, *args):
    out = pytester.path / f"draws-{len(list(pytester.path.glob('draws-*')))}.jsonl"
    monkeypatch.setenv("DRAWS_OUT", str(out))
    pytester.runpytest(*args).assert_outcomes(passed=1)
    return json.loads(out.read_text())


def test_the_same_seed_reproduces_the_same_draws_and_another_seed_does_not(
    project, pytester, monkeypatch
):
    project(DRAWS)
    first = _draws(pytester, monkeypatch, "--harness-seed=1234")
    again = _draws(pytester, monkeypatch, "--harness-seed=1234")
    other = _draws(pytester, monkeypatch, "--harness-seed=1235")
    assert first == again
    for source in ("seed", "random", "numpy", "torch"):
        assert first[source] != other[source], source


def test_seed_last_replays_the_previous_runs_seed(project, pytester, monkeypatch):
    project(DRAWS)
    first = _draws(pytester, monkeypatch)  # a random base seed
    replay = _draws(pytester, monkeypatch, "--harness-seed=last")
    assert replay == first


def test_the_seed_is_printed_in_the_header_and_taken_from_the_environment(
    project, pytester, monkeypatch
):
    project(TWO_TIERS)
    monkeypatch.setenv("HARNESS_SEED", "777")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(
        ["harness: seed 777 ($HARNESS_SEED; replay with --harness-seed=777)*"]
    )


def test_a_bad_seed_is_a_usage_error(project, pytester):
    project(TWO_TIERS)
    result = pytester.runpytest("--harness-seed=abc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--harness-seed: a seed is a decimal integer in [[]0, 2**32), got 'abc';"
            " or 'last', or 'random'*"
        ]
    )


def test_a_tests_seed_does_not_depend_on_which_other_tests_ran(project, pytester, monkeypatch):
    project(
        {
            "suites/unit/test_s.py": """
                import json, os

                def test_a(seed):
                    open(os.environ["DRAWS_OUT"], "a").write(json.dumps({"a": seed}) + "\\n")

                def test_b(seed):
                    open(os.environ["DRAWS_OUT"], "a").write(json.dumps({"b": seed}) + "\\n")
            """
        }
    )
    out = pytester.path / "seeds.jsonl"
    monkeypatch.setenv("DRAWS_OUT", str(out))
    pytester.runpytest("--harness-seed=5").assert_outcomes(passed=2)
    pytester.runpytest("--harness-seed=5", "suites/unit/test_s.py::test_b").assert_outcomes(
        passed=1
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["a"] != rows[1]["b"]  # each test has its own seed
    assert rows[1]["b"] == rows[2]["b"]  # and keeps it when run alone


def test_a_failing_test_prints_a_repro_command_that_reproduces_the_failure(project, pytester):
    project(
        {
            "suites/unit/test_r.py": """
                import random

                def test_unlucky():
                    value = random.random()
                    assert value < 0, f"drew {value!r}"
            """
        }
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    match = re.search(
        r"^(pytest suites/unit/test_r.py::test_unlucky --harness-seed=\d+)$", out, re.M
    )
    assert match, out
    drawn = re.search(r"AssertionError: drew (\S+)", out).group(1)
    rerun = pytester.runpytest(*shlex.split(match.group(1))[1:])
    rerun.assert_outcomes(failed=1)
    assert f"drew {drawn}" in rerun.stdout.str()


HYPOTHESIS_PROBE = {
    "suites/property/test_h.py": """
        from hypothesis import given, settings, strategies as st

        @given(st.just(0))  # one possible example: hypothesis stops after it, whatever the profile
        def test_probe(x):
            s = settings()
            print("PROFILE", s.derandomize, s.max_examples, s.database is None)
    """
}


@pytest.mark.parametrize(
    ("ci", "profile_env", "expected"),
    [
        ("true", None, "PROFILE True 100 True"),
        (None, "nightly", "PROFILE False 2000 True"),
        (None, None, "PROFILE False 100"),  # the example database is hypothesis's own choice
    ],
    ids=["ci-derandomized", "nightly-many-examples", "dev"],
)
def test_the_hypothesis_profile_follows_ci_and_the_nightly_switch(
    project, pytester, monkeypatch, ci, profile_env, expected
):
    project(HYPOTHESIS_PROBE)
    if ci:
        monkeypatch.setenv("CI", ci)
    if profile_env:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", profile_env)
    result = pytester.runpytest("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*{expected}*"])


LAZY_PROBE = {
    "conftest.py": """
        import sys
        from pathlib import Path

        def pytest_unconfigure(config):
            Path("imported.txt").write_text(str("hypothesis" in sys.modules))
    """,
    "suites/unit/test_plain.py": """
        def test_plain():
            assert True
    """,
    "suites/property/test_pinned.py": """
        import hypothesis.core
        from hypothesis import given, settings, strategies as st

        @settings(max_examples=3)  # built at import: it inherits the profile loaded by then
        @given(st.just(0))
        def test_pinned(x):
            pass

        def test_report():
            s = test_pinned._hypothesis_internal_use_settings
            print("PINNED", s.derandomize, s.database is None, s.max_examples)
            print("FORCED", hypothesis.core.global_force_seed)
    """,
}


def test_a_run_that_never_uses_hypothesis_does_not_import_it(project, pytester):
    # In a fresh process (hypothesis is imported in this one): the profile is loaded at
    # hypothesis's first import instead, and hypothesis's end-of-run summary is skipped.
    project(LAZY_PROBE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "suites/unit")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "imported.txt").read_text() == "False"


@pytest.mark.parametrize(
    ("ci", "expected"),
    [
        ("true", ["PINNED True True 3", "FORCED None"]),
        (None, ["PINNED False False 3", "FORCED 4242"]),
    ],
    ids=["ci", "dev"],
)
def test_a_profile_loaded_at_hypothesis_first_import_is_the_one_test_modules_see(
    project, pytester, monkeypatch, ci, expected
):
    project(LAZY_PROBE)
    if ci:
        monkeypatch.setenv("CI", ci)
    result = pytester.runpytest_subprocess(
        "-s", "-p", "no:cacheprovider", "--harness-seed=4242", "suites/property"
    )
    result.assert_outcomes(passed=2)
    for line in expected:
        assert line in result.stdout.str()
    assert (pytester.path / "imported.txt").read_text() == "True"
    assert "hypothesis profile " + ("ci" if ci else "dev") in result.stdout.str()


PINNED_PROBE = {
    "suites/property/test_pinned.py": """
        import pytest
        from hypothesis import given, settings, strategies as st

        CALLS = {}

        @settings(max_examples=8, database=None)
        @given(st.integers())
        @pytest.mark.parametrize("case", ["a", "b"])
        def test_pinned(case, x):
            CALLS[case] = CALLS.get(case, 0) + 1

        @settings(max_examples=600, database=None)  # at or above the nightly cap: left alone
        @given(st.integers())
        def test_large(x):
            CALLS["large"] = CALLS.get("large", 0) + 1

        def test_report():  # runs last (file order)
            print("CALLS", sorted(CALLS.items()))
    """
}


@pytest.mark.parametrize(
    ("profile_env", "expected"),
    [
        # nightly: a pinned count x5 (the factor), once per function although parametrized.
        ("nightly", "CALLS [('a', 40), ('b', 40), ('large', 600)]"),
        (None, "CALLS [('a', 8), ('b', 8), ('large', 600)]"),
    ],
    ids=["nightly-raises-pinned-counts", "dev-keeps-them"],
)
def test_the_nightly_profile_raises_counts_that_tests_pin_themselves(
    project, pytester, monkeypatch, profile_env, expected
):
    project(PINNED_PROBE)
    if profile_env:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", profile_env)
    result = pytester.runpytest("-s", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=4)
    assert expected in result.stdout.str()


def test_the_tier_table_decides_harness_cis_default_tiers(tmp_path):
    from harness import tiers

    # Built in: every CPU tier, not gpu (the gpu tier is its own step of harness ci).
    assert tiers.default_selection(tiers.DEFAULT_TIERS) == [
        "unit",
        "property",
        "integration",
        "distributed",
    ]
    (tmp_path / "pyproject.toml").write_text(
        "[tool.harness.tiers.integration]\ndefault = false\n"
        "[tool.harness.tiers.smoke]\ndescription = 'a project tier'\n"
    )
    chosen = tiers.default_selection(tiers.project_tiers(tmp_path))
    assert chosen == ["unit", "property", "distributed", "smoke"]
