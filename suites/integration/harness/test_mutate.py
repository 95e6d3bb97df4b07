"""`harness mutate` from the outside: mutmut on a small module with a deliberately weak test."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("mutmut")

DISCOUNT = """
    def discount(total):
        if total >= 100:
            return total - 10
        return total
"""

# Weak on purpose: nothing checks the boundary at exactly 100.
WEAK_TEST = """
    from shop.discount import discount

    def test_discount():
        assert discount(50) == 50
        assert discount(200) == 190
"""


def _mutate(pytester, *args):
    return pytester.run(
        sys.executable, "-m", "harness.cli", "mutate", *args, "--report-dir", "m", timeout=600
    )


def test_a_weak_test_leaves_the_boundary_mutant_alive_and_a_boundary_test_kills_it(
    project, pytester, monkeypatch
):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    project(
        {
            "shop/__init__.py": "",
            "shop/discount.py": DISCOUNT,
            "suites/unit/test_discount.py": WEAK_TEST,
        }
    )
    result = _mutate(pytester, "shop/discount.py")
    assert result.ret == 0, result.stdout.str()
    report = json.loads((pytester.path / "m/mutation.json").read_text())
    (module,) = report["modules"]
    assert module["path"] == "shop/discount.py"
    assert module["tests"] == ["suites/unit/test_discount.py"]
    assert 0 < module["killed"] < module["total"]  # `- 10` changes are caught, not all
    changes = {(s["line"], s["before"], s["after"]) for s in module["survivors"]}
    assert (2, "if total >= 100:", "if total > 100:") in changes
    markdown = (pytester.path / "m/mutation.md").read_text()
    assert "| shop/discount.py:2 | survived | `if total >= 100:` → `if total > 100:` |" in markdown
    weak_score = module["score"]

    # The survivor, turned into a test: the same mutant is now killed.
    (pytester.path / "suites/unit/test_discount.py").write_text(
        WEAK_TEST.replace("    def", "def").replace("\n    ", "\n")
        + "\ndef test_the_boundary_gets_the_discount():\n    assert discount(100) == 90\n"
    )
    assert _mutate(pytester, "shop/discount.py", "--min-score", "0").ret == 0
    (module,) = json.loads((pytester.path / "m/mutation.json").read_text())["modules"]
    changes = {(s["line"], s["before"], s["after"]) for s in module["survivors"]}
    assert (2, "if total >= 100:", "if total > 100:") not in changes
    assert module["score"] > weak_score


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("shop/missing.py", "shop/missing.py: not a Python module of the project"),
        (
            "shop/untested.py",
            "shop/untested.py: no test file of the tiers unit,property imports it",
        ),
    ],
)
def test_a_module_that_cannot_be_mutation_tested_is_a_usage_error(project, pytester, path, message):
    project({"shop/__init__.py": "", "shop/untested.py": "X = 1\n"})
    result = _mutate(pytester, path)
    assert result.ret == 2
    assert message in result.stderr.str()
    assert not (pytester.path / "m").exists()  # nothing was run or written
