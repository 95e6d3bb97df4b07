"""--harness-record-errors, --harness-repeat, $HARNESS_TOLERANCE_OVERRIDES and
`harness tolerances propose`, tested from the outside on a tiny project."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from harness.cli import main

# Line 6: an error of exactly half the bound (5e-6 against rtol 1e-5 at |e| = 1, atol 0).
# Line 7: exact. Line 8: an error that varies with the seed, far inside its bound.
# Line 9: assert_within, a fifth of its bound.
CHECKS = """
    import numpy as np
    from harness import assert_close, assert_equal, assert_within


    def test_checks(rng):
        assert_close(np.array([1.0 + 5e-6, 2.0]), np.array([1.0, 2.0]), rtol=1e-5, atol=0.0)
        assert_equal(np.arange(3), np.arange(3))
        assert_close(rng.normal(0.0, 1e-3, 50), np.zeros(50), rtol=0.0, atol=1.0)
        assert_within(0.2, 1.0)


    def test_golden(golden):
        golden.check("loss", 0.5, rtol=1e-3, atol=0.0)
"""
SITE_HALF, SITE_EXACT, SITE_NOISE, SITE_WITHIN = (
    f"suites/unit/test_c.py:{n}" for n in (6, 7, 8, 9)
)


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_run_of_each_site_is_one_record_with_the_share_of_its_bound_used(project, pytester):
    root = project({"suites/unit/test_c.py": CHECKS})
    result = pytester.runpytest(
        "--harness-record-errors=rec.jsonl", "--harness-repeat=3", "-k", "checks"
    )
    result.assert_outcomes(passed=3)
    records = _records(root / "rec.jsonl")
    by_site: dict[str, list[dict]] = {}
    for r in records:
        by_site.setdefault(r["site"], []).append(r)
    assert sorted(by_site) == sorted([SITE_HALF, SITE_EXACT, SITE_NOISE, SITE_WITHIN])
    assert all(len(runs) == 3 for runs in by_site.values())
    # (1 + 5e-6) - 1 is 5e-6 within float64 rounding of 1 (1e-16): 2e-11 of the bound.
    assert all(r["max_used"] == pytest.approx(0.5, abs=1e-10) for r in by_site[SITE_HALF])
    assert {r["max_abs"] for r in by_site[SITE_EXACT]} == {0.0}
    assert len({r["max_used"] for r in by_site[SITE_NOISE]}) == 3  # one seed per repeat
    assert len({r["seed"] for r in by_site[SITE_NOISE]}) == 3
    assert {r["test"] for r in records} == {"suites/unit/test_c.py::test_checks"}
    assert by_site[SITE_WITHIN][0]["max_used"] == pytest.approx(0.2, rel=1e-15)


def test_a_repeated_golden_check_reads_the_one_golden_of_its_test(project, pytester):
    root = project({"suites/unit/test_c.py": CHECKS})
    pytester.runpytest("-k", "golden").assert_outcomes(passed=1)  # records the golden
    result = pytester.runpytest("-k", "golden", "--harness-repeat=2", "--harness-record-errors")
    result.assert_outcomes(passed=2)
    goldens = json.loads((root / "suites/goldens/unit/test_c.json").read_text())
    assert list(goldens) == ["test_golden"]
    (first, second) = _records(root / "reports/tolerance-errors.jsonl")
    assert first["kind"] == second["kind"] == "golden"
    assert first["max_used"] == 0.0 and first["site"] == "suites/unit/test_c.py:13"


def test_an_override_tightens_one_site_until_it_fails(project, pytester, monkeypatch):
    root = project({"suites/unit/test_c.py": CHECKS})
    overrides = root / "overrides.json"
    overrides.write_text(json.dumps({SITE_HALF: {"scale": 0.4}}))
    monkeypatch.setenv("HARNESS_TOLERANCE_OVERRIDES", str(overrides))
    result = pytester.runpytest("-k", "checks")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Tolerance: rtol=4*e-06, atol=0.0*"])
    overrides.write_text(json.dumps({SITE_HALF: {"scale": 0.6}}))
    pytester.runpytest("-k", "checks").assert_outcomes(passed=1)


def test_a_bad_override_file_is_a_usage_error_naming_it(project, pytester, monkeypatch):
    root = project({"suites/unit/test_c.py": CHECKS})
    (root / "o.json").write_text('{"x.py:1": {"scale": "big"}}')
    monkeypatch.setenv("HARNESS_TOLERANCE_OVERRIDES", str(root / "o.json"))
    result = pytester.runpytest("-k", "checks")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*o.json*'x.py:1'*"])


def test_xdist_workers_append_to_one_file(project, pytester, monkeypatch):
    root = project({"suites/unit/test_c.py": CHECKS})
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        # Under `harness mutate`'s coverage pass, mutmut's hook in each process looks for its
        # config in the working folder; the xdist workers start in pytester's folder, where
        # there is none, and die. They run the unmutated code instead (the mutant passes,
        # where a worker would run it, still reach them through the variable).
        monkeypatch.delenv("MUTANT_UNDER_TEST")
    args = ["-p", "xdist", "-n", "2", "--harness-record-errors=rec.jsonl", "--harness-repeat=4"]
    result = pytester.runpytest(*args, "-k", "checks")
    result.assert_outcomes(passed=4)
    records = _records(root / "rec.jsonl")
    assert len(records) == 16  # 4 runs x 4 sites, no line lost or torn
    assert len({r["nodeid"] for r in records}) == 4


def test_propose_end_to_end_judges_each_site_and_patches_the_literal(
    project, pytester, monkeypatch
):
    root = project({"suites/unit/test_c.py": CHECKS})
    monkeypatch.chdir(root)
    out = root / "p.json"
    result = CliRunner().invoke(
        main,
        ["tolerances", "propose", "suites/unit/test_c.py::test_checks", "--runs", "40",
         "--per-process", "40", "--bootstrap", "20", "--json", str(out), "--write"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    sites = {s["site"]: s for s in json.loads(out.read_text())["sites"]}
    assert sites[SITE_EXACT]["verdict"].startswith("no fit: every error is 0 over 40 runs")
    assert sites[SITE_HALF]["verdict"].startswith("no fit: the error does not change")
    noise = sites[SITE_NOISE]
    # |N(0, 1e-3)| over 50 draws stays below 5e-3 with probability 1 - 3e-5 per run: a bound
    # of 1.0 is over a hundred times too loose.
    assert noise["verdict"].startswith("too loose by"), noise["verdict"]
    assert noise["proposed_atol"] < 0.05
    assert "-    assert_close(rng.normal(0.0, 1e-3, 50), np.zeros(50), rtol=0.0, atol=1.0)" in (
        result.output
    )
    assert f"atol={noise['proposed_atol']!r})" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target-failure", "2"], "not a probability"),
        (["suites/unit/test_c.py::nope", "--runs", "1"], "pytest exited 4"),
        ([], "give NODEIDs to run, or --records"),
    ],
)
def test_propose_turns_bad_input_into_a_usage_error(project, monkeypatch, args, message):
    root = project({"suites/unit/test_c.py": CHECKS})
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["tolerances", "propose", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_mutants_run_once_with_the_current_bounds_and_once_with_the_proposed(project, monkeypatch):
    from harness import mutation

    root = project({"suites/unit/test_c.py": CHECKS})
    monkeypatch.chdir(root)
    monkeypatch.delenv("HARNESS_SEED", raising=False)
    seen, seeds = [], []

    def fake_run_module(root_, module, work, *, tests, progress, jobs):
        assert jobs == 2  # --jobs 1: mutmut's own default of 2 workers
        path = os.environ["HARNESS_TOLERANCE_OVERRIDES"]
        seen.append((module, tests, json.loads(Path(path).read_text()) if path else None))
        seeds.append(os.environ.get("HARNESS_SEED"))
        killed = 5 if path else 4  # a tighter bound kills more
        return mutation.ModuleResult(
            path=module,
            tests=tests,
            counts={"killed": killed, "survived": 1},
            survivors=[],
            seconds=0.0,
            work_dir="",
        )

    monkeypatch.setattr(mutation, "run_module", fake_run_module)
    out = root / "p.json"
    result = CliRunner().invoke(
        main,
        ["tolerances", "propose", "suites/unit/test_c.py::test_checks", "--runs", "30",
         "--per-process", "30", "--bootstrap", "10", "--mutants", "--module", "m.py",
         "--json", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (_, tests, current), (_, _, proposed) = seen
    assert tests == ["suites/unit/test_c.py"] and current is None
    noise = next(s for s in json.loads(out.read_text())["sites"] if s["site"] == SITE_NOISE)
    assert proposed[SITE_NOISE] == {"rtol": 0.0, "atol": noise["proposed_atol"]}
    assert json.loads(out.read_text())["mutants"]["proposed"]["killed"] == 5
    # Both passes draw the same inputs (one $HARNESS_SEED: --seed's 0), then it is unset again.
    assert seeds == ["0", "0"] and "HARNESS_SEED" not in os.environ

    # From a recording alone (no NODEIDs): the recorded tests' files, the same proposals.
    records = root / "rec.jsonl"
    records.write_text(
        "".join(json.dumps({**s, "test": "suites/unit/test_c.py::test_checks"}) + "\n"
                for s in _fake_noise_records(noise))
    )  # fmt: skip
    seen.clear()
    result = CliRunner().invoke(
        main,
        ["tolerances", "propose", "--records", str(records), "--bootstrap", "10", "--mutants",
         "--module", "m.py"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [t for _, t, _ in seen] == [["suites/unit/test_c.py"]] * 2
    assert SITE_NOISE in seen[1][2]


def _fake_noise_records(site: dict) -> list[dict]:
    rng = np.random.default_rng(1)
    return [
        {"site": SITE_NOISE, "max_used": float(u), "rtol": 0.0, "atol": 1.0, "seed": i,
         "kind": "assert_close", "bound": "given"}
        for i, u in enumerate(rng.uniform(0.0, site["max_used"], 60))
    ]  # fmt: skip


def test_each_repeat_of_a_hypothesis_test_draws_its_own_examples(project, pytester):
    # Each repeat writes the examples it was given: a repeat reusing another's Hypothesis seed
    # would draw the same list. (Comparing the recorded max_used instead can collide by
    # chance: Hypothesis favours the bound 0.5, so two repeats' maxima are often both 0.5.)
    root = project(
        {
            "suites/unit/test_h.py": """
                import hypothesis.core
                from hypothesis import given, settings, strategies as st
                from harness import assert_within


                @settings(max_examples=5, database=None)
                @given(st.floats(0.0, 0.5))
                def test_h(x):
                    with open(f"drawn-{hypothesis.core.global_force_seed}.txt", "a") as f:
                        f.write(repr(x) + "\\n")
                    assert_within(x, 1.0)
            """
        }
    )
    result = pytester.runpytest(
        "--harness-repeat=4", "--harness-record-errors=rec.jsonl", "--harness-seed=7"
    )
    result.assert_outcomes(passed=4)
    assert len(_records(root / "rec.jsonl")) == 4
    drawn = [tuple(p.read_text().split()) for p in sorted(root.glob("drawn-*.txt"))]
    assert len(drawn) == 4 and len(set(drawn)) == 4, drawn


def test_a_sweep_names_the_seeds_under_which_a_test_failed(project, monkeypatch):
    root = project({"suites/unit/test_f.py": "def test_f():\n    assert False, 'broken'\n"})
    monkeypatch.chdir(root)
    result = CliRunner().invoke(
        main, ["tolerances", "propose", "suites/unit/test_f.py::test_f", "--runs", "2"]
    )
    assert result.exit_code == 2  # nothing recorded: a usage error, after the warning
    assert "a test failed under --harness-seed=" in result.output
    assert "no check was recorded" in result.output


def test_a_sweep_split_over_jobs_records_the_same_samples(project, monkeypatch):
    from harness.tolerances_evidence import propose

    root = project({"suites/unit/test_c.py": CHECKS})
    monkeypatch.chdir(root)
    runs: dict[int, list] = {}
    for jobs in (1, 2):
        path = root / f"rec{jobs}.jsonl"
        seeds, failed = propose.run_sweep(
            root, ["suites/unit/test_c.py::test_checks"], path,
            runs=4, per_process=2, seed=5, jobs=jobs,
        )  # fmt: skip
        assert len(seeds) == 2 and failed == []
        runs[jobs] = sorted((r["seed"], r["site"], r["max_used"]) for r in _records(path))
    assert len(runs[1]) == 16 and runs[1] == runs[2]  # 4 runs x 4 sites, whatever the jobs


def test_held_out_seeds_are_no_fit_seeds_of_any_seed():
    from harness.tolerances_evidence import propose

    fit = {s for k in range(4) for s in propose.sweep_seeds(k, 50)}
    held = [s for k in range(4) for s in propose.sweep_seeds(k, 50, holdout=True)]
    assert len(set(held)) == 200 and not fit & set(held)
    assert propose.sweep_seeds(3, 5) == propose.sweep_seeds(3, 5)  # reproducible


def test_a_held_out_check_split_over_processes_is_merged_and_judged(project, monkeypatch):
    root = project({"suites/unit/test_c.py": CHECKS})
    monkeypatch.chdir(root)
    node = "suites/unit/test_c.py::test_checks"
    common = ["--per-process", "20", "--bootstrap", "10"]
    fit = CliRunner().invoke(
        main, ["tolerances", "propose", node, "--runs", "40", "--records", "fit.jsonl", *common]
    )
    assert fit.exit_code == 0, fit.output
    for k in (1, 2):  # two held-out sweeps under distinct seeds, as on two machines
        result = CliRunner().invoke(
            main,
            ["tolerances", "propose", node, "--runs", "1", "--holdout-runs", "20",
             "--seed", str(k), "--holdout-records", f"h{k}.jsonl", *common],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    held = root / "held.jsonl"
    held.write_text((root / "h1.jsonl").read_text() + (root / "h2.jsonl").read_text())
    result = CliRunner().invoke(
        main,
        ["tolerances", "propose", "--records", "fit.jsonl", "--holdout-records", "held.jsonl",
         "--bootstrap", "10", "--json", "p.json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    sites = {s["site"]: s for s in json.loads((root / "p.json").read_text())["sites"]}
    noise = sites[SITE_NOISE]["holdout"]
    assert (noise["runs"], noise["bound"], noise["over"]) == (40, "proposed", 0)
    assert noise["expected"] == pytest.approx(40 * 1e-4)
    # No proposal (an exact check): the held-out runs are checked against the current bound.
    assert sites[SITE_EXACT]["holdout"]["bound"] == "current"
    assert sites[SITE_EXACT]["holdout"]["over"] == 0

    # The same file twice: each sample counts once, said; the fit's own records: refused.
    held.write_text(held.read_text() * 2)
    again = CliRunner().invoke(
        main, ["tolerances", "propose", "--records", "fit.jsonl", "--holdout-records",
               "held.jsonl", "--bootstrap", "10", "--json", "p.json"],
    )  # fmt: skip
    assert again.exit_code == 0 and "recorded twice" in again.output
    assert all(
        s["holdout"]["runs"] == 40 for s in json.loads((root / "p.json").read_text())["sites"]
    )
    same = CliRunner().invoke(
        main,
        ["tolerances", "propose", "--records", "fit.jsonl", "--holdout-records", "fit.jsonl"],
    )
    assert same.exit_code == 2 and "not held out" in same.output


def test_a_held_out_sample_under_a_changed_bound_is_rescaled():
    from harness.tolerances_evidence import propose

    rng = np.random.default_rng(0)
    fit = [
        {"test": "t.py::test_a", "site": "t.py:3", "max_used": float(u), "rtol": 1e-5,
         "atol": 1e-5, "kind": "assert_close", "bound": "given", "seed": i}
        for i, u in enumerate(rng.uniform(0.0, 0.1, 200))
    ]  # fmt: skip
    (report,) = propose.analyse(fit, 1e-4, bootstrap=10)
    assert report.factor is not None and report.factor < 0.2
    # Recorded after the bound was halved: 1.5 F of 5e-6 is 0.75 F of 1e-5 (within).
    fresh = [
        {**fit[0], "seed": 1000, "max_used": 1.5 * report.factor, "rtol": 5e-6, "atol": 5e-6},
        {**fit[0], "seed": 1001, "max_used": 2 * report.factor + 0.1, "rtol": 5e-6,
         "atol": 5e-6},
        {**fit[0], "seed": 1002, "max_used": 0.01, "rtol": 1e-5, "atol": 0.0},
    ]  # fmt: skip
    out, notes = propose.holdout_check([report], fresh, 1e-4, fitted=fit)
    h = out["t.py:3"]
    assert (h.over, h.runs, h.skipped) == (1, 2, 1)
    assert notes and "no multiple" in notes[0]
    assert 0 < h.p < 1e-3  # one failure in 2 runs at 1e-4 is far more than predicted


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--json", "no/such/folder/p.json"], "does not exist"),
        (["--json", "."], "is a directory"),
        (["--holdout-records", "h.jsonl"], "needs --holdout-runs"),
    ],
)
def test_propose_checks_its_output_paths_before_any_work(project, monkeypatch, extra, message):
    root = project({"suites/unit/test_f.py": "def test_f():\n    assert False, 'ran'\n"})
    monkeypatch.chdir(root)
    result = CliRunner().invoke(
        main, ["tolerances", "propose", "suites/unit/test_f.py::test_f", "--runs", "1", *extra]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "a test failed" not in result.output  # refused before the sweep


def test_a_json_path_that_cannot_be_written_is_refused_naming_it(tmp_path):
    import click

    from harness.cli.paths import writable_json_path

    ctx = click.Context(click.Command("c"))
    param = click.Option(["--json"])
    assert writable_json_path(ctx, param, None) is None
    assert writable_json_path(ctx, param, tmp_path / "new.json") == tmp_path / "new.json"
    with pytest.raises(click.BadParameter, match="a folder"):
        writable_json_path(ctx, param, tmp_path)
    with pytest.raises(click.BadParameter, match="missing.*does not exist"):
        writable_json_path(ctx, param, tmp_path / "missing" / "p.json")
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    locked.chmod(0o444)
    if not os.access(locked, os.W_OK):  # as root every file is writable
        with pytest.raises(click.BadParameter, match="locked.json.*not writable"):
            writable_json_path(ctx, param, locked)
