"""Fused attention (FlashAttention-2 in Triton), forward and backward, with its eager reference,
a warp-specialized Hopper forward and backward in Gluon (FlashAttention-3's schedule,
``gluon_fwd``, ``gluon_bwd``) that ``attention`` picks on sm_90 where they measured faster, and
an fp8 (e4m3) forward for inference with per-block scales.

    from reference_impls.attention import attention, reference_attention
    o = attention(q, k, v, causal=True)  # q: (B, H, Nq, D), k/v: (B, Hkv, Nk, D)
    o8 = attention_fp8(q, k, v, causal=True)  # inference: e4m3 operands, bf16 output

Benchmark: ``python -m reference_impls.attention.bench`` (CUDA only). Under
``TRITON_INTERPRET=1``, set before this package is imported, the kernels run on CPU tensors.
"""

from reference_impls.attention.fp8 import Fp8Blocks, attention_fp8, quantize_fp8
from reference_impls.attention.kernel import attention, reference_attention

__all__ = ["attention", "reference_attention", "attention_fp8", "quantize_fp8", "Fp8Blocks"]
