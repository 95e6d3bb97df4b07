"""One side of an interleaved A/B measurement: a process that times one benchmark sample on request.

Started by harness.perf.ab as a script (``python _ab_worker.py BENCHMARK_DIR``), never imported
as part of ``harness``: the base side runs with the base commit's code ahead on sys.path, which
may hold an older ``harness``. It speaks JSON lines on stdin/stdout:

- ``{"op": "load", "name": "bench_x.Class.time_y(1, 'a')", "number": N or null, "cache_dir":
  DIR or null}`` finds the benchmark with asv's own discovery (asv_runner), runs its
  setup_cache (or reads its value from DIR, where the first block's worker left it) and
  setup, picks the
  number of calls per sample as asv does (at least ``sample_time``, 10 ms by default) unless
  given one, and warms up; replies ``{"ok": true, "number": N, "modules": [...]}`` (the
  installed third-party top-level modules the load imported: what a zygote may import for the
  next children; and ``"environ"``/``"unset"``: the variables the benchmark's module set or
  removed when it was imported, which the zygote applies before it imports them), or
  ``{"ok": false, "error": "..."}`` (not a timing benchmark, skipped by its setup, raised).
  ``"budget"``: the benchmark's ``harness_ab_budget`` (seconds of pairs), or null.
- ``{"op": "sample"}`` times one sample in CPU time (``_cpu_time``: this process's and that of
  its children that ended within the sample, e.g. a pytest or process group it ran); replies
  ``{"ok": true, "seconds": per-call time}``. With ``"extra": f`` the sample also spins for
  f times one sample's CPU time (the median of 3, taken before the first such sample: an
  injected slowdown of f, for ``harness perf calibrate``), counted in the sample.
- ``{"op": "warmup"}`` warms up again (a worker loaded ahead of its block, ab.py's prefetch).
- ``{"op": "teardown"}`` runs the benchmark's teardown (as does the end of the requests,
  when a benchmark is still set up).
- ``{"op": "list"}`` replies ``{"ok": true, "names": [...]}``: every timing benchmark, one name
  per parameter combination, as the gate's rows name them (``harness perf calibrate``).

``python _ab_worker.py --zygote BENCHMARK_DIR FD`` is a fork server instead (harness.perf.ab's
``_Zygote``): on the Unix socket FD it takes ``{"op": "preload", "modules": [...], "environ":
{...}, "unset": [...]}`` (set the environment a child's load left, then import the modules here,
once, for every later child) and ``{"op": "fork", "seed": S}`` with three file
descriptors attached (requests, replies, stderr): it forks a child that serves the requests
above on them, after moving its allocations by an amount drawn from S (``_scatter``) and
reseeding the random generators, and replies ``{"ok": true, "pid": P}``.
"""

import hashlib
import importlib
import itertools
import json
import os
import pickle
import random
import resource
import signal
import socket
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


def _setup_cache(bench: Any, cache_dir: Any) -> Any:
    """The value of the benchmark's setup_cache: computed once per side and kept (pickled, as
    asv keeps it) in cache_dir for the later blocks' workers, keyed as asv keys it (benchmarks
    that share a setup_cache share its value); without cache_dir, computed here.

    As asv does, the setup_cache runs in a folder of its own, and the benchmarks that use its
    value run there too: what it writes into its working directory (a database, a checkpoint)
    is theirs, is not the other side's, and goes when the measurement's folder goes."""
    if not cache_dir:
        return bench.do_setup_cache()
    key = hashlib.sha256(str(bench.setup_cache_key).encode()).hexdigest()[:24]
    here = os.path.join(cache_dir, key)
    os.makedirs(here, exist_ok=True)
    os.chdir(here)
    path = os.path.join(here, "value.pickle")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    value = bench.do_setup_cache()
    with open(f"{path}.{os.getpid()}", "wb") as f:
        pickle.dump(value, f)
    os.replace(f"{path}.{os.getpid()}", path)
    return value


# Whether this worker's benchmark keeps processes running between samples (a forkserver that
# forks its gloo processes, a server): set once one is seen, after setup and while calibrating.
_descendants_seen = False
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _descendants_cpu() -> "float | None":
    """CPU seconds of this process's live descendants, each with its children that ended and
    were waited for (fields 14-17 of /proc/PID/stat, in clock ticks); None without any (or
    without /proc). A process forked by a forkserver is the forkserver's child, not this
    one's: its time reaches RUSAGE_CHILDREN only when the forkserver ends, so it is read here
    as the forkserver's children's time once the forkserver has reaped it."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in pids:
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        pid = int(name)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])
    mine: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - mine
        mine |= frontier
    return sum(ticks[pid] for pid in mine) / _TICKS if mine else None


def _watch_descendants() -> None:
    global _descendants_seen
    _descendants_seen = _descendants_seen or _descendants_cpu() is not None


def _cpu_time() -> float:
    """CPU seconds of this process (all its threads), of its children that have ended and been
    waited for, and, once the benchmark has left processes running (``_watch_descendants``),
    of its live descendants. A benchmark that runs its work in other processes (pytest in a
    subprocess, a group of gloo processes) costs what they use: ``time.process_time`` alone
    would time only this process waiting for them, and a slower child would read unchanged."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() + children.ru_utime + children.ru_stime
    if _descendants_seen:
        cpu += _descendants_cpu() or 0.0
    return cpu


def _declared(bench: Any, name: str) -> Any:
    """The benchmark's own attribute ``name`` (``harness_counts``, ``harness_ab_budget``), as
    asv finds its attributes: on the benchmark function first, then its class; None without."""
    for source in getattr(bench, "_attr_sources", []) or []:
        if hasattr(source, name):
            return getattr(source, name)
    return None


def _own_budget(bench: Any) -> "float | None":
    """``harness_ab_budget``: the seconds of A/B pairs this benchmark may take, for one whose
    samples cost seconds."""
    value = _declared(bench, "harness_ab_budget")
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0 < value < float("inf"):
        raise ValueError(f"harness_ab_budget must be seconds > 0, got {value!r}")
    return float(value)


def _load(
    root: str,
    full_name: str,
    number: Any = None,
    cache_dir: Any = None,
    imported: Any = None,
) -> tuple[Any, Any, int]:
    """The benchmark set up, its timer and calls per sample. imported: called once the
    benchmark's module is imported, before its setup_cache and setup run."""
    global _descendants_seen
    _descendants_seen = False
    bench = _find(root, full_name)
    if imported is not None:
        imported()
    if getattr(bench, "type", None) != "time":
        raise ValueError(f"{full_name} is a {getattr(bench, 'type', '?')} benchmark, not a timing")
    if bench._setup_cache is not None:
        bench.set_cache(_setup_cache(bench, cache_dir))
    if bench.do_setup():
        raise ValueError(f"{full_name} skipped itself in setup")
    _watch_descendants()
    # CPU time (with the children's), not wall time: on a runner shared with other jobs a
    # sample's wall time is mostly how long the scheduler kept it waiting (harness/perf/ab.py).
    bench.timer = _cpu_time
    timer = bench._get_timer(*bench._build_params())
    sample_time = float(getattr(bench, "sample_time", 0.01) or 0.01)
    # The driver passes the first block's number to later blocks: the same work per sample in
    # every block, and no calibration to pay again.
    number = int(number or getattr(bench, "number", 0) or 0)
    if number <= 0:
        number = 1
        while number < 10**7:
            took = timer.timeit(number)
            if not _descendants_seen:
                _watch_descendants()
                if _descendants_seen:  # timed without them: again, with them
                    continue
            if took >= sample_time:
                break
            number *= 2
    _warm_up(bench, timer, number)
    _watch_descendants()
    return bench, timer, number


def _warm_up(bench: Any, timer: Any, number: int) -> None:
    """Run the benchmark for its warmup_time (asv's; 0.05 s when unset, at most 0.2 s)."""
    warmup = getattr(bench, "warmup_time", -1)
    warmup = 0.05 if warmup is None or warmup < 0 else min(float(warmup), 0.2)
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        timer.timeit(number)


def _spin(seconds: float) -> float:
    """Burn this much CPU time (the injected extra work); returns the CPU time it took."""
    start = time.process_time()
    x = 0
    while time.process_time() - start < seconds:
        x += 1
    return time.process_time() - start


def _third_party(names: "set[str]") -> list[str]:
    """The modules among names (dotted) that were imported from the installed environment's
    site-packages, not from the project's code tree: what a zygote may import once for every
    child, as it is the same code on both sides. Sorted, so a package comes before its parts."""
    prefixes = tuple(os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix))
    out = []
    for name in sorted(names):
        origin = getattr(sys.modules.get(name), "__file__", None)
        if not origin or name == "__main__":
            continue
        real = os.path.realpath(origin)
        if real.startswith(prefixes) and f"{os.sep}site-packages{os.sep}" in real:
            out.append(name)
    return out


def _environ_changes(before: "dict[str, str]") -> "dict[str, Any]":
    """What the import changed in os.environ: ``{"environ": {name: value}, "unset": [names]}``.
    A benchmark module may set a variable before it imports an installed module that reads it
    at import (bench_attention sets TRITON_INTERPRET before triton is imported): a zygote must
    import that module under the same environment, or its later children get it configured
    otherwise (triton then refuses to interpret: docs/perf.md)."""
    now = dict(os.environ)
    return {
        "environ": {k: v for k, v in now.items() if before.get(k) != v},
        "unset": sorted(set(before) - set(now)),
    }


def serve(root: str, requests: Any, replies: Any) -> None:
    """Answer JSON-line requests (the module docstring lists them) until requests end."""
    bench: Any = None
    timer: Any = None
    number = 1
    # One sample's CPU time (the median of 3, taken before the first sample that asks for extra
    # work): the unit of injected extra work. Not taken when no sample asks (the gate's own).
    reference = 0.0
    for line in requests:
        request = json.loads(line)
        reply: dict[str, Any]
        try:
            if request["op"] == "load":
                before, environ = set(sys.modules), dict(os.environ)
                # What the module's import did to the environment: not its setup's (asv runs
                # the setup in every process; the import is what a zygote stands in for).
                changes: dict[str, Any] = {}
                bench, timer, number = _load(
                    root,
                    request["name"],
                    request.get("number"),
                    request.get("cache_dir"),
                    imported=lambda c=changes, e=environ: c.update(_environ_changes(e)),
                )
                reference = 0.0
                after = set(sys.modules)
                modules = _third_party(after - before)
                reply = {"ok": True, "number": number, "modules": modules, **changes}
                reply["budget"] = _own_budget(bench)
            elif request["op"] == "sample":
                extra = float(request.get("extra", 0.0))
                if extra > 0 and not reference:  # measured once, before the first timed sample
                    reference = sorted(timer.timeit(number) for _ in range(3))[1]
                seconds = timer.timeit(number)
                if extra > 0:
                    seconds += _spin(extra * reference)
                reply = {"ok": True, "seconds": seconds / number}
            elif request["op"] == "warmup":
                _warm_up(bench, timer, number)
                reply = {"ok": True}
            elif request["op"] == "list":
                reply = {"ok": True, "names": _list(root)}
            elif request["op"] == "teardown":
                torn, bench, timer = bench, None, None  # once, even if it raises
                if torn is not None:
                    torn.do_teardown()
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown op {request['op']!r}"}
        except BaseException as exc:  # reported to the driver, which decides
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            reply = {"ok": False, "error": detail}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    # Requests ended with the benchmark still set up: a pair loaded ahead of a block that was
    # never sampled (ab.py's prefetch; sampling had decided), or a driver that stopped. asv runs
    # teardown after every setup: without it each A/B left one setup's temporary folders behind.
    if bench is not None:
        try:
            bench.do_teardown()
        except BaseException:  # the replies have ended: nothing is waiting to be told
            traceback.print_exc()


def main() -> None:
    # Replies go to the original stdout; anything a benchmark prints (Python or C) goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.argv[1], sys.stdin, replies)


def _scatter(seed: int) -> list[Any]:
    """Move where this child's later allocations land, by an amount drawn from seed.

    A forked child inherits its zygote's memory layout, where a fresh process gets a new one
    from address-space randomization; two long-lived processes running identical code differ
    by a few percent (docs/perf.md), and that difference must stay random from block to block.
    This holds on to: a block of whole pages (an mmap of its own: later mmaps, pymalloc's
    arenas and large arrays among them, start that many pages lower), a buffer below the mmap
    threshold (moves the malloc heap's top) and small objects of mixed sizes (moves pymalloc's
    free slots). Kept until the child exits."""
    rng = random.Random(seed)
    keep: list[Any] = [bytearray(4096 * rng.randrange(64, 1024))]
    keep.append(bytearray(16 * rng.randrange(1, 4096)))
    keep += [bytes(rng.randrange(1, 512)) for _ in range(rng.randrange(0, 2048))]
    return keep


def _child(root: str, fds: "list[int]", seed: int) -> None:  # pragma: no cover - forked
    requests_fd, replies_fd, stderr_fd = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote's reaping is not the child's
    os.dup2(stderr_fd, 2)
    os.dup2(stderr_fd, 1)  # anything a benchmark prints goes to the error file
    os.close(stderr_fd)
    sys.stdout = sys.stderr
    # A fresh process seeds its random generators from the OS: so does a forked child.
    random.seed()
    # Only generators already imported (by the zygote): importing one here would hide it from
    # the modules the load reports.
    for name, reseed in (("numpy.random", "seed"), ("torch", "seed")):
        module = sys.modules.get(name)
        fn = getattr(module, reseed, None) if module is not None else None
        if callable(fn):
            fn()
    keep = _scatter(seed)
    code = 0
    try:
        serve(root, os.fdopen(requests_fd, "r"), os.fdopen(replies_fd, "w"))
    except BaseException:
        code = 1
    del keep
    os._exit(code)


def zygote(root: str, control_fd: int) -> None:
    """A fork server: imports asv_runner (and, on request, installed third-party modules such as
    numpy or torch: never the benchmarks' code, which differs between base and head) once, then
    forks a child per request that serves one block of samples on the pipes it was sent."""
    import asv_runner.discovery  # type: ignore[import-untyped]  # noqa: F401  (every child needs it)

    os.dup2(2, 1)  # what an import prints goes to the error file; replies go on the socket
    sys.stdout = sys.stderr
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control = socket.socket(fileno=control_fd)
    while True:
        message, fds, _, _ = socket.recv_fds(control, 65536, 3)
        if not message:
            return
        request = json.loads(message)
        reply: dict[str, Any]
        try:
            if request["op"] == "fork":
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child
                    control.close()
                    _child(root, fds, int(request["seed"]))
                for fd in fds:
                    os.close(fd)
                reply = {"ok": True, "pid": pid}
            elif request["op"] == "preload":
                # The environment the child loaded the benchmark in, before its imports.
                os.environ.update(request.get("environ", {}))
                for name in request.get("unset", []):
                    os.environ.pop(name, None)
                failed = []
                for name in request["modules"]:
                    try:
                        importlib.import_module(name)
                    except BaseException:  # not preloaded: the child imports it itself
                        failed.append(name)
                reply = {"ok": True, "failed": failed}
            else:
                reply = {"ok": False, "error": f"unknown op {request['op']!r}"}
        except BaseException as exc:
            reply = {"ok": False, "error": traceback.format_exception_only(type(exc), exc)[-1]}
        control.send(json.dumps(reply).encode())


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote(sys.argv[2], int(sys.argv[3]))
    else:
        main()
