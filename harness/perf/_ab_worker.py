"""One side of an interleaved A/B measurement: a process that times one benchmark sample on request.

Started by harness.perf.ab as a script (``python _ab_worker.py BENCHMARK_DIR``), never imported
as part of ``harness``: the base side runs with the base commit's code ahead on sys.path, which
may hold an older ``harness``. It speaks JSON lines on stdin/stdout:

- ``{"op": "load", "name": "bench_x.Class.time_y(1, 'a')"}`` finds the benchmark with asv's own
  discovery (asv_runner), runs its setup_cache and setup, picks the number of calls per sample
  as asv does (at least ``sample_time``, 10 ms by default) and warms up; replies
  ``{"ok": true, "number": N}``, or ``{"ok": false, "error": "..."}`` (not a timing benchmark,
  skipped by its setup, raised).
- ``{"op": "sample"}`` times one sample in CPU time (``time.process_time``); replies
  ``{"ok": true, "seconds": per-call time}``. With ``"extra": f`` the sample also spins for
  f times the sample's CPU time measured at load (an injected slowdown of f, for
  ``harness perf calibrate``), counted in the sample.
- ``{"op": "teardown"}`` runs the benchmark's teardown.
- ``{"op": "list"}`` replies ``{"ok": true, "names": [...]}``: every timing benchmark, one name
  per parameter combination, as the gate's rows name them (``harness perf calibrate``).
"""

import itertools
import json
import os
import sys
import time
import traceback
from typing import Any


def _find(root: str, full_name: str) -> Any:
    from asv_runner.discovery import get_benchmark_from_name  # type: ignore[import-untyped]

    name, _, params = full_name.partition("(")
    bench = get_benchmark_from_name(root, name)
    if params:
        wanted = full_name
        for idx, combo in enumerate(itertools.product(*bench.params)):
            if f"{name}({', '.join(combo)})" == wanted:
                bench.set_param_idx(idx)
                break
        else:
            raise ValueError(f"no parameter combination of {name} is {params[:-1]!r}")
    return bench


def _list(root: str) -> list[str]:
    from asv_runner.discovery import disc_benchmarks, update_sys_path

    update_sys_path(root)  # as asv's own listing does: the benchmark folder imports as a package
    names = []
    for bench in disc_benchmarks(root):
        if getattr(bench, "type", None) != "time":
            continue
        if bench.params:
            names += [
                f"{bench.name}({', '.join(combo)})" for combo in itertools.product(*bench.params)
            ]
        else:
            names.append(bench.name)
    return names


def _load(root: str, full_name: str) -> tuple[Any, Any, int]:
    bench = _find(root, full_name)
    if getattr(bench, "type", None) != "time":
        raise ValueError(f"{full_name} is a {getattr(bench, 'type', '?')} benchmark, not a timing")
    if bench._setup_cache is not None:
        bench.set_cache(bench.do_setup_cache())
    if bench.do_setup():
        raise ValueError(f"{full_name} skipped itself in setup")
    # CPU time of this process, not wall time: on a runner shared with other jobs a sample's
    # wall time is mostly how long the scheduler kept it waiting (harness/perf/ab.py).
    bench.timer = time.process_time
    timer = bench._get_timer(*bench._build_params())
    sample_time = float(getattr(bench, "sample_time", 0.01) or 0.01)
    number = int(getattr(bench, "number", 0) or 0)
    if number <= 0:
        number = 1
        while number < 10**7:
            if timer.timeit(number) >= sample_time:
                break
            number *= 2
    warmup = getattr(bench, "warmup_time", -1)
    warmup = 0.05 if warmup is None or warmup < 0 else min(float(warmup), 0.2)
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        timer.timeit(number)
    return bench, timer, number


def _spin(seconds: float) -> float:
    """Burn this much CPU time (the injected extra work); returns the CPU time it took."""
    start = time.process_time()
    x = 0
    while time.process_time() - start < seconds:
        x += 1
    return time.process_time() - start


def main() -> None:
    # Replies go to the original stdout; anything a benchmark prints (Python or C) goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    root = sys.argv[1]
    bench: Any = None
    timer: Any = None
    number = 1
    reference = 0.0  # one sample's CPU time right after load: the unit of injected extra work
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any]
        try:
            if request["op"] == "load":
                bench, timer, number = _load(root, request["name"])
                reference = sorted(timer.timeit(number) for _ in range(3))[1]
                reply = {"ok": True, "number": number}
            elif request["op"] == "sample":
                seconds = timer.timeit(number)
                extra = float(request.get("extra", 0.0))
                if extra > 0:
                    seconds += _spin(extra * reference)
                reply = {"ok": True, "seconds": seconds / number}
            elif request["op"] == "list":
                reply = {"ok": True, "names": _list(root)}
            elif request["op"] == "teardown":
                if bench is not None:
                    bench.do_teardown()
                bench = timer = None
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown op {request['op']!r}"}
        except BaseException as exc:  # reported to the driver, which decides
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            reply = {"ok": False, "error": detail}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
