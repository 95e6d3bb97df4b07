"""Properties over generated inputs: the hot cache stays within its byte bound and serves
correct bytes under any access and pinning pattern; retention plans never touch promoted
artifacts or protected runs, and count as freed exactly the bytes no remaining reference
names."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impls.tracking.artifacts import LocalArtifactStore
from reference_impls.tracking.cache import HotCache
from reference_impls.tracking.metadata import ArtifactRef
from reference_impls.tracking.retention import RetentionPolicy, plan_retention

SIZES = [0, 1, 700, 1500, 3000, 5000]  # bytes; 5000 > the largest bound drawn below


@settings(max_examples=40, deadline=None)
@given(
    bound=st.integers(1000, 4500),
    ops=st.lists(
        st.tuples(st.sampled_from(["fetch", "pin", "unpin"]), st.integers(0, len(SIZES) - 1)),
        max_size=40,
    ),
)
def test_the_cache_never_exceeds_its_bound_and_always_serves_the_right_bytes(bound, ops):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = LocalArtifactStore(root / "store", fsync=False)
        objs = []
        for i, size in enumerate(SIZES):
            src = root / f"src{i}"
            src.write_bytes(bytes([i + 1]) * size)
            sha, n, _ = store.put_file(src)
            objs.append((sha, n, src.read_bytes()))
        cache = HotCache(root / "cache", max_bytes=bound)
        pins = [0] * len(SIZES)
        for op, i in ops:
            sha, size, data = objs[i]
            if op == "pin":
                cache.pin(sha)
                pins[i] += 1
            elif op == "unpin" and pins[i]:
                cache.unpin(sha)
                pins[i] -= 1
            elif op == "fetch":
                dest = root / "out"
                cache.fetch(sha, size, dest, store)
                assert dest.read_bytes() == data
            assert cache.disk_bytes() <= bound
            assert cache.stats().bytes_in_use <= bound
        stats = cache.stats()
        assert stats.hits + stats.misses == sum(op == "fetch" for op, _ in ops)


DAY = 86_400.0
NOW = 10_000 * DAY


@st.composite
def stores(draw):
    n_runs = draw(st.integers(1, 8))
    runs = [
        (f"r{i}", draw(st.sampled_from(["a", "b"])), NOW - draw(st.floats(0, 800)) * DAY, None)
        for i in range(n_runs)
    ]
    arts = []
    for rid, *_ in runs:
        for j in range(draw(st.integers(0, 4))):
            content = draw(st.integers(0, 5))  # few distinct contents: shared bytes are common
            arts.append(
                ArtifactRef(
                    rid,
                    f"f{j}.pt",
                    hashlib.sha256(bytes([content])).hexdigest(),
                    100 + content,
                    "u",
                    draw(st.sampled_from(["checkpoint", "file"])),
                    draw(st.booleans()),
                    draw(st.floats(0, 10)),
                )
            )
    policy = RetentionPolicy(
        keep_all_days=draw(st.floats(0, 100)),
        keep_last_runs=draw(st.integers(0, 3)),
        delete_after_days=draw(st.floats(100, 500)),
    )
    return runs, arts, policy


@settings(max_examples=200, deadline=None)
@given(stores())
def test_retention_never_deletes_what_it_must_keep_and_counts_freed_bytes_exactly(data):
    runs, arts, policy = data
    plan = plan_retention(runs, arts, policy, now=NOW)
    going = set(plan.artifacts)
    by_key = {(a.run_id, a.name): a for a in arts}
    assert all(not by_key[k].promoted for k in going)
    for rid, project, created, _ in runs:
        newest = sorted(
            (r for r in runs if r[1] == project), key=lambda r: (r[2], r[0]), reverse=True
        )
        protected = (NOW - created) / DAY < policy.keep_all_days or rid in {
            r[0] for r in newest[: policy.keep_last_runs]
        }
        mine = [a for a in arts if a.run_id == rid]
        if protected:
            assert not any((rid, a.name) in going for a in mine) and rid not in plan.runs
        if rid in plan.runs:
            assert all((rid, a.name) in going for a in mine)  # nothing of it is kept
        ckpts = [a for a in mine if a.kind == "checkpoint"]
        if (
            ckpts
            and not protected
            and rid not in plan.runs
            and (NOW - created) / DAY < policy.delete_after_days
        ):
            # A thinned run keeps its checkpoints that are promoted and at most one other.
            kept = [a for a in ckpts if (rid, a.name) not in going]
            assert len([a for a in kept if not a.promoted]) <= 1 and kept
    remaining = {a.sha256 for a in arts if (a.run_id, a.name) not in going}
    freed = {
        a.sha256: a.size for a in arts if (a.run_id, a.name) in going and a.sha256 not in remaining
    }
    assert plan.bytes_freed == sum(freed.values())
    assert plan.objects_freed == len(freed)
