"""Deterministic mode, tested from the outside in fresh processes (the torch switches are
process-global, so these cannot run in-process; a fresh torch import makes them slow for the
unit tier's budget)."""

from __future__ import annotations

import pytest

DETERMINISM_PROBE = {
    "suites/unit/test_det.py": """
        import os
        import torch

        def test_probe():
            print("DETERMINISTIC", torch.are_deterministic_algorithms_enabled(),
                  torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                  os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    """
}


@pytest.mark.parametrize(
    ("ci", "args", "expected"),
    [
        (None, [], "DETERMINISTIC False False False None"),
        ("true", [], "DETERMINISTIC True True False :4096:8"),
        (None, ["--harness-deterministic=on"], "DETERMINISTIC True True False :4096:8"),
        ("true", ["--harness-deterministic=off"], "DETERMINISTIC False False False None"),
    ],
    ids=["local-default-off", "ci-default-on", "local-opt-in", "ci-opt-out"],
)
def test_deterministic_mode_is_on_under_ci_and_selectable_locally(
    project, pytester, monkeypatch, ci, args, expected
):
    project(DETERMINISM_PROBE)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    if ci:
        monkeypatch.setenv("CI", ci)
    # A subprocess: the torch switches are process-global and must not leak into this run.
    result = pytester.runpytest_subprocess("-s", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*{expected}"])
