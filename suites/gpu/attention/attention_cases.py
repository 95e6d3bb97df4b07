"""The realistic shapes both gpu attention suites run (test_attention_gpu.py and
test_attention_fp8_gpu.py), kept in one place so the fp8 forward is checked on exactly the
shapes the bf16/fp16 kernel is."""

CASES = {  # name: (B, H, Hkv, Nq, Nk, D, causal)
    "d64-n1024": (2, 16, 16, 1024, 1024, 64, False),
    "d64-n1024-causal": (2, 16, 16, 1024, 1024, 64, True),
    "d128-n2048": (1, 16, 16, 2048, 2048, 128, False),
    "d128-n2048-causal": (1, 16, 16, 2048, 2048, 128, True),
    "gqa-d128-causal": (2, 16, 4, 1024, 1024, 128, True),
    "ragged-d96-causal": (1, 8, 8, 1000, 1531, 96, True),
    "ragged-d64": (2, 4, 2, 777, 333, 64, False),
}
