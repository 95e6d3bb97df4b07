"""One side of an instruction count: run under callgrind, count one benchmark's timed calls.

Started by harness.perf.counts as a script under Valgrind (``valgrind --tool=callgrind
--collect-atstart=no ... python _counts_worker.py SHIM BENCHMARK_DIR NAME REPEATS OUT``),
never imported as part of ``harness``: the base side runs with the base commit's code ahead on
sys.path. It sits in one folder with a copy of ``_ab_worker.py`` (as ``ab_worker.py``) and
sets the benchmark up exactly as the A/B worker does (asv's own discovery, setup_cache, setup,
``number`` calls per sample, warm-up). Then, REPEATS times: callgrind's counters are zeroed,
collection is switched on, the timed function is called ``number`` times (asv's timer, gc off
as timeit does), collection is switched off and the counters are dumped as part
``harness-rep-<i>`` (callgrind writes one file per dump). One more, empty, region
(``harness-empty``) measures what switching costs, which the driver subtracts.

SHIM is a shared library of four functions around callgrind's client requests (CodSpeed's
pytest-codspeed uses the same requests around its timed region); the driver compiles it
(counts.py). Around each region the worker reads what would make counts meaningless: threads
(``/proc/self/status``), voluntary context switches (sleeps, I/O, locks, waiting for a child),
child processes' CPU time and block I/O. It writes OUT (JSON): ``{"ok": true, "number": N,
"reps": R, "waits": ..., "threads": ..., "children_cpu_s": ..., "blocks": ...,
"opt_out": null | "reason"}`` or ``{"ok": false, "error": "..."}``.
"""

import ctypes
import json
import os
import resource
import sys
import traceback
from typing import Any


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


def _opt_out(bench: Any) -> Any:
    """``harness_counts`` on the benchmark function or its class (asv's attribute sources):
    False opts out, a number is the benchmark's own count threshold (a fraction)."""
    for source in getattr(bench, "_attr_sources", []) or []:
        if hasattr(source, "harness_counts"):
            return source.harness_counts
    return None


def _count(shim_path: str, root: str, name: str, repeats: int) -> dict[str, Any]:
    import ab_worker  # type: ignore[import-not-found]  # the copy beside this script

    shim = ctypes.CDLL(shim_path)
    shim.harness_dump.argtypes = [ctypes.c_char_p]
    if not shim.harness_running_on_valgrind():
        raise RuntimeError("not running under valgrind: nothing would be counted")
    bench = ab_worker._find(root, name)
    setting = _opt_out(bench)
    if setting is False:
        return {"ok": True, "opt_out": "harness_counts = False", "setting": None}
    bench, timer, number = ab_worker._load(root, name)
    timer.timeit(number)  # one more warm call after the warm-up: the adaptive interpreter
    threads_before = _threads()
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for rep in range(repeats):
        shim.harness_zero()
        shim.harness_toggle()
        timer.timeit(number)
        shim.harness_toggle()
        shim.harness_dump(f"harness-rep-{rep}".encode())
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    threads = max(threads_before, _threads())
    shim.harness_zero()
    shim.harness_toggle()
    shim.harness_toggle()
    shim.harness_dump(b"harness-empty")
    bench.do_teardown()
    return {
        "ok": True,
        "opt_out": None,
        "setting": setting if isinstance(setting, (int, float)) else None,
        "number": number,
        "reps": repeats,
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
