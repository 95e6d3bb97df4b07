"""`harness ci` in pull-request mode from the outside: a git project, a change, what runs.

Also the xdist scheduling it uses (harness.xdist_groups): the distributed tier on one worker,
an integration module with a module-scoped fixture on one worker, node ids (and so seeds,
quarantine and reproduce lines) untouched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiny_asv_project import git

from harness.seeding import node_seed

pytest.importorskip("xdist")

# The env check step compares this venv with the repository's lock: the project under test
# has none of its own.
LOCK = Path(__file__).resolve().parents[3] / "requirements" / "cpu.lock"

RECORD = """
    import json, os

    def record(request, seed):
        with open(os.environ["RUN_LOG"], "a") as f:
            f.write(json.dumps({"nodeid": request.node.nodeid, "seed": seed,
                                "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")
"""


MODULE_FIXTURE = """
        @pytest.fixture(scope="module")
        def shared():
            pass
"""


def _test_file(module: str, n: int) -> str:
    return f"""
        import pytest
        from helpers_log import record
        import {module}

        @pytest.mark.parametrize("i", range({n}))
        def test_it(i, request, seed):
            record(request, seed)
            assert {module}.VALUE == 1
    """


@pytest.fixture
def logged(project, pytester, monkeypatch):
    log = pytester.path / "run.jsonl"
    monkeypatch.setenv("RUN_LOG", str(log))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.syspathinsert()  # helpers_log, comp_a, comp_b import from the project root

    def rows() -> list[dict]:
        if not log.exists():
            return []
        out = [json.loads(line) for line in log.read_text().splitlines()]
        log.unlink()
        return out

    project({"helpers_log.py": RECORD})
    return rows


def test_distributed_tests_share_one_worker_and_integration_tests_their_modules_node_ids_intact(
    project, pytester, logged
):
    project(
        {
            "comp_a.py": "VALUE = 1\n",
            "suites/unit/test_u.py": _test_file("comp_a", 6),
            # A module-scoped fixture: its module is one unit of work, on one worker.
            "suites/integration/test_i.py": _test_file("comp_a", 3) + MODULE_FIXTURE,
            "suites/distributed/test_d1.py": _test_file("comp_a", 2),
            "suites/distributed/test_d2.py": _test_file("comp_a", 2),
        }
    )
    result = pytester.runpytest_subprocess(
        "-p", "harness.xdist_groups", "-n", "2", "--harness-seed=11", "--harness-json=r.json"
    )
    result.assert_outcomes(passed=13)
    rows = logged()
    distributed = [r for r in rows if "/distributed/" in r["nodeid"]]
    assert len({r["worker"] for r in distributed}) == 1, rows  # both modules on one worker
    # ... one after the other, in collection order (no two gloo groups at once).
    assert [r["nodeid"] for r in distributed] == sorted(r["nodeid"] for r in distributed)
    assert len({r["worker"] for r in rows if "/integration/" in r["nodeid"]}) == 1, rows
    assert all("@" not in r["nodeid"] for r in rows)
    assert all(r["seed"] == node_seed(11, r["nodeid"]) for r in rows)
    report = json.loads((pytester.path / "r.json").read_text())
    assert sorted(t["nodeid"] for t in report["tests"]) == sorted(r["nodeid"] for r in rows)


def _ci(pytester):
    result = pytester.run(
        sys.executable, "-m", "harness.cli", "ci", "--no-perf", "--changed-since", "main",
        "--workers", "2", "--lock", str(LOCK), "--report-dir", "r", timeout=300,
    )  # fmt: skip
    selection = json.loads((pytester.path / "r" / "selection.json").read_text())
    return result, selection


def test_pr_mode_runs_what_a_change_reaches_nothing_for_no_change_and_all_for_the_config(
    project, pytester, logged
):
    root = project(
        {
            "comp_a.py": "VALUE = 1\n",
            "comp_b.py": "VALUE = 1\n",
            "suites/unit/test_a.py": _test_file("comp_a", 3),
            "suites/unit/test_b.py": _test_file("comp_b", 3),
            "suites/integration/test_b_slow.py": _test_file("comp_b", 1),
            "pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = ['suites']\n",
            # What the runs write is not part of the change (pytester's own output included).
            ".gitignore": "r/\nrun.jsonl\nstdout\nstderr\n__pycache__/\n.pytest_cache/\n",
        }
    )
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "feature")

    # No change (the base itself, e.g. a fresh clone of main): a selection would be empty and
    # pass without testing anything, so the run falls back to every test, saying why.
    result, selection = _ci(pytester)
    assert result.ret == 0, result.stdout.str()
    assert selection["full_run"] and "nothing changed since main" in selection["note"]
    assert "--numprocesses=2" in selection["pytest_args"]  # the full run is parallel too
    rows = logged()
    assert len(rows) == 7 and all(r["worker"] for r in rows)

    # A documentation-only change reaches no test: skipped, and said so.
    (root / "NOTES.md").write_text("notes\n")
    result, selection = _ci(pytester)
    assert result.ret == 0, result.stdout.str()
    assert selection["changed"] == ["NOTES.md"] and selection["tests"] == []
    result.stdout.fnmatch_lines(["*cpu tiers: skipped (no test file reaches the change*"])
    assert logged() == []
    (root / "NOTES.md").unlink()

    # A one-line change in comp_b: its two test files, on two workers, nothing of comp_a.
    (root / "comp_b.py").write_text("VALUE = 2\n")  # and it breaks them
    result, selection = _ci(pytester)
    assert result.ret == 1
    assert selection["tests"] == ["suites/integration/test_b_slow.py", "suites/unit/test_b.py"]
    ran = {r["nodeid"].split("::")[0] for r in logged()}
    assert ran == {"suites/integration/test_b_slow.py", "suites/unit/test_b.py"}
    cpu = json.loads((root / "r" / "cpu" / "report.json").read_text())
    assert len(cpu["tests"]) == 4 and all(t["outcome"] == "failed" for t in cpu["tests"])

    # A change to the configuration reaches every test.
    (root / "comp_b.py").write_text("VALUE = 1\n")
    (root / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\ntestpaths = ['suites']\naddopts = ['-ra']\n"
    )
    result, selection = _ci(pytester)
    assert result.ret == 0, result.stdout.str()
    assert selection["everything"] and "pyproject.toml" in selection["note"]
    assert len(logged()) == 7


def test_a_base_ref_that_does_not_exist_is_a_usage_error(project, pytester):
    root = project({"suites/unit/test_ok.py": "def test_ok():\n    pass\n"})
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    result = pytester.run(
        sys.executable, "-m", "harness.cli", "ci", "--no-perf", "--changed-since", "nope"
    )
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*--changed-since*'nope'*"])
