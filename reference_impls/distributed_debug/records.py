"""What the tracer records about one collective or point-to-point call, and the per-rank dump.

A :class:`Record` is small and flat (``__slots__``, tuples and interned strings) because one is
built on every ``torch.distributed`` call; a :class:`RankDump` is what one rank publishes (its
ring of recent records plus who it is), serialized as JSON so that dumps from every rank can be
merged by the analysis, online through the rendezvous store or offline from files.

Records are validated when read back (:func:`load_dump`, :func:`parse_dump`): a truncated file,
a missing field, a dump of another format version or of another run is a :class:`RecordsError`
that names the file and the fix, never a silently wrong report.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "CallSite",
    "RankDump",
    "RankState",
    "Record",
    "RecordStatus",
    "RecordsError",
    "load_dump",
    "load_dumps",
    "parse_dump",
]

FORMAT_VERSION = 1
"""Bumped whenever a field of the JSON dump changes meaning; readers refuse other versions."""


class RecordsError(ValueError):
    """Records that cannot be analysed as they are: truncated, malformed, from another run."""


class RecordStatus(enum.StrEnum):
    """Where one call is. Transitions: PENDING -> DONE, or PENDING -> ERROR (the call raised)."""

    PENDING = "pending"
    DONE = "done"
    ERROR = "error"


class RankState(enum.StrEnum):
    """What is known about a rank when its records are merged.

    ALIVE: it published its own ring. EXITED: its process said goodbye (interpreter exit) while
    others still waited. DEAD: its heartbeat stopped (killed, crashed, aborted): only the last
    records it published with its heartbeat are known. UNKNOWN: nothing from it at all.
    """

    ALIVE = "alive"
    EXITED = "exited"
    DEAD = "dead"
    UNKNOWN = "unknown"


CallSite = tuple[str, int, str]
"""(file, line, function) of the first frame outside torch and outside this tracer."""


class Record:
    """One traced call. ``seq`` counts collectives per process group (0, 1, ...); point-to-point
    calls have ``p2p`` set and count per (group, peer, direction, tag) instead, which is how
    gloo and NCCL pair a send with its receive."""

    __slots__ = (
        "callsite",
        "dtypes",
        "error",
        "group",
        "op",
        "p2p",
        "peer",
        "reduce_op",
        "seq",
        "shapes",
        "t_done",
        "t_issue",
        "tag",
        "work",
    )

    def __init__(
        self,
        *,
        seq: int,
        op: str,
        group: str,
        shapes: tuple[tuple[int, ...], ...],
        dtypes: tuple[str, ...],
        reduce_op: str | None,
        peer: int | None,
        callsite: CallSite,
        t_issue: float,
        p2p: bool = False,
        tag: int = 0,
        t_done: float | None = None,
        error: str | None = None,
    ) -> None:
        self.seq = seq
        self.op = op
        self.group = group
        self.shapes = shapes  # the shapes every rank must agree on, e.g. ((8, 4),)
        self.dtypes = dtypes
        self.reduce_op = reduce_op
        self.peer = peer  # global rank: the root of a rooted collective, the other end of a P2P
        self.callsite = callsite
        self.t_issue = t_issue  # time.time(): comparable across ranks of one host
        self.p2p = p2p
        self.tag = tag
        self.t_done = t_done
        self.error = error
        self.work: Any = None  # the async Work while it is pending (never serialized)

    @property
    def status(self) -> RecordStatus:
        if self.error is not None:
            return RecordStatus.ERROR
        return RecordStatus.PENDING if self.t_done is None else RecordStatus.DONE

    def signature(self) -> tuple[Any, ...]:
        """What every rank must agree on for this call to pair up correctly."""
        return (self.op, self.shapes, self.dtypes, self.reduce_op, self.peer if not self.p2p else 0)

    def where(self) -> str:
        file, line, func = self.callsite
        return f"{file}:{line} ({func})"

    def describe(self) -> str:
        shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.shapes) or "-"
        dtypes = ",".join(sorted(set(self.dtypes))) or "-"
        extra = f", op={self.reduce_op}" if self.reduce_op else ""
        if self.p2p:
            direction = "to" if self.op in ("send", "isend") else "from"
            extra += f", {direction} rank {self.peer}, tag {self.tag}"
        elif self.peer is not None:
            extra += f", root {self.peer}"
        return f"{self.op}([{shapes}] {dtypes}{extra})"

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "op": self.op,
            "group": self.group,
            "shapes": [list(s) for s in self.shapes],
            "dtypes": list(self.dtypes),
            "reduce_op": self.reduce_op,
            "peer": self.peer,
            "callsite": list(self.callsite),
            "t_issue": self.t_issue,
            "t_done": self.t_done,
            "p2p": self.p2p,
            "tag": self.tag,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Record:
        try:
            file, line, func = d["callsite"]
            return cls(
                seq=int(d["seq"]),
                op=str(d["op"]),
                group=str(d["group"]),
                shapes=tuple(tuple(int(n) for n in s) for s in d["shapes"]),
                dtypes=tuple(str(t) for t in d["dtypes"]),
                reduce_op=None if d["reduce_op"] is None else str(d["reduce_op"]),
                peer=None if d["peer"] is None else int(d["peer"]),
                callsite=(str(file), int(line), str(func)),
                t_issue=float(d["t_issue"]),
                t_done=None if d["t_done"] is None else float(d["t_done"]),
                p2p=bool(d["p2p"]),
                tag=int(d["tag"]),
                error=None if d["error"] is None else str(d["error"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordsError(
                f"malformed record {dict(d)!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        kind = "p2p" if self.p2p else "seq"
        return f"Record({kind} {self.seq} {self.describe()} at {self.where()}, {self.status})"


@dataclasses.dataclass(kw_only=True)
class RankDump:
    """Everything one rank tells the analysis."""

    run_id: str
    """Same on every rank of one job (agreed through the store); dumps of two runs never mix."""
    rank: int
    world_size: int
    state: RankState
    published_at: float
    """time.time() when the rank published: a pending call's wait is measured up to here."""
    groups: dict[str, list[int]]
    """Process group name -> its global ranks, for every group this rank traced."""
    records: list[Record]
    """Oldest first. For a DEAD rank, only what its last heartbeat carried."""
    dropped: int = 0
    """Records that fell out of the ring before this dump (it keeps only the newest)."""
    pid: int | None = None
    host: str = ""
    reason: str = ""
    """Why it published (stall, error, exit, on request)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "run_id": self.run_id,
            "rank": self.rank,
            "world_size": self.world_size,
            "state": str(self.state),
            "published_at": self.published_at,
            "groups": self.groups,
            "dropped": self.dropped,
            "pid": self.pid,
            "host": self.host,
            "reason": self.reason,
            "records": [r.to_json() for r in self.records],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


MAX_WORLD_SIZE = 1 << 24
"""More ranks than any job runs (16M); a larger world size in a dump is corruption."""


def parse_dump(text: str | bytes, source: str) -> RankDump:
    """A :class:`RankDump` from its JSON text; ``source`` names it in errors (a path, a key)."""
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordsError(
            f"{source}: not valid JSON ({exc}); the dump is truncated or was overwritten while "
            "being written: dump again or drop this file"
        ) from exc
    if not isinstance(d, dict):
        raise RecordsError(f"{source}: expected a JSON object, got {type(d).__name__}")
    version = d.get("format")
    if version != FORMAT_VERSION:
        raise RecordsError(
            f"{source}: record format {version!r}, this reader understands {FORMAT_VERSION}; "
            "analyse it with the version of reference_impls.distributed_debug that wrote it"
        )
    try:
        records = [Record.from_json(r) for r in d["records"]]
        dump = RankDump(
            run_id=str(d["run_id"]),
            rank=int(d["rank"]),
            world_size=int(d["world_size"]),
            state=RankState(d["state"]),
            published_at=float(d["published_at"]),
            groups={str(k): [int(r) for r in v] for k, v in d["groups"].items()},
            records=records,
            dropped=int(d.get("dropped", 0)),
            pid=d.get("pid"),
            host=str(d.get("host", "")),
            reason=str(d.get("reason", "")),
        )
    except RecordsError as exc:
        raise RecordsError(f"{source}: {exc}") from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RecordsError(
            f"{source}: missing or malformed field: {type(exc).__name__}: {exc}"
        ) from exc
    if not 0 <= dump.rank < dump.world_size:
        raise RecordsError(f"{source}: rank {dump.rank} outside world size {dump.world_size}")
    if dump.world_size > MAX_WORLD_SIZE:
        # The report has a line per rank: a corrupt or edited size would be a loop that long.
        raise RecordsError(
            f"{source}: world size {dump.world_size} is past {MAX_WORLD_SIZE} ranks; the dump "
            "is corrupt or was edited"
        )
    bad_time = next(
        (t for t in (dump.published_at, *(x.t_issue for x in records)) if not math.isfinite(t)),
        None,
    )
    if bad_time is not None:
        raise RecordsError(f"{source}: a time of {bad_time} s; the dump is corrupt or was edited")
    return dump


def load_dump(path: Path) -> RankDump:
    return parse_dump(path.read_bytes(), str(path))


def check_same_run(dumps: Iterable[RankDump]) -> list[RankDump]:
    """The dumps, one per rank, all of one run and one world size; else a RecordsError."""
    dumps = list(dumps)
    if not dumps:
        raise RecordsError("no rank dumps to analyse")
    runs: dict[str, list[int]] = {}
    for d in dumps:
        runs.setdefault(d.run_id, []).append(d.rank)
    if len(runs) > 1:
        listing = "; ".join(f"run {run}: ranks {sorted(ranks)}" for run, ranks in runs.items())
        raise RecordsError(
            f"the dumps come from {len(runs)} different runs ({listing}); analyse one run's "
            "dumps at a time (move the others to another folder)"
        )
    worlds = {d.world_size for d in dumps}
    if len(worlds) > 1:
        raise RecordsError(f"the dumps disagree on the world size: {sorted(worlds)}")
    seen: dict[int, RankDump] = {}
    for d in dumps:
        if d.rank in seen:
            raise RecordsError(f"two dumps for rank {d.rank}: keep one")
        seen[d.rank] = d
    return [seen[r] for r in sorted(seen)]


def load_dumps(directory: Path) -> list[RankDump]:
    """Every ``rank*.json`` under ``directory`` (one run), checked with :func:`check_same_run`."""
    if not directory.is_dir():
        raise RecordsError(f"{directory} is not a directory of rank dumps (rank0.json, ...)")
    paths = sorted(directory.glob("rank*.json"))
    if not paths:
        raise RecordsError(
            f"{directory} holds no rank*.json dumps; the tracer writes them under its "
            "report_dir/records (or call Tracer.dump(dir) on every rank)"
        )
    return check_same_run(load_dump(p) for p in paths)
