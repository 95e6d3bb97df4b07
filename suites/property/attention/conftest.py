"""Run the attention kernels under the Triton interpreter where there is no GPU.

Triton chooses between compiling and interpreting when a kernel is *defined*, so
TRITON_INTERPRET must be set before reference_impls.attention is first imported: here, at
conftest import, before pytest imports the test modules of this folder. On a machine with a
GPU nothing is set and these tests run the compiled kernels on CUDA tensors.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference_impls.attention import kernel  # noqa: E402  (after the variable is set)

if not kernel.INTERPRET and not torch.cuda.is_available():
    raise pytest.UsageError(
        "reference_impls.attention was imported before TRITON_INTERPRET=1 was set and this "
        "machine has no GPU: its kernels cannot run. Import it lazily (inside tests) in "
        "modules collected before suites/property/attention.")
