"""The process of a GPU A/B measurement: base and head kernels, both loaded here, timed in pairs.

Started by harness.perf.gpu_ab as a script (``python _gpu_ab_worker.py``), never imported as
part of ``harness`` (the base side may hold an older ``harness``). Unlike the CPU A/B
(_ab_worker.py: one process per side), both sides live in this one process: a CUDA kernel's
time does not depend on the host process's memory layout, and one process shares the GPU's
state (clocks, L2, other tenants) between the two sides sample by sample.

Each side's benchmark module is imported from its own tree under its own module name
(``_harness_gpu_ab_base__<module>``, ``_harness_gpu_ab_head__<module>``), with that tree's code
first on sys.path; then every module imported from that tree is dropped from sys.modules, so
that the other side imports its own copy (the loaded module objects keep theirs). Imports done
lazily inside a benchmark's functions after that are not separated (docs/perf.md).

JSON lines on stdin/stdout:

- ``{"op": "device"}``: ``{"ok": true, "name": ..., "l2_bytes": ...}``, or ok false when no CUDA
  device is visible (the driver turns that into a clear error).
- ``{"op": "load", "name": "bench_x.Class.time_y(1, 'a')", "sides": {"base": [bench_dir,
  code_dir], "head": [...]}}``: imports, instantiates and sets up the benchmark on both sides,
  warms each up, picks the calls per sample (the benchmark's ``number``, else enough calls for
  about 1 ms of GPU time); replies ``{"ok": true, "number": N, "ms": {side: one call}}``.
- ``{"op": "pair", "first": "base"|"head"}``: one sample of each side, the named one first;
  each sample is N calls, every call preceded by an L2 flush and timed alone with CUDA events
  (the flush outside the events); replies ``{"ok": true, "seconds": {side: per call}}``.
- ``{"op": "teardown"}``.
- ``{"op": "profile", "side": S}``: one call of the loaded benchmark of side S between
  cudaProfilerStart and cudaProfilerStop, a marker kernel after it (``ncu --profile-from-start
  off``). ``python _gpu_ab_worker.py --profile REQUEST.json`` does that for base and head of
  each name in the request, without the JSON-lines loop (run under ncu by gpu_ab.py).
"""

import contextlib
import importlib.util
import itertools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

MODULE_PREFIX = "_harness_gpu_ab_"
# The L2 flush writes a buffer this many times the L2's size (at least FLUSH_MIN_BYTES), as
# triton.testing.do_bench does with its 256 MB buffer.
FLUSH_MIN_BYTES = 256 * 2**20
FLUSH_L2_MULTIPLE = 4
WARMUP_S = 0.2
SAMPLE_TARGET_S = 0.001
MAX_NUMBER = 100


def _torch() -> Any:
    import torch

    return torch


def _under(path: str | None, root: str) -> bool:
    if not path:
        return False
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


class _Namespace:
    """One side's modules: those imported from its trees (code_dir, bench_dir), kept out of
    sys.modules except while that side runs (``active``). While it runs, its trees are first on
    sys.path and its modules are in sys.modules under their usual names, so that an import done
    lazily inside its functions (``from reference_impls.attention import attention`` in a
    helper) finds its own code, not the other side's."""

    def __init__(self, side: str, bench_dir: str, code_dir: str) -> None:
        self.side, self.bench_dir, self.code_dir = side, bench_dir, code_dir
        self.roots = [os.path.realpath(code_dir), os.path.realpath(bench_dir)]
        self.modules: dict[str, Any] = {}
        self.benchmarks: dict[str, Any] = {}  # module name -> the imported benchmark module

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        saved_path = list(sys.path)
        sys.path[:0] = [self.code_dir, self.bench_dir]
        displaced = {k: sys.modules[k] for k in self.modules if k in sys.modules}
        sys.modules.update(self.modules)
        before = set(sys.modules)
        try:
            yield
        finally:
            sys.path[:] = saved_path
            for key in set(sys.modules) - before:
                if any(_under(getattr(sys.modules[key], "__file__", None), r) for r in self.roots):
                    self.modules[key] = sys.modules[key]
            for key in self.modules:
                sys.modules.pop(key, None)
            sys.modules.update(displaced)

    def benchmark_module(self, module: str) -> Any:
        """bench_dir/<module path>.py, imported once as _harness_gpu_ab_<side>__<module>."""
        if module in self.benchmarks:
            return self.benchmarks[module]
        path = os.path.join(self.bench_dir, *module.split(".")) + ".py"
        if not os.path.isfile(path):
            raise ValueError(f"no benchmark module {module!r}: {path} does not exist")
        name = f"{MODULE_PREFIX}{self.side}__{module.replace('.', '__')}"
        with self.active():
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod  # as an import would (dataclasses, pickling look it up)
            spec.loader.exec_module(mod)
        self.benchmarks[module] = mod
        return mod

    def by_common_name(self) -> dict[str, Any]:
        """Its modules, the benchmark modules named alike on both sides (share_tuning)."""
        named = {k: v for k, v in self.modules.items() if not k.startswith(MODULE_PREFIX)}
        named.update({f"<benchmarks>.{k}": v for k, v in self.benchmarks.items()})
        return named


def _tuning_key(tuner: Any) -> tuple[str, list[str]] | None:
    """What makes two Triton autotuners the same: the kernel's source (its cache key) and the
    configs (as str: a triton.Config has __str__ but no __repr__, so str() of the list would
    show each object's address); None for anything else."""
    if type(tuner).__name__ != "Autotuner":
        return None
    try:
        return str(tuner.fn.cache_key), [str(c) for c in tuner.configs]
    except Exception:  # not a Triton kernel after all
        return None


def share_tuning(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """Give each of head's Triton autotuners the picks base's made (as head's own Config
    objects), where the kernel and its configs are the same on both sides. Why: two tunings of
    one kernel can pick two configs whose times differ by a few percent (the tuner's own noise
    decides between near-equals); then unchanged code reads as changed for that process. A
    changed kernel, or changed configs, tune themselves."""
    shared = []
    for mod_name, hmod in head.items():
        bmod = base.get(mod_name)
        if bmod is None:
            continue
        for attr, tuner in vars(hmod).items():
            key = _tuning_key(tuner)
            other = getattr(bmod, attr, None)
            if key is None or other is None or key != _tuning_key(other):
                continue
            mine = {str(c): c for c in tuner.configs}
            picks = {k: mine[str(c)] for k, c in other.cache.items() if str(c) in mine}
            tuner.cache.update(picks)
            shared.append(f"{mod_name}.{attr}")
    return shared


class _Side:
    """One side's benchmark: instance, bound method and parameters, set up in its namespace."""

    def __init__(
        self, ns: _Namespace, full_name: str, before_setup: Callable[[], None] | None = None
    ) -> None:
        self.ns = ns
        name, _, params = full_name.partition("(")
        parts = name.split(".")
        if len(parts) < 3:
            raise ValueError(f"{full_name!r} is not module.Class.time_method")
        module, cls_name, method = ".".join(parts[:-2]), parts[-2], parts[-1]
        if not method.startswith("time_"):
            raise ValueError(f"{full_name} is not a timing benchmark (time_*)")
        cls = getattr(ns.benchmark_module(module), cls_name)
        self.args: tuple[Any, ...] = ()
        grid = getattr(cls, "params", None)
        if grid:
            if not isinstance(grid[0], (list, tuple)):
                grid = [grid]
            for combo in itertools.product(*grid):
                if f"{name}({', '.join(repr(v) for v in combo)})" == full_name:
                    self.args = combo
                    break
            else:
                raise ValueError(f"no parameter combination of {name} is {params[:-1]!r}")
        elif params:
            raise ValueError(f"{name} takes no parameters, got ({params}")
        if hasattr(cls, "setup_cache"):
            raise ValueError(f"{name}: setup_cache is not supported by the GPU A/B timer")
        with ns.active():
            self.instance = cls()
            self.fn = getattr(self.instance, method)
            if before_setup is not None:
                before_setup()
            setup = getattr(self.instance, "setup", None)
            if setup is not None:
                try:
                    setup(*self.args)
                except NotImplementedError as exc:  # asv's way of skipping a benchmark
                    raise ValueError(f"{full_name} skipped itself in setup: {exc}") from None

    def teardown(self) -> None:
        teardown = getattr(self.instance, "teardown", None)
        if teardown is not None:
            with self.ns.active():
                teardown(*self.args)


def _no_synchronize(device: Any = None) -> None:
    """torch.cuda.synchronize while a sample's calls are queued (Timer.calls)."""


class Timer:
    def __init__(self) -> None:
        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is visible (torch.cuda.is_available() is False)")
        self.torch = torch
        props = torch.cuda.get_device_properties(0)
        self.device_name = props.name
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        size = max(FLUSH_MIN_BYTES, FLUSH_L2_MULTIPLE * self.l2_bytes)
        self.flush_buffer = torch.empty(size, dtype=torch.int8, device="cuda")
        self.sides: dict[str, _Side] = {}
        self.namespaces: dict[tuple[str, str, str], _Namespace] = {}
        self.shared: list[str] = []
        self.number = 1

    def calls(self, side: _Side, n: int) -> float:
        """n calls, each after an L2 flush and timed alone with CUDA events; seconds per call."""
        cuda = self.torch.cuda
        events = [
            (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for _ in range(n)
        ]
        # An asv GPU benchmark ends with torch.cuda.synchronize() (its wall time needs it); here
        # that would put the host's wake-up and the next launch inside the events (tens of us,
        # a few percent of a 1 ms kernel, and jitter). The events need no host wait: it is a
        # no-op while the calls are queued, and one real synchronize follows.
        synchronize = cuda.synchronize
        cuda.synchronize = _no_synchronize
        try:
            with side.ns.active():
                for start, end in events:
                    self.flush_buffer.zero_()
                    start.record()
                    side.fn(*side.args)
                    end.record()
        finally:
            cuda.synchronize = synchronize
        synchronize()
        return float(sum(s.elapsed_time(e) for s, e in events)) / 1000.0 / n

    def load(self, full_name: str, sides: dict[str, list[str]]) -> dict[str, Any]:
        self.teardown()
        ns = {}
        for side in ("base", "head"):
            key = (side, sides[side][0], sides[side][1])
            if key not in self.namespaces:
                self.namespaces[key] = _Namespace(side, sides[side][0], sides[side][1])
            ns[side] = self.namespaces[key]

        def share() -> None:
            self.shared = share_tuning(ns["base"].by_common_name(), ns["head"].by_common_name())

        # Base first, set up (autotuned) before head's setup, which reuses its picks.
        self.sides["base"] = _Side(ns["base"], full_name)
        self.sides["head"] = _Side(ns["head"], full_name, share)
        ms = {}
        for side, bench in self.sides.items():
            end = time.perf_counter() + WARMUP_S
            one = self.calls(bench, 1)
            while time.perf_counter() < end:
                one = self.calls(bench, 1)
            ms[side] = one * 1e3
        fixed = int(getattr(self.sides["head"].instance, "number", 0) or 0)
        if fixed > 0:
            self.number = min(fixed, MAX_NUMBER)
        else:
            shortest = max(min(ms.values()) / 1e3, 1e-7)
            self.number = max(1, min(MAX_NUMBER, math.ceil(SAMPLE_TARGET_S / shortest)))
        return {"ok": True, "number": self.number, "ms": ms, "shared_tuning": self.shared}

    def pair(self, first: str) -> dict[str, Any]:
        order = ("base", "head") if first == "base" else ("head", "base")
        seconds = {side: self.calls(self.sides[side], self.number) for side in order}
        return {"ok": True, "seconds": seconds}

    def profile(self, side: str) -> dict[str, Any]:
        """One call of side's benchmark inside a profiler range (ncu --profile-from-start off),
        after an L2 flush outside it, followed by MARKER_KERNEL inside it: ncu.py splits the
        kernels it lists at the markers."""
        torch = self.torch
        cudart = torch.cuda.cudart()
        self.flush_buffer.zero_()
        torch.cuda.synchronize()
        bench = self.sides[side]
        cudart.cudaProfilerStart()
        with bench.ns.active():
            bench.fn(*bench.args)
        torch.cuda._sleep(1)  # the marker: a kernel no benchmark launches by itself
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
        return {"ok": True}

    def teardown(self) -> None:
        for bench in self.sides.values():
            bench.teardown()
        self.sides.clear()


def profile_main(request_path: str) -> int:
    """``--profile REQUEST.json`` (run under ncu): for each name, load both sides and profile
    base's call, then head's. Progress and errors go to stderr; exit 1 on an error."""
    with open(request_path) as f:
        request = json.load(f)
    try:
        timer = Timer()
        for name in request["names"]:
            timer.load(name, request["sides"])
            for side in ("base", "head"):
                timer.profile(side)
            print(f"profiled {name}", file=sys.stderr, flush=True)
        timer.teardown()
    except Exception as exc:
        detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        print(f"gpu_ab profile error: {detail}", file=sys.stderr, flush=True)
        return 1
    return 0


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--profile":
        sys.exit(profile_main(sys.argv[2]))
    # Replies go to the original stdout; anything a benchmark prints goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    timer: Timer | None = None
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any]
        try:
            op = request["op"]
            if op == "device":
                timer = timer or Timer()
                reply = {"ok": True, "name": timer.device_name, "l2_bytes": timer.l2_bytes}
            elif timer is None:
                reply = {"ok": False, "error": "ask for the device first"}
            elif op == "load":
                reply = timer.load(request["name"], request["sides"])
            elif op == "pair":
                reply = timer.pair(request.get("first", "base"))
            elif op == "profile":
                reply = timer.profile(request["side"])
            elif op == "teardown":
                timer.teardown()
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except BaseException as exc:  # reported to the driver, which decides
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            reply = {"ok": False, "error": detail}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
