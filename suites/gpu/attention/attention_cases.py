"""The realistic shapes both gpu attention suites run (test_attention_gpu.py and
test_attention_fp8_gpu.py), kept in one place so the fp8 forward is checked on exactly the
shapes the bf16/fp16 kernel is, and the error bounds test_attention_gpu.py and
test_attention_gluon_gpu.py hold both forward kernels to."""

import torch

CASES = {  # name: (B, H, Hkv, Nq, Nk, D, causal)
    "d64-n1024": (2, 16, 16, 1024, 1024, 64, False),
    "d64-n1024-causal": (2, 16, 16, 1024, 1024, 64, True),
    "d128-n2048": (1, 16, 16, 2048, 2048, 128, False),
    "d128-n2048-causal": (1, 16, 16, 2048, 2048, 128, True),
    "gqa-d128-causal": (2, 16, 4, 1024, 1024, 128, True),
    "ragged-d96-causal": (1, 8, 8, 1000, 1531, 96, True),
    "ragged-d64": (2, 4, 2, 777, 333, 64, False),
}

# ||kernel - fp32 math|| / ||fp32 math||. On the GPU fp32 -> fp16/bf16 casts round to nearest;
# the kernel rounds its output, P before P @ V and dS before the dQ/dK products.
# float16: unit roundoff 4.9e-4; bfloat16: 3.9e-3. Gradients take two more roundings.
# Seen on an H200 (2026-11-30, docs/benchmarks/attention.md): fp16 output 2.5-2.8e-4,
# gradients 2.9-3.1e-4; bf16 output 2.0-2.3e-3, gradients 2.3-2.5e-3. The bounds leave ~7x.
FWD_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}
GRAD_TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}
