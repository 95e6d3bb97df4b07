"""Does the GPU A/B timer catch 5% more work in the attention forward and backward, and pass an
unchanged kernel? (docs/perf.md, "GPU kernels: CUDA-event A/B pairs")

Each run is one call of ``harness.perf.gpu_ab.measure_gpu_ab_trees`` (one fresh worker process,
as one gate run makes) comparing ``suites/benchmarks/bench_attention.py`` (base) with a copy of
it in a temporary folder (head), both importing this checkout's ``reference_impls``:

- ``same``: the copy is byte for byte the file (two copies of identical code);
- ``slow``: the copy has INJECTION appended: after its setup, ``AttentionGPU``'s forward and
  backward callables also run the same Triton kernels on an extra problem of the same shape
  but round(fraction * B * H) (batch, head) pairs (batch 1): at the default (D=64, N=1024,
  B=32, H=32, fraction 0.05) that is 51 of 1024, 4.98% more of the same work, as one more
  launch of each kernel.

Runs alternate same, slow, same, ... Writes one JSON line per run to --out (flushed as it
goes), and with --ncu the Nsight Compute counters of one call per side of the slow case.

    python docs/tools/gpu_ab_injection.py --runs 10 --factor 1.03 --out $OUT/gpu_ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.perf.gpu_ab import Tree, measure_gpu_ab_trees, ncu_counters, to_json  # noqa: E402

INJECTION = """

# --- injected by docs/tools/gpu_ab_injection.py: FRACTION more of the same work ---
_INJECTED_FRACTION = {fraction!r}
_original_setup = AttentionGPU.setup


def _injected_setup(self, head_dim, seq_len, causal):
    _original_setup(self, head_dim, seq_len, causal)
    full = bench.Case.standard(head_dim, seq_len, causal, "fwd")
    pairs = max(1, round(_INJECTED_FRACTION * full.batch * full.heads))
    extra = {{
        mode: bench.Case(head_dim, seq_len, causal, mode, batch=1, heads=pairs)
        for mode in ("fwd", "bwd")
    }}
    inputs = bench.make_inputs(extra["fwd"], seed=1)
    extra_fwd = bench.step_fn("triton", extra["fwd"], inputs)
    extra_bwd = bench.step_fn("triton", extra["bwd"], inputs)
    fwd, bwd = self.fwd, self.bwd
    self.fwd = lambda: (fwd(), extra_fwd())
    self.bwd = lambda: (bwd(), extra_bwd())
    self.fwd(), self.bwd()
    torch.cuda.synchronize()


AttentionGPU.setup = _injected_setup
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per case")
    parser.add_argument("--factor", type=float, default=1.03)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per benchmark")
    parser.add_argument("--ncu", action="store_true", help="also the ncu counters (slow case)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=0, help="stop starting runs after s")
    args = parser.parse_args(argv)
    if args.runs < 0 or not 0 < args.fraction < 1:
        parser.error(f"--runs {args.runs} / --fraction {args.fraction}: need >= 0 / in (0, 1)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    bench_dir = ROOT / "suites" / "benchmarks"
    source = (bench_dir / "bench_attention.py").read_text()
    params = f"({args.head_dim}, {args.seq_len}, False)"
    names = [f"bench_attention.AttentionGPU.time_{m}{params}" for m in ("forward", "backward")]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name, args.out.open("a") as out:
        tmp = Path(tmp_name)
        heads = {}
        for case, text in (
            ("same", source),
            ("slow", source + INJECTION.format(fraction=args.fraction)),
        ):
            folder = tmp / case
            folder.mkdir()
            (folder / "bench_attention.py").write_text(text)
            heads[case] = Tree(folder, ROOT)
        base = Tree(bench_dir, ROOT)
        head_line = {"python": sys.version.split()[0], "host": platform.node(), "names": names}
        out.write(
            json.dumps(
                {"start": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), **head_line}
            )
            + "\n"
        )
        for run in range(args.runs):
            for case in ("same", "slow"):
                if args.deadline and time.monotonic() - start > args.deadline:
                    print(f"deadline reached before run {run} {case}", flush=True)
                    return 0
                t0 = time.monotonic()
                res = measure_gpu_ab_trees(
                    base,
                    heads[case],
                    names,
                    factor=args.factor,
                    pairs=args.pairs,
                    max_seconds=args.budget,
                )
                line = {
                    "run": run,
                    "case": case,
                    "factor": args.factor,
                    "seconds": round(time.monotonic() - t0, 2),
                    "results": to_json(res),
                }
                out.write(json.dumps(line) + "\n")
                out.flush()
                summary = ", ".join(
                    f"{n.split('.')[-1].split('(')[0]}: {r['verdict']} {r['ratio'] or 0:.4f} "
                    f"[{(r['interval'] or [0, 0])[0]:.4f}, {(r['interval'] or [0, 0])[1]:.4f}] "
                    f"{r['pairs']}p" + (f" ERROR {r['error']}" if r["error"] else "")
                    for n, r in line["results"].items()
                )
                print(f"run {run} {case} {line['seconds']:.1f}s: {summary}", flush=True)
        if args.ncu:
            t0 = time.monotonic()
            try:
                counters = ncu_counters(base, heads["slow"], names, echo=print)
                got = {
                    n: {"base": c.base, "head": c.head, "ratio": c.ratios(), "kernels": c.kernels}
                    for n, c in counters.items()
                }
            except Exception as exc:  # reported in the output, not a crash of the whole script
                got = {"error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps({"ncu": got, "seconds": round(time.monotonic() - t0, 2)}) + "\n")
            print("ncu:", json.dumps(got), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
