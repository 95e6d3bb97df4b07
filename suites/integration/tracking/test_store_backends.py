"""The same behaviour on every backend: SQLite + local files, PostgreSQL + local files,
SQLite + SeaweedFS S3 (the ``backend`` fixture). Real databases, a real S3 server."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from reference_impls.tracking.artifacts import LocalArtifactStore
from reference_impls.tracking.errors import ArtifactError, FilterError, TrackingError
from reference_impls.tracking.metadata import MetricPoint
from reference_impls.tracking.query import matches, parse
from reference_impls.tracking.retention import (
    RetentionPolicy,
    apply_plan,
    collect,
    plan_for_store,
)
from reference_impls.tracking.schema import Metric, Param, Run

DAY = 86_400.0


def _points(key, steps, value=lambda s: s * 0.5):
    return [MetricPoint(key, s, float(value(s)), 1000.0 + s) for s in steps]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _count(backend, table) -> int:
    with backend.meta.engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(table)))


def test_numeric_params_compare_as_numbers_not_as_text(backend):
    ids = {
        lr: backend.create_run("p", params={"lr": lr, "opt": "adam"}) for lr in (9e-4, 0.002, 10)
    }
    found = {r.params["lr"] for r in backend.search("p", "params.lr > 0.001").runs}
    # As text, '9e-4' > '0.001' would match too.
    assert found == {0.002, 10}
    run = backend.get_run(ids[10])
    assert run.params == {"lr": 10, "opt": "adam"}
    assert isinstance(run.params["lr"], int)
    assert {r.id for r in backend.search("p", "params.opt = 'adam'").runs} == set(ids.values())
    # A number never equals a text, and a missing param satisfies no comparison.
    assert backend.search("p", "params.opt = 1 or params.missing != 3").runs == []


def test_metric_batches_sent_twice_are_stored_once_and_latest_follows_the_highest_step(backend):
    rid = backend.create_run("p")
    batch = _points("loss", range(0, 500))
    backend.log_metrics(rid, batch)
    backend.log_metrics(rid, batch)  # a client retrying after a lost answer
    backend.log_metrics(rid, _points("loss", [10], value=lambda s: 99.0))  # late, older step
    history = backend.metric_history(rid, "loss")
    assert [s for s, _, _ in history] == list(range(500))
    assert history[10][1] == 99.0  # a re-logged step replaces its value
    assert backend.get_run(rid).metrics == {"loss": 499 * 0.5}
    assert _count(backend, Metric) == 500


def test_a_runs_last_points_are_written_with_its_end_in_one_transaction(backend):
    rid = backend.create_run("p", params={"lr": 0.1}, tags={"team": "nlp"})
    backend.log_metrics(rid, _points("loss", range(3)))
    backend.end_run(rid, "finished", _points("loss", [3, 4]) + _points("acc", [4]))
    run = backend.get_run(rid)
    assert run.status == "finished" and run.ended_at is not None
    assert [s for s, _, _ in backend.metric_history(rid, "loss")] == [0, 1, 2, 3, 4]
    assert run.metrics == {"loss": 4 * 0.5, "acc": 4 * 0.5}
    assert run.params == {"lr": 0.1} and run.tags == {"team": "nlp"}
    # A bad last point fails the whole end: the run stays running and nothing is written.
    other = backend.create_run("p")
    with pytest.raises(TrackingError, match="only finite"):
        backend.end_run(other, "finished", [MetricPoint("loss", 9, math.nan, 0.0)])
    assert backend.get_run(other).status == "running"
    assert backend.metric_history(other, "loss") == []


def test_search_filters_orders_and_pages_like_the_python_oracle(backend, seed):
    rng = np.random.default_rng(seed)
    now = time.time()
    for i in range(50):
        # The first four match whatever the seed draws, so the expected page is never empty.
        lr = float(10 ** rng.uniform(-3.5, -2.5)) if i < 4 else float(10 ** rng.uniform(-5, -1))
        rid = backend.create_run(
            "p",
            name=f"r{i:02d}",
            params={"lr": lr, "layers": int(rng.integers(1, 5))},
            tags={"team": "nlp" if i < 4 else str(rng.choice(["nlp", "cv"]))},
            created_at=now - float(rng.uniform(0, 29 if i < 4 else 60)) * DAY,
        )
        acc = float(rng.uniform(0.35, 1) if i < 4 else rng.uniform(0, 1))
        backend.log_metrics(rid, [MetricPoint("acc", 0, acc, now)])
    backend.create_run("other", params={"lr": 1e-3})  # another project never shows up
    text = (
        "metrics.acc > 0.3 and params.lr between 1e-4 and 1e-2 and tags.team = 'nlp' "
        "and created > -30d"
    )
    every = [r for r in backend.meta.get_runs(_all_ids(backend)) if r.project == "p"]
    expected = sorted(
        (r for r in every if matches(parse(text).where, r, now)),
        key=lambda r: (-r.metrics["acc"], r.id),
    )
    assert expected, "the seeded data should match a few runs"
    pages, token = [], None
    while True:
        page = backend.search("p", text, order_by="metrics.acc desc", limit=3, page_token=token)
        pages.append([r.id for r in page.runs])
        token = page.next_page_token
        if token is None:
            break
    assert [i for p in pages for i in p] == [r.id for r in expected]
    assert all(len(p) == 3 for p in pages[:-1])
    first = backend.search("p", text, order_by="metrics.acc desc", limit=1)
    assert first.next_page_token is not None
    with pytest.raises(FilterError, match="different query"):
        backend.search("p", "metrics.acc > 0.9", limit=1, page_token=first.next_page_token)
    with pytest.raises(FilterError, match="not one this server gave out"):
        backend.search("p", text, page_token="garbage!")


def _all_ids(backend) -> list[str]:
    with backend.meta.engine.connect() as conn:
        return list(conn.scalars(select(Run.id)))


def test_injection_attempts_are_compared_as_values_and_change_nothing(backend):
    evil = "x'; DROP TABLE runs; --"
    rid = backend.create_run("p", tags={"note": evil}, params={"name": "a' OR '1'='1"})
    backend.create_run("p", tags={"note": "plain"})
    quoted = evil.replace("'", "''")
    assert [r.id for r in backend.search("p", f"tags.note = '{quoted}'").runs] == [rid]
    assert backend.search("p", "params.name = 'a'' OR ''1''=''1'").runs[0].id == rid
    with pytest.raises(FilterError, match="expected a field"):
        backend.search("p", "tags.note = 'x' or '1'='1'")  # a value is not a field
    for attack in (
        "tags.note = '' OR 1=1 --'",
        "metrics.a > 0 UNION SELECT * FROM users",
        "params.`lr` > 0",
        'tags.note = "x"',
        "metrics.a > 0/*",
    ):
        try:
            page = backend.search("p", attack)
        except FilterError:
            continue
        assert page.runs == [], attack  # parsed as a plain comparison that matches nothing
    assert _count(backend, Run) == 2


def test_lineage_forward_and_backward_with_json_and_dot(backend, tmp_path):
    train = backend.create_run("p", name="train", git_commit="c0ffee")
    backend.add_edges([("dataset:mnist@3", f"run:{train}", "input")])
    ckpt = backend.log_artifact(train, _write(tmp_path / "c.pt", b"weights"), "best.pt")
    finetune = backend.create_run("p", name="finetune")
    backend.add_edges(
        [
            (f"artifact:{ckpt.sha256}", f"run:{finetune}", "input"),
            ("dataset:extra@1", f"run:{finetune}", "input"),
        ]
    )
    model = backend.log_artifact(finetune, _write(tmp_path / "m.pt", b"model"), "model.pt")
    unrelated = backend.create_run("p", name="unrelated")
    backend.add_edges([("dataset:mnist@2", f"run:{unrelated}", "input")])
    # A cycle must not make the recursive query run forever.
    backend.add_edges([(f"artifact:{model.sha256}", "dataset:mnist@3", "derived")])

    fwd = backend.lineage("dataset:extra@1", "forward")
    assert set(fwd.nodes) >= {f"run:{finetune}", f"artifact:{model.sha256}"}
    assert f"run:{train}" in fwd.nodes  # through the cycle: model -> mnist@3 -> train
    back = backend.lineage(f"artifact:{model.sha256}", "backward")
    assert set(back.nodes) >= {
        "dataset:mnist@3",
        "dataset:extra@1",
        "code:c0ffee",
        f"artifact:{ckpt.sha256}",
        f"run:{train}",
        f"run:{finetune}",
    }
    assert f"run:{unrelated}" not in back.nodes and "dataset:mnist@2" not in back.nodes
    d = back.to_dict()
    assert {"src": "code:c0ffee", "dst": f"run:{train}", "relation": "input"} in d["edges"]
    dot = back.to_dot()
    assert dot.startswith("digraph lineage {") and f'"code:c0ffee" -> "run:{train}"' in dot
    with pytest.raises(TrackingError, match="invalid lineage node"):
        backend.lineage('run:x" -> "y', "backward")


def test_the_same_bytes_are_stored_once_and_downloads_are_verified(backend, tmp_path):
    data = np.random.default_rng(0).bytes(6 * 1024 * 1024 + 123)  # multipart on S3 (5 MiB parts)
    src = _write(tmp_path / "w.bin", data)
    refs = [
        backend.log_artifact(backend.create_run("p"), src, "w.bin", kind="checkpoint")
        for _ in range(3)
    ]
    assert len({r.sha256 for r in refs}) == 1
    assert [o.sha256 for o in backend.store.list_objects()] == [refs[0].sha256]
    out = backend.download_artifact(refs[1].run_id, "w.bin", tmp_path / "out" / "w.bin")
    assert out.read_bytes() == data
    # Damage the stored object: the download fails and leaves no file behind.
    _damage(backend.store, refs[0].sha256, data)
    with pytest.raises(ArtifactError, match="damaged"):
        backend.download_artifact(refs[2].run_id, "w.bin", tmp_path / "bad.bin")
    assert not (tmp_path / "bad.bin").exists()
    assert not list(tmp_path.glob(".bad.bin*"))
    with pytest.raises(TrackingError, match="already has an artifact named"):
        backend.log_artifact(refs[0].run_id, src, "w.bin")
    with pytest.raises(ArtifactError, match="relative path"):
        backend.log_artifact(refs[0].run_id, src, "../escape.bin")


def _damage(store, sha, data: bytes) -> None:
    bad = bytes([data[0] ^ 1]) + data[1:]
    if isinstance(store, LocalArtifactStore):
        store.path(sha).write_bytes(bad)
    else:
        store.client.put_object(Bucket=store.bucket, Key=store.key(sha), Body=bad)


def test_collection_deletes_orphans_and_never_bytes_another_run_references(backend, tmp_path):
    shared = _write(tmp_path / "shared", b"shared" * 1000)
    only = _write(tmp_path / "only", b"only" * 1000)
    orphan = _write(tmp_path / "orphan", b"orphan" * 1000)
    doomed = backend.create_run("p")
    keeper = backend.create_run("p")
    a = backend.log_artifact(doomed, shared, "s")
    b = backend.log_artifact(doomed, only, "o")
    backend.log_artifact(keeper, shared, "s")
    orphan_sha = backend.store.put_file(orphan)[0]  # bytes no reference names
    backend.meta.soft_delete(run_ids=[doomed])
    # Soft-deleted rows still hold their bytes: undo is possible until collection.
    dry = collect(
        backend.meta, backend.store, soft_delete_grace_s=0, upload_grace_s=0, dry_run=True
    )
    assert sorted(s for s, _ in dry.orphans) == sorted([orphan_sha, b.sha256])
    assert backend.store.exists(orphan_sha)  # a dry run changes nothing
    report = collect(backend.meta, backend.store, soft_delete_grace_s=0, upload_grace_s=0)
    assert sorted(s for s, _ in report.orphans) == sorted([orphan_sha, b.sha256])
    assert report.bytes_freed == dry.bytes_freed == 6000 + 4000
    assert backend.store.exists(a.sha256)  # still referenced by keeper
    assert not backend.store.exists(b.sha256) and not backend.store.exists(orphan_sha)
    assert (
        backend.download_artifact(keeper, "s", tmp_path / "k").read_bytes() == shared.read_bytes()
    )
    with pytest.raises(TrackingError, match="no run with id"):
        backend.get_run(doomed)


def test_retention_frees_what_its_dry_run_reported(backend, tmp_path):
    now = time.time()
    policy = RetentionPolicy(keep_all_days=7, keep_last_runs=1, delete_after_days=90)
    sizes = {}
    runs = {}
    for name, age in (("new", 1), ("mid", 30), ("old", 200), ("old_promoted", 300)):
        rid = backend.create_run("p", name=name, created_at=now - age * DAY)
        runs[name] = rid
        for step in (1, 2, 3):
            data = f"{name}-ckpt-{step}".encode() * 100
            ref = backend.log_artifact(
                rid, _write(tmp_path / "f", data), f"step{step}.pt", kind="checkpoint"
            )
            sizes[(rid, ref.name)] = ref.size
    backend.meta.set_promoted(runs["old_promoted"], "step3.pt")
    plan = plan_for_store(backend.meta, policy, now=now)
    assert plan.runs == [runs["old"]]
    expected = sorted(
        [(runs["mid"], "step1.pt"), (runs["mid"], "step2.pt")]
        + [(runs["old"], f"step{s}.pt") for s in (1, 2, 3)]
        + [(runs["old_promoted"], f"step{s}.pt") for s in (1, 2)]
    )
    assert plan.artifacts == expected
    assert plan.bytes_freed == sum(sizes[k] for k in expected)
    before = {o.sha256: o.size for o in backend.store.list_objects()}
    apply_plan(backend.meta, plan)
    collect(backend.meta, backend.store, soft_delete_grace_s=0, upload_grace_s=0)
    after = {o.sha256: o.size for o in backend.store.list_objects()}
    assert sum(before.values()) - sum(after.values()) == plan.bytes_freed
    assert [a.name for a in backend.meta.artifacts(runs["old_promoted"])] == ["step3.pt"]
    assert [a.name for a in backend.meta.artifacts(runs["new"])] == [
        "step1.pt",
        "step2.pt",
        "step3.pt",
    ]


BAD_INPUT = [
    (lambda b, r: b.log_metrics(r, [MetricPoint("loss", 1, math.nan, 0.0)]), "only finite"),
    (lambda b, r: b.log_metrics(r, [MetricPoint("loss", 1, math.inf, 0.0)]), "only finite"),
    (lambda b, r: b.log_metrics(r, [MetricPoint("bad key!", 1, 1.0, 0.0)]), "invalid metric"),
    (lambda b, r: b.log_metrics(r, [MetricPoint("loss", -1, 1.0, 0.0)]), "step must be"),
    (lambda b, r: b.log_metrics(r, [MetricPoint("loss", 2**40, 1.0, 0.0)]), "step must be"),
    (lambda b, r: b.create_run("p", params={"seed": 2**60}), "larger than 2**53"),
    (lambda b, r: b.create_run("p", params={"lr": math.nan}), "not a finite number"),
    (lambda b, r: b.create_run("p", params={"notes": "x" * 20_000}), "characters long"),
    (lambda b, r: b.create_run("p", params={"obj": [1, 2]}), "type list"),
    (lambda b, r: b.create_run("bad project!"), "invalid project name"),
    (lambda b, r: b.set_tags(r, {"t": 3}), "must be a string"),
    (lambda b, r: b.end_run(r, "exploded"), "exploded"),
    (lambda b, r: b.log_metrics("0" * 32, [MetricPoint("loss", 1, 1.0, 0.0)]), "no run with id"),
    (lambda b, r: b.end_run("0" * 32, "finished", _points("loss", [1])), "no run with id"),
    (lambda b, r: b.end_run(r, "finished", [MetricPoint("loss", 2, math.inf, 0.0)]), "only finite"),
]


def test_bad_input_is_refused_with_a_clear_error_and_writes_nothing(backend):
    rid = backend.create_run("p", params={"lr": 0.1})
    backend.log_metrics(rid, [MetricPoint("loss", 0, 1.0, 0.0)])
    for n, (call, fragment) in enumerate(BAD_INPUT):
        with pytest.raises((TrackingError, ValueError)) as info:
            call(backend, rid)
        assert fragment in str(info.value), (n, str(info.value))
    assert (
        _count(backend, Run) == 1 and _count(backend, Param) == 1 and _count(backend, Metric) == 1
    )
