"""The bench's implementation strings (reference_impls.collectives.busbw.parse_impl)."""

import pytest
import torch

from reference_impls.collectives.busbw import BenchSpec, parse_impl


@pytest.mark.parametrize(
    "impl",
    [
        "all_reduce",
        "all_reduce:graph=1",
        "ring",
        "ring:segments=2:check=0",
        "ring:ctas=100:graph=1",
    ],
)
def test_valid_impl_strings_make_a_maker(impl):
    assert callable(parse_impl(impl))


@pytest.mark.parametrize(
    ("impl", "message"),
    [
        ("nccl", "unknown impl 'nccl'"),
        ("all_reduce:segments=2", "unknown setting 'segments=2'"),
        ("ring:ctas=x", "unknown setting 'ctas=x'"),
        ("ring:check=2", "unknown setting 'check=2'"),
    ],
)
def test_malformed_impl_strings_name_what_is_wrong(impl, message):
    with pytest.raises(ValueError, match=message):
        parse_impl(impl)


def test_ring_settings_are_validated_by_ring_config():
    with pytest.raises(ValueError, match="combine_ctas must be None or an int >= 1, got 0"):
        parse_impl("ring:ctas=0")


def test_a_captured_nccl_all_reduce_needs_a_cuda_tensor():
    with pytest.raises(ValueError, match="captures CUDA work"):
        parse_impl("all_reduce:graph=1")(torch.ones(4))


def test_profiling_is_cuda_only():
    with pytest.raises(ValueError, match="trace_calls"):
        BenchSpec(sizes=(1024,), device="cpu", trace_calls=2)
