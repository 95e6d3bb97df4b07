"""Instruction counts under Valgrind: a deterministic tier for pure-CPU benchmarks.

Why: CPU time still moves with the machine (a busy neighbour on the same core, the memory
layout of two processes), so the A/B pairs need a factor of ~1.2 or many pairs to decide.
The instructions a benchmark call executes (callgrind's ``Ir``) do not depend on the load:
on this VM two processes of identical code agree to ~1e-5 (the tiny loop) to ~1% (an
allocation-heavy benchmark: the heap differs; docs/perf.md, "Instruction counts (Valgrind)"),
so a 5% change in the work done is a 5% change in the count. Counts miss what is not instructions
(cache and memory stalls, sleeps, I/O, another thread's work), and a count change need not be
a time change, so a count regression only **fails** the gate when interleaved CPU-time A/B
pairs (ab.py) at the count threshold confirm it; pairs that cannot tell make the benchmark
``undecided`` (exit 2), never OK. Counts never clear a benchmark: its A/B verdict at the
gate's factor stands whatever the count says.

How: each side (the base commit's ``git archive``, the working tree) runs
``_counts_worker.py`` under ``valgrind --tool=callgrind --instr-atstart=no
--collect-atstart=no``; the worker sets the benchmark up with asv's own discovery (as the A/B
worker does), starts instrumentation, and switches collection on only around ``number`` and
``2 * number`` calls of the timed function (their difference is the count: a region's own
cost cancels), through callgrind's client requests (``CALLGRIND_START_INSTRUMENTATION``,
``CALLGRIND_ZERO_STATS``, ``CALLGRIND_TOGGLE_COLLECT``, ``CALLGRIND_DUMP_STATS_AT``, the
requests CodSpeed's instrumentation uses). The smallest of the repeats is a side's count.
Valgrind 3.19's cachegrind has no such requests (3.22 added them), hence callgrind. The
requests are C macros: a five-function shim is compiled with the system C compiler on first
use into a cache folder and loaded with ctypes (:func:`build_shim`; a clear error when
valgrind, the compiler or ``valgrind/callgrind.h`` is missing). Both sides get
PYTHONHASHSEED=0 and one BLAS/OpenMP thread.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.perf._common import Echo, PerfError, Project, _asv_environ, python_path
from harness.perf.runs import _archived_config

# A count ratio head/base at or above 1 + threshold is a count regression (then confirmed by
# A/B pairs at factor 1 + threshold). A benchmark may set its own: ``harness_counts = 0.1``.
DEFAULT_COUNT_THRESHOLD = 0.05
MAX_COUNT_THRESHOLD = 9.0
# Counted regions per side (one process): their spread is what the verdict calls unstable.
DEFAULT_REPEATS = 5
# Within one side, a median of the repeats further than this fraction of the threshold above
# their smallest is not a deterministic count (the benchmark's work depends on something
# else: time, randomness, another thread): the count verdict is then "unstable" and A/B pairs
# decide as for a count regression.
UNSTABLE_SHARE = 0.25
# One side's Valgrind run is killed after this long (Valgrind runs Python ~50x slower).
VALGRIND_TIMEOUT_S = 900.0
# Both sides: hashing and thread pools fixed, so that they are not one more difference.
COUNT_ENV = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

# A coverage tracer started in the counted process (coverage.py's start-up hook, pytest-cov's
# subprocess support) runs inside the counted regions: its per-line work is counted with the
# benchmark's, and its data writes made the repeats of unchanged code differ by 2.3% once
# (`harness impact record`, 2026-12-03). Counts measure the benchmark, so they are not passed on.
COVERAGE_START_VARS = (
    "COVERAGE_PROCESS_START",
    "COVERAGE_PROCESS_CONFIG",
    "COV_CORE_SOURCE",
    "COV_CORE_CONFIG",
    "COV_CORE_DATAFILE",
)


def count_environ(project: Project) -> dict[str, str]:
    """The environment of one side's counted run: asv's, COUNT_ENV, no coverage tracer."""
    env = _asv_environ(project, COUNT_ENV)
    for name in COVERAGE_START_VARS:
        env.pop(name, None)
    return env


SHIM_SOURCE = """\
#include <valgrind/callgrind.h>
int harness_running_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
void harness_zero(void) { CALLGRIND_ZERO_STATS; }
void harness_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void harness_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
void harness_start_instrumentation(void) { CALLGRIND_START_INSTRUMENTATION; }
"""


class CountVerdict(enum.StrEnum):
    """What the instruction counts say about head against base at the count threshold T."""

    REGRESSED = "count regressed"
    """head/base >= 1 + T: confirmed (or not) by A/B pairs at factor 1 + T."""
    UNCHANGED = "count unchanged"
    """Within (1/(1 + T), 1 + T): evidence only, the A/B verdict at the gate's factor stands."""
    IMPROVED = "count improved"
    """head/base <= 1/(1 + T): evidence only."""
    UNSTABLE = "count unstable"
    """Repeats of one side differ by more than UNSTABLE_SHARE of T: not deterministic; A/B
    pairs at factor 1 + T decide, as for a count regression."""
    INELIGIBLE = "not counted"
    """Opted out (``harness_counts = False``), or the counted calls waited, ran threads or
    child processes, did block I/O or used CUDA: counts do not measure it."""
    FAILED = "count failed"
    """Valgrind or the benchmark failed: the tier asked for could not decide (exit 2)."""


# Count verdicts that A/B pairs at the count threshold must settle before the gate can pass.
NEEDS_CONFIRMATION = frozenset({CountVerdict.REGRESSED, CountVerdict.UNSTABLE})


@dataclasses.dataclass(frozen=True)
class CountComparison:
    verdict: CountVerdict
    ratio: float  # smallest head count / smallest base count per call (nan when not counted)
    spread: float  # the larger side's (median / min - 1) over its repeats
    threshold: float
    why: str = ""  # for INELIGIBLE and FAILED


def check_threshold(value: float, *, source: str = "--counts-threshold") -> float:
    """A count threshold: a fraction > 0 and <= MAX_COUNT_THRESHOLD (PerfError naming it)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_COUNT_THRESHOLD
    ):
        raise PerfError(
            f"{source} {value!r} is not a count threshold: give a fraction > 0 and <= "
            f"{MAX_COUNT_THRESHOLD:g} (0.05: a count 5% higher is a count regression)"
        )
    return float(value)


def judge_counts(base: Sequence[float], head: Sequence[float], threshold: float) -> CountComparison:
    """The count verdict from per-call counts of repeated regions on each side."""
    check_threshold(threshold, source="count threshold")
    b = [x for x in base if math.isfinite(x) and x > 0]
    h = [x for x in head if math.isfinite(x) and x > 0]
    if not b or not h:
        return CountComparison(
            CountVerdict.FAILED, math.nan, math.nan, threshold, "no positive count on a side"
        )
    # The smallest repeat is the count: Python's allocator (pymalloc's pools and arenas) adds
    # 1-5% to some regions and never takes any away (docs/perf.md). Stable means that at least
    # half the repeats agree with the smallest: the median is within UNSTABLE_SHARE * T of it.
    spread = max(statistics.median(s) / min(s) - 1 for s in (b, h))
    ratio = min(h) / min(b)
    if spread > UNSTABLE_SHARE * threshold:
        return CountComparison(
            CountVerdict.UNSTABLE,
            ratio,
            spread,
            threshold,
            f"repeats differ by {spread:.2%} (> {UNSTABLE_SHARE * threshold:.2%})",
        )
    if ratio >= 1 + threshold:
        verdict = CountVerdict.REGRESSED
    elif ratio <= 1 / (1 + threshold):
        verdict = CountVerdict.IMPROVED
    else:
        verdict = CountVerdict.UNCHANGED
    return CountComparison(verdict, ratio, spread, threshold)


# --------------------------------------------------------------------------------------------
# Measuring


@dataclasses.dataclass
class CountSide:
    """One side's Valgrind run of one benchmark: Ir per call for each repeat, the other
    events (with --cache-sim) per call as medians, and what made it ineligible."""

    per_call: list[float]
    events: dict[str, float]
    number: int
    wall_s: float
    ineligible: str = ""
    cpu_s: float = 0.0  # the Valgrind run's CPU time (its wall time grows with the load)
    setting: float | None = None  # the benchmark's own threshold (harness_counts = 0.1)


@dataclasses.dataclass
class CountResult:
    name: str
    base: CountSide | None = None
    head: CountSide | None = None
    error: str | None = None

    def threshold(self, default: float) -> float:
        for side in (self.head, self.base):
            if side is not None and side.setting is not None:
                return check_threshold(side.setting, source=f"{self.name}: harness_counts")
        return default

    def judge(self, default: float) -> CountComparison:
        try:
            threshold = self.threshold(default)
        except PerfError as exc:
            return CountComparison(CountVerdict.FAILED, math.nan, math.nan, default, str(exc))
        if self.error is not None or self.base is None or self.head is None:
            return CountComparison(
                CountVerdict.FAILED, math.nan, math.nan, threshold, self.error or "not measured"
            )
        why = "; ".join(
            f"{label}: {s.ineligible}"
            for label, s in (("base", self.base), ("head", self.head))
            if s.ineligible
        )
        if why:
            return CountComparison(CountVerdict.INELIGIBLE, math.nan, math.nan, threshold, why)
        return judge_counts(self.base.per_call, self.head.per_call, threshold)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness"


def find_valgrind() -> str:
    """The valgrind executable, or a PerfError saying it is missing (the counts tier needs it)."""
    found = shutil.which("valgrind")
    if not found:
        raise PerfError(
            "--counts needs Valgrind (its callgrind tool), and `valgrind` is not on PATH: "
            "install it (Debian/Ubuntu: apt-get install valgrind) or leave out --counts"
        )
    return found


def build_shim(cache_dir: Path | None = None) -> Path:
    """The client-request shim, compiled once per source and compiler into the cache folder
    (``$XDG_CACHE_HOME/harness`` or ``~/.cache/harness``). PerfError when the C compiler
    (``$CC``, else ``cc``) or ``valgrind/callgrind.h`` is missing."""
    cc = os.environ.get("CC") or "cc"
    cc_path = shutil.which(cc)
    if not cc_path:
        raise PerfError(
            f"--counts compiles a tiny C shim around callgrind's client requests, and the C "
            f"compiler {cc!r} ($CC, else cc) is not on PATH: install gcc or set CC"
        )
    folder = cache_dir or _cache_dir()
    key = hashlib.sha256((SHIM_SOURCE + cc_path).encode()).hexdigest()[:16]
    target = folder / f"callgrind-shim-{key}.so"
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PerfError(f"cannot create the cache folder {folder} for the shim: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="harness-shim-", dir=folder) as tmp:
        source = Path(tmp) / "shim.c"
        source.write_text(SHIM_SOURCE)
        built = Path(tmp) / "shim.so"
        proc = subprocess.run(
            [cc_path, "-O2", "-shared", "-fPIC", "-o", str(built), str(source)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            detail = proc.stderr.strip().splitlines()
            missing = any("callgrind.h" in line for line in detail)
            raise PerfError(
                (
                    "valgrind/callgrind.h was not found by the C compiler: install Valgrind's "
                    "headers (Debian/Ubuntu: the valgrind package ships them)"
                    if missing
                    else f"compiling the callgrind shim with {cc_path} failed"
                )
                + (f": {detail[-1]}" if detail else "")
            )
        os.replace(built, target)  # atomic: two gates building at once both get a whole file
    return target


def check_counts_tools(cache_dir: Path | None = None) -> tuple[str, Path]:
    """valgrind and the shim, before any work: (valgrind path, shim path) or PerfError."""
    return find_valgrind(), build_shim(cache_dir)


_TOTALS = re.compile(
    r"^(desc: Trigger: Client Request: (?P<req>\S+)|events: (?P<ev>.*)|"
    r"totals: (?P<tot>.*))$"
)


def parse_dumps(prefix: Path) -> dict[str, dict[str, int]]:
    """{dump name: {event: total}} from callgrind's part files ``prefix.N``."""
    found: dict[str, dict[str, int]] = {}
    for part in sorted(prefix.parent.glob(prefix.name + ".*")):
        name = ""
        events: list[str] = []
        for line in part.read_text(errors="replace").splitlines():
            m = _TOTALS.match(line)
            if not m:
                continue
            if m["req"]:
                name = m["req"]
            elif m["ev"]:
                events = m["ev"].split()
            elif m["tot"] and name:
                found[name] = dict(zip(events, (int(x) for x in m["tot"].split()), strict=False))
    return found


def _side_from(reply: dict[str, Any], dumps: dict[str, dict[str, int]], wall: float) -> CountSide:
    if reply.get("opt_out"):
        return CountSide([], {}, 0, wall, ineligible=str(reply["opt_out"]))
    number = int(reply["number"])
    reps = int(reply["reps"])
    small = [dumps[f"harness-rep-{i}-a"] for i in range(reps) if f"harness-rep-{i}-a" in dumps]
    large = [dumps[f"harness-rep-{i}-b"] for i in range(reps) if f"harness-rep-{i}-b" in dumps]
    if not small or not large:
        raise PerfError("callgrind wrote no counted region (did the shim run under valgrind?)")
    # number calls = (a region of 2 * number calls) - (one of number calls): what a region
    # costs whatever it holds cancels. The smallest small region is the reference: pymalloc
    # adds to some regions, never takes away, so a spike shows as one large per-call value.
    # callgrind leaves trailing zero events out of a totals line: a missing event is 0.
    names = sorted({ev for r in small + large for ev in r})
    floor = {ev: min(r.get(ev, 0) for r in small) for ev in names}
    per_call = [(r.get("Ir", 0) - floor.get("Ir", 0)) / number for r in large]
    events = {
        ev: statistics.median((r.get(ev, 0) - floor[ev]) / number for r in large)
        for ev in names
        if ev != "Ir"
    }
    reasons = []
    if reply.get("threads", 1) > 1:
        reasons.append(f"{reply['threads']} threads")
    regions = int(reply.get("regions", reps))
    # Every counted region waited (a sleep, I/O, a lock, a child): one that did is chance.
    if reply.get("waits", 0) >= regions:
        reasons.append(
            f"waited in {reply['waits']} of {regions} counted regions "
            "(sleep, I/O, a lock or a child)"
        )
    if reply.get("children_cpu_s", 0) > 0:
        reasons.append("ran child processes")
    if reply.get("blocks", 0) >= regions:
        reasons.append(f"did block I/O in {reply['blocks']} of {regions} counted regions")
    if reply.get("cuda"):
        reasons.append("used CUDA")
    setting = reply.get("setting")
    return CountSide(
        per_call,
        events,
        number,
        wall,
        ineligible=", ".join(reasons),
        setting=float(setting) if setting is not None else None,
    )


def measure_counts(
    root: Path | str,
    base_sha: str,
    names: Sequence[str],
    *,
    repeats: int = DEFAULT_REPEATS,
    cache_sim: bool = False,
    timeout_s: float = VALGRIND_TIMEOUT_S,
    echo: Echo | None = None,
    cache_dir: Path | None = None,
) -> dict[str, CountResult]:
    """Count Ir per call of each benchmark in names for base_sha (``git archive``) and the
    working tree, one Valgrind run per side and benchmark."""
    if not 1 <= repeats <= 20:
        raise PerfError(f"count repeats must be between 1 and 20, got {repeats}")
    valgrind, shim = check_counts_tools(cache_dir)
    project = Project.load(root)
    results: dict[str, CountResult] = {}
    with tempfile.TemporaryDirectory(prefix="harness-perf-counts-") as tmp_name:
        tmp = Path(tmp_name)
        _, code_dir = _archived_config(project, base_sha, tmp)
        shutil.copyfile(Path(__file__).with_name("_ab_worker.py"), tmp / "ab_worker.py")
        script = tmp / "counts_worker.py"
        shutil.copyfile(Path(__file__).with_name("_counts_worker.py"), script)
        rel = project.benchmark_dir.relative_to(project.root)
        base_env = count_environ(project)
        base_env["PYTHONPATH"] = os.pathsep.join(
            [str(code_dir)] + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else [])
        )
        head_env = count_environ(project)
        sides = {"base": (code_dir / rel, base_env), "head": (project.benchmark_dir, head_env)}
        for n, name in enumerate(names, 1):
            result = results[name] = CountResult(name)
            for label, (bench_root, env) in sides.items():
                side, error = _run_side(
                    valgrind,
                    shim,
                    script,
                    bench_root,
                    env,
                    name,
                    repeats,
                    cache_sim,
                    timeout_s,
                    tmp / f"{n}-{label}",
                )
                if error:
                    result.error = f"{label}: {error}"
                    break
                setattr(result, label, side)
            if echo:
                verdict = result.judge(DEFAULT_COUNT_THRESHOLD)
                walls = "/".join(
                    f"{s.wall_s:.0f}" for s in (result.base, result.head) if s is not None
                )
                echo(
                    f"harness perf: counts {n}/{len(names)} {name}: "
                    + (
                        f"{verdict.verdict} ({verdict.why})"
                        if verdict.why
                        else f"{verdict.verdict}, ratio {verdict.ratio:.4f}"
                    )
                    + f"; valgrind {walls} s"
                    + "".join(
                        f"; {label} per call: "
                        + ", ".join(f"{ev} {v:.4g}" for ev, v in sorted(side.events.items()))
                        for label, side in (("base", result.base), ("head", result.head))
                        if side is not None and side.events
                    )
                )
    return results


def _run_side(
    valgrind: str,
    shim: Path,
    script: Path,
    bench_root: Path,
    env: dict[str, str],
    name: str,
    repeats: int,
    cache_sim: bool,
    timeout_s: float,
    work: Path,
) -> tuple[CountSide | None, str | None]:
    work.mkdir()
    out = work / "reply.json"
    prefix = work / "callgrind.out"
    cmd = [
        valgrind,
        "--tool=callgrind",
        "--instr-atstart=no",  # setup and imports run uninstrumented: several times faster
        "--collect-atstart=no",
        f"--cache-sim={'yes' if cache_sim else 'no'}",
        "--dump-instr=no",
        "--dump-line=no",
        f"--callgrind-out-file={prefix}",
        "--log-file=" + str(work / "valgrind.log"),
        python_path(),
        str(script),
        str(shim),
        str(bench_root),
        name,
        str(repeats),
        str(out),
    ]
    start = time.monotonic()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=work, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None, f"valgrind ran past {timeout_s:g} s (killed)"
    wall = time.monotonic() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    try:
        reply = json.loads(out.read_text())
    except (OSError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"valgrind exited {proc.returncode} without a reply: {tail}"
    if not reply.get("ok"):
        return None, str(reply.get("error"))
    try:
        side = _side_from(reply, parse_dumps(prefix), wall)
    except (PerfError, KeyError, ValueError) as exc:
        return None, str(exc)
    side.cpu_s = cpu
    return side, None
