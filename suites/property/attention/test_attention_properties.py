"""Properties of reference_impls.attention over generated shapes (hypothesis).

Under the Triton interpreter on CPU (suites/conftest.py), so the bounds are small: B <= 2, Hkv <= 2,
group <= 2, N <= 72, D in {8, 16, 24, 32, 64}. Every example compiles nothing and runs a few
hundred NumPy tile operations; the example counts keep the whole file under ~15 s on a 2-core
machine under the "ci" profile (and scale up under "nightly").
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import assert_close, assert_within, rel_error
from reference_impls.attention import attention, reference_attention
from reference_impls.attention.kernel import INTERPRET

DEVICE = "cpu" if INTERPRET else "cuda"

# ||kernel - float64|| / ||float64|| bounds; the unit suite's table, widened for generated
# shapes: a row that sees few keys (causal, ragged, N = 1) has a small norm, so one rounding
# counts for more of it. float32: observed <= 1e-6; float16: unit roundoff 4.9e-4;
# bfloat16: 3.9e-3, truncated rather than rounded under the interpreter.
FWD_TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 4e-2}
GRAD_TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 6e-2}
# Gradients of rows with almost no signal (one key: the softmax gradient is exactly 0) are
# compared with this absolute floor, scaled to the reference's norm.
GRAD_FLOOR = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}

# Examples per test: a quarter of the profile's count (ci/dev: 100 -> 25, nightly: 2000 -> 500).
EXAMPLES = max(8, settings().max_examples // 4)
PROPERTY = settings(max_examples=EXAMPLES, deadline=None)


@st.composite
def problems(draw, dtypes=(torch.float32, torch.float16, torch.bfloat16)):
    """(shape dict, causal, dtype) for one attention call."""
    h_kv = draw(st.integers(1, 2))
    shape = {
        "b": draw(st.integers(1, 2)),
        "h_kv": h_kv,
        "h": h_kv * draw(st.integers(1, 2)),
        "n_q": draw(st.integers(1, 72)),
        "n_k": draw(st.integers(1, 72)),
        "d": draw(st.sampled_from([8, 16, 24, 32, 64])),
    }
    return shape, draw(st.booleans()), draw(st.sampled_from(dtypes))


def make_qkv(s, dtype):
    shapes = (
        (s["b"], s["h"], s["n_q"], s["d"]),
        (s["b"], s["h_kv"], s["n_k"], s["d"]),
        (s["b"], s["h_kv"], s["n_k"], s["d"]),
    )
    return [torch.randn(x, device=DEVICE).to(dtype).requires_grad_() for x in shapes]


@PROPERTY
@given(problems())
def test_output_and_gradients_stay_within_the_dtype_bound(problem):
    shape, causal, dtype = problem
    q, k, v = make_qkv(shape, dtype)
    out = attention(q, k, v, causal=causal)
    do = torch.randn_like(out)
    out.backward(do)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64, causal=causal)
    ref.backward(do.double())
    assert torch.isfinite(out).all()
    if ref.abs().max() > 0:  # causal with Nq > Nk can leave every row without a key
        assert_within(rel_error(out, ref), FWD_TOL[dtype])
    else:
        assert (out == 0).all()
    for name, t, g in zip("qkv", (q, k, v), (q64.grad, k64.grad, v64.grad), strict=True):
        err = (t.grad.double() - g).norm()
        bound = GRAD_TOL[dtype] * g.norm() + GRAD_FLOOR[dtype] * (1 + ref.norm())
        assert_within(float(err), float(bound), msg=f"d{name}: |error|")


@PROPERTY
@given(problems(dtypes=(torch.float32,)), st.randoms(use_true_random=False))
def test_permuting_keys_and_values_together_leaves_non_causal_output_unchanged(problem, rnd):
    shape, _, dtype = problem
    q, k, v = (t.detach() for t in make_qkv(shape, dtype))
    perm = list(range(shape["n_k"]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm, device=DEVICE)
    out = attention(q, k, v)
    permuted = attention(q, k[:, :, perm], v[:, :, perm])
    # Only the order of the fp32 sums changes: a few units in the last place.
    assert_close(permuted, out, rtol=1e-5, atol=1e-6)


@PROPERTY
@given(problems())
def test_values_of_ones_give_outputs_of_ones(problem):
    shape, causal, dtype = problem
    q, k, v = (t.detach() for t in make_qkv(shape, dtype))
    out = attention(q, k, torch.ones_like(v), causal=causal)
    expected = torch.ones_like(out)
    if causal:
        # Bottom-right aligned: query i sees keys j <= i + Nk - Nq; one that sees none gets 0.
        sees_none = torch.arange(shape["n_q"], device=DEVICE) + shape["n_k"] - shape["n_q"] < 0
        expected[:, :, sees_none] = 0
    # The weights are normalised by an fp32 sum of unrounded exponentials, but multiply V after
    # rounding to the dtype: the row sum is 1 within one rounding of the dtype (plus the
    # output's own rounding).
    tol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    assert_close(out, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("causal", [False, True])
def test_property_file_runs_the_kernels_it_claims(causal):
    """A guard for the bounds above: one fixed example must really exercise the kernel path
    (a silently empty strategy would make every property vacuous)."""
    q, k, v = make_qkv({"b": 1, "h": 2, "h_kv": 1, "n_q": 9, "n_k": 13, "d": 16}, torch.float32)
    assert (
        rel_error(
            attention(q, k, v, causal=causal),
            reference_attention(q.double(), k.double(), v.double(), causal=causal),
        )
        < 1e-5
    )
