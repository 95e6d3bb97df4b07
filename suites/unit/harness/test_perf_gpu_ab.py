"""harness.perf.gpu_ab without a GPU: the pairing, blocking and sequential verdict on synthetic
samples (a fake worker), each side's module namespace, the autotuner sharing, the ncu CSV
parsing, and what happens where no CUDA device is visible (a clear error, exit 2)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness import perf
from harness.cli import main
from harness.perf import _gpu_ab_worker as worker
from harness.perf import gpu_ab, step
from harness.perf.decision import Verdict
from harness.perf.sequential import SamplingPlan


class FakeWorker:
    """Answers the driver's requests with synthetic per-call seconds: base ~ 1 ms, head ~
    ratio ms, each with multiplicative lognormal noise of sd `noise` (seeded)."""

    def __init__(self, ratio: float, noise: float, seed: int, fail_at: int | None = None) -> None:
        self.ratio, self.noise, self.rng = ratio, noise, random.Random(seed)
        self.requests: list[dict[str, Any]] = []
        self.fail_at = fail_at

    def ask(self, request: dict[str, Any], timeout: float = 0) -> dict[str, Any]:
        self.requests.append(request)
        if request["op"] == "load":
            return {"ok": True, "number": 5, "ms": {"base": 1.0, "head": self.ratio}}
        if request["op"] == "pair":
            pairs = sum(1 for r in self.requests if r["op"] == "pair")
            if self.fail_at is not None and pairs > self.fail_at:
                return {"ok": False, "error": "RuntimeError: CUDA error: an illegal memory access"}
            drift = math.exp(self.rng.gauss(0, 0.02))  # shared by the pair (clocks, a neighbour)
            return {
                "ok": True,
                "seconds": {
                    side: 1e-3 * drift * r * math.exp(self.rng.gauss(0, self.noise))
                    for side, r in (("base", 1.0), ("head", self.ratio))
                },
            }
        return {"ok": True}


TREE = gpu_ab.Tree(Path("b"), Path("c"))
PLAN = SamplingPlan(first=60, max_pairs=600, budget_s=1e9)


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [(1.05, Verdict.REGRESSED), (1.0, Verdict.UNCHANGED), (1 / 1.05, Verdict.IMPROVED)],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthetic_pairs_get_the_verdict_of_their_ratio(ratio, expected, seed):
    fake = FakeWorker(ratio, noise=0.01, seed=seed)
    result = gpu_ab._measure_one(fake, "m.KGPU.time_x", TREE, TREE, 1.03, PLAN)  # type: ignore[arg-type]
    assert result.error is None
    assert result.comparison is not None and result.comparison.verdict is expected
    assert result.stopped == "decided"
    assert result.comparison.low <= ratio <= result.comparison.high
    # Blocks of 5 pairs are the units: 60 pairs are 12 blocks.
    assert result.comparison.units == len(result.base) // 5
    # The side that goes first alternates pair by pair.
    firsts = [r["first"] for r in fake.requests if r["op"] == "pair"]
    assert firsts[:4] == ["base", "head", "base", "head"]
    assert fake.requests[-1]["op"] == "teardown"


def test_a_ratio_on_the_factor_takes_more_pairs_and_ends_undecided():
    # 1.015 against factor 1.03 with 10% noise: 200 pairs cannot put its interval inside
    # (1/1.03, 1.03), and its estimate is below the factor.
    fake = FakeWorker(1.015, noise=0.1, seed=4)
    plan = SamplingPlan(first=60, max_pairs=200, budget_s=1e9)
    result = gpu_ab._measure_one(fake, "m.KGPU.time_x", TREE, TREE, 1.03, plan)  # type: ignore[arg-type]
    assert result.comparison is not None
    assert result.comparison.verdict is Verdict.UNDECIDED
    assert len(result.base) == 200 and result.stopped == "max_pairs"
    assert gpu_ab.exit_code({"x": result}) == 2
    assert "would need" in gpu_ab.markdown({"x": result})


def test_a_worker_error_is_reported_and_never_passes():
    fake = FakeWorker(1.0, noise=0.01, seed=5, fail_at=7)
    result = gpu_ab._measure_one(fake, "m.KGPU.time_x", TREE, TREE, 1.03, PLAN)  # type: ignore[arg-type]
    assert result.stopped == "error" and "illegal memory access" in (result.error or "")
    assert gpu_ab.exit_code({"x": result}) == 2


def _tree(root: Path, value: str) -> None:
    (root / "code").mkdir(parents=True)
    (root / "code" / "lib_x.py").write_text(
        f"VALUE = {value!r}\n\ndef lazy():\n    import lib_y\n    return lib_y.V\n"
    )
    (root / "code" / "lib_y.py").write_text(f"V = {value + '-lazy'!r}\n")
    (root / "bench").mkdir()
    (root / "bench" / "bench_toy.py").write_text(
        "import lib_x\n\n\nclass ToyGPU:\n    params = [[1, 2], ['a']]\n\n"
        "    def setup(self, n, s):\n        self.seen = lib_x.VALUE\n\n"
        "    def time_it(self, n, s):\n        return (self.seen, lib_x.lazy(), n, s)\n"
    )


def test_each_side_runs_its_own_tree_also_for_lazy_imports(tmp_path):
    for side in ("base", "head"):
        _tree(tmp_path / side, side)
    spaces = {
        side: worker._Namespace(side, str(tmp_path / side / "bench"), str(tmp_path / side / "code"))
        for side in ("base", "head")
    }
    benches = {
        side: worker._Side(ns, "bench_toy.ToyGPU.time_it(2, 'a')") for side, ns in spaces.items()
    }
    for side, bench in benches.items():
        with spaces[side].active():
            assert bench.fn(*bench.args) == (side, f"{side}-lazy", 2, "a")
    import sys

    assert "lib_x" not in sys.modules and "lib_y" not in sys.modules  # only while a side runs
    assert set(spaces["head"].by_common_name()) == {"<benchmarks>.bench_toy", "lib_x", "lib_y"}


def test_a_parameter_combination_that_does_not_exist_names_itself(tmp_path):
    _tree(tmp_path / "base", "base")
    ns = worker._Namespace(
        "base", str(tmp_path / "base" / "bench"), str(tmp_path / "base" / "code")
    )
    with pytest.raises(ValueError, match=r"no parameter combination of bench_toy\.ToyGPU\.time_it"):
        worker._Side(ns, "bench_toy.ToyGPU.time_it(3, 'a')")
    with pytest.raises(ValueError, match="not a timing benchmark"):
        worker._Side(ns, "bench_toy.ToyGPU.track_it(2, 'a')")


class Config:  # as triton.Config: __str__, no __repr__ (str of a list shows addresses)
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


class Autotuner:  # named as Triton's: share_tuning matches the type's name
    def __init__(self, source: str, configs: list[str]) -> None:
        self.fn = type("Fn", (), {"cache_key": source})()
        self.configs = [Config(c) for c in configs]  # each side has its own objects
        self.cache: dict[tuple, Config] = {}


def test_head_reuses_base_tuning_only_for_the_same_kernel_and_configs():
    base, head = {"k": type("B", (), {})()}, {"k": type("H", (), {})()}
    for attr in ("same", "changed", "retuned"):
        tuner = Autotuner("src1", ["c1", "c2"])
        tuner.cache[(1024, 64)] = tuner.configs[1]
        setattr(base["k"], attr, tuner)
    head["k"].same = Autotuner("src1", ["c1", "c2"])
    head["k"].changed = Autotuner("src2", ["c1", "c2"])  # the kernel changed
    head["k"].retuned = Autotuner("src1", ["c1", "c3"])  # its configs changed
    shared = worker.share_tuning(base, head)
    assert shared == ["k.same"]
    # head's own Config object, the one base picked
    assert head["k"].same.cache == {(1024, 64): head["k"].same.configs[1]}
    assert head["k"].changed.cache == {} and head["k"].retuned.cache == {}


NCU_HEADER = (
    "ID,Process ID,Process Name,Host Name,Kernel Name,Context,Stream,Block Size,Grid Size,"
    "Device,CC,Section Name,Metric Name,Metric Unit,Metric Value"
)


def _ncu_csv(kernels: list[tuple[str, str, str]]) -> str:
    """ncu --csv's layout: a quoted row per kernel and metric (thousands separators in the
    values), its ==PROF== lines around them. kernels: (name, dram bytes, instructions)."""
    lines = ["==PROF== Connected to process 1", ",".join(f'"{c}"' for c in NCU_HEADER.split(","))]
    for i, (name, dram, inst) in enumerate(kernels):
        for metric, unit, value in (
            ("dram__bytes.sum", "byte", dram),
            ("sm__sass_inst_executed.sum", "inst", inst),
        ):
            cells = [str(i), "1", "python", "h", name, "1", "7", "(128, 1, 1)", "(8, 4, 1)"]
            cells += ["0", "9.0", "Command line profiler metrics", metric, unit, value]
            lines.append(",".join(f'"{c}"' for c in cells))
    return "\n".join([*lines, "==PROF== Disconnected from process 1"])


SPIN = "void at::cuda::spin_kernel(long)"
NCU_CSV = _ncu_csv(
    [
        ("_attn_fwd", "1,000,000", "2,000"),
        (SPIN, "0", "3"),
        ("_attn_fwd", "1,000,000", "2,000"),
        ("_attn_fwd", "50,000", "100"),
        (SPIN, "0", "3"),
    ]
)


def test_ncu_counters_sum_each_call_between_markers():
    metrics = gpu_ab.DEFAULT_METRICS
    chunks = gpu_ab.parse_ncu_csv(NCU_CSV, metrics)
    got = gpu_ab.counters_from_chunks(["m.KGPU.time_x"], chunks, metrics)["m.KGPU.time_x"]
    assert got.kernels == (1, 2)
    assert got.base == {"sm__sass_inst_executed.sum": 2000.0, "dram__bytes.sum": 1e6}
    assert got.ratios() == {"sm__sass_inst_executed.sum": 1.05, "dram__bytes.sum": 1.05}
    with pytest.raises(gpu_ab.PerfError, match="expected 4"):
        gpu_ab.counters_from_chunks(["a.K.time_x", "b.K.time_y"], chunks, metrics)
    with pytest.raises(gpu_ab.PerfError, match="no CSV rows"):
        gpu_ab.parse_ncu_csv("==PROF== nothing\n", metrics)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["HEAD", "bench_x.K.track_y"], "is not a timing benchmark name"),
        (["HEAD", "bench_x.KGPU.time_y", "--factor", "1"], "--factor"),
        (["HEAD", "bench_x.KGPU.time_y", "--pairs", "5"], "--pairs"),
        (["-x", "bench_x.KGPU.time_y"], "-x"),
    ],
)
def test_gpu_ab_command_rejects_bad_input_with_exit_2(args, message):
    result = CliRunner().invoke(main, ["perf", "gpu-ab", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


# --- the gate's GPU group (harness perf ci --group gpu): rows judged on GPU A/B pairs -------


def _gate_report(*rows: perf.Row) -> perf.GateReport:
    return perf.GateReport(0, "a" * 40, "b" * 40, "gpu-h200", 1.03, list(rows), [])


def _row(name: str, status: str = "unchanged") -> perf.Row:
    return perf.Row(name, "env", status, 1.0, 1.0, "seconds", 7, 7, ratio=1.0, kind="time")


def test_every_comparable_gpu_timing_row_is_timed_in_gpu_pairs():
    report = _gate_report(
        _row("b.C.time_cpu", "undecided"),
        _row("b.AttnGPU.time_fwd", "unchanged"),  # stored results said so: timed anyway
        _row("b.AttnGPU.time_bwd", "undecided"),
        _row("b.AttnGPU.time_new", "new in head, no baseline"),
    )
    assert step.gpu_ab_names(report) == ["b.AttnGPU.time_fwd", "b.AttnGPU.time_bwd"]
    assert "b.AttnGPU.time_fwd" not in step.ab_names(report, measured_here=True)


def _synthetic(name: str, ratio: float, noise: float, seed: int, pairs: int = 60):
    fake = FakeWorker(ratio, noise, seed)
    plan = SamplingPlan(first=pairs, max_pairs=pairs, budget_s=1e9)
    return gpu_ab._measure_one(fake, name, TREE, TREE, 1.03, plan)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ratio", "noise", "status", "code"),
    [(1.05, 0.01, "regressed", 1), (1.0, 0.01, "unchanged", 0), (1.015, 0.1, "undecided", 2)],
)
def test_gpu_pairs_decide_the_gpu_rows_and_undecided_exits_2(
    monkeypatch, ratio, noise, status, code
):
    name = "b.AttnGPU.time_fwd"
    report = _gate_report(_row(name, "unchanged"))
    monkeypatch.setattr(
        step, "measure_gpu_ab", lambda *a, **k: {name: _synthetic(name, ratio, noise, seed=7)}
    )
    config = step.PerfStepConfig(group="gpu", factor=1.03)
    judged, note = step._gpu_ab(Path("."), "a" * 40, [name], report, config, None)
    (row,) = judged.rows
    assert row.status == status and judged.exit_code == code
    assert row.method == "GPU A/B pairs" and row.passes == 60
    assert "CUDA events" in note


def test_without_a_cuda_device_the_gpu_rows_keep_the_asv_verdict_and_say_why(monkeypatch):
    def no_gpu(*args, **kwargs):
        raise gpu_ab.NoGpuError("GPU A/B timing needs a CUDA device: none visible")

    monkeypatch.setattr(step, "measure_gpu_ab", no_gpu)
    report = _gate_report(_row("b.AttnGPU.time_fwd", "undecided"))
    config = step.PerfStepConfig(group="gpu", factor=1.03)
    judged, note = step._gpu_ab(Path("."), "a" * 40, ["b.AttnGPU.time_fwd"], report, config, None)
    assert judged is report  # the asv samples' verdict stands (undecided: still exit 2)
    assert "not taken" in note and "needs a CUDA device" in note
