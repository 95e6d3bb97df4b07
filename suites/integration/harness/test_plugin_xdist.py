"""The plugin under pytest-xdist: one base seed for the whole run, whatever the worker."""

from __future__ import annotations

import json
import re

import pytest

from harness.seeding import node_seed

pytest.importorskip("xdist")


def test_every_xdist_worker_derives_test_seeds_from_the_controllers_base_seed(
    project, pytester, monkeypatch
):
    out = pytester.path / "seeds.jsonl"
    monkeypatch.setenv("SEEDS_OUT", str(out))
    project(
        {
            "suites/unit/test_many.py": """
                import json, os
                import pytest

                @pytest.mark.parametrize("i", range(8))
                def test_seed(i, seed, request):
                    with open(os.environ["SEEDS_OUT"], "a") as f:
                        worker = os.environ.get("PYTEST_XDIST_WORKER")
                        f.write(json.dumps({"nodeid": request.node.nodeid, "seed": seed,
                                            "worker": worker}) + "\\n")
            """
        }
    )
    # No --harness-seed: each worker would draw its own random base seed if not handed one.
    result = pytester.runpytest_subprocess("-n", "2", "-p", "xdist", "--harness-json=report.json")
    result.assert_outcomes(passed=8)
    base = int(re.search(r"harness: seed (\d+)", result.stdout.str()).group(1))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["worker"] for r in rows} == {"gw0", "gw1"}  # both workers ran tests
    assert all(r["seed"] == node_seed(base, r["nodeid"]) for r in rows)
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["seed"] == base and len(report["tests"]) == 8  # the controller saw every test
