"""harness.perf.gpu_ab on a real GPU: a kernel with a real 25% more work reads ``regressed``,
two copies of identical code read ``unchanged`` (one worker process each, CUDA events, L2
flushed before every call). Skipped without CUDA, with the reason shown."""

from pathlib import Path

import pytest
import torch

from harness.perf.decision import Verdict
from harness.perf.gpu_ab import Tree, measure_gpu_ab_trees

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (torch.cuda.is_available() is False)",
)

BENCH = """
import torch

REPS = {reps}


class MatmulGPU:
    def setup(self):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.a = torch.randn(2048, 2048, device="cuda", generator=g)
        self.b = torch.randn(2048, 2048, device="cuda", generator=g)

    def time_mm(self):
        for _ in range(REPS):
            torch.mm(self.a, self.b)
        torch.cuda.synchronize()
"""
NAME = "bench_mm.MatmulGPU.time_mm"


def _tree(root: Path, reps: int) -> Tree:
    root.mkdir()
    (root / "bench_mm.py").write_text(BENCH.format(reps=reps))
    return Tree(root, root)


@pytest.mark.parametrize(
    ("head_reps", "expected"), [(5, Verdict.REGRESSED), (4, Verdict.UNCHANGED)]
)
def test_gpu_ab_catches_more_work_and_passes_identical_code(tmp_path, head_reps, expected):
    base, head = _tree(tmp_path / "base", 4), _tree(tmp_path / "head", head_reps)
    result = measure_gpu_ab_trees(base, head, [NAME], factor=1.1, max_seconds=60)[NAME]
    assert result.error is None, result.error
    assert result.comparison is not None
    assert result.comparison.verdict is expected, result.comparison
    if expected is Verdict.REGRESSED:
        assert 1.15 < result.comparison.estimate < 1.35  # 5 products against 4
