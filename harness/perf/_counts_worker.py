"""One side of an instruction count: run under callgrind, count one benchmark's timed calls.

Started by harness.perf.counts as a script under Valgrind (``valgrind --tool=callgrind
--collect-atstart=no ... python _counts_worker.py SHIM BENCHMARK_DIR NAME REPEATS OUT``),
never imported as part of ``harness``: the base side runs with the base commit's code ahead on
sys.path. It sits in one folder with a copy of ``_ab_worker.py`` (as ``ab_worker.py``) and
sets the benchmark up exactly as the A/B worker does (asv's own discovery, setup_cache, setup,
``number`` calls per sample, warm-up; ``number`` doubled until a region takes 0.2 s under
Valgrind). Instrumentation starts only then (Valgrind runs with ``--instr-atstart=no``).
Then, REPEATS times, two regions: callgrind's counters are zeroed, collection is switched on,
the timed function is called ``number`` times (part ``a``) or ``2 * number`` times (part
``b``; asv's timer, gc off as timeit does), collection is switched off and the counters are
dumped as ``harness-rep-<i>-<part>`` (callgrind writes one file per dump). The driver takes
b - a: what a region costs whatever it holds cancels.

SHIM is a shared library of five functions around callgrind's client requests (CodSpeed's
pytest-codspeed uses the same requests around its timed region); the driver compiles it
(counts.py). Around each region the worker reads what would make counts meaningless: threads
(``/proc/self/status``), voluntary context switches (sleeps, I/O, locks, waiting for a child),
child processes' CPU time and block I/O. It writes OUT (JSON): ``{"ok": true, "number": N,
"reps": R, "regions": 2R, "waits": regions that waited, "threads": ..., "children_cpu_s": ...,
"blocks": regions with block I/O,
"opt_out": null | "reason"}`` or ``{"ok": false, "error": "..."}``.
"""

import ctypes
import json
import os
import resource
import sys
import time
import traceback
from typing import Any

REGION_S = 0.2


def _threads() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import threading

    return threading.active_count()


def _count(shim_path: str, root: str, name: str, repeats: int) -> dict[str, Any]:
    import ab_worker  # type: ignore[import-not-found]  # the copy beside this script

    shim = ctypes.CDLL(shim_path)
    shim.harness_dump.argtypes = [ctypes.c_char_p]
    if not shim.harness_running_on_valgrind():
        raise RuntimeError("not running under valgrind: nothing would be counted")
    bench = ab_worker._find(root, name)
    # harness_counts: False opts out, a number is the benchmark's own count threshold.
    setting = ab_worker._declared(bench, "harness_counts")
    if setting is False:
        return {"ok": True, "opt_out": "harness_counts = False", "setting": None}
    bench, timer, number = ab_worker._load(root, name)
    # Instrumentation starts here (the run began with --instr-atstart=no: setup ran at
    # Valgrind's fastest); the calls below are instrumented and warm the adaptive interpreter.
    shim.harness_start_instrumentation()
    # A counted region of at least REGION_S of CPU time under Valgrind: a few 10k instructions
    # now and then (allocator, interpreter housekeeping) are then ~0.1% of it, not percents.
    while True:
        start = time.process_time()
        timer.timeit(number)
        if time.process_time() - start >= REGION_S or number >= 10**7:
            break
        number *= 2
    threads_before = _threads()
    # Per counted region: how many waited, did block I/O. A region that waits once (a page
    # read back in, memory reclaim) is chance; a benchmark that sleeps or reads waits in all.
    waits = blocks = 0
    children_cpu = 0.0
    for rep in range(repeats):
        # Two regions per repeat, ``number`` calls and ``2 * number``: their difference is the
        # count of ``number`` calls without what a region costs whatever it holds (~1e5
        # instructions: timeit's set-up, the switching), which would otherwise depend on
        # ``number``, itself picked by timing (docs/perf.md).
        for part, calls in (("a", number), ("b", 2 * number)):
            # Only the counted calls are watched: the dump below writes a file itself.
            self0 = resource.getrusage(resource.RUSAGE_SELF)
            child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            shim.harness_zero()
            shim.harness_toggle()
            timer.timeit(calls)
            shim.harness_toggle()
            self1 = resource.getrusage(resource.RUSAGE_SELF)
            child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            shim.harness_dump(f"harness-rep-{rep}-{part}".encode())
            waits += self1.ru_nvcsw > self0.ru_nvcsw
            blocks += (self1.ru_inblock + self1.ru_oublock) > (self0.ru_inblock + self0.ru_oublock)
            children_cpu += (child1.ru_utime + child1.ru_stime) - (
                child0.ru_utime + child0.ru_stime
            )
    threads = max(threads_before, _threads())
    bench.do_teardown()
    return {
        "ok": True,
        "opt_out": None,
        "setting": setting if isinstance(setting, (int, float)) else None,
        "number": number,
        "reps": repeats,
        "regions": 2 * repeats,
        "threads": threads,
        "waits": self1.ru_nvcsw - self0.ru_nvcsw,
        "blocks": (self1.ru_inblock - self0.ru_inblock) + (self1.ru_oublock - self0.ru_oublock),
        "children_cpu_s": (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime),
        "cuda": bool(
            "torch" in sys.modules
            and getattr(sys.modules["torch"], "cuda", None) is not None
            and sys.modules["torch"].cuda.is_initialized()
        ),
    }


def main() -> None:
    shim_path, root, name, repeats, out = sys.argv[1:6]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        reply = _count(shim_path, root, name, int(repeats))
    except BaseException as exc:  # reported to the driver, which decides
        detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        reply = {"ok": False, "error": detail}
    with open(out, "w") as f:
        json.dump(reply, f)


if __name__ == "__main__":
    main()
