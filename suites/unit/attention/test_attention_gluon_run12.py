"""Run 12's options of the Gluon forward (gluon_fwd.GluonConfig.thread_release and .p_smem),
checked on the CPU in the SASS of an offline sm_90a compile (Triton's own ptxas and cuobjdump,
as test_attention_gluon_offline.py): what each option is for has to be in the machine code,
or its timing measures something else. Correctness is the gpu tier's job
(test_thread_release_and_p_in_shared_memory_match_float64).

- thread_release: the K/V slots and the ping-pong turns are released by every consumer
  thread's own arrive (``ARRIVES.LDGSTSBAR``), not by one thread's after a warpgroup
  ``BAR.SYNC``: fewer ``BAR.SYNC`` than the same tiling without it.
- p_smem: P goes through shared memory (``STSM``), and ptxas keeps the softmax's exponentials
  between the wait for the score wgmma and the wait for P_{j-1} V_{j-1}: the overlap that
  register P loses (docs/benchmarks/attention.md, run 11: ptxas moves that wait above them).

The compile runs in a child process without TRITON_INTERPRET (suites/conftest.py turns the
interpreter on for this process).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
REPO = Path(__file__).resolve().parents[3]
COMPILE_TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(
    not all((TOOLS / t).exists() for t in ("ptxas", "cuobjdump")),
    reason=f"this Triton has no ptxas/cuobjdump under {TOOLS}",
)

# The child: compile each tiling (D=64, fp16, not causal) through gluon_offline, with run 12's
# kernel and constexprs where the tiling asks for them, and report per tiling the spills and,
# from the SASS, the counts below and, for each wait for the score wgmma inside the key loop,
# how many exponentials come before the wait for P @ V.
_CHILD = r"""
import json, os, subprocess, sys, tempfile
import triton
from reference_impls.attention import gluon_fwd as gf, gluon_offline as go

kernels = []
compile_ = triton.compile
def capture(src, target=None, options=None):
    kernels.append(compile_(src, target=target, options=options))
    return kernels[-1]
triton.compile = capture
offline = go._compile
def run12(fn, args, constants, options):
    if CFG.thread_release or CFG.p_smem:
        fn = gf._attn_fwd_ws_run12
        constants = dict(constants, THREAD_RELEASE=CFG.thread_release, P_SMEM=CFG.p_smem)
    return offline(fn, args, constants, options)
go._compile = run12
tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = {}
for name, kw in json.loads(sys.argv[1]).items():
    CFG = gf.GluonConfig(64, 128, 3, 2, **kw)
    c = go.compile_forward(CFG, 64, False)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernels[-1].asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True, check=True).stdout.splitlines()
    windows = []
    for i, line in enumerate(sass):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            n = 0
            for later in sass[i + 1:]:
                if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in later:
                    break
                n += "MUFU.EX2" in later
            windows.append(n)
    out[name] = {"spills": c.spill_stores + c.spill_loads,
                 "bar_sync": sum("BAR.SYNC" in x for x in sass),
                 "thread_arrives": sum("ARRIVES.LDGSTSBAR" in x for x in sass),
                 "stsm": sum("STSM" in x for x in sass), "ex2_before_pv_wait": windows}
print(json.dumps(out))
"""

_TILINGS = {
    # The D=64 default (ping-pong, persistent, score wgmma first), then with each option.
    "default": {"pingpong": True, "persistent": True, "early_qk": True},
    "thread_release": {
        "pingpong": True, "persistent": True, "early_qk": True, "thread_release": True,
    },
    "p_smem": {"pingpong": True, "persistent": True, "early_qk": True, "p_smem": True},
}  # fmt: skip


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(_TILINGS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=COMPILE_TIMEOUT_S,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(result)
    return result


def test_no_tiling_spills(compiled):
    assert all(c["spills"] == 0 for c in compiled.values()), compiled


def test_thread_release_arrives_from_every_thread_without_bar_sync(compiled):
    default, release = compiled["default"], compiled["thread_release"]
    assert default["thread_arrives"] == 0, default
    # The K/V slot in the key loop, the ping-pong turn, and the last block's slot.
    assert release["thread_arrives"] >= 3, release
    # Two bar.syncs fewer per key block (before the turn's arrive and the slot's), in each
    # copy of the loop.
    assert release["bar_sync"] < default["bar_sync"], (release, default)


def test_p_in_shared_memory_keeps_the_softmax_over_the_pv_wgmma(compiled):
    default, p_smem = compiled["default"], compiled["p_smem"]
    # Register P: ptxas puts the wait for P @ V right after the wait for the scores, above
    # every exponential (run 11's finding), in each copy of the key loop.
    assert default["ex2_before_pv_wait"] and max(default["ex2_before_pv_wait"]) == 0, default
    # P through shared memory: the block's 64 exponentials per thread (64 x 128 scores over
    # 128 threads) between the two waits, in each copy of the loop.
    assert p_smem["stsm"] > 0, p_smem
    assert p_smem["ex2_before_pv_wait"], p_smem
    assert min(p_smem["ex2_before_pv_wait"]) >= 64, p_smem
