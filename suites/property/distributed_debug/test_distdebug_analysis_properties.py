"""The analysis on generated per-rank sequences: a common sequence of collectives (from a few
call sites, with loops), one rank's copy mutated (a skipped call, two calls swapped, a changed
shape, a changed op), then every rank's records cut where it would hang. Whatever the mutation,
the report's first divergence must be the first position where the ranks' calls differ (found
here by plain comparison) and, with 3 or more ranks, name the mutated rank."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reference_impls.distributed_debug.analysis import Kind, analyze
from reference_impls.distributed_debug.records import RankDump, RankState, Record

# (op, shape, line): a handful of call sites, as a training loop has.
CALLS = [
    ("all_reduce", (4,), 10),
    ("all_reduce", (4,), 11),
    ("all_reduce", (2,), 12),
    ("broadcast", (4,), 13),
    ("all_gather", (4,), 14),
    ("barrier", None, 15),
]

calls = st.sampled_from(CALLS)
# Loops: a call site repeated a few times, then another.
sequences = st.lists(st.tuples(calls, st.integers(1, 3)), min_size=3, max_size=12).map(
    lambda runs: [c for c, n in runs for _ in range(n)]
)


def _records(seq, pending_last=True):
    out = []
    for i, (op, shape, line) in enumerate(seq):
        out.append(
            Record(
                seq=i,
                op=op,
                group="0",
                shapes=(shape,) if shape else (),
                dtypes=("float32",) if shape else (),
                reduce_op="sum" if op == "all_reduce" else None,
                peer=0 if op == "broadcast" else None,
                callsite=("/job/loop.py", line, "step"),
                t_issue=1000.0 + i,
                t_done=None if pending_last and i == len(seq) - 1 else 1000.5 + i,
            )
        )
    return out


def _mutate(seq, kind, pos, replacement):
    seq = list(seq)
    if kind == "skip":
        del seq[pos]
    elif kind == "swap":
        seq[pos], seq[pos + 1] = seq[pos + 1], seq[pos]
    elif kind == "shape":
        op, shape, line = seq[pos]
        seq[pos] = (op, (7,) if shape != (7,) else (9,), line) if shape else (op, (7,), line)
    else:
        seq[pos] = replacement
    return seq


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


@settings(max_examples=150, deadline=None)
@given(
    common=sequences,
    world=st.integers(2, 4),
    data=st.data(),
    kind=st.sampled_from(["skip", "swap", "shape", "replace"]),
)
def test_the_first_divergence_and_the_odd_rank_are_found(common, world, data, kind):
    pos = data.draw(st.integers(0, len(common) - 2), label="pos")
    victim = data.draw(st.integers(0 if world > 2 else 1, world - 1), label="victim")
    replacement = data.draw(calls, label="replacement")
    mutated = _mutate(common, kind, pos, replacement)
    first = _first_difference(common, mutated)
    assume(first is not None)  # a swap of two equal calls changes nothing
    # The ranks pair calls up to the first difference and a little beyond (gloo pairs equal
    # sizes silently), then hang: each keeps its calls up to two past the difference.
    cut = first + 3
    dumps = [
        RankDump(
            run_id="prop",
            rank=r,
            world_size=world,
            state=RankState.ALIVE,
            published_at=2000.0,
            groups={"0": list(range(world))},
            records=_records((mutated if r == victim else common)[:cut]),
        )
        for r in range(world)
    ]
    report = analyze(dumps)
    f = report.primary
    if kind == "replace" and replacement[:2] == common[pos][:2]:
        # The same op and arguments from another line: gloo pairs the two calls, so they are
        # no mismatch. Either the calls around it show a shift (a skipped or extra call,
        # checked below like any other), or the report says so in a note and finds what
        # follows: every rank waiting in the same last call.
        assert f.kind in (Kind.SKIPPED_OR_EXTRA, Kind.STUCK), report.findings
        if f.kind is Kind.STUCK:
            note = f"group 0 seq {first}: same call from different lines"
            assert any(n.startswith(note) for n in report.notes), report.notes
            return
    assert f.kind in (Kind.OP_MISMATCH, Kind.ARGUMENT_MISMATCH, Kind.SKIPPED_OR_EXTRA), (
        report.findings
    )
    assert f.seq == first
    if world >= 3:
        assert f.ranks == [victim]
        assert f.others == [r for r in range(world) if r != victim]
    else:
        assert sorted([*f.ranks, *f.others]) == [0, 1]
    if kind == "skip":
        assert f.kind is Kind.SKIPPED_OR_EXTRA


@settings(max_examples=60, deadline=None)
@given(common=sequences, world=st.integers(2, 4))
def test_identical_sequences_never_report_a_divergence(common, world):
    dumps = [
        RankDump(
            run_id="prop",
            rank=r,
            world_size=world,
            state=RankState.ALIVE,
            published_at=2000.0,
            groups={"0": list(range(world))},
            records=_records(common, pending_last=False),
        )
        for r in range(world)
    ]
    assert analyze(dumps).primary.kind is Kind.NONE
