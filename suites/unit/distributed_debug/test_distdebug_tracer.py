"""The tracer in one process on a 1-rank gloo group: what it records, bounds, bad input."""

from __future__ import annotations

import datetime as dt
import inspect
import time

import pytest
import torch
import torch.distributed as dist

from harness import assert_equal
from reference_impls.distributed_debug import TraceConfig, TracerError, trace_collectives
from reference_impls.distributed_debug import tracer as tracer_module


@pytest.fixture
def group(tmp_path):
    """A 1-rank gloo group on a fresh store, destroyed afterwards."""
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=dt.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield store
    tracer_module.uninstall(restore_functions=True)
    dist.destroy_process_group()


def _config(tmp_path, **kw):
    return TraceConfig(stall_s=30, report_dir=tmp_path, **kw)


def _line_of(marker: str) -> int:
    src, start = inspect.getsourcelines(
        test_every_op_is_recorded_with_shapes_dtypes_and_the_callers_line
    )
    return start + next(i for i, line in enumerate(src) if marker in line)


def test_every_op_is_recorded_with_shapes_dtypes_and_the_callers_line(group, tmp_path):
    x = torch.ones(3, 2)
    with trace_collectives(config=_config(tmp_path)) as tracer:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)  # marker-all-reduce
        dist.broadcast(x, src=0)
        out = torch.empty(3, 2)
        dist.all_gather_into_tensor(out, x)
        dist.reduce_scatter_tensor(torch.empty(3, 2), out)
        dist.all_gather([torch.empty(3, 2)], x)
        dist.all_to_all_single(torch.empty(4), torch.arange(4.0))
        dist.gather(torch.ones(2, dtype=torch.int64), [torch.empty(2, dtype=torch.int64)], dst=0)
        dist.barrier()
        work = dist.all_reduce(x, async_op=True)  # marker-async
        work.wait()
        objs = [None]
        dist.all_gather_object(objs, {"a": 1})  # marker-object
    records, dropped = tracer.snapshot()
    ops = [r.op for r in records]
    assert ops[:8] == [
        "all_reduce",
        "broadcast",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_gather",
        "all_to_all_single",
        "gather",
        "barrier",
    ]
    assert [r.seq for r in records] == list(range(len(records))) and dropped == 0
    first = records[0]
    assert first.shapes == ((3, 2),) and first.dtypes == ("float32",) and first.reduce_op == "max"
    assert first.callsite == (
        __file__,
        _line_of("marker-all-reduce"),
        inspect.currentframe().f_code.co_name,
    )
    assert records[1].peer == 0  # broadcast's root
    assert records[6].dtypes == ("int64",)
    # torch's all_gather_object calls all_gather twice: both are the user's line.
    assert [r.callsite[1] for r in records[9:]] == [_line_of("marker-object")] * 2
    assert all(r.t_done is not None and r.t_done >= r.t_issue for r in records[:8])


def test_an_async_call_completes_when_its_work_does(group, tmp_path):
    with trace_collectives(config=_config(tmp_path, tick_s=0.05)) as tracer:
        work = dist.all_reduce(torch.ones(4), async_op=True)
        work.wait()
        deadline = time.monotonic() + 10  # the watchdog polls every 0.05 s
        while tracer.snapshot()[0][-1].t_done is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tracer.snapshot()[0][-1].t_done is not None
        assert tracer.oldest_pending() is None


def test_the_ring_keeps_only_the_newest_records(group, tmp_path):
    with trace_collectives(config=_config(tmp_path, ring_size=8)) as tracer:
        for _ in range(20):
            dist.all_reduce(torch.ones(1))
    records, dropped = tracer.snapshot()
    assert [r.seq for r in records] == list(range(12, 20)) and dropped == 12


def test_calls_outside_the_block_are_not_recorded_and_results_are_unchanged(group, tmp_path):
    plain = torch.arange(6.0)
    dist.all_reduce(plain)
    with trace_collectives(config=_config(tmp_path)) as tracer:
        traced = torch.arange(6.0)
        dist.all_reduce(traced)
    dist.all_reduce(torch.ones(1))
    assert_equal(plain, traced, bitwise=True)
    assert len(tracer.snapshot()[0]) == 1


def test_the_tracer_publishes_heartbeats_and_full_records_through_the_store(group, tmp_path):
    with trace_collectives(config=_config(tmp_path)) as tracer:
        dist.all_reduce(torch.ones(2))
    store = dist.PrefixStore(tracer.watchdog.prefix, group)
    from reference_impls.distributed_debug.records import parse_dump

    final = parse_dump(store.get("records/0"), "records/0")
    assert final.state == "exited" and [r.op for r in final.records] == ["all_reduce"]
    assert parse_dump(store.get("hb/0"), "hb/0").rank == 0


def test_each_tracing_session_publishes_under_keys_of_its_own(group, tmp_path):
    with trace_collectives(config=_config(tmp_path)) as first:
        dist.all_reduce(torch.ones(2))
    with trace_collectives(config=_config(tmp_path)) as second:
        pass
    assert first.watchdog.run_id == second.watchdog.run_id  # one job, one store
    assert first.watchdog.prefix != second.watchdog.prefix
    store = dist.PrefixStore(second.watchdog.prefix, group)
    from reference_impls.distributed_debug.records import parse_dump

    # The second session's final records hold its own (no) calls, not the first one's.
    assert parse_dump(store.get("records/0"), "records/0").records == []


def test_a_second_tracer_in_the_same_process_is_refused(group, tmp_path):
    with (
        trace_collectives(config=_config(tmp_path)),
        pytest.raises(TracerError, match="already active"),
        trace_collectives(config=_config(tmp_path)),
    ):
        pass


def test_tracing_a_group_this_process_never_initialized_is_a_clear_error(tmp_path):
    assert not dist.is_initialized()
    with (
        pytest.raises(TracerError, match="not initialized: call dist.init_process_group"),
        trace_collectives(config=_config(tmp_path)),
    ):
        pass


def test_an_unreachable_store_is_a_clear_error_naming_it(group, tmp_path):
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=dt.timedelta(seconds=5))
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=dt.timedelta(seconds=2))
    port = server.port
    del server  # the store's host goes away
    time.sleep(0.2)
    with (
        pytest.raises(TracerError, match=rf"store at 127.0.0.1:{port} is unreachable"),
        trace_collectives(config=_config(tmp_path, store_timeout_s=2), store=client),
    ):
        pass
    assert tracer_module.active_tracer() is None


def test_a_group_filter_traces_that_group_only_with_its_own_sequence(group, tmp_path):
    sub = dist.new_group([0])
    with trace_collectives(sub, config=_config(tmp_path)) as tracer:
        dist.all_reduce(torch.ones(2))  # the default group: not traced
        dist.all_reduce(torch.ones(3), group=sub)
        dist.broadcast(torch.ones(3), src=0, group=sub)
    records, _ = tracer.snapshot()
    assert [(r.op, r.group, r.seq) for r in records] == [
        ("all_reduce", sub.group_name, 0),
        ("broadcast", sub.group_name, 1),
    ]
    assert sub.group_name != "0"
    assert tracer.dump().groups == {sub.group_name: [0]}
