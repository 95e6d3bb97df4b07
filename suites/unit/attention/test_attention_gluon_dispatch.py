"""Which forward ``attention(forward="auto")`` takes, checked on the CPU: the policy itself
(``kernel.gluon_forward_by_default``, by head dim, mask and key count) and that ``_use_gluon``
follows it for a call the Gluon kernel covers. The gpu tier checks that "auto" then runs that
kernel (test_attention_gluon_gpu.py, ``test_auto_picks_gluon_only_where_it_measured_faster``).

Run 13 (docs/benchmarks/attention.md): at D=64 the Gluon forward is taken for non-causal calls
from 16384 keys on, where it was faster than the Triton forward in every round of bench.py's
table and level with it when the two alternate in one process; D=128 takes it always; D=64
causal never.
"""

import pytest
import torch

from reference_impls.attention import kernel


@pytest.mark.parametrize(
    ("d", "causal", "n_k", "gluon"),
    [
        (128, False, 1024, True),
        (128, True, 1024, True),
        (128, True, 16384, True),
        (64, False, 1024, False),
        (64, False, 4096, False),
        (64, False, 16383, False),
        (64, False, 16384, True),
        (64, False, 65536, True),
        (64, True, 16384, False),
        (64, True, 65536, False),
    ],
)
def test_run13_policy(d: int, causal: bool, n_k: int, gluon: bool) -> None:
    assert kernel.gluon_forward_by_default(d, causal, n_k) is gluon


def test_auto_follows_the_policy_for_calls_the_gluon_kernel_covers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under the interpreter the Gluon kernel covers nothing (_gluon_unsupported says why), so
    # pretend it covers every call: what is left is the dispatch by head dim, mask and Nk.
    # Nq differs from Nk so that a dispatch on the wrong length shows.
    monkeypatch.setattr(kernel, "_gluon_unsupported", lambda *args, **kwargs: None)
    for d, causal, n_q, n_k in [
        (64, False, 16384, 4096),
        (64, False, 4096, 16384),
        (64, True, 4096, 16384),
        (128, True, 64, 128),
    ]:
        q = torch.empty(1, 1, n_q, d, dtype=torch.bfloat16)
        k = v = torch.empty(1, 1, n_k, d, dtype=torch.bfloat16)
        want = kernel.gluon_forward_by_default(d, causal, n_k)
        assert kernel._use_gluon(q, k, v, causal, "auto") is want, (d, causal, n_q, n_k)
        assert kernel._use_gluon(q, k, v, causal, "gluon") is True
        assert kernel._use_gluon(q, k, v, causal, "triton") is False
    # The non-causal threshold is on Nk: 16384 keys take Gluon, 4096 keys do not.
    q = torch.empty(1, 1, 4096, 64, dtype=torch.bfloat16)
    long_k = torch.empty(1, 1, 16384, 64, dtype=torch.bfloat16)
    assert kernel._use_gluon(q, long_k, long_k, False, "auto")
    assert not kernel._use_gluon(long_k, q, q, False, "auto")


def test_constants_keep_their_shape() -> None:
    # Each threshold is a positive key count per head dim the Gluon kernel has tilings for.
    from reference_impls.attention import gluon_fwd

    for table in (kernel.GLUON_FORWARD_NONCAUSAL_MIN_KEYS, kernel.GLUON_FORWARD_CAUSAL_MIN_KEYS):
        for d, n in table.items():
            assert d in gluon_fwd.CONFIGS and isinstance(n, int) and n > 0
