"""harness.seeding called directly: the seed's accepted range, the per-test seed, what gets
seeded, the determinism switches and the hypothesis profiles.

The plugin tests (test_plugin_tiers_and_seeds.py) check the same behaviour end to end through
inner pytest runs; these pin the edges those runs do not reach (the largest seed, the first
seed out of range, the exact profile settings) and run in the same process as the module.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from harness import seeding

# Paid here, at collection, so the tests time seeding and not torch's 1-2 s first import.
with contextlib.suppress(ImportError):
    import torch  # noqa: F401

MAX_SEED = 2**32 - 1  # NumPy's legacy global seed takes at most this


# --- parse_seed ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("7", 7), (str(MAX_SEED), MAX_SEED), ("000" + str(MAX_SEED), MAX_SEED)],
)
def test_a_seed_in_range_is_read_including_the_largest_and_leading_zeros(text, value):
    assert seeding.parse_seed(text) == value


@pytest.mark.parametrize("text", [str(MAX_SEED + 1), "9999999999", "1" + "0" * 10])
def test_the_first_seed_past_the_range_is_refused_naming_the_range_and_the_value(text):
    with pytest.raises(
        ValueError, match=rf"must be in \[0, 2\*\*32\) = \[0, {MAX_SEED}\], got {text}$"
    ):
        seeding.parse_seed(text)


def test_a_seed_of_thousands_of_digits_gets_the_seed_message_not_ints_digit_limit():
    # int() refuses strings of over 4300 digits with its own, unrelated message.
    with pytest.raises(ValueError, match=r"must be in \[0, 2\*\*32\)"):
        seeding.parse_seed("1" * 5000)


@pytest.mark.parametrize("text", ["", " 7", "7 ", "+7", "-1", "1_000", "\u0663", "0x10", "7.0"])
def test_anything_but_plain_ascii_digits_is_refused_naming_the_text(text):
    with pytest.raises(
        ValueError, match=r"a seed is a decimal integer in \[0, 2\*\*32\), got "
    ) as e:
        seeding.parse_seed(text)
    assert str(e.value).endswith(repr(text))


def test_a_seed_that_is_not_a_string_is_refused_not_converted():
    with pytest.raises(ValueError, match=r"decimal integer in \[0, 2\*\*32\), got 7$"):
        seeding.parse_seed(7)  # type: ignore[arg-type]


# --- new_base_seed and node_seed -------------------------------------------------------------


def test_fresh_base_seeds_span_the_whole_range_and_parse_back():
    seeds = [seeding.new_base_seed() for _ in range(200)]
    assert all(
        0 <= s <= MAX_SEED for s in seeds
    )  # 200 draws from a 2**33 range: all below 2**32 has p = 2**-200
    assert max(seeds) >= 2**24  # from [0, 2**32): 200 draws all below 2**24 has p = 2**-1600
    assert [seeding.parse_seed(str(s)) for s in seeds] == seeds


def test_a_tests_seed_is_stable_across_processes_and_hash_randomisation():
    # Known answer: sha256("5:suites/unit/test_s.py::test_a"), first 8 bytes big-endian, mod
    # 2**32. A change here silently changes every test's seed, so seeds recorded in old reports
    # would no longer replay the failure they came from.
    nodeid = "suites/unit/test_s.py::test_a"
    assert seeding.node_seed(5, nodeid) == 4077682940
    code = f"from harness.seeding import node_seed; print(node_seed(5, {nodeid!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": "123"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout) == 4077682940


def test_a_tests_seed_depends_on_the_base_seed_and_the_node_id_and_stays_in_range():
    seeds = {seeding.node_seed(b, f"t.py::test_{i}") for b in range(20) for i in range(20)}
    assert len(seeds) == 400  # 400 distinct inputs; a collision in 2**32 has p < 2**-13
    assert all(0 <= s <= MAX_SEED for s in seeds)
    assert max(seeds) >= 2**24  # the low 32 bits, not fewer


# --- seed_everything and enable_determinism --------------------------------------------------


def test_seeding_everything_makes_random_numpy_and_torch_draw_as_from_that_seed():
    torch = pytest.importorskip("torch")
    seeded = seeding.seed_everything(1234)
    assert seeded == ["random", "numpy", "torch"]
    draws = (random.random(), np.random.rand(), torch.rand(1).item())
    expected_torch = torch.rand(1, generator=torch.Generator().manual_seed(1234)).item()
    assert draws == (
        random.Random(1234).random(),
        np.random.RandomState(1234).rand(),
        expected_torch,
    )


def test_torch_is_not_imported_or_seeded_when_the_run_has_not_imported_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert seeding.seed_everything(1) == ["random", "numpy"]
    assert "torch" not in sys.modules


@pytest.fixture(scope="module")
def torch_determinism_loaded():
    """torch's first use_deterministic_algorithms(True) imports about 900 modules (6-7 s here);
    pay that in a fixture, outside the unit tier's per-test budget, and put the flag back."""
    torch = pytest.importorskip("torch")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch.use_deterministic_algorithms(was)
    return torch


def test_determinism_switches_torch_and_cudnn_and_keeps_a_set_cublas_workspace(
    monkeypatch, torch_determinism_loaded
):
    torch = torch_determinism_loaded
    cudnn = torch.backends.cudnn
    before = (torch.are_deterministic_algorithms_enabled(), cudnn.deterministic, cudnn.benchmark)
    try:
        torch.use_deterministic_algorithms(False)
        cudnn.deterministic, cudnn.benchmark = False, True
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
        seeding.enable_determinism()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled()
        assert (cudnn.deterministic, cudnn.benchmark) == (True, False)
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        seeding.enable_determinism()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's choice is kept
    finally:
        torch.use_deterministic_algorithms(before[0])
        cudnn.deterministic, cudnn.benchmark = before[1], before[2]


# --- hypothesis profiles ---------------------------------------------------------------------


def test_the_profiles_have_the_documented_settings_whatever_profile_was_loaded():
    hypothesis = pytest.importorskip("hypothesis")
    settings, too_slow = hypothesis.settings, hypothesis.HealthCheck.too_slow
    # The plugin registered the three profiles when this run started: replace them with
    # something else first, so what is read below is what this call registered.
    for name in ("dev", "ci", "nightly"):
        settings.register_profile(name, max_examples=5)
    settings.register_profile("some_user_profile", max_examples=3, derandomize=True)
    settings.load_profile("some_user_profile")  # the autouse fixture restores the outer one
    try:
        assert seeding.register_hypothesis_profiles() is True
    finally:
        seeding.register_hypothesis_profiles()  # the real ones back, whatever happened
    default = settings.get_profile("default")
    dev, ci, nightly = (settings.get_profile(n) for n in ("dev", "ci", "nightly"))
    # Parented on "default", not on the profile that happened to be loaded.
    assert (dev.max_examples, dev.derandomize, dev.deadline) == (default.max_examples, False, None)
    assert dev.database is not None and dev.suppress_health_check == default.suppress_health_check
    assert (ci.derandomize, ci.database, ci.deadline, ci.print_blob) == (True, None, None, True)
    assert ci.max_examples == default.max_examples
    assert list(ci.suppress_health_check) == [too_slow]
    assert (nightly.max_examples, nightly.derandomize, nightly.database) == (2000, False, None)
    assert (nightly.deadline, nightly.print_blob) == (None, True)
    assert list(nightly.suppress_health_check) == [too_slow]


def test_without_hypothesis_no_profile_is_registered_or_loaded(monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # import hypothesis raises ImportError
    assert seeding.register_hypothesis_profiles() is False
    monkeypatch.delitem(sys.modules, "hypothesis")
    assert seeding.load_hypothesis_profile(None, ci=True, seed=1) is None


@pytest.fixture
def hypo(monkeypatch):
    pytest.importorskip("hypothesis")
    import hypothesis.core

    seeding.register_hypothesis_profiles()
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    hypothesis.core.global_force_seed = None  # the autouse fixture restores the outer value
    return hypothesis


@pytest.mark.parametrize(("ci", "profile"), [(True, "ci"), (False, "dev")])
def test_without_a_choice_ci_gets_ci_and_elsewhere_dev(hypo, ci, profile):
    assert seeding.load_hypothesis_profile(None, ci=ci, seed=99) == profile
    assert hypo.settings.get_current_profile_name() == profile


def test_the_environment_variable_picks_the_profile_over_the_ci_default(hypo, monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nightly")
    assert seeding.load_hypothesis_profile(None, ci=True, seed=99) == "nightly"
    assert hypo.settings().max_examples == 2000


def test_an_unknown_profile_in_the_environment_is_refused_naming_it(hypo, monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nihgtly")
    with pytest.raises(ValueError, match=r"^\$HYPOTHESIS_PROFILE: .*nihgtly"):
        seeding.load_hypothesis_profile(None, ci=False, seed=99)


def test_a_given_profile_is_returned_and_not_loaded_again(hypo):
    hypo.settings.load_profile("dev")
    assert seeding.load_hypothesis_profile("ci", ci=False, seed=99) == "ci"
    assert (
        hypo.settings.get_current_profile_name() == "dev"
    )  # hypothesis loads --hypothesis-profile


def test_a_random_profile_is_tied_to_the_runs_seed_unless_a_seed_was_given(hypo):
    seeding.load_hypothesis_profile(None, ci=False, seed=99)
    assert hypo.core.global_force_seed == 99
    hypo.core.global_force_seed = None
    seeding.load_hypothesis_profile(None, ci=False, seed=99, force_seed=False)
    assert hypo.core.global_force_seed is None


def test_a_derandomized_profile_is_not_given_a_seed(hypo):
    seeding.load_hypothesis_profile(None, ci=True, seed=99)
    assert hypo.core.global_force_seed is None


def test_nightly_raises_a_pinned_count_fivefold_up_to_a_quarter_of_the_profile(hypo):
    # Called directly: the plugin test (test_plugin_tiers_and_seeds.py) covers x5 and a count
    # already over the cap, through an inner pytest run; the cap itself is checked here. A
    # count it sets must stay an int: hypothesis refuses max_examples=500.0, so a cap computed
    # as 2000 / 4 would crash every capped test under the nightly profile (a mutant that
    # survived mutation testing on 2026-12-02).
    from hypothesis import given, settings
    from hypothesis import strategies as st

    def pinned(count):
        @settings(max_examples=count, database=None)
        @given(st.integers())
        def t(x):
            pass

        return t

    settings.load_profile("nightly")  # 2000 examples: the cap is 500
    small, capped, large = pinned(8), pinned(150), pinned(600)
    assert seeding.nightly_examples(small, "nightly") == 40
    assert small._hypothesis_internal_use_settings.max_examples == 40
    assert seeding.nightly_examples(small, "nightly") is None  # once per function
    assert small._hypothesis_internal_use_settings.max_examples == 40
    assert seeding.nightly_examples(capped, "nightly") == 500  # 750, capped
    count = capped._hypothesis_internal_use_settings.max_examples
    assert count == 500 and type(count) is int
    assert seeding.nightly_examples(large, "nightly") is None  # over the cap: left alone
    assert large._hypothesis_internal_use_settings.max_examples == 600
    assert seeding.nightly_examples(given(st.integers())(lambda x: None), "nightly") is None
    assert seeding.nightly_examples(lambda: None, "nightly") is None  # not a hypothesis test
    other = pinned(8)
    assert seeding.nightly_examples(other, "ci") is None  # only the nightly profile
    assert other._hypothesis_internal_use_settings.max_examples == 8


def test_nightly_keeps_a_pinned_tests_other_settings_and_leaves_a_count_at_the_cap(hypo):
    # The raised count is layered on the test's own settings: a test that pins a deadline (or
    # a database, a health check) keeps it under the nightly profile. A count already at the
    # cap is left as it is (500 of the nightly profile's 2000).
    import datetime as dt

    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=8, deadline=1234, database=None)
    @given(st.integers())
    def t(x):
        pass

    @settings(max_examples=500, database=None)
    @given(st.integers())
    def at_cap(x):
        pass

    before = at_cap._hypothesis_internal_use_settings
    settings.load_profile("nightly")
    assert seeding.nightly_examples(t, "nightly") == 40
    raised = t._hypothesis_internal_use_settings
    assert raised.deadline == dt.timedelta(milliseconds=1234)
    assert raised.max_examples == 40
    assert seeding.nightly_examples(at_cap, "nightly") is None
    assert at_cap._hypothesis_internal_use_settings is before


def test_an_action_deferred_to_hypothesis_import_runs_there_and_none_forgets_it(hypo, monkeypatch):
    # The plugin defers loading the run's profile until hypothesis is imported; hypothesis
    # then calls on_hypothesis_import (its entry point). Only the last deferral counts.
    monkeypatch.setattr(seeding, "_on_import", [])
    calls: list[str] = []
    seeding.defer_hypothesis_profile(lambda: calls.append("first"))
    seeding.defer_hypothesis_profile(lambda: calls.append("second"))
    seeding.on_hypothesis_import()
    assert calls == ["second"]
    seeding.defer_hypothesis_profile(None)
    seeding.on_hypothesis_import()
    assert calls == ["second"]


def test_the_hypothesis_hook_is_off_when_the_variable_says_so_or_the_entry_point_is_missing(
    monkeypatch,
):
    monkeypatch.delenv("HYPOTHESIS_NO_PLUGINS", raising=False)
    monkeypatch.setattr(seeding, "_entry_point_installed", lambda: True)
    assert seeding.hypothesis_hook_installed()
    monkeypatch.setenv("HYPOTHESIS_NO_PLUGINS", "1")
    assert not seeding.hypothesis_hook_installed()
    monkeypatch.delenv("HYPOTHESIS_NO_PLUGINS")
    monkeypatch.setattr(seeding, "_entry_point_installed", lambda: False)
    assert not seeding.hypothesis_hook_installed()
