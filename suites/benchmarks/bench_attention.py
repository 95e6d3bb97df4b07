"""asv benchmarks of reference_impls.attention.

- ``AttentionInterpreter``: the kernels under the Triton interpreter on a tiny problem, on
  machines without a GPU (the CPU CI machines): a regression here is a slower interpreter path
  (more tile operations per block), not a slower GPU kernel.
- ``AttentionGPU``: bf16 at the benchmark table's shapes (``python -m
  reference_impls.attention.bench``: H = 2048 / D, B = 32768 / N): forward, backward alone
  and forward+backward. ``track_info_*`` (plotted, never gated: they derive from wall times,
  suites/benchmarks/README.md item 6): TFLOP/s from the table's formula (4 B H N^2 D, halved
  when causal, x2.5 for the backward, x3.5 for both) and this kernel's time over SDPA flash's
  and over SDPA cuDNN's, each measured in the same process (bigger is worse). Skipped without
  CUDA. Results and the full comparison: docs/benchmarks/attention.md.

TRITON_INTERPRET must be set before the kernels are defined, so this module sets it (when no
GPU is visible) before importing reference_impls.attention.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference_impls.attention import (
    attention,  # noqa: E402
    bench,  # noqa: E402
)
from reference_impls.attention.kernel import INTERPRET  # noqa: E402


class AttentionInterpreter:
    """B=1, H=2, N=64, D=32, fp32: about 0.1 s forward under the interpreter."""

    params = [[False, True]]
    param_names = ["causal"]
    timeout = 120
    repeat = (7, 10, 60.0)  # the gate needs >= 7 samples (suites/benchmarks/README.md item 5)

    def setup(self, causal):
        if not INTERPRET:
            raise NotImplementedError(
                "the kernels are compiled here (a GPU is visible), not interpreted"
            )
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v = (
            torch.randn(1, 2, 64, 32, generator=g).requires_grad_() for _ in range(3)
        )
        self.do = torch.randn(1, 2, 64, 32, generator=g)
        attention(self.q, self.k, self.v, causal=causal)  # touch the code paths once

    def time_forward(self, causal):
        with torch.no_grad():
            attention(self.q, self.k, self.v, causal=causal)

    def time_forward_backward(self, causal):
        out = attention(self.q, self.k, self.v, causal=causal)
        torch.autograd.grad(out, (self.q, self.k, self.v), self.do)


class AttentionGPU:
    """The benchmark table's bf16 shapes: H = 2048 / D, B = 32768 / N."""

    params = [[64, 128], [1024, 4096, 16384], [False, True]]
    param_names = ["head_dim", "seq_len", "causal"]
    timeout = 600  # the first call per shape autotunes (compiles and times a few configs)
    number = 5
    repeat = (7, 10, 60.0)

    def setup(self, head_dim, seq_len, causal):
        if not torch.cuda.is_available() or INTERPRET:
            raise NotImplementedError("CUDA is not available")
        self.fwd_case = bench.Case.standard(head_dim, seq_len, causal, "fwd")
        self.bwd_only_case = bench.Case.standard(head_dim, seq_len, causal, "bwd")
        self.bwd_case = bench.Case.standard(head_dim, seq_len, causal, "fwd+bwd")
        self.inputs = bench.make_inputs(self.fwd_case)
        self.fwd = bench.step_fn("triton", self.fwd_case, self.inputs)
        self.bwd = bench.step_fn("triton", self.bwd_only_case, self.inputs)
        self.fwd_bwd = bench.step_fn("triton", self.bwd_case, self.inputs)
        self.fwd_bwd()  # autotune both passes outside the timings
        torch.cuda.synchronize()

    def teardown(self, head_dim, seq_len, causal):
        self.inputs = self.fwd = self.bwd = self.fwd_bwd = None
        torch.cuda.empty_cache()

    def time_forward(self, head_dim, seq_len, causal):
        self.fwd()
        torch.cuda.synchronize()

    def time_backward(self, head_dim, seq_len, causal):
        self.bwd()
        torch.cuda.synchronize()

    def time_forward_backward(self, head_dim, seq_len, causal):
        self.fwd_bwd()
        torch.cuda.synchronize()

    def track_info_tflops_forward(self, head_dim, seq_len, causal):
        return bench.measure(self.fwd_case, "triton", self.inputs).tflops

    track_info_tflops_forward.unit = "TFLOP/s"

    def track_info_tflops_forward_backward(self, head_dim, seq_len, causal):
        return bench.measure(self.bwd_case, "triton", self.inputs).tflops

    track_info_tflops_forward_backward.unit = "TFLOP/s"

    def track_info_tflops_backward(self, head_dim, seq_len, causal):
        return bench.measure(self.bwd_only_case, "triton", self.inputs).tflops

    track_info_tflops_backward.unit = "TFLOP/s"

    def track_info_time_relative_to_sdpa_flash(self, head_dim, seq_len, causal):
        ours = bench.measure(self.bwd_case, "triton", self.inputs)
        flash = bench.measure(self.bwd_case, "flash", self.inputs)
        if ours.ms is None or flash.ms is None:
            raise NotImplementedError(ours.error or flash.error)
        return ours.ms / flash.ms

    track_info_time_relative_to_sdpa_flash.unit = "x SDPA flash time (fwd+bwd)"

    def track_info_time_relative_to_sdpa_cudnn(self, head_dim, seq_len, causal):
        ours = bench.measure(self.bwd_case, "triton", self.inputs)
        cudnn = bench.measure(self.bwd_case, "cudnn", self.inputs)
        if ours.ms is None or cudnn.ms is None:
            raise NotImplementedError(ours.error or cudnn.error)
        return ours.ms / cudnn.ms

    track_info_time_relative_to_sdpa_cudnn.unit = "x SDPA cuDNN time (fwd+bwd)"


class AttentionFp8GPU:
    """attention_fp8 (pre-quantized inputs) at the table's shapes, against cuDNN's bf16 forward."""

    params = [[64, 128], [1024, 4096, 16384], [False, True]]
    param_names = ["head_dim", "seq_len", "causal"]
    timeout = 600
    number = 5
    repeat = (7, 10, 60.0)

    def setup(self, head_dim, seq_len, causal):
        if not torch.cuda.is_available() or INTERPRET:
            raise NotImplementedError("CUDA is not available")
        self.case = bench.Case.standard(head_dim, seq_len, causal, "fwd")
        self.inputs = bench.make_inputs(self.case)
        self.fwd = bench.step_fn("fp8", self.case, self.inputs)
        self.fwd()  # autotune outside the timings
        torch.cuda.synchronize()

    def teardown(self, head_dim, seq_len, causal):
        self.inputs = self.fwd = None
        torch.cuda.empty_cache()

    def time_forward(self, head_dim, seq_len, causal):
        self.fwd()
        torch.cuda.synchronize()

    def track_info_tflops_forward(self, head_dim, seq_len, causal):
        return bench.measure(self.case, "fp8", self.inputs).tflops

    track_info_tflops_forward.unit = "TFLOP/s"

    def track_info_time_relative_to_sdpa_cudnn(self, head_dim, seq_len, causal):
        ours = bench.measure(self.case, "fp8", self.inputs)
        cudnn = bench.measure(self.case, "cudnn", self.inputs)
        if ours.ms is None or cudnn.ms is None:
            raise NotImplementedError(ours.error or cudnn.error)
        return ours.ms / cudnn.ms

    track_info_time_relative_to_sdpa_cudnn.unit = "x SDPA cuDNN bf16 time (fwd)"
