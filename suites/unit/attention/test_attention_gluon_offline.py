"""The Gluon forward and backward compile for sm_90a on a machine without a GPU (Triton's own
ptxas), so this CPU tier catches what would otherwise surface only on a GPU: compile errors, a
tiling that spills registers, shared memory over the limit. Correctness is the gpu tier's job
(suites/gpu/attention/test_attention_gluon_gpu.py).

The compile runs in a child process without TRITON_INTERPRET: suites/conftest.py turns the
interpreter on for this process, and Triton refuses to compile its interpreted functions.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

# Triton's nvidia backend carries ptxas and cuobjdump; a build without them cannot compile.
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
REPO = Path(__file__).resolve().parents[3]
COMPILE_TIMEOUT_S = 300  # two cold compiles take ~10 s on a loaded 2-core machine

pytestmark = pytest.mark.skipif(
    not all((TOOLS / t).exists() for t in ("ptxas", "cuobjdump")),
    reason=f"this Triton has no ptxas/cuobjdump under {TOOLS}",
)


@pytest.mark.parametrize("d", [64, 128])
def test_default_tiling_compiles_for_sm90a_without_spills(d):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "reference_impls.attention.gluon_offline"]
    run = subprocess.run(
        [*cmd, "--dims", str(d), "--default-only", "--check", "--kernels", "fwd"],
        capture_output=True,
        text=True,
        env=env,
        timeout=COMPILE_TIMEOUT_S,
    )
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    # Both key loops (unmasked, and the causal diagonal's) are compiled and checked.
    assert run.stdout.count("ok ") == 2, run.stdout


def test_backward_default_tilings_compile_for_sm90a_without_spills():
    # gluon_bwd.py at D=128: the dK/dV kernel (with and without the in-kernel dQ, causal or
    # not) and the dQ kernel. --check fails on spills of what dispatch can run; the in-kernel
    # dQ's few spills are reported as SPILLS.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "reference_impls.attention.gluon_offline"]
    run = subprocess.run(
        [*cmd, "--dims", "128", "--default-only", "--check", "--kernels", "bwd"],
        capture_output=True,
        text=True,
        env=env,
        timeout=COMPILE_TIMEOUT_S,
    )
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert sum(x.startswith("ok  bwd D=128") and "atomic_dq=False" in x for x in lines) == 2
    assert sum(x.startswith("ok  bwd-dq D=128") for x in lines) == 2, run.stdout
