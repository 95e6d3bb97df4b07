"""Interleaved A/B timing: base and head sampled alternately, one sample each, milliseconds apart.

Why: on a shared runner the load changes within seconds (another job starts; two busy loops on
2 cores slow a sample 2-30x). asv measures one commit per run, so base and head samples are at
least one asv start-up (seconds) apart even when the runs alternate, and a load swing between
them reads as a change. Here two long-lived worker processes, one with the base commit's code
(a ``git archive``, imported ahead of the installed package, as ``harness perf run --commit``
does) and one with the working tree, each set up the same benchmark with asv's own discovery
and then take one sample at a time on request: base, head, head, base, base, head ... (the order
alternates so that neither side is always first), timed in the worker's CPU time
(``time.process_time`` plus its child processes': a benchmark that runs pytest or a process
group costs what they use; ``_ab_worker._cpu_time``): under load a sample's wall time is mostly
how long the scheduler kept it waiting, and that depends on the sample's length (one shorter
than a time slice often runs undisturbed), so even pairs milliseconds apart read a 2x slowdown
as 1x or 12x in wall time at load average 15; in CPU time they read 2.0 (docs/perf.md).

Every block of AB_BLOCK consecutive pairs is measured by a fresh pair of workers, both pinned to
the same CPU (the CPUs taken in turn, block by block): two long-lived processes running
identical code differ by a few percent for as long as they live (their memory layouts; the core
each was scheduled on, and what else ran on its sibling), and one pair of workers read identical
code as 1.13x and 1.20x, "significantly", over 20 pairs (docs/perf.md). Across fresh pairs that
difference is random, so the gate treats blocks, not pairs, as the independent units
(decision.compare_blocks). The pair is forked, not exec'd: one zygote per side and benchmark
module (a fork server, ``_Zygote``) imports asv_runner and, after the first block, the installed
modules the benchmark imported (numpy, torch; never the benchmarks' own code, which differs
between base and head), under the environment variables the benchmark's module set
(bench_attention's TRITON_INTERPRET), and every block's worker is a child of it that imports the
benchmark, sets it up and moves its own allocations by a random amount (fresh processes get a
new layout from address-space randomization; a forked child would otherwise share its zygote's);
the first block's calls per sample are kept for the others. ``start="exec"`` starts fresh
processes instead, the design before (docs/perf.md compares the two). Pairs are taken
sequentially (sequential.py): ``pairs`` first, more while the verdict is undecided, within a
pair count and a time budget per benchmark. Both workers get the same PYTHONHASHSEED, so that
hashing is not one more difference between them.

A benchmark whose pairs read ``regressed`` is measured again from the start by a new zygote
pair (new processes, a new calibration, seconds later), up to decision.MEASUREMENTS readings:
the blocks of one measurement share whatever that measurement carries, which their interval
cannot see, and the verdict is the one two independent readings share (decision.settle).

The worker (``_ab_worker.py``) runs as a script copied to a temporary folder, so that the base
side never imports this version of ``harness``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from harness.perf._common import Echo, PerfError, Project, _asv_environ, check_factor, python_path
from harness.perf.decision import MEASUREMENTS, Comparison, Verdict, settle
from harness.perf.runs import _archived_config
from harness.perf.sequential import (
    AB_BLOCK,
    SamplerError,
    SamplingPlan,
    sample_until_decided,
)

# The pairs of the first look: 12 blocks of 5, each block one fresh process pair; 10 blocks are
# the fewest that can decide anything (sequential.MIN_BLOCKS). An undecided verdict takes more.
DEFAULT_PAIRS = 60
# More pairs than this is a typo, not a measurement.
MAX_AB_PAIRS = 1000
# An undecided benchmark takes at most this many times its first pairs.
MAX_PAIRS_FACTOR = 10
# A benchmark's A/B stops after this many seconds even with fewer pairs (then the gate says
# "undecided", or "too few samples" below 10 blocks, and exits 2).
MAX_SECONDS_PER_BENCHMARK = 120.0
# How each block's pair of workers starts (measure_ab's start): forked from a zygote per side.
AB_STARTS = ("fork", "exec")
DEFAULT_START = "fork"
# A worker that does not answer a request (load with setup, or one sample) in this long is
# killed and its benchmark reported as failed to measure.
REQUEST_TIMEOUT = 300.0
# A worker told to stop (its requests closed) has this long to finish what it is doing (a load
# ahead of a block that was not needed) and its benchmark's teardown before it is killed.
CLOSE_TIMEOUT = 60.0


@dataclasses.dataclass
class ABResult:
    """Paired samples of one benchmark: base[i] and head[i] were taken one right after the
    other. error: why it could not be measured (then the lists may be empty)."""

    name: str
    base: list[float]
    head: list[float]
    error: str | None = None
    comparison: Comparison | None = None  # the last look's (sequential.py)
    stopped: str = ""  # why sampling stopped: decided, max_pairs, budget, error
    seconds: float | None = None  # the wall time this measurement took, worker starts included
    # The independent re-measurements (each with its own zygote pair) that a `regressed`
    # reading took, in order (decision.settle): this result's pairs are the first measurement's.
    confirmations: list[ABResult] = dataclasses.field(default_factory=list)

    def measurements(self) -> list[ABResult]:
        """This measurement and its confirmations, in the order taken."""
        return [self, *self.confirmations]

    def settled(self) -> Verdict | None:
        """The verdict of all measurements together (decision.settle), None without one."""
        if self.comparison is None:
            return None
        # A confirmation that failed to measure is a reading that could not decide.
        return settle(
            [self.comparison.verdict]
            + [
                c.comparison.verdict
                if c.comparison is not None and c.error is None
                else Verdict.UNDECIDED
                for c in self.confirmations
            ]
        )


class _Worker:
    """One side's worker for one block: a process started afresh (``start``) or forked by a
    zygote (``_Zygote.fork``), spoken to in JSON lines over a pair of pipes."""

    def __init__(
        self,
        pid: int,
        requests: IO[str],
        replies: IO[str],
        stderr_path: Path,
        proc: subprocess.Popen[str] | None = None,
    ) -> None:
        self.pid, self.requests, self.replies = pid, requests, replies
        self.stderr_path, self.proc = stderr_path, proc

    @classmethod
    def start(cls, script: Path, bench_root: Path, env: dict[str, str], cwd: Path) -> _Worker:
        # The worker's stderr (and whatever its benchmarks print) goes to a file: a pipe could
        # fill up and block it; its tail explains a worker that died.
        stderr_path = cwd / f"worker-{next(_COUNTER)}.err"
        with stderr_path.open("w") as stderr:
            proc = subprocess.Popen(
                [python_path(), str(script), str(bench_root)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                bufsize=1,
                env=env,
                cwd=cwd,
            )
        assert proc.stdin is not None and proc.stdout is not None
        return cls(proc.pid, proc.stdin, proc.stdout, stderr_path, proc)

    def send(self, request: dict[str, Any]) -> str | None:
        """Send request without waiting for the reply (receive reads it); None, or why not."""
        try:
            self.requests.write(json.dumps(request) + "\n")
            self.requests.flush()
        except (OSError, ValueError):  # the worker is gone (a broken pipe), or closed
            return self._died()
        return None

    def receive(self, timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
        with selectors.DefaultSelector() as sel:
            sel.register(self.replies, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.kill()
                return {"ok": False, "error": f"no answer in {timeout:g} s (killed)"}
        line = self.replies.readline()
        if not line:
            return {"ok": False, "error": self._died()}
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, request: dict[str, Any], timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
        error = self.send(request)
        return {"ok": False, "error": error} if error else self.receive(timeout)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        else:  # forked by a zygote, which reaps it
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _died(self) -> str:
        code = ""
        if self.proc is not None:
            self.proc.wait()
            code = f" {self.proc.returncode}"
        return f"worker exited{code}" + _tail(self.stderr_path)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.requests.close()  # the worker's requests end: it exits
        if self.proc is not None:
            try:
                self.proc.wait(timeout=CLOSE_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        else:  # its replies end when it exits: drain any unread one until then, or the deadline
            deadline = time.monotonic() + CLOSE_TIMEOUT
            fd = self.replies.fileno()
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or not sel.select(left):
                        self.kill()
                        break
                    if not os.read(fd, 65536):
                        break
        self.replies.close()


def _tail(path: Path) -> str:
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-3:]
    except OSError:
        return ""
    return f": {' | '.join(tail)}" if tail else ""


_COUNTER = itertools.count()


class _Zygote:
    """A fork server for one side (``_ab_worker.py --zygote``): started once per benchmark
    module (measure_ab), it imports asv_runner, and the installed third-party modules the
    module's benchmarks turned out to import (numpy, torch: never the project's code, which
    differs between base and head), once; each block's worker is a child forked from it, which
    imports the benchmark and sets it up. A fresh Python process and its imports cost each block
    ~1 s under load, torch's import far more; a fork costs milliseconds. The child moves its
    later allocations by a random amount (``_ab_worker._scatter``): a forked child shares its
    zygote's layout where a fresh process gets a new one, and the difference between two
    processes must stay random from block to block (docs/perf.md measures it)."""

    def __init__(self, script: Path, bench_root: Path, env: dict[str, str], cwd: Path) -> None:
        self.cwd = cwd
        self.stderr_path = cwd / f"zygote-{next(_COUNTER)}.err"
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with self.stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen(
                [python_path(), str(script), "--zygote", str(bench_root), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd=cwd,
            )
        theirs.close()
        self.preloaded: set[str] = set()
        self.pending = False  # a request whose reply is not read yet

    def _call(
        self,
        request: dict[str, Any],
        fds: Sequence[int] = (),
        timeout: float = REQUEST_TIMEOUT,
        *,
        wait: bool = True,
    ) -> dict[str, Any]:
        """Send request (with fds); wait for its reply unless ``wait`` is False (then the next
        call collects it first: a preload runs while the current block samples)."""
        self.sock.settimeout(timeout)
        data, why = b"{}", ""
        try:
            if self.pending:
                self.pending = False
                data = self.sock.recv(65536)
            if data:
                socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
                if not wait:
                    self.pending = True
                    return {"ok": True}
                data = self.sock.recv(65536)
        except OSError as exc:  # a timeout, or a zygote that is gone
            data, why = b"", f": {exc}"
        if not data:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            return {
                "ok": False,
                "error": f"zygote exited {self.proc.returncode}{why}" + _tail(self.stderr_path),
            }
        reply: dict[str, Any] = json.loads(data)
        return reply

    def fork(self) -> _Worker:
        """A child of the zygote as a worker; raises SamplerError when it cannot fork."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        stderr_path = self.cwd / f"worker-{next(_COUNTER)}.err"
        err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        seed = random.SystemRandom().randrange(2**32)  # where the child's allocations land
        try:
            reply = self._call({"op": "fork", "seed": seed}, [req_r, rep_w, err])
        finally:
            for fd in (req_r, rep_w, err):
                os.close(fd)
        if not reply.get("ok"):
            os.close(req_w)
            os.close(rep_r)
            raise SamplerError(str(reply.get("error")))
        requests, replies = os.fdopen(req_w, "w"), os.fdopen(rep_r, "r")
        return _Worker(int(reply["pid"]), requests, replies, stderr_path)

    def preload(
        self,
        modules: Sequence[str],
        environ: dict[str, str] | None = None,
        unset: Sequence[str] = (),
    ) -> None:
        """Import these installed modules in the zygote, for the children forked after this
        block (a module that fails to import there is imported by each child as before), after
        setting the environment variables the child's load set (environ) or removed (unset):
        an installed module may read them at import (triton's TRITON_INTERPRET)."""
        new = sorted(set(modules) - self.preloaded)
        if new or environ or unset:  # imported while this block samples (on the other CPU)
            request = {
                "op": "preload",
                "modules": new,
                "environ": environ or {},
                "unset": list(unset),
            }
            self._call(request, wait=False)
            self.preloaded.update(new)

    def close(self) -> None:
        self.sock.close()  # the zygote's requests end: it exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def benchmark_module(bench_dir: Path, name: str) -> str:
    """The module (dotted, relative to bench_dir) that defines benchmark name
    (``module.Class.method(params)`` or ``module.function``): the longest dotted prefix that is
    a ``.py`` file or a package under bench_dir, as asv's discovery finds it."""
    parts = name.partition("(")[0].split(".")
    for k in range(len(parts) - 1, 0, -1):
        path = bench_dir.joinpath(*parts[:k])
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts[:k])
    return parts[0]


def measure_ab(
    root: Path | str,
    base_sha: str,
    names: Sequence[str],
    *,
    factor: float,
    pairs: int = DEFAULT_PAIRS,
    max_pairs: int | None = None,
    max_seconds: float = MAX_SECONDS_PER_BENCHMARK,
    extra: float = 0.0,
    echo: Echo | None = None,
    start: str = DEFAULT_START,
) -> dict[str, ABResult]:
    """Time each benchmark in names (``module.Class.method`` or with ``(params)``) for base_sha
    and the working tree, alternately: ``pairs`` pairs, then more while the verdict at
    ``factor`` is undecided, up to ``max_pairs`` (default MAX_PAIRS_FACTOR * pairs, at most
    MAX_AB_PAIRS) or ``max_seconds`` per benchmark (sequential.py). ``extra``: the head side
    does that fraction more work per sample (an injected slowdown: ``harness perf calibrate``).
    start: how each block's workers start: ``fork`` (children of one zygote per side, the
    default) or ``exec`` (fresh Python processes; the design before, kept to compare).
    """
    if start not in AB_STARTS:
        raise PerfError(f"worker start must be 'fork' or 'exec', got {start!r}")
    if pairs < 1:
        raise PerfError(f"pairs must be >= 1, got {pairs}")
    if not 0 <= extra <= 10:
        raise PerfError(f"extra work must be a fraction between 0 and 10, got {extra!r}")
    check_factor(factor)
    plan = SamplingPlan(
        first=pairs,
        max_pairs=max(pairs, max_pairs or min(MAX_AB_PAIRS, MAX_PAIRS_FACTOR * pairs)),
        budget_s=max_seconds,
    )
    project = Project.load(root)
    results: dict[str, ABResult] = {}
    with tempfile.TemporaryDirectory(prefix="harness-perf-ab-") as tmp_name:
        tmp = Path(tmp_name)
        _, code_dir = _archived_config(project, base_sha, tmp)
        script = tmp / "ab_worker.py"
        shutil.copyfile(Path(__file__).with_name("_ab_worker.py"), script)
        rel = project.benchmark_dir.relative_to(project.root)
        same_seed = {"PYTHONHASHSEED": "0"}
        base_env = _asv_environ(project, same_seed)
        base_env["PYTHONPATH"] = os.pathsep.join(
            [str(code_dir)] + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else [])
        )
        head_env = _asv_environ(project, same_seed)
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

        roots = {"base": code_dir / rel, "head": project.benchmark_dir}
        caches = {side: str(tmp / f"setup-cache-{side}") for side in roots}
        envs = {"base": base_env, "head": head_env}
        zygotes: dict[str, _Zygote] = {}

        def spawn(block: int) -> dict[str, _Worker]:
            pair: dict[str, _Worker] = {}
            try:
                for side in ("base", "head"):
                    if start == "exec":
                        pair[side] = _Worker.start(script, roots[side], envs[side], tmp)
                        continue
                    if side not in zygotes:
                        zygotes[side] = _Zygote(script, roots[side], envs[side], tmp)
                    pair[side] = zygotes[side].fork()
            except BaseException:
                for worker in pair.values():
                    worker.close()
                raise
            if cpus:  # both on one CPU: they never run at once, and share its conditions
                for worker in pair.values():
                    # A worker that exited already: its first request reports why.
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(worker.pid, {cpus[block % len(cpus)]})
            return pair

        def loaded(side: str, reply: dict[str, Any]) -> None:
            if side in zygotes:  # later children find these imported already
                zygotes[side].preload(
                    [str(m) for m in reply.get("modules", [])],
                    {str(k): str(v) for k, v in reply.get("environ", {}).items()},
                    [str(k) for k in reply.get("unset", [])],
                )

        def close_zygotes() -> None:
            """End both sides' zygotes; the next block's spawn starts new ones."""
            for zygote in zygotes.values():
                zygote.close()
            zygotes.clear()

        served = ""  # the benchmark module the zygotes serve
        for n, name in enumerate(names, 1):
            # A zygote serves one benchmark module: what a module's imports left in it (the
            # environment it set, installed modules imported under it) must not reach another
            # module's benchmarks, which asv runs in processes of their own.
            module = benchmark_module(project.benchmark_dir, name)
            if module != served:
                close_zygotes()
                served = module
            if echo:
                echo(
                    f"harness perf: A/B {n}/{len(names)} {name}: {pairs} interleaved pairs in "
                    f"blocks of {AB_BLOCK}, more while undecided (up to {plan.max_pairs} or "
                    f"{plan.budget_s:g} s)"
                )

            def measure(name: str = name) -> ABResult:
                return _measure_one(
                    spawn,
                    name,
                    factor,
                    plan,
                    extra=extra,
                    loaded=loaded,
                    cache_dirs=caches,
                    prefetch=len(cpus) >= 2,
                )

            try:
                result = measure()
                # A regression is measured again by new processes (decision.settle says why).
                while (
                    result.error is None
                    and result.comparison is not None
                    and result.settled() is None
                ):
                    close_zygotes()
                    if echo:
                        last = result.measurements()[-1].comparison
                        echo(
                            f"harness perf: A/B of {name} read {last.verdict if last else '?'}: "
                            f"measuring it again with new worker processes "
                            f"({len(result.measurements()) + 1} of at most {MEASUREMENTS})"
                        )
                    result.confirmations.append(measure())
            except BaseException:
                close_zygotes()
                raise
            results[name] = result
            if echo and result.error:
                echo(f"harness perf: A/B of {name} failed: {result.error}")
            elif echo and result.comparison is not None:
                readings = ", ".join(
                    f"{m.comparison.verdict if m.comparison else m.error} after "
                    f"{len(m.base)} pairs ({m.stopped}) in {m.seconds or 0:.0f} s"
                    for m in result.measurements()
                )
                echo(f"harness perf: A/B of {name}: {result.settled()}: {readings}")
        close_zygotes()
    return results


def _measure_one(
    spawn: Callable[[int], dict[str, _Worker]],
    name: str,
    factor: float,
    plan: SamplingPlan,
    *,
    extra: float = 0.0,
    loaded: Callable[[str, dict[str, Any]], None] | None = None,
    cache_dirs: dict[str, str] | None = None,
    prefetch: bool = False,
) -> ABResult:
    """Sample name sequentially, a fresh worker pair for every block of AB_BLOCK pairs.
    extra: the head side adds this fraction of its sample's CPU time as more work (calibrate).
    loaded: told each side's reply to its first load (the modules it imported). Each side's
    calls per sample are picked in the first block and kept for the others (the same work per
    sample throughout, and no calibration to repeat). cache_dirs: per side, a folder where the
    first block's worker leaves the value of the benchmark's setup_cache for the later blocks
    (asv computes it once per run too: a 100,000-run database is not rebuilt 24 times).
    prefetch: start each next block's pair (spawn, load: import, setup) while this block
    samples, pinned to the next CPU, and warm it up again when its block starts; only where
    there are two CPUs or more (on one it would compete with the samples for the CPU)."""
    result = ABResult(name, [], [])
    started = time.monotonic()
    workers: dict[str, _Worker] = {}
    numbers: dict[str, int] = {}
    own_budget: float | None = None  # the head's harness_ab_budget: the branch's declaration

    def close() -> None:
        for worker in workers.values():
            worker.ask({"op": "teardown"}, timeout=60)
            worker.close()
        workers.clear()

    prepared: dict[int, dict[str, _Worker]] = {}  # the next block's pair, loading

    def close_prepared() -> None:
        for pair in prepared.values():
            for worker in pair.values():
                worker.close()  # its load reply unread: closing its requests ends it
        prepared.clear()

    def start_load(block: int) -> dict[str, _Worker]:
        """Spawn block's pair and send both their load requests (replies read by finish_load)."""
        pair = spawn(block)
        for side, worker in pair.items():
            load: dict[str, Any] = {"op": "load", "name": name, "number": numbers.get(side)}
            if cache_dirs:
                load["cache_dir"] = cache_dirs[side]
            error = worker.send(load)
            if error:
                for w in pair.values():
                    w.close()
                raise SamplerError(f"{side}: {error}")
        return pair

    def finish_load(pair: dict[str, _Worker], warm: bool) -> None:
        nonlocal own_budget
        for side, worker in pair.items():
            reply = worker.receive()
            if reply.get("ok") and warm:  # it loaded while the block before sampled: warm again
                reply = worker.ask({"op": "warmup"}) | {"number": reply.get("number")}
            if not reply.get("ok"):
                raise SamplerError(f"{side}: {reply.get('error')}")
            if side not in numbers:
                numbers[side] = int(reply["number"])
                if side == "head" and reply.get("budget") is not None:
                    own_budget = float(reply["budget"])
                if loaded is not None:
                    loaded(side, reply)

    def sample_pair(i: int) -> tuple[float, float]:
        if i % AB_BLOCK == 0:
            close()
            block = i // AB_BLOCK
            ahead = prepared.pop(block, None)
            workers.update(ahead or start_load(block))
            try:
                finish_load(workers, warm=ahead is not None)
            finally:
                close_prepared()
            # The next block's pair loads on the other CPU while this one samples (not during the
            # first block: the zygotes are then importing what it reported, and a fork waits).
            if prefetch and block >= 1:
                prepared[block + 1] = start_load(block + 1)
        # The order alternates so that neither side always goes first.
        got: dict[str, float] = {}
        for side in ("base", "head") if i % 2 == 0 else ("head", "base"):
            request: dict[str, Any] = {"op": "sample"}
            if side == "head" and extra:
                request["extra"] = extra
            reply = workers[side].ask(request)
            if not reply.get("ok"):
                raise SamplerError(f"{side}: {reply.get('error')}")
            got[side] = float(reply["seconds"])
        return got["base"], got["head"]

    try:
        sampled = sample_until_decided(sample_pair, factor, plan, budget_s=lambda: own_budget)
    finally:
        close_prepared()
        close()
    result.base, result.head, result.error = sampled.base, sampled.head, sampled.error
    result.comparison, result.stopped = sampled.comparison, sampled.stopped
    result.seconds = time.monotonic() - started
    return result


def list_timing_benchmarks(root: Path | str) -> list[str]:
    """Every timing benchmark of the working tree (one name per parameter combination), found
    by asv's discovery in a worker process: this process never imports the benchmarks."""
    project = Project.load(root)
    with tempfile.TemporaryDirectory(prefix="harness-perf-list-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "ab_worker.py"
        shutil.copyfile(Path(__file__).with_name("_ab_worker.py"), script)
        worker = _Worker.start(script, project.benchmark_dir, _asv_environ(project), tmp)
        try:
            reply = worker.ask({"op": "list"})
        finally:
            worker.close()
    if not reply.get("ok"):
        raise PerfError(f"listing the benchmarks in {project.benchmark_dir} failed: {reply}")
    return [str(n) for n in reply["names"]]


if __name__ == "__main__":  # pragma: no cover - a manual check: python -m harness.perf.ab BASE NAME
    out = measure_ab(Path.cwd(), sys.argv[1], sys.argv[2:], factor=1.2, echo=print)
    for r in out.values():
        print(r)
