"""The analysis on hand-built per-rank records: each class (a)-(f), the frontier, bad input."""

from __future__ import annotations

import pytest

from reference_impls.distributed_debug.analysis import Kind, analyze, format_report, rank_list
from reference_impls.distributed_debug.records import RankDump, RankState, Record, RecordsError

T0 = 1_000_000.0


def rec(
    seq,
    op="all_reduce",
    shape=(4,),
    line=10,
    *,
    done=True,
    dtype="float32",
    redop="sum",
    peer=None,
    p2p=False,
    tag=0,
    t=None,
    group="0",
    error=None,
):
    t_issue = T0 + seq if t is None else t
    return Record(
        seq=seq,
        op=op,
        group=group,
        shapes=(shape,) if shape else (),
        dtypes=(dtype,) if shape else (),
        reduce_op=redop if op in ("all_reduce", "reduce") else None,
        peer=peer,
        callsite=("/job/train.py", line, "step"),
        t_issue=t_issue,
        t_done=t_issue + 0.001 if done else None,
        p2p=p2p,
        tag=tag,
        error=error,
    )


def dump(
    rank,
    records,
    world,
    *,
    state=RankState.ALIVE,
    published_at=T0 + 100,
    run_id="r1",
    dropped=0,
    groups=None,
):
    return RankDump(
        run_id=run_id,
        rank=rank,
        world_size=world,
        state=state,
        published_at=published_at,
        groups=groups or {"0": list(range(world))},
        records=records,
        dropped=dropped,
    )


def seq_of(*specs, pending_last=True):
    """Records for ops given as (op, line[, shape]); the last one pending."""
    out = []
    for i, spec in enumerate(specs):
        op, line, *shape = spec
        out.append(
            rec(
                i,
                op,
                shape[0] if shape else (4,),
                line,
                done=not (pending_last and i == len(specs) - 1),
            )
        )
    return out


def test_a_different_op_at_the_same_sequence_number_is_class_a():
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 11))
    r1 = seq_of(("all_reduce", 10), ("broadcast", 12))
    report = analyze([dump(0, r0, 2), dump(1, r1, 2)])
    f = report.primary
    assert (f.kind, f.seq, f.ranks, f.others) == (Kind.OP_MISMATCH, 1, [1], [0])
    assert "train.py:12" in f.callsites[1] and "train.py:11" in f.callsites[0]
    assert "(a)" in f.summary and "broadcast" in f.summary and "train.py:11" in f.summary


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"shape": (8,)}, "shapes"),
        ({"dtype": "float64"}, "dtypes"),
        ({"redop": "max"}, "reduce op"),
    ],
)
def test_b_same_op_with_different_arguments_is_class_b_naming_what_differs(change, word):
    r = [seq_of(("all_reduce", 10), ("all_reduce", 11)) for _ in range(3)]
    r[2][1] = rec(1, "all_reduce", line=11, done=False, **change)
    report = analyze([dump(i, r[i], 3) for i in range(3)])
    f = report.primary
    assert (f.kind, f.seq, f.ranks) == (Kind.ARGUMENT_MISMATCH, 1, [2])
    assert f"different {word}" in f.summary


def test_c_the_seed_scenario_names_rank_3_at_sequence_6_with_both_call_sites_and_batch_counts():
    # broadcast, 3 training all-reduces, then per-batch (line 85) x3 and epoch (line 87);
    # rank 3 has 2 batches, its epoch all-reduce paired with the others' third batch one.
    common = [("broadcast", 60), ("all_reduce", 64), ("all_reduce", 64), ("all_reduce", 64)]
    full = seq_of(
        *common, ("all_reduce", 85), ("all_reduce", 85), ("all_reduce", 85), ("all_reduce", 87)
    )
    short = seq_of(
        *common, ("all_reduce", 85), ("all_reduce", 85), ("all_reduce", 87), ("barrier", 103, None)
    )
    report = analyze([dump(r, full, 4) for r in range(3)] + [dump(3, short, 4)])
    f = report.primary
    assert (f.kind, f.seq, f.ranks, f.others) == (Kind.SKIPPED_OR_EXTRA, 6, [3], [0, 1, 2])
    assert "train.py:87" in f.callsites[3] and "train.py:85" in f.callsites[0]
    assert "rank 3 ran 2 iterations" in f.summary and "ranks 0-2 ran 3" in f.summary


def test_c_a_rank_leaving_a_loop_early_is_a_skip_even_without_a_later_call_to_align():
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 10), ("all_reduce", 10))
    r1 = seq_of(("all_reduce", 10), ("all_reduce", 10), ("barrier", 20, None))
    f = analyze([dump(0, r0, 2), dump(1, r1, 2)]).primary
    assert (f.kind, f.seq, f.ranks) == (Kind.SKIPPED_OR_EXTRA, 2, [1])
    assert "skipped 1" in f.summary


def test_c_an_extra_call_is_reported_as_extra():
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 11), ("all_reduce", 12))
    r1 = seq_of(("all_reduce", 10), ("all_reduce", 30), ("all_reduce", 11), ("all_reduce", 12))
    f = analyze([dump(0, r0, 3), dump(1, r0, 3), dump(2, r1, 3)]).primary
    assert (f.kind, f.seq, f.ranks) == (Kind.SKIPPED_OR_EXTRA, 1, [2])
    assert "extra" in f.summary and "train.py:30" in f.summary


def test_d_every_rank_in_the_same_call_that_never_completes_lists_each_wait():
    rs = [seq_of(("all_reduce", 10), ("all_reduce", 11)) for _ in range(2)]
    rs[1][1].t_issue += 0.5
    f = analyze([dump(0, rs[0], 2), dump(1, rs[1], 2)]).primary
    assert (f.kind, f.seq, f.ranks) == (Kind.STUCK, 1, [0, 1])
    assert "rank 0 99.0 s" in f.summary and "rank 1 98.5 s" in f.summary
    assert "rank 1 arrived last" in f.summary


def test_d_a_rank_that_never_arrives_is_named_as_the_straggler():
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 11))
    r1 = seq_of(("all_reduce", 10), pending_last=False)
    f = analyze([dump(0, r0, 2), dump(1, r1, 2)]).primary
    assert (f.kind, f.seq, f.ranks, f.others) == (Kind.STUCK, 1, [1], [0])
    assert "rank 1 is not in any call" in f.summary


def test_e_a_dead_rank_is_reported_with_its_last_record():
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 11))
    dead = dump(1, seq_of(("all_reduce", 10), ("all_reduce", 11)), 2, state=RankState.DEAD)
    dead.reason = "no heartbeat for 3.0 s"
    report = analyze([dump(0, r0, 2), dead])
    kinds = [f.kind for f in report.findings]
    assert kinds[0] is Kind.DEAD_RANK, format_report(report)
    f = report.primary
    assert f.ranks == [1] and f.seq == 1 and "train.py:11" in f.callsites[1]
    assert "no heartbeat for 3.0 s" in f.summary


def test_e_a_rank_missing_entirely_is_reported_dead_when_others_wait():
    report = analyze([dump(0, seq_of(("all_reduce", 10)), 2)])
    assert report.primary.kind is Kind.DEAD_RANK and report.primary.ranks == [1]
    assert "never sent a heartbeat" in report.primary.summary


def test_f_a_send_without_its_receive_is_unmatched_p2p():
    send = rec(0, "send", line=40, done=False, peer=1, p2p=True)
    r0 = [*seq_of(("all_reduce", 10), pending_last=False), send]
    r1 = seq_of(("all_reduce", 10), ("all_reduce", 41))
    f = analyze([dump(0, r0, 2), dump(1, r1, 2)]).primary
    assert (f.kind, f.ranks, f.others) == (Kind.UNMATCHED_P2P, [0], [1])
    assert "train.py:40" in f.summary and "posted 0 such receives" in f.summary
    assert "waiting" in f.summary and "train.py:41" in f.summary


def test_f_a_matched_send_and_receive_of_different_sizes_is_an_argument_mismatch():
    r0 = [rec(0, "send", (4,), 40, done=False, peer=1, p2p=True)]
    r1 = [rec(0, "recv", (8,), 41, done=False, peer=0, p2p=True)]
    f = analyze([dump(0, r0, 2), dump(1, r1, 2)]).primary
    assert f.kind is Kind.ARGUMENT_MISMATCH and "size mismatch" in f.summary


def test_a_healthy_run_reports_nothing():
    rs = seq_of(("all_reduce", 10), ("broadcast", 11), pending_last=False)
    report = analyze([dump(0, rs, 2), dump(1, rs, 2)])
    assert report.primary.kind is Kind.NONE and len(report.findings) == 1


def test_the_first_divergence_wins_over_a_later_one_and_over_the_frontier():
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 11), ("all_reduce", 12), ("all_reduce", 13))
    r1 = seq_of(("all_reduce", 10), ("all_reduce", 11, (8,)), ("broadcast", 12), ("all_reduce", 13))
    f = analyze([dump(0, r0, 2), dump(1, r1, 2)]).primary
    assert (f.kind, f.seq) == (Kind.ARGUMENT_MISMATCH, 1)


def test_rings_that_dropped_old_records_are_compared_from_the_oldest_common_sequence():
    long = seq_of(*[("all_reduce", 10)] * 10, ("all_reduce", 11))
    late = long[4:]
    late[-1] = rec(10, "broadcast", line=12, done=False)
    report = analyze([dump(0, long, 2), dump(1, late, 2, dropped=4)])
    assert (report.primary.kind, report.primary.seq) == (Kind.OP_MISMATCH, 10)
    assert "rank 1: 4 older records fell out of its ring" in report.notes


def test_same_call_from_different_lines_without_a_shift_is_only_a_note():
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 11), pending_last=False)
    r1 = seq_of(("all_reduce", 10), ("all_reduce", 21), pending_last=False)
    report = analyze([dump(0, r0, 2), dump(1, r1, 2)])
    assert report.primary.kind is Kind.NONE
    assert any("different lines" in n for n in report.notes)


def test_dumps_from_two_runs_are_refused_naming_both():
    from reference_impls.distributed_debug.records import check_same_run

    with pytest.raises(
        RecordsError, match=r"2 different runs .*run r1: ranks \[0\].*run r2: ranks \[1\]"
    ):
        check_same_run([dump(0, [], 2), dump(1, [], 2, run_id="r2")])


def test_dumps_that_disagree_on_a_groups_members_are_refused():
    with pytest.raises(RecordsError, match="group '0' is ranks"):
        analyze([dump(0, [], 2), dump(1, [], 2, groups={"0": [0, 2]})])


def test_rank_lists_read_as_ranges():
    assert rank_list([3]) == "rank 3"
    assert rank_list([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"


def test_a_dead_ranks_short_window_does_not_hide_an_earlier_divergence_of_the_others():
    r0 = seq_of(*[("all_reduce", 10 + i) for i in range(13)])  # 13 different lines
    r1 = list(r0)
    r1[2] = rec(2, "broadcast", line=40)  # ranks 0 and 1 diverge at seq 2
    dead = dump(2, r0[-3:], 3, state=RankState.DEAD)  # its heartbeat holds seqs 10-12 only
    report = analyze([dump(0, r0, 3), dump(1, r1, 3), dead])
    assert (report.primary.kind, report.primary.seq) == (Kind.OP_MISMATCH, 2)
    assert any(f.kind is Kind.DEAD_RANK and f.ranks == [2] for f in report.findings)


def test_c_a_skip_is_read_from_every_majority_rank_not_only_the_lowest():
    # Each step: broadcast (root 2) at line 11, all_reduce at line 12. Rank 1 swallowed an
    # exception and skipped step 1's broadcast: its all_reduce paired with the others'
    # broadcast and it went on to the next step's broadcast. Rank 0 is stuck in the broadcast
    # (nothing past it); rank 2, the root, got through it and its next call is rank 1's.
    def bc(seq, done=True):
        return rec(seq, "broadcast", line=11, peer=2, done=done)

    def ar(seq, done=True):
        return rec(seq, "all_reduce", line=12, done=done)

    r0 = [bc(0), ar(1), bc(2, done=False)]
    r1 = [bc(0), ar(1), ar(2), bc(3, done=False)]
    r2 = [bc(0), ar(1), bc(2), ar(3, done=False)]
    f = analyze([dump(0, r0, 3), dump(1, r1, 3), dump(2, r2, 3)]).primary
    assert (f.kind, f.seq, f.ranks, f.others) == (Kind.SKIPPED_OR_EXTRA, 2, [1], [0, 2])
    assert "rank 1 skipped 1 collective" in f.summary, f.summary
    assert "broadcast" in f.summary.split("Missing on rank 1:")[1]
    assert "extra" not in f.summary and not any("check_equal_steps" in d for d in f.details)


def test_e_a_rank_that_exits_with_an_error_is_not_also_named_as_waiting():
    # Rank 1's call raised and it exited; rank 0's pending call then raised too (its peer
    # closed the connection): neither is waiting, and rank 1 is the one that left.
    r0 = seq_of(("all_reduce", 10), ("all_reduce", 11))
    r0[1].error = "RuntimeError: Connection closed by peer"
    r1 = seq_of(("all_reduce", 10), ("all_reduce", 11))
    r1[1].error = "ValueError: bad batch"
    report = analyze([dump(0, r0, 2), dump(1, r1, 2, state=RankState.EXITED)])
    f = report.primary
    assert (f.kind, f.ranks) == (Kind.DEAD_RANK, [1]), format_report(report)
    assert "rank 1 exited" in f.summary and "while rank 1" not in f.summary, f.summary
    assert "while rank 0 waited" in f.summary and 1 not in f.others
