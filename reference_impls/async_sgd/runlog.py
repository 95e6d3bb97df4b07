"""A run directory: the staleness log (one JSON line per push) and a JSON summary.

Both the simulator and the real parameter server write the same layout, so ``analyze`` reads
either::

    RUN_DIR/staleness.jsonl   one UpdateRecord per line, in the order the server handled them
    RUN_DIR/run.json          mode, config, policy, counts, deaths, final loss, wall time
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reference_impls import atomic
from reference_impls.async_sgd.server import UpdateRecord, UpdateStatus

__all__ = ["LOG_NAME", "SUMMARY_NAME", "read_log", "read_summary", "write_run"]

LOG_NAME = "staleness.jsonl"
SUMMARY_NAME = "run.json"


def write_run(
    run_dir: str | Path, records: Iterable[UpdateRecord], summary: Mapping[str, Any]
) -> Path:
    """Write the log and the summary into ``run_dir`` (created if missing)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r.to_json()) + "\n" for r in records)
    # Not durable: a rerun rewrites both; what matters is never reading half a file.
    atomic.write_text(run_dir / LOG_NAME, lines, durable=False)
    summary_text = json.dumps(dict(summary), indent=2, default=str) + "\n"
    atomic.write_text(run_dir / SUMMARY_NAME, summary_text, durable=False)
    return run_dir


def read_log(run_dir: str | Path) -> list[UpdateRecord]:
    """The records of ``run_dir``; a clear error when it is not a run directory."""
    path = Path(run_dir) / LOG_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no {LOG_NAME}: pass a directory written by 'train' or 'simulate'"
        )
    records = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            d["status"] = UpdateStatus(d["status"])
            records.append(UpdateRecord(**d))
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{path}:{n}: not a staleness record ({exc})") from None
    return records


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / SUMMARY_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no {SUMMARY_NAME}")
    try:
        summary = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: not valid JSON ({exc}): the run was cut short or the file was edited; "
            "rerun 'train' or 'simulate' into a fresh directory"
        ) from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(summary).__name__}")
    return summary


def _read_text(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 are a damaged file, named as such."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not a text file (byte {exc.start} is not UTF-8): the file is damaged; "
            "rerun 'train' or 'simulate' into a fresh directory"
        ) from None
