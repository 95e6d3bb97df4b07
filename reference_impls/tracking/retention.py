"""Retention: tiered policies, a dry-run plan with the bytes it frees, soft delete, collection.

Tiers, decided per run from its age (now - created):

1. *keep everything*: runs younger than ``keep_all_days``, and the newest ``keep_last_runs``
   runs of each project whatever their age;
2. *final checkpoint only*: other runs younger than ``delete_after_days`` lose every
   artifact of a checkpoint kind except their final one (the newest; ties by name); other
   artifacts stay;
3. *deleted*: older runs lose every artifact, and the run itself goes unless it holds a
   promoted artifact.

Promoted artifacts are never deleted. :func:`plan_retention` is a pure function of the runs,
their artifacts and global reference counts; "bytes freed" counts an object only when every
reference to it (in any run of any project, soft-deleted ones included) is deleted by the
plan, because collection never deletes bytes that another reference still names.

Applying a plan soft-deletes (rows get ``deleted_at``; :meth:`MetadataStore.restore` undoes
it). :func:`collect` later purges rows soft-deleted longer than the grace period, then deletes
objects no row references (and partial uploads) once they are older than the upload grace.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reference_impls.tracking.metadata import ArtifactRef, MetadataStore

__all__ = ["GcReport", "RetentionPlan", "RetentionPolicy", "collect", "plan_retention"]

DAY = 86_400.0


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    keep_all_days: float = 30.0
    """Runs younger than this keep everything."""
    keep_last_runs: int = 20
    """The newest runs of each project that keep everything regardless of age."""
    delete_after_days: float = 365.0
    """Runs older than this are deleted (promoted artifacts and their runs stay)."""
    checkpoint_kinds: tuple[str, ...] = ("checkpoint",)
    """Artifact kinds that tier 2 thins to the final one per run."""

    def __post_init__(self) -> None:
        if not self.keep_all_days >= 0:
            raise ValueError(f"keep_all_days must be >= 0, got {self.keep_all_days}")
        if not isinstance(self.keep_last_runs, int) or self.keep_last_runs < 0:
            raise ValueError(f"keep_last_runs must be an integer >= 0, got {self.keep_last_runs}")
        if not self.delete_after_days >= self.keep_all_days:
            raise ValueError(
                f"delete_after_days ({self.delete_after_days}) must be >= keep_all_days "
                f"({self.keep_all_days}): a run cannot be deleted before it may be thinned"
            )
        if not self.checkpoint_kinds:
            raise ValueError("checkpoint_kinds must name at least one artifact kind")


@dataclass
class RetentionPlan:
    runs: list[str] = field(default_factory=list)
    artifacts: list[tuple[str, str]] = field(default_factory=list)  # (run id, name)
    bytes_freed: int = 0
    objects_freed: int = 0
    tiers: dict[str, int] = field(default_factory=dict)  # run counts per tier

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs_deleted": len(self.runs),
            "artifacts_deleted": len(self.artifacts),
            "bytes_freed": self.bytes_freed,
            "objects_freed": self.objects_freed,
            "tiers": self.tiers,
            "runs": self.runs,
            "artifacts": [list(a) for a in self.artifacts],
        }


def plan_retention(
    runs: Sequence[tuple[str, str, float, float | None]],
    artifacts: Sequence[ArtifactRef],
    policy: RetentionPolicy,
    *,
    now: float,
    ref_counts: Mapping[str, int] | None = None,
) -> RetentionPlan:
    """Decide what goes. ``runs``: (id, project, created_at, deleted_at); ``artifacts``: the
    live references of those runs; ``ref_counts``: sha256 -> references in the whole store
    (defaults to those in ``artifacts``, i.e. a store holding only these runs)."""
    live = [r for r in runs if r[3] is None]
    by_project: dict[str, list[tuple[str, str, float, float | None]]] = defaultdict(list)
    for r in live:
        by_project[r[1]].append(r)
    newest: set[str] = set()
    for rs in by_project.values():
        rs.sort(key=lambda r: (r[2], r[0]), reverse=True)
        newest.update(r[0] for r in rs[: policy.keep_last_runs])
    arts: dict[str, list[ArtifactRef]] = defaultdict(list)
    for a in artifacts:
        if a.deleted_at is None:
            arts[a.run_id].append(a)
    plan = RetentionPlan(tiers={"keep": 0, "final_checkpoint": 0, "delete": 0})
    doomed: list[ArtifactRef] = []
    for rid, _project, created, _deleted in sorted(live):
        age_days = (now - created) / DAY
        mine = arts.get(rid, [])
        if rid in newest or age_days < policy.keep_all_days:
            plan.tiers["keep"] += 1
            continue
        if age_days < policy.delete_after_days:
            plan.tiers["final_checkpoint"] += 1
            ckpts = [a for a in mine if a.kind in policy.checkpoint_kinds]
            if ckpts:
                final = max(ckpts, key=lambda a: (a.created_at, a.name))
                doomed += [a for a in ckpts if a is not final and not a.promoted]
            continue
        plan.tiers["delete"] += 1
        doomed += [a for a in mine if not a.promoted]
        if not any(a.promoted for a in mine):
            plan.runs.append(rid)
    plan.artifacts = sorted((a.run_id, a.name) for a in doomed)
    counts = ref_counts if ref_counts is not None else _counts(artifacts)
    going: dict[str, int] = defaultdict(int)
    sizes: dict[str, int] = {}
    for a in doomed:
        going[a.sha256] += 1
        sizes[a.sha256] = a.size
    freed = [sha for sha, n in going.items() if n >= counts.get(sha, 0)]
    plan.objects_freed = len(freed)
    plan.bytes_freed = sum(sizes[s] for s in freed)
    return plan


def _counts(artifacts: Iterable[ArtifactRef]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for a in artifacts:
        out[a.sha256] += 1
    return out


def plan_for_store(
    meta: MetadataStore,
    policy: RetentionPolicy,
    *,
    project: str | None = None,
    now: float | None = None,
) -> RetentionPlan:
    runs, arts = meta.retention_inputs(project)
    return plan_retention(
        runs,
        arts,
        policy,
        now=time.time() if now is None else now,
        ref_counts=meta.all_live_hash_counts(),
    )


def apply_plan(meta: MetadataStore, plan: RetentionPlan) -> None:
    """Soft-delete what the plan names (undo with MetadataStore.restore until collection)."""
    meta.soft_delete(run_ids=plan.runs, artifacts=plan.artifacts)


@dataclass
class GcReport:
    dry_run: bool
    rows_purged: int = 0
    runs_purged: int = 0
    partial_uploads: int = 0
    orphans: list[tuple[str, int]] = field(default_factory=list)

    @property
    def bytes_freed(self) -> int:
        return sum(size for _, size in self.orphans)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "artifact_rows_purged": self.rows_purged,
            "runs_purged": self.runs_purged,
            "partial_uploads_removed": self.partial_uploads,
            "objects_deleted": len(self.orphans),
            "bytes_freed": self.bytes_freed,
            "objects": [{"sha256": s, "size": n} for s, n in self.orphans],
        }


def collect(
    meta: MetadataStore,
    store: Any,
    *,
    soft_delete_grace_s: float = 7 * DAY,
    upload_grace_s: float = 3600.0,
    dry_run: bool = False,
    now: float | None = None,
) -> GcReport:
    """Purge rows soft-deleted over ``soft_delete_grace_s`` ago, then delete objects that no
    row references and that are older than ``upload_grace_s`` (uploads in flight are younger
    or hold an upload intent). With ``dry_run`` nothing changes; the report says what would."""
    for name, value in (
        ("soft_delete_grace_s", soft_delete_grace_s),
        ("upload_grace_s", upload_grace_s),
    ):
        # A negative grace puts the cutoff in the future: every soft-deleted row and every
        # upload still in flight would be collected at once (NaN: comparisons all false).
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    now = time.time() if now is None else now
    report = GcReport(dry_run=dry_run)
    if not dry_run:
        report.rows_purged, report.runs_purged = meta.purge_deleted(
            older_than=now - soft_delete_grace_s
        )
        meta.expire_uploads(upload_grace_s=upload_grace_s)
        report.partial_uploads = store.cleanup_partials(upload_grace_s)
        referenced = meta.referenced_hashes(upload_grace_s=upload_grace_s)
    else:
        referenced = _referenced_after_purge(meta, now - soft_delete_grace_s, upload_grace_s)
    cutoff = now - upload_grace_s
    for obj in store.list_objects():
        if obj.sha256 not in referenced and obj.mtime <= cutoff:
            report.orphans.append((obj.sha256, obj.size))
    if not dry_run:
        # Re-read the references right before deleting: a reference committed since the
        # listing keeps its bytes.
        again = meta.referenced_hashes(upload_grace_s=upload_grace_s)
        report.orphans = [(s, n) for s, n in report.orphans if s not in again]
        for sha, _ in report.orphans:
            store.delete(sha)
    return report


def _referenced_after_purge(
    meta: MetadataStore, older_than: float, upload_grace_s: float
) -> set[str]:
    from sqlalchemy import or_, select

    from reference_impls.tracking.schema import Artifact

    with meta.read_engine.connect() as conn:
        kept = set(
            conn.scalars(
                select(Artifact.sha256)
                .where(or_(Artifact.deleted_at.is_(None), Artifact.deleted_at >= older_than))
                .distinct()
            )
        )
    return kept | (meta.referenced_hashes(upload_grace_s=upload_grace_s) - _all_hashes(meta))


def _all_hashes(meta: MetadataStore) -> set[str]:
    return set(meta.all_live_hash_counts())
