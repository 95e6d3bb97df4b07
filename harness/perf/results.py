"""Reading asv's result files, and the pass records that pair base and head samples.

asv keeps one result file per (machine, commit, environment) and, with ``--append-samples``,
one flat list of samples per benchmark: it forgets which asv run each sample came from. The
gate needs that (stats.py: samples of base and head taken in the same pass are compared with
each other only), so after every asv run :func:`record_pass` notes the samples the run added,
tagged with the pass they belong to (a session id and the pass's index in it), in
``.asv/passes/<machine>/<commit>.json``. Base and head passes with the same tag were measured
one right after the other. A record whose sample counts no longer match the result file (asv
run by hand, a benchmark whose code changed) is ignored, and the gate pools the samples as asv
does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.perf._common import Project


@dataclasses.dataclass
class Measurement:
    """One benchmark (with its parameters) of one commit, as asv recorded it."""

    value: float | None
    stats: dict[str, Any] | None
    samples: list[float] | None
    version: str | None


Results = dict[str, dict[str, Measurement]]  # {env name: {benchmark name(params): measurement}}


def load_results(
    project: Project, machine: str, sha: str, *, results_dir: Path | None = None
) -> Results:
    """{env name: {benchmark name with params: measurement}} for one commit on one machine.

    results_dir: another folder laid out like asv's (a stored baseline), default the project's.
    """
    from asv.commands.compare import unroll_result
    from asv.results import iter_results_for_machine_and_hash

    results_dir = results_dir or project.results_dir
    by_env: Results = {}
    if not (results_dir / machine).is_dir():
        return by_env
    for result in iter_results_for_machine_and_hash(str(results_dir), machine, sha):
        rows = by_env.setdefault(result.env_name, {})
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            version = result.benchmark_version.get(key)
            for name, value, stats, samples in unroll_result(
                key,
                params,
                result.get_result_value(key, params),
                result.get_result_stats(key, params),
                result.get_result_samples(key, params),
            ):
                rows[name] = Measurement(value, stats, samples, version)
    return by_env


# --------------------------------------------------------------------------------------------
# Pass records

PassTag = tuple[str, int]  # (session id, index of the pass in that session)


def _passes_path(project: Project, machine: str, sha: str) -> Path:
    return project.state_dir / "passes" / machine / f"{sha}.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_pass(
    project: Project,
    machine: str,
    sha: str,
    env: str,
    before: dict[str, Measurement],
    after: dict[str, Measurement],
    tag: PassTag,
    *,
    appended: bool,
) -> None:
    """Note which samples the asv run that turned ``before`` into ``after`` added.

    A benchmark whose samples were replaced (no append, or its code changed) starts a new
    record; one that this run did not measure keeps its record.
    """
    path = _passes_path(project, machine, sha)
    data = _read(path)
    records = data.setdefault(env, {})
    for name, new in after.items():
        old = before.get(name)
        if not new.samples:
            records.pop(name, None)
            continue
        if old is not None and old.samples == new.samples:
            continue  # not measured by this run
        kept = (
            appended
            and old is not None
            and old.samples
            and old.version == new.version
            and new.samples[: len(old.samples)] == old.samples
        )
        if kept:
            assert old is not None and old.samples is not None
            added = new.samples[len(old.samples) :]
            passes = records.get(name, [])
        else:
            added, passes = new.samples, []
        passes.append({"session": tag[0], "index": tag[1], "samples": added})
        records[name] = passes
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def load_passes(
    project: Project, machine: str, sha: str, env: str, results: dict[str, Measurement]
) -> dict[str, dict[PassTag, list[float]]]:
    """{benchmark: {pass tag: samples}} for the benchmarks whose record still matches results
    (the recorded passes hold exactly the result file's samples, in order)."""
    records = _read(_passes_path(project, machine, sha)).get(env, {})
    out: dict[str, dict[PassTag, list[float]]] = {}
    for name, passes in records.items():
        m = results.get(name)
        if m is None or not m.samples or not isinstance(passes, list):
            continue
        try:
            flat = [x for p in passes for x in p["samples"]]
            tagged = {(str(p["session"]), int(p["index"])): list(p["samples"]) for p in passes}
        except (KeyError, TypeError, ValueError):
            continue
        if flat == list(m.samples) and len(tagged) == len(passes):
            out[name] = tagged
    return out
