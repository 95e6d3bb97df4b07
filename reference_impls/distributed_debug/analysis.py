"""Merge every rank's records and name the first divergence, the ranks and both call sites.

A hang is reported where it starts, not where it ends: ranks that disagree about which
collective comes next often keep going for a while (gloo pairs two all-reduces of equal size
from different lines without complaint), and the call that finally never completes is
downstream of the cause. So the analysis walks each process group's sequence numbers from the
oldest one every rank still holds and stops at the first one where ranks disagree:

(a) ``op_mismatch``: different ops at the same sequence number;
(b) ``argument_mismatch``: same op, different shapes, dtypes, reduce ops or roots (also a send
    and its receive of different shapes);
(c) ``skipped_or_extra``: one rank's calls are the others' shifted by k (it skipped, or added,
    k calls), seen either ahead (its call at s is theirs at s+k) or behind (it left a repeated
    call site one iteration early or late); the report counts each rank's run of calls at that
    site (for a validation loop: its number of batches);
and when every rank agrees on everything recorded, at the frontier:
(e) ``dead_rank``: a rank died (heartbeat stopped) or exited while others wait, with its last
    record;
(f) ``unmatched_p2p``: a pending send whose receive was never posted (or the reverse);
(d) ``stuck``: every rank in the same collective with matching arguments and none completes
    (transport, network, or a straggler), or ranks waiting for one that has not arrived, with
    each rank's wait.

Pure functions of the dumps: the online reporter and the offline CLI share them.

Over 500 lines, one algorithm: each finding kind is one step of the same walk over the merged
groups (first divergence, dead ranks, unmatched P2P, stuck), and the report's text is formatted
from the findings at the end.
"""

from __future__ import annotations

import dataclasses
import enum
import linecache
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from reference_impls.distributed_debug.records import RankDump, RankState, Record, RecordsError

__all__ = ["Finding", "Kind", "Report", "analyze", "format_report", "rank_list"]

SHIFT_LOOKAHEAD = 4
"""How many calls ahead a skipped/extra collective is looked for (a loop body rarely has more)."""


class Kind(enum.StrEnum):
    """The class of a finding (the letters are the report's)."""

    OP_MISMATCH = "op_mismatch"
    ARGUMENT_MISMATCH = "argument_mismatch"
    SKIPPED_OR_EXTRA = "skipped_or_extra"
    STUCK = "stuck"
    DEAD_RANK = "dead_rank"
    UNMATCHED_P2P = "unmatched_p2p"
    NONE = "none"

    @property
    def letter(self) -> str:
        return {
            "op_mismatch": "a",
            "argument_mismatch": "b",
            "skipped_or_extra": "c",
            "stuck": "d",
            "dead_rank": "e",
            "unmatched_p2p": "f",
            "none": "-",
        }[self.value]


@dataclasses.dataclass
class Finding:
    kind: Kind
    summary: str
    """One paragraph that names the sequence number, the ranks and both call sites."""
    group: str | None = None
    seq: int | None = None
    ranks: list[int] = dataclasses.field(default_factory=list)
    """The odd ranks out (the ones that skipped, differ, died, or wait unmatched)."""
    others: list[int] = dataclasses.field(default_factory=list)
    callsites: dict[int, str] = dataclasses.field(default_factory=dict)
    """rank -> file:line (function) of its call at the divergence."""
    details: list[str] = dataclasses.field(default_factory=list)
    t_issue: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kind"] = str(self.kind)
        d["letter"] = self.kind.letter
        d["callsites"] = {str(k): v for k, v in self.callsites.items()}
        return d


@dataclasses.dataclass
class Report:
    run_id: str
    world_size: int
    reason: str
    findings: list[Finding]
    """Most telling first: the first divergence, else the frontier's explanation."""
    ranks: dict[int, str]
    """rank -> its state and where it is (waiting in what, since when)."""
    stall_began: float | None
    """time.time() of the oldest call still pending (or that raised) on a live rank: when the
    incident began."""
    reported_at: float | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def primary(self) -> Finding:
        return self.findings[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "world_size": self.world_size,
            "reason": self.reason,
            "findings": [f.to_json() for f in self.findings],
            "ranks": {str(k): v for k, v in self.ranks.items()},
            "stall_began": self.stall_began,
            "reported_at": self.reported_at,
            "notes": self.notes,
        }


def rank_list(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'; [3] -> 'rank 3'."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    parts, start = [], None
    for i, r in enumerate(rs):
        if start is None:
            start = r
        if i + 1 == len(rs) or rs[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return "ranks " + ", ".join(parts)


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _label(file: str, line: int) -> str:
    """The comment at the end of the call's source line, if the file is here to read."""
    text = linecache.getline(file, line)
    comments = [c.strip() for c in text.split("#")[1:]]
    # Tool pragmas (type: ignore, noqa) say nothing about what the call is for.
    words = [c for c in comments if c and not c.startswith(("type:", "noqa", "pragma"))]
    return words[0][:60] if words else ""


def _where(rec: Record) -> str:
    file, line, func = rec.callsite
    label = _label(file, line)
    return f"{_short(file)}:{line} ({func}{': ' + label if label else ''})"


def _group(name: str) -> str:
    # torch names the default group "0" and later groups "1", "2", ... in creation order.
    return "the default group" if name == "0" else f"process group {name!r}"


def _site(rec: Record) -> tuple[str, int, str]:
    # Ranks on different hosts may run the same code from different checkouts.
    file, line, func = rec.callsite
    return (os.path.basename(file), line, func)


def _key(rec: Record) -> tuple[Any, ...]:
    return (rec.signature(), _site(rec))


class _Group:
    """One process group's collective records, per member rank, by sequence number."""

    def __init__(self, name: str, members: list[int], dumps: dict[int, RankDump]) -> None:
        self.name = name
        self.members = members
        self.by_rank: dict[int, dict[int, Record]] = {}
        for r in members:
            d = dumps.get(r)
            recs = [] if d is None else [x for x in d.records if x.group == name and not x.p2p]
            self.by_rank[r] = {x.seq: x for x in recs}

    def rec(self, rank: int, seq: int) -> Record | None:
        return self.by_rank[rank].get(seq)

    def run_length(self, rank: int, seq: int, site: tuple[str, int, str]) -> int:
        """How many consecutive calls from ``site`` this rank made ending at ``seq``."""
        n = 0
        while (x := self.rec(rank, seq - n)) is not None and _site(x) == site:
            n += 1
        return n


def analyze(
    dumps: Sequence[RankDump], *, world_size: int | None = None, reason: str = ""
) -> Report:
    """The report for one run's dumps (one per rank; missing ranks count as unknown)."""
    if not dumps:
        raise RecordsError("no rank dumps to analyse")
    world = world_size if world_size is not None else dumps[0].world_size
    by_rank = {d.rank: d for d in dumps}
    groups: dict[str, list[int]] = {}
    for d in dumps:
        for name, ranks in d.groups.items():
            if name in groups and groups[name] != ranks:
                raise RecordsError(
                    f"rank {d.rank} says group {name!r} is ranks {ranks}, another rank says "
                    f"{groups[name]}: these dumps do not describe one job"
                )
            groups[name] = ranks
    notes: list[str] = []
    for d in dumps:
        if d.dropped and d.state in (RankState.ALIVE, RankState.EXITED):
            notes.append(f"rank {d.rank}: {d.dropped} older records fell out of its ring")
    findings: list[Finding] = []
    divergences = []
    for name in sorted(groups, key=lambda n: (len(n), n)):
        g = _Group(name, groups[name], by_rank)
        found = _first_divergence(g, by_rank, notes)
        if found is not None:
            divergences.append(found)
    divergences.sort(key=lambda f: f.t_issue)
    findings.extend(divergences)
    findings.extend(_dead_ranks(by_rank, world, groups))
    findings.extend(_unmatched_p2p(by_rank))
    if not findings:
        findings.extend(_stuck(groups, by_rank))
    if not findings:
        findings.append(
            Finding(Kind.NONE, "no divergence, dead rank, unmatched P2P or pending call found")
        )
    pending = [
        x.t_issue
        for d in dumps
        if d.state is RankState.ALIVE
        for x in d.records
        if x.t_done is None  # pending, or failed (a call that raised ends an incident too)
    ]
    return Report(
        run_id=dumps[0].run_id,
        world_size=world,
        reason=reason,
        findings=findings,
        ranks=_rank_lines(by_rank, world),
        stall_began=min(pending) if pending else None,
        notes=notes,
    )


def _first_divergence(g: _Group, dumps: dict[int, RankDump], notes: list[str]) -> Finding | None:
    # Compare from the oldest sequence number every rank that published its ring still holds;
    # a dead rank's few heartbeat records join the comparison where they exist.
    ring_starts: list[int] = []
    partial_starts: list[int] = []
    ends: list[int] = []
    for r in g.members:
        seqs = g.by_rank[r]
        d = dumps.get(r)
        if seqs and d is not None:
            whole = d.state in (RankState.ALIVE, RankState.EXITED)
            first = 0 if whole and not d.dropped else min(seqs)
            (ring_starts if whole else partial_starts).append(first)
            ends.append(max(seqs))
    if not ends:
        return None
    start, end = max(ring_starts or partial_starts), max(ends)
    # The sequence numbers some member recorded, not every integer in between: a dump whose
    # counter jumped (a long job, or an edited file: seq 10**15) would otherwise be a loop of
    # that many steps; a number no member holds is skipped below anyway.
    held = sorted({s for r in g.members for s in g.by_rank[r] if start <= s <= end})
    for s in held:
        present = {r: x for r in g.members if (x := g.rec(r, s)) is not None}
        if len(present) < 2:
            continue
        buckets: dict[tuple[Any, ...], list[int]] = {}
        for r, x in present.items():
            buckets.setdefault(_key(x), []).append(r)
        if len(buckets) == 1:
            continue
        finding = _classify(g, s, present, buckets)
        if finding is None:  # same op and arguments from different lines, nothing shifted
            lines = ", ".join(f"rank {r} at {_where(x)}" for r, x in sorted(present.items()))
            notes.append(f"group {g.name} seq {s}: same call from different lines ({lines})")
            continue
        return finding
    return None


def _classify(
    g: _Group, s: int, present: dict[int, Record], buckets: dict[tuple[Any, ...], list[int]]
) -> Finding | None:
    ordered = sorted(buckets.values(), key=lambda rs: (-len(rs), min(rs)))
    majority, odd = ordered[0], sorted(r for rs in ordered[1:] for r in rs)
    m0 = majority[0]
    m = present[m0]
    odd_groups = ordered[1:]
    rs = odd_groups[0]
    x = present[rs[0]]
    sites = {r: _where(present[r]) for r in present}
    t = min(v.t_issue for v in present.values())
    head = f"at sequence {s} on {_group(g.name)}"
    base: dict[str, Any] = {
        "group": g.name,
        "seq": s,
        "ranks": odd,
        "others": sorted(majority),
        "callsites": sites,
        "t_issue": t,
    }
    # (c) ahead: the odd rank's call at s is the majority's at s + k (it skipped k calls) ...
    # Every majority rank's records are read, not only the lowest's: that one may be stuck in
    # the call at s (holding nothing past it) while another got through it (a broadcast's
    # root does) and shows the skipped rank's call right after. Read alone, the stuck rank
    # would let the odd rank's own later records make the skip look like an extra call.
    for k in range(1, SHIFT_LOOKAHEAD + 1):
        for r in majority:
            ahead = g.rec(r, s + k)
            if ahead is not None and _key(ahead) == _key(x):
                witness = [r, *(o for o in majority if o != r)]
                return _skip(g, s, k, rs, witness, x, m, head, base, skipped=True)
        for r in rs:
            own = g.rec(r, s + k)
            if own is not None and _key(own) == _key(m):
                odd_first = [r, *(o for o in rs if o != r)]
                return _skip(g, s, k, odd_first, majority, x, m, head, base, skipped=False)
    # ... or behind: it left (or stayed in) a repeated call one iteration early (late).
    prev_odd, prev_maj = g.rec(rs[0], s - 1), g.rec(m0, s - 1)
    if prev_odd is not None and _key(prev_odd) == _key(m) and _site(x) != _site(m):
        return _skip(g, s, 1, rs, majority, x, m, head, base, skipped=True)
    if prev_maj is not None and _key(prev_maj) == _key(x) and _site(x) != _site(m):
        return _skip(g, s, 1, rs, majority, x, m, head, base, skipped=False)
    both = (
        f"{rank_list(rs)} called {x.describe()} at {_where(x)} while {rank_list(majority)} "
        f"called {m.describe()} at {_where(m)}"
    )
    if x.op != m.op:
        return Finding(Kind.OP_MISMATCH, f"(a) different collectives {head}: {both}.", **base)
    if x.signature() != m.signature():
        what = [
            name
            for name, a, b in (
                ("shapes", x.shapes, m.shapes),
                ("dtypes", x.dtypes, m.dtypes),
                ("reduce op", x.reduce_op, m.reduce_op),
                ("root", x.peer, m.peer),
            )
            if a != b
        ]
        return Finding(
            Kind.ARGUMENT_MISMATCH,
            f"(b) same collective, different {' and '.join(what)} {head}: {both}.",
            **base,
        )
    return None


def _skip(
    g: _Group,
    s: int,
    k: int,
    rs: list[int],
    majority: list[int],
    x: Record,
    m: Record,
    head: str,
    base: dict[str, Any],
    *,
    skipped: bool,
) -> Finding:
    who = rank_list(rs)
    if skipped:
        missing = [g.rec(majority[0], s + i) for i in range(k)]
        calls = "; ".join(
            f"seq {s + i}: {c.describe()} at {_where(c)}" for i, c in enumerate(missing) if c
        )
        summary = (
            f"(c) {who} skipped {k} collective{'s' if k > 1 else ''} {head}: {who} called "
            f"{x.op} at {_where(x)} while {rank_list(majority)} called {m.op} at {_where(m)}. "
            f"Missing on {who}: {calls}."
        )
        site = _site(m)
        n_odd = g.run_length(rs[0], s - 1, site)
        n_maj = g.run_length(majority[0], s + k - 1, site)
    else:
        extra = [g.rec(rs[0], s + i) for i in range(k)]
        calls = "; ".join(
            f"seq {s + i}: {c.describe()} at {_where(c)}" for i, c in enumerate(extra) if c
        )
        summary = (
            f"(c) {who} made {k} extra collective{'s' if k > 1 else ''} {head}: {who} called "
            f"{x.op} at {_where(x)} while {rank_list(majority)} called {m.op} at {_where(m)}. "
            f"Extra on {who}: {calls}."
        )
        site = _site(x)
        n_odd = g.run_length(rs[0], s + k - 1, site)
        n_maj = g.run_length(majority[0], s - 1, site)
    details = []
    if n_odd != n_maj and max(n_odd, n_maj) > 1:
        file, line, _ = site
        details.append(
            f"{file}:{line} ran {n_maj} times in a row on {rank_list(majority)} but {n_odd} "
            f"on {who}: "
            f"a loop with a different number of iterations on {who} (uneven data? see "
            "check_equal_steps and the even sampler)"
        )
        summary += (
            f" {who} ran {n_odd} iterations of the loop at {file}:{line}, "
            f"{rank_list(majority)} ran {n_maj}."
        )
    return Finding(Kind.SKIPPED_OR_EXTRA, summary, details=details, **base)


def _dead_ranks(
    dumps: dict[int, RankDump], world: int, groups: dict[str, list[int]]
) -> list[Finding]:
    waiting = [
        r
        for r, d in dumps.items()
        if d.state is RankState.ALIVE
        and any(x.t_done is None and x.error is None for x in d.records)
    ]
    failed = [r for r, d in dumps.items() if any(x.error for x in d.records[-3:])]
    if not waiting and not failed:
        return []
    out = []
    for r in range(world):
        d = dumps.get(r)
        if d is not None and d.state is RankState.ALIVE:
            continue
        if d is None:
            state = "never sent a heartbeat"
        elif d.state is RankState.EXITED:
            state = "its process ended or it stopped tracing"
        else:
            state = f"{d.reason or 'heartbeat stopped'}: killed or crashed"
        last = d.records[-1] if d is not None and d.records else None
        if d is not None and d.state is RankState.UNKNOWN:
            continue  # alive but silent: the frontier explains it
        lastline = (
            f"its last record: {'p2p' if last.p2p else 'seq'} {last.seq} {last.describe()} "
            f"at {_where(last)}, "
            f"{last.status}"
            if last is not None
            else "no record"
        )
        verb = "exited" if d is not None and d.state is RankState.EXITED else "died"
        # A rank whose own last call raised before it exited is in ``failed``; it is the one
        # that left, not one of those left waiting.
        left_waiting = [o for o in (waiting or failed) if o != r]
        during = f" while {rank_list(left_waiting)} waited" if left_waiting else ""
        summary = f"(e) rank {r} {verb} ({state}){during}; {lastline}."
        out.append(
            Finding(
                Kind.DEAD_RANK,
                summary,
                group=last.group if last else None,
                seq=last.seq if last else None,
                ranks=[r],
                others=sorted(o for o in waiting if o != r),
                callsites={r: _where(last)} if last else {},
                t_issue=last.t_issue if last else 0.0,
            )
        )
    return out


def _unmatched_p2p(dumps: dict[int, RankDump]) -> list[Finding]:
    out = []
    counts: dict[int, Counter[tuple[str, int, str, int]]] = {}
    by_key: dict[int, dict[tuple[str, int, str, int, int], Record]] = {}
    for r, d in dumps.items():
        c: Counter[tuple[str, int, str, int]] = Counter()
        keyed = {}
        for x in d.records:
            if x.p2p:
                direction = "send" if x.op in ("send", "isend") else "recv"
                k = (x.group, -1 if x.peer is None else x.peer, direction, x.tag)
                c[k] = max(c[k], x.seq + 1)
                keyed[(*k, x.seq)] = x
        counts[r], by_key[r] = c, keyed
    for r, d in sorted(dumps.items()):
        if d.state is not RankState.ALIVE:
            continue
        for x in d.records:
            if not x.p2p or x.t_done is not None or x.error is not None or x.peer is None:
                continue
            peer = dumps.get(x.peer)
            if peer is None or peer.state in (RankState.DEAD, RankState.UNKNOWN):
                continue  # a dead peer is its own finding
            sending = x.op in ("send", "isend")
            want = (x.group, r, "recv" if sending else "send", x.tag, x.seq)
            match = by_key[x.peer].get(want)
            if match is None and sending:  # a receive from any source also matches
                match = next(
                    (
                        y
                        for y in peer.records
                        if y.p2p
                        and y.peer is None
                        and y.op in ("recv", "irecv")
                        and y.t_done is None
                    ),
                    None,
                )
            where = _peer_position(peer)
            if match is None:
                verb = "receive" if sending else "send"
                n = counts[x.peer][(x.group, r, "recv" if sending else "send", x.tag)]
                summary = (
                    f"(f) unmatched point-to-point: rank {r} {x.op} #{x.seq} "
                    f"{'to' if sending else 'from'} rank "
                    f"{x.peer} (tag {x.tag}) at {_where(x)} has no matching {verb} on rank "
                    f"{x.peer}, "
                    f"which posted {n} such {verb}s and is {where}."
                )
                out.append(
                    Finding(
                        Kind.UNMATCHED_P2P,
                        summary,
                        group=x.group,
                        seq=x.seq,
                        ranks=[r],
                        others=[x.peer],
                        callsites={r: _where(x)},
                        t_issue=x.t_issue,
                    )
                )
            elif match.shapes != x.shapes or match.dtypes != x.dtypes:
                summary = (
                    f"(b) point-to-point size mismatch: rank {r} {x.describe()} at {_where(x)} "
                    "vs rank "
                    f"{x.peer} {match.describe()} at {_where(match)}."
                )
                out.append(
                    Finding(
                        Kind.ARGUMENT_MISMATCH,
                        summary,
                        group=x.group,
                        seq=x.seq,
                        ranks=[r, x.peer],
                        callsites={r: _where(x), x.peer: _where(match)},
                        t_issue=x.t_issue,
                    )
                )
    out.sort(key=lambda f: f.t_issue)
    return out[:1] + [
        f for f in out[1:] if f.kind is not Kind.UNMATCHED_P2P or f.ranks[0] not in out[0].others
    ]


def _peer_position(d: RankDump) -> str:
    pending = [x for x in d.records if x.t_done is None and x.error is None]
    if pending:
        x = pending[0]
        wait = d.published_at - x.t_issue
        return f"waiting {wait:.1f} s in {x.describe()} at {_where(x)}"
    if d.records:
        x = d.records[-1]
        if x.error is not None:
            return f"out of its last call, {x.op} at {_where(x)}, which raised {x.error[:160]}"
        ago = d.published_at - (x.t_done or x.t_issue)
        return f"not in any call (its last, {x.op} at {_where(x)}, ended {ago:.1f} s earlier)"
    return "not in any call"


def _stuck(groups: dict[str, list[int]], dumps: dict[int, RankDump]) -> list[Finding]:
    out = []
    for name, members in sorted(groups.items()):
        pend: dict[int, Record] = {}
        for r in members:
            d = dumps.get(r)
            if d is None:
                continue
            for x in d.records:
                if x.group == name and not x.p2p and x.t_done is None and x.error is None:
                    pend[r] = x
                    break
        if not pend:
            continue
        s = min(x.seq for x in pend.values())
        at_s = {r: x for r, x in pend.items() if x.seq == s}
        absent = [r for r in members if r not in at_s]
        waits = {r: dumps[r].published_at - x.t_issue for r, x in at_s.items()}
        wait_text = ", ".join(f"rank {r} {w:.1f} s" for r, w in sorted(waits.items()))
        x0 = next(iter(at_s.values()))
        head = f"at sequence {s} on {_group(name)}"
        if not absent:
            last = min(waits, key=lambda r: waits[r])
            summary = (
                f"(d) every rank is in {x0.describe()} {head} with matching arguments and it "
                "does not "
                "complete: a transport or network problem, or a rank that stalls inside it. "
                "Waits: "
                f"{wait_text}; rank {last} arrived last."
            )
            ranks = sorted(at_s)
        else:
            why = "; ".join(
                f"rank {r} is {_peer_position(dumps[r])}"
                if r in dumps
                else f"rank {r}: nothing known"
                for r in absent
            )
            summary = (
                f"(d) {rank_list(at_s)} {'waits' if len(at_s) == 1 else 'wait'} in {x0.describe()} "
                f"at {_where(x0)} {head} ({wait_text}) for {rank_list(absent)}, which "
                f"{'has' if len(absent) == 1 else 'have'} not issued it: {why}. A straggler, or a "
                "rank stuck outside collectives."
            )
            ranks = absent
        out.append(
            Finding(
                Kind.STUCK,
                summary,
                group=name,
                seq=s,
                ranks=ranks,
                others=sorted(at_s) if absent else [],
                callsites={r: _where(x) for r, x in at_s.items()},
                t_issue=min(x.t_issue for x in at_s.values()),
            )
        )
    out.sort(key=lambda f: f.t_issue)
    return out


def _rank_lines(dumps: dict[int, RankDump], world: int) -> dict[int, str]:
    lines = {}
    for r in range(world):
        d = dumps.get(r)
        if d is None:
            lines[r] = "nothing known (no records, no heartbeat)"
            continue
        lines[r] = f"{d.state}: {_peer_position(d)}"
    return lines


def format_report(report: Report) -> str:
    """The human-readable report (what goes to stderr and report.txt)."""
    out = [
        "=" * 78,
        f"distributed_debug report: run {report.run_id}, {report.world_size} ranks",
    ]
    if report.reason:
        out.append(f"trigger: {report.reason}")
    if report.stall_began is not None and report.reported_at is not None:
        out.append(
            f"reported {report.reported_at - report.stall_began:.2f} s after the oldest pending "
            "call was issued"
        )
    out.append("")
    out.append("FIRST DIVERGENCE" if report.primary.kind.letter in "abc" else "FINDING")
    out.append("  " + report.primary.summary)
    for line in report.primary.details:
        out.append("  " + line)
    if len(report.findings) > 1:
        out.append("")
        out.append("ALSO")
        for f in report.findings[1:]:
            out.append("  " + f.summary)
    out.append("")
    out.append("RANKS")
    for r, line in sorted(report.ranks.items()):
        out.append(f"  rank {r}: {line}")
    if report.notes:
        out.append("")
        out.append("NOTES")
        out.extend("  " + n for n in report.notes)
    out.append("=" * 78)
    return "\n".join(out)
