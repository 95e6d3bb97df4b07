"""The benchmark side of ``harness impact record``: every asv benchmark run under coverage.

Run as ``python -m harness.impact.bench_recorder ROOT BENCHMARK_DIR OUT [TIMEOUT_S]`` by the
recording, in the environment that starts coverage.py in every Python process
(:func:`harness.impact.environment`). Benchmarks are found with asv's own discovery
(asv_runner, as the perf step's workers find them), in a temporary folder (a module that
writes at import writes there, never into the repository). Then, as asv runs them, **each
benchmark and parameter combination runs in a process of its own**, forked from this one,
in a fresh temporary folder, with coverage's context and :data:`harness.impact.CONTEXT_ENV`
set to ``asv:<benchmark name>`` (:data:`harness.impact.BENCH_PREFIX`) for its whole life: so
nothing one benchmark keeps (a module-level cache, a forkserver, a background thread) is
credited to another, and the processes it starts carry its label. In that process: setup,
the benchmark called **twice** (asv calls it many times; code that runs only from the second
call on, a memo's hit path, is seen; setup runs again between the two calls where asv's would:
``number = 1``, track and memory benchmarks), teardown, and then its threads are waited for.
A ``timeraw_`` benchmark's statement runs in a Python process of its own (with the label).

A ``setup_cache`` runs once per cache in a process of its own, labelled ``asv-cache:<n>``,
in the folder the benchmarks sharing it then run in (asv's convention); its value is handed
to them pickled, as asv hands it. OUT says which benchmarks share each cache, and the map
credits every one of them with what it ran.

A benchmark is ``"ran": false`` (pull-request mode then re-times it whenever the import
graph reaches its file, as if there were no map) when any of its parameter combinations
skipped itself (asv's ``NotImplementedError`` in setup: a GPU benchmark on a CPU machine),
raised (``SystemExit`` included), ran past its time limit, left threads running, or started
a process with an environment that drops coverage's start-up variable (what that process
ran is unknown). OUT (JSON): ``{"benchmarks": {name: {"file": repository-relative path,
"ran": bool, "why": "..."}}, "caches": {label: [names]}}``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import itertools
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from harness.impact import BENCH_CACHE_PREFIX, BENCH_PREFIX, CONTEXT_ENV

_START_VAR = "COVERAGE_PROCESS_START"
THREAD_WAIT_S = 10.0
"""How long a benchmark's process waits for the threads it started before it reports them."""


def _file_of(bench: Any, bench_dir: Path, root: Path) -> str:
    """The file that defines benchmark ``bench`` (asv names it module.Class.method, the module
    dotted from the benchmark folder; else where its function is), repository-relative; ""
    when none is found."""
    parts = bench.name.split(".")
    candidates = [
        bench_dir.joinpath(*parts[:k]).with_suffix(".py") for k in range(len(parts) - 1, 0, -1)
    ]
    try:
        source = inspect.getsourcefile(bench.func)
    except TypeError:
        source = None
    if source:
        candidates.append(Path(source))
    for candidate in candidates:
        if candidate.is_file():
            try:
                return candidate.resolve().relative_to(root).as_posix()
            except ValueError:
                continue
    return ""


def _combos(bench: Any) -> list[int | None]:
    if not bench.params:
        return [None]
    return list(range(len(list(itertools.product(*bench.params)))))


def _label(name: str) -> None:
    from coverage import Coverage

    os.environ[CONTEXT_ENV] = name
    cov = Coverage.current()  # after a fork, the child's own (the recording patches fork)
    if cov is not None:
        cov.switch_context(name)


def _watch_children(problems: list[str]) -> None:
    """Note any process started with an environment without coverage's start-up variable."""
    original = subprocess.Popen.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        env = kwargs.get("env")
        if env is not None and _START_VAR not in env:
            cmd = kwargs.get("args", args[0] if args else "?")
            problems.append(f"started a process without {_START_VAR} in its environment: {cmd!r}")
        original(self, *args, **kwargs)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]


def _in_child(fn: Any, timeout: float) -> dict[str, Any]:
    """Run ``fn`` (returning a JSON-able dict) in a forked process; its reply, or why none."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_fd)
        reply: dict[str, Any]
        try:
            reply = fn()
        except BaseException as exc:  # noqa: BLE001 - SystemExit and all: the benchmark's
            traceback.print_exc(file=sys.stderr)
            reply = {"ok": False, "why": f"raised {exc!r}"}
        try:
            with os.fdopen(write_fd, "w") as out:
                out.write(json.dumps(reply))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # coverage saves its data here (the recording patches os._exit)
    os.close(write_fd)
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        return {"ok": False, "why": f"ran past its time limit ({timeout:.0f} s)"}
    with os.fdopen(read_fd) as reply_in:
        text = reply_in.read()
    try:
        reply = json.loads(text)
    except json.JSONDecodeError:
        return {"ok": False, "why": f"its process ended without a reply (status {status})"}
    return reply if isinstance(reply, dict) else {"ok": False, "why": "a bad reply"}


def _run_once(bench: Any, idx: int | None, cache_file: Path | None, folder: Path) -> dict[str, Any]:
    """In the benchmark's own process: setup, two calls, teardown, its threads."""
    os.chdir(folder)
    _label(BENCH_PREFIX + bench.name)
    problems: list[str] = []
    _watch_children(problems)
    before = set(threading.enumerate())
    if idx is not None:
        bench.set_param_idx(idx)
    if tuple(bench._current_params) in bench._skip_tuples:
        return {"ok": True, "why": ""}  # asv's skip_params: never run anywhere
    if cache_file is not None:
        bench.set_cache(pickle.loads(cache_file.read_bytes()))
    with contextlib.redirect_stdout(io.StringIO()):  # asv's "skipped" line
        skipped = bench.do_setup()
    if skipped:
        return {"ok": False, "skipped": True, "why": "skipped itself in setup"}
    try:
        params = bench._build_params()
        if bench.name.split(".")[-1].startswith("timeraw_"):
            _timeraw(bench.func(*params))
        else:
            bench.func(*params)
            # The second call as asv makes it: a timing benchmark with ``number`` other than 1
            # is called again after one setup; otherwise (number = 1, track_, mem_) setup
            # runs again first (a loop that refuses to overwrite its checkpoints must).
            if bench.type != "time" or getattr(bench, "number", 0) == 1:
                bench.do_teardown()
                bench.do_setup()
            bench.func(*params)
    finally:
        bench.do_teardown()
    deadline = time.monotonic() + THREAD_WAIT_S
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    if alive:
        problems.append(f"threads still running {THREAD_WAIT_S:.0f} s after teardown: {alive}")
    return {"ok": not problems, "why": "; ".join(dict.fromkeys(problems))}


def _timeraw(code: Any) -> None:
    """A timeraw_ benchmark returns the statement (and setup) asv runs in a fresh process."""
    stmt, setup = (code, "") if isinstance(code, str) else (code[0], code[1])
    subprocess.run([sys.executable, "-c", f"{setup}\n{stmt}\n{stmt}\n"], check=True)


def _make_cache(bench: Any, cache_file: Path, label: str) -> dict[str, Any]:
    """In the cache's own process, in the folder its benchmarks then run in."""
    os.chdir(cache_file.parent)
    _label(label)
    cache_file.write_bytes(pickle.dumps(bench.do_setup_cache()))
    return {"ok": True}


def record(bench_dir: Path, root: Path, timeout: float = 300.0) -> dict[str, Any]:
    from asv_runner.discovery import (  # type: ignore[import-untyped]
        disc_benchmarks,
        update_sys_path,
    )
    from coverage import Coverage

    cov = Coverage.current()
    if cov is None:
        raise SystemExit(
            "harness.impact.bench_recorder: coverage is not measuring this process; run it "
            "through `harness impact record`"
        )
    _label("")
    scratch = Path(tempfile.mkdtemp(prefix="harness-bench-record-"))
    try:
        os.chdir(scratch)
        update_sys_path(str(bench_dir))
        # A file that fails to import has no benchmark in the table: pull-request mode then
        # re-times that file whole whenever the import graph reaches it.
        found = list(disc_benchmarks(str(bench_dir), ignore_import_errors=True))
        return _record_all(found, bench_dir, root, scratch, timeout)
    finally:
        os.chdir(root)
        shutil.rmtree(scratch, ignore_errors=True)


def _record_all(
    found: list[Any], bench_dir: Path, root: Path, scratch: Path, timeout: float
) -> dict[str, Any]:
    benchmarks: dict[str, dict[str, Any]] = {}
    caches: dict[str, list[str]] = {}
    cache_state: dict[str, tuple[Path, str]] = {}  # label -> (pickle, why it failed or "")
    cache_labels: dict[str, str] = {}  # asv's setup_cache_key -> our label
    for i, bench in enumerate(found, 1):
        name = bench.name
        entry: dict[str, Any] = {"file": _file_of(bench, bench_dir, root), "ran": False}
        benchmarks[name] = entry
        started = time.monotonic()
        print(f"[{i}/{len(found)}] {name}", end="", flush=True)
        limit = 3 * max(float(getattr(bench, "timeout", 0) or 0), timeout)  # coverage is slow
        cache_file: Path | None = None
        why: list[str] = []
        if bench._setup_cache is not None:
            key = str(bench.setup_cache_key)
            cache_label = cache_labels.setdefault(key, f"{BENCH_CACHE_PREFIX}{len(cache_labels)}")
            caches.setdefault(cache_label, []).append(name)
            if cache_label not in cache_state:
                cache_dir = scratch / cache_label.replace(":", "-")
                cache_dir.mkdir()
                made = cache_dir / "cache.pickle"
                make = functools.partial(_make_cache, bench, made, cache_label)
                reply = _in_child(make, limit)
                cache_state[cache_label] = (made, "" if reply.get("ok") else reply["why"])
            cache_file, failed = cache_state[cache_label]
            if failed:
                why.append(f"its setup_cache failed: {failed}")
        ran = skipped = 0
        combos = _combos(bench)
        for idx in combos if not why else ():
            # A fresh folder per process; asv runs a cache's benchmarks where the cache ran.
            folder = cache_file.parent if cache_file else Path(tempfile.mkdtemp(dir=scratch))
            once = functools.partial(_run_once, bench, idx, cache_file, folder)
            reply = _in_child(once, limit)
            if reply.get("ok"):
                ran += 1
            elif reply.get("skipped"):
                skipped += 1
            elif reply["why"] not in why:
                why.append(reply["why"])
        if skipped:
            total = len(combos)
            why.append(f"skipped itself in setup for {skipped} of {total} parameter combination(s)")
        entry["ran"] = ran > 0 and not why
        entry["why"] = "; ".join(why)
        state = "ran" if entry["ran"] else f"not fully seen: {entry['why']}"
        print(f": {state} ({time.monotonic() - started:.1f} s)", flush=True)
    return {"benchmarks": benchmarks, "caches": caches}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4):
        usage = "usage: python -m harness.impact.bench_recorder ROOT BENCHMARK_DIR OUT [TIMEOUT_S]"
        print(usage, file=sys.stderr)
        return 2
    root, bench_dir, out = (Path(a) for a in args[:3])
    timeout = float(args[3]) if len(args) == 4 else 300.0
    payload = record(bench_dir.resolve(), root.resolve(), timeout)
    out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
