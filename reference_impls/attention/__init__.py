"""Fused attention (FlashAttention-2 in Triton), forward and backward, with its eager reference.

    from reference_impls.attention import attention, reference_attention
    o = attention(q, k, v, causal=True)  # q: (B, H, Nq, D), k/v: (B, Hkv, Nk, D)

Benchmark: ``python -m reference_impls.attention.bench`` (CUDA only). Under
``TRITON_INTERPRET=1``, set before this package is imported, the kernels run on CPU tensors.
"""

from reference_impls.attention.kernel import attention, reference_attention

__all__ = ["attention", "reference_attention"]
