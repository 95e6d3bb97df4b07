"""The benchmark side of ``harness impact record``: every asv benchmark run once, under coverage.

Run as ``python -m harness.impact.bench_recorder ROOT BENCHMARK_DIR OUT`` by the recording, in
the environment that starts coverage.py in every Python process
(:func:`harness.impact.environment`). Each benchmark is found with asv's own discovery
(asv_runner, as the perf step's workers find them) and, once per parameter combination,
set up, called once and torn down, with coverage's context switched to
``asv:<benchmark name>`` (:data:`harness.impact.BENCH_PREFIX`) and the same label in
:data:`harness.impact.CONTEXT_ENV`, so that the processes a benchmark starts (a pytest run,
torch.distributed ranks) are labelled too. A ``setup_cache`` runs once per cache, as asv runs
it, labelled ``asv-cache:<n>``: OUT says which benchmarks share each cache, and the map
credits every one of them with what it ran. Discovery and imports are ambient (the empty
label), as collection is for tests.

OUT (JSON): ``{"benchmarks": {name: {"file": repository-relative path, "ran": bool, "why":
"..."}}, "caches": {label: [names]}}``. ``ran`` is false for a benchmark that skipped itself
(asv's ``NotImplementedError`` in setup: a GPU benchmark on a CPU machine), raised, or whose
cache raised: pull-request mode then selects it whenever its file is reached, as if there
were no map. A benchmark's timing loop is not run: once is enough to see what code it runs.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from harness.impact import BENCH_CACHE_PREFIX, BENCH_PREFIX, CONTEXT_ENV


def _file_of(name: str, bench_dir: Path, root: Path) -> str:
    """The file that defines benchmark ``name`` (asv names it module.Class.method, the module
    dotted from the benchmark folder), repository-relative; "" when none is found."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        candidate = bench_dir.joinpath(*parts[:k]).with_suffix(".py")
        if candidate.is_file():
            try:
                return candidate.resolve().relative_to(root).as_posix()
            except ValueError:
                return ""
    return ""


def _combos(bench: Any) -> list[int | None]:
    if not bench.params:
        return [None]
    return list(range(len(list(itertools.product(*bench.params)))))


def record(bench_dir: Path, root: Path) -> dict[str, Any]:
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

    def label(name: str) -> None:
        os.environ[CONTEXT_ENV] = name
        cov.switch_context(name)

    label("")
    update_sys_path(str(bench_dir))
    # A file that fails to import has no benchmark in the table: pull-request mode then
    # re-times that file whole whenever the import graph reaches it.
    found = list(disc_benchmarks(str(bench_dir), ignore_import_errors=True))
    # As asv does: benchmarks run in a temporary folder, and those sharing a setup_cache in
    # the folder it ran in (what it wrote there is theirs), never in the repository.
    scratch = Path(tempfile.mkdtemp(prefix="harness-bench-record-"))
    (scratch / "plain").mkdir()
    try:
        return _record_all(found, bench_dir, root, scratch, label)
    finally:
        os.chdir(root)
        shutil.rmtree(scratch, ignore_errors=True)


def _record_all(
    found: list[Any], bench_dir: Path, root: Path, scratch: Path, label: Any
) -> dict[str, Any]:
    benchmarks: dict[str, dict[str, Any]] = {}
    caches: dict[str, list[str]] = {}
    cache_values: dict[str, tuple[bool, Any]] = {}  # cache label -> (ok, value or error)
    cache_labels: dict[str, str] = {}  # asv's setup_cache_key -> our label
    for i, bench in enumerate(found, 1):
        name = bench.name
        entry: dict[str, Any] = {"file": _file_of(name, bench_dir, root), "ran": False, "why": ""}
        benchmarks[name] = entry
        started = time.monotonic()
        print(f"[{i}/{len(found)}] {name}", end="", flush=True)
        os.chdir(scratch / "plain")
        try:
            cache: Any = None
            if bench._setup_cache is not None:
                key = str(bench.setup_cache_key)
                cache_label = cache_labels.setdefault(
                    key, f"{BENCH_CACHE_PREFIX}{len(cache_labels)}"
                )
                caches.setdefault(cache_label, []).append(name)
                folder = scratch / cache_label.replace(":", "-")
                folder.mkdir(exist_ok=True)
                os.chdir(folder)
                if cache_label not in cache_values:
                    label(cache_label)
                    try:
                        cache_values[cache_label] = (True, bench.do_setup_cache())
                    except Exception as exc:  # noqa: BLE001 - the benchmark's own error
                        cache_values[cache_label] = (False, f"setup_cache raised {exc!r}")
                    finally:
                        label("")
                ok, cache = cache_values[cache_label]
                if not ok:
                    raise RuntimeError(cache)
            ran = 0
            for idx in _combos(bench):
                if idx is not None:
                    bench.set_param_idx(idx)
                if bench._setup_cache is not None:
                    bench.set_cache(cache)
                label(BENCH_PREFIX + name)
                try:
                    with contextlib.redirect_stdout(io.StringIO()):  # asv's "skipped" line
                        skipped = bench.do_setup()
                    if skipped:
                        continue  # skipped itself (asv's NotImplementedError) or by a skip list
                    try:
                        bench.func(*bench._build_params())
                    finally:
                        bench.do_teardown()
                    ran += 1
                finally:
                    label("")
            entry["ran"] = ran > 0
            if not ran:
                entry["why"] = "skipped itself in setup for every parameter combination"
        except Exception as exc:  # noqa: BLE001 - the benchmark's own error, reported
            entry["why"] = f"raised {exc!r}"
            traceback.print_exc(file=sys.stderr)
        state = "ran" if entry["ran"] else f"not run: {entry['why']}"
        print(f": {state} ({time.monotonic() - started:.1f} s)", flush=True)
    return {"benchmarks": benchmarks, "caches": caches}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        usage = "usage: python -m harness.impact.bench_recorder ROOT BENCHMARK_DIR OUT"
        print(usage, file=sys.stderr)
        return 2
    root, bench_dir, out = (Path(a) for a in args)
    payload = record(bench_dir.resolve(), root.resolve())
    out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
