"""The GPU A/B timer on a machine without a CUDA device: a clear error naming why, and
``harness perf gpu-ab`` exits 2 with it (never 0: nothing was measured). The worker really
starts (and imports torch), so this is an integration test; suites/gpu/perf runs the timer
where a GPU is."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from tiny_asv_project import make_repo

from harness.cli import main
from harness.perf import gpu_ab

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA device is visible: suites/gpu/perf tests the timer"
)


def test_the_timer_says_that_it_needs_a_cuda_device(tmp_path):
    tree = gpu_ab.Tree(tmp_path, tmp_path)
    with pytest.raises(
        gpu_ab.NoGpuError, match=r"needs a CUDA device: .*is_available\(\) is False"
    ):
        gpu_ab.measure_gpu_ab_trees(tree, tree, ["m.KGPU.time_x"], factor=1.05)


def test_gpu_ab_command_exits_2_without_a_gpu(tmp_path, monkeypatch):
    repo, sha = make_repo(tmp_path)
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(main, ["perf", "gpu-ab", sha, "bench_tiny.Loop.time_work"])
    assert result.exit_code == 2, result.output
    assert "needs a CUDA device" in result.output
    assert "Traceback" not in result.output
