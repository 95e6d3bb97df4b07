"""The stored baseline is kept per machine and environment: another environment's run names it
and never replaces it.

Before, one baseline per machine: a run in another environment (a runner whose interpreter
changed, a second venv) found "no stored baseline", though one was there, and replaced it with
its own, so the first environment's next run had none either. Here the result files are
written with asv's own classes (no benchmark runs), in a real git repository (the baseline's
commit must be HEAD or an ancestor of it).
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from asv import util as asv_util
from asv.results import Results
from asv.runner import BenchmarkResult

from harness import perf
from harness.perf._common import Project
from harness.perf.results import load_results

MACHINE = "runner-1"
ASV_CONF = {
    "version": 1,
    "project": "tiny",
    "repo": ".",
    "dvcs": "git",
    "environment_type": "existing",
    "branches": ["HEAD"],
    "benchmark_dir": "benchmarks",
    "results_dir": ".asv/results",
    "html_dir": ".asv/html",
}
BENCH = {
    "name": "bench.time_x",
    "params": [],
    "param_names": [],
    "version": "1",
    "type": "time",
    "unit": "seconds",
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "asv.conf.json").write_text(json.dumps(ASV_CONF))
    _git(root, "init", "-q")
    _git(
        root,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "a",
    )
    return root


def _results(repo: Path, env: str, seconds: float, machine: str = MACHINE) -> str:
    """asv's result file of HEAD in env (one benchmark), as `asv run` leaves it."""
    head = _git(repo, "rev-parse", "HEAD")
    results = Results({"machine": machine}, {}, head, 1_700_000_000_000, "3.12", env, {})
    results.add_result(
        BENCH,
        BenchmarkResult(
            result=[seconds],
            samples=[[seconds] * 3],
            number=[1],
            errcode=0,
            stderr="",
            profile=None,
        ),
        started_at=datetime.datetime.now(datetime.UTC),
        duration=1.0,
    )
    results.save(str(repo / ".asv" / "results"))
    asv_util.write_json(
        str(repo / ".asv" / "results" / machine / "machine.json"),
        {"machine": machine, "version": 1},
        api_version=1,
    )
    return head


def _value(repo: Path, baseline: perf.StoredBaseline) -> float:
    project = Project.load(repo)
    rows = load_results(
        project, baseline.machine, baseline.commit, results_dir=baseline.results_dir
    )[baseline.env]
    value = next(iter(rows.values())).value
    assert value is not None
    return value


def test_a_run_in_another_environment_names_the_stored_one_and_keeps_it(repo: Path) -> None:
    head = _results(repo, "env-x", 0.5)
    perf.record_baseline(repo, head, machine=MACHINE, env="env-x", source="working tree")
    _results(repo, "env-y", 0.25)
    # The other environment has none of its own: not this one's baseline, named as not.
    assert perf.stored_baseline(repo, machine=MACHINE, env="env-y") is None
    note = perf.others_note(repo, machine=MACHINE, env="env-y")
    assert f"this run is machine `{MACHINE}`, environment `env-y`" in note
    assert f"machine `{MACHINE}`, environment `env-x` (`{head[:10]}`" in note
    assert "kept as they are" in note
    # Recording env-y's run keeps env-x's: each reads its own results back.
    perf.record_baseline(repo, head, machine=MACHINE, env="env-y", source="working tree")
    x = perf.stored_baseline(repo, machine=MACHINE, env="env-x")
    y = perf.stored_baseline(repo, machine=MACHINE, env="env-y")
    assert x is not None and y is not None
    assert (_value(repo, x), _value(repo, y)) == (0.5, 0.25)
    manifest = json.loads((repo / ".asv/baseline" / f"{MACHINE}.json").read_text())
    assert sorted(manifest["baselines"]) == ["env-x", "env-y"]
    assert perf.others_note(repo, machine=MACHINE, env="env-x").count("environment `env-y`") == 1


def test_another_machines_baseline_is_named_too(repo: Path) -> None:
    head = _results(repo, "env-x", 0.5, machine="runner-2")
    perf.record_baseline(repo, head, machine="runner-2", env="env-x", source="working tree")
    assert perf.stored_baseline(repo, machine=MACHINE, env="env-x") is None
    assert "machine `runner-2`, environment `env-x`" in perf.others_note(
        repo, machine=MACHINE, env="env-x"
    )
    assert perf.others_note(repo, machine="runner-2", env="env-x") == ""


def test_a_single_baseline_manifest_of_before_is_read_and_survives_another_env(
    repo: Path,
) -> None:
    # What a store written before per-environment baselines holds: one entry's fields on top.
    head = _results(repo, "env-x", 0.5)
    perf.record_baseline(repo, head, machine=MACHINE, env="env-x", source="working tree")
    path = repo / ".asv/baseline" / f"{MACHINE}.json"
    old = json.loads(path.read_text())["baselines"]["env-x"]
    path.write_text(json.dumps(old))
    assert perf.stored_baseline(repo, machine=MACHINE, env="env-x") is not None
    _results(repo, "env-y", 0.25)
    perf.record_baseline(repo, head, machine=MACHINE, env="env-y", source="working tree")
    x = perf.stored_baseline(repo, machine=MACHINE, env="env-x")
    assert x is not None and _value(repo, x) == 0.5


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"machine": "runner-9"}, "is for machine 'runner-9'"),
        ({"commit": "HEAD"}, "names commit 'HEAD', not a 40-digit hash"),
        ({"env": "env-z"}, "environment 'env-z', not machine"),
    ],
)
def test_a_manifest_entry_that_contradicts_its_key_is_refused_and_not_replaced(
    repo: Path, entry: dict[str, str], named: str
) -> None:
    head = _results(repo, "env-x", 0.5)
    perf.record_baseline(repo, head, machine=MACHINE, env="env-x", source="working tree")
    path = repo / ".asv/baseline" / f"{MACHINE}.json"
    manifest = json.loads(path.read_text())
    manifest["baselines"]["env-x"].update(entry)
    path.write_text(json.dumps(manifest))
    calls: list[Callable[[], object]] = [
        lambda: perf.stored_baseline(repo, machine=MACHINE, env="env-y"),
        lambda: perf.record_baseline(
            repo, head, machine=MACHINE, env="env-x", source="working tree"
        ),
    ]
    for call in calls:
        with pytest.raises(perf.PerfError, match="cannot be read") as info:
            call()
        assert named in str(info.value) and str(path) in str(info.value)
    assert json.loads(path.read_text()) == manifest


def test_another_machines_damaged_manifest_does_not_stop_this_machines_step(repo: Path) -> None:
    # Its own step reports it (the test above); here it is neither named as a baseline nor
    # allowed to fail a machine that does not read it.
    (repo / ".asv/baseline").mkdir(parents=True)
    (repo / ".asv/baseline/runner-2.json").write_text("{not json")
    assert perf.others_note(repo, machine=MACHINE, env="env-x") == ""
    (repo / ".asv/baseline" / f"{MACHINE}.json").write_text("{not json")
    with pytest.raises(perf.PerfError, match="cannot be read"):
        perf.others_note(repo, machine=MACHINE, env="env-x")
