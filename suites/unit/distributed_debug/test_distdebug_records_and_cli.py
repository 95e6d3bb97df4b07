"""Dumps on disk: round trip, every kind of bad file, and the offline ``analyze`` command."""

from __future__ import annotations

import json

import pytest

from reference_impls.distributed_debug.__main__ import main
from reference_impls.distributed_debug.config import TraceConfig, TracerError
from reference_impls.distributed_debug.records import (
    FORMAT_VERSION,
    RankDump,
    RankState,
    Record,
    RecordsError,
    load_dumps,
    parse_dump,
)


def _dump(rank, world=2, *, run_id="run-a", pending_op=None):
    recs = [
        Record(
            seq=0,
            op="all_reduce",
            group="0",
            shapes=((4, 2),),
            dtypes=("float32",),
            reduce_op="sum",
            peer=None,
            callsite=("/job/train.py", 10, "step"),
            t_issue=1000.0,
            t_done=1000.5,
        ),
    ]
    if pending_op:
        recs.append(
            Record(
                seq=1,
                op=pending_op,
                group="0",
                shapes=((4,),),
                dtypes=("float32",),
                reduce_op=None,
                peer=0,
                callsite=("/job/train.py", 11, "step"),
                t_issue=1001.0,
            )
        )
    return RankDump(
        run_id=run_id,
        rank=rank,
        world_size=world,
        state=RankState.ALIVE,
        published_at=1010.0,
        groups={"0": list(range(world))},
        records=recs,
    )


def test_a_dump_survives_json_exactly():
    d = _dump(1, pending_op="broadcast")
    back = parse_dump(d.dumps(), "test")
    assert back.to_json() == d.to_json()
    assert back.records[1].status == "pending" and back.records[0].status == "done"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (
            lambda text: text.replace(f'"format":{FORMAT_VERSION}', '"format":99'),
            "record format 99",
        ),
        (lambda text: text.replace('"op":"all_reduce",', ""), "malformed record"),
        (lambda text: text.replace('"rank":1,', '"rank":5,'), "rank 5 outside world size 2"),
        (lambda text: "[1, 2]", "expected a JSON object"),
    ],
    ids=["truncated", "other-version", "missing-field", "bad-rank", "not-an-object"],
)
def test_bad_dumps_raise_a_records_error_naming_the_source(mutate, message):
    text = _dump(1).dumps()
    with pytest.raises(RecordsError, match=message) as info:
        parse_dump(mutate(text), "/runs/x/rank1.json")
    assert "/runs/x/rank1.json" in str(info.value)


def test_analyze_prints_the_report_and_exits_1_when_it_finds_a_problem(tmp_path, capsys):
    (tmp_path / "rank0.json").write_text(_dump(0, pending_op="all_reduce").dumps())
    (tmp_path / "rank1.json").write_text(_dump(1, pending_op="broadcast").dumps())
    assert main(["analyze", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "(a) different collectives at sequence 1" in out and "train.py:11" in out


def test_analyze_exits_0_on_a_healthy_run_and_writes_json_on_request(tmp_path, capsys):
    for r in range(2):
        (tmp_path / f"rank{r}.json").write_text(_dump(r).dumps())
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["findings"][0]["kind"] == "none"


def test_analyze_exits_2_on_a_truncated_dump_and_says_which(tmp_path, capsys):
    (tmp_path / "rank0.json").write_text(_dump(0).dumps())
    (tmp_path / "rank1.json").write_text(_dump(1).dumps()[:50])
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "rank1.json" in err and "truncated" in err


def test_analyze_exits_2_on_dumps_of_different_runs(tmp_path, capsys):
    (tmp_path / "rank0.json").write_text(_dump(0).dumps())
    (tmp_path / "rank1.json").write_text(_dump(1, run_id="run-b").dumps())
    assert main(["analyze", str(tmp_path)]) == 2
    assert "2 different runs" in capsys.readouterr().err


def test_analyze_on_an_empty_or_missing_directory_says_what_it_expected(tmp_path):
    with pytest.raises(RecordsError, match="holds no rank"):
        load_dumps(tmp_path)
    with pytest.raises(RecordsError, match="not a directory"):
        load_dumps(tmp_path / "nope")


def test_the_command_line_has_help_for_both_commands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "analyze" in out and "demo" in out


def test_demo_outside_torchrun_explains_how_to_launch_it(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    assert main(["demo"]) == 2
    assert "torchrun --nproc-per-node 4" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ring_size": 2}, "ring_size must be an int >= 8"),
        ({"stall_s": 0}, "stall_s must be > 0"),
        ({"heartbeat_s": 2.0, "dead_after_s": 1.0}, "dead_after_s .* must exceed heartbeat_s"),
        ({"tick_s": -1.0}, "tick_s must be None or > 0"),
    ],
)
def test_bad_config_is_refused_with_the_value(kwargs, message):
    with pytest.raises(TracerError, match=message):
        TraceConfig(**kwargs)


def test_the_stall_threshold_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("DISTDEBUG_STALL_S", "2.5")
    assert TraceConfig().stall_s == 2.5
    monkeypatch.setenv("DISTDEBUG_STALL_S", "soon")
    with pytest.raises(
        TracerError, match="DISTDEBUG_STALL_S must be a number of seconds, got 'soon'"
    ):
        TraceConfig()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--scenario", "nope"], "unknown scenario 'nope'; known: seed,"),
        (["demo", "--scenario", "skipped", "--fix", "pad"], "--fix applies to the seed scenario"),
    ],
)
def test_demo_refuses_bad_arguments_before_joining_a_group(monkeypatch, capsys, argv, message):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ('"world_size":2', '"world_size":10000000000', "world size 10000000000 is past"),
        ('"published_at":1010.0', '"published_at":NaN', "a time of nan s"),
        ('"t_issue":1000.0', '"t_issue":Infinity', "a time of inf s"),
    ],
)
def test_dumps_whose_numbers_no_job_has_are_refused(field, value, message):
    # A world size of 10**10 made the report loop over 10**10 ranks (a hang, not an error).
    text = _dump(1).dumps().replace(" ", "")
    assert field in text
    with pytest.raises(RecordsError, match=message):
        parse_dump(text.replace(field, value), "/runs/x/rank1.json")


def test_a_jump_in_sequence_numbers_is_not_walked_one_number_at_a_time(monkeypatch):
    from reference_impls.distributed_debug import analysis

    calls = 0
    rec = analysis._Group.rec

    def counting(self, rank, seq):
        nonlocal calls
        calls += 1
        return rec(self, rank, seq)

    monkeypatch.setattr(analysis._Group, "rec", counting)
    a, b = _dump(0), _dump(1, pending_op="broadcast")
    b.records[1].seq = 10**6  # the counter jumped (or the file was edited)
    report = analysis.analyze([a, b])
    assert report.findings
    assert calls < 1_000  # one visit per recorded number, not per integer in the gap
