"""The embedded backend: the metadata store, an artifact store and (optionally) a hot cache in
this process. The REST client (remote.py) offers the same methods over HTTP, so the client API
(client.py) works with either.

Logging an artifact: (1) the bytes are hashed and, before they become visible, an upload
intent is recorded; (2) the bytes are stored (or found already stored); (3) the reference is
committed and the intent dropped, in one transaction. A crash before (3) leaves bytes no
reference names (collected later), never a reference to missing bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reference_impls.tracking.artifacts import ArtifactStore, open_artifact_store
from reference_impls.tracking.cache import HotCache
from reference_impls.tracking.errors import ArtifactError
from reference_impls.tracking.lineage import Graph, lineage
from reference_impls.tracking.metadata import (
    ArtifactRef,
    MetadataStore,
    MetricPoint,
    RunInfo,
    RunStatus,
    check_artifact_kind,
    check_text,
)
from reference_impls.tracking.query import SearchPage, search_runs

__all__ = ["EmbeddedBackend", "check_artifact_name"]

MAX_NAME = 500


def check_artifact_name(name: str) -> str:
    """A relative POSIX path inside the run: no '..', no absolute path, no empty parts."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise ArtifactError(f"artifact name must be 1-{MAX_NAME} characters, got {name!r}")
    parts = name.split("/")
    if (
        name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ArtifactError(
            f"artifact name {name!r} must be a relative path like 'checkpoints/best.pt' "
            "without '.', '..', empty parts, backslashes or NUL"
        )
    return check_text(name, "artifact name")


class EmbeddedBackend:
    """Metadata in ``db`` (a path or URL), bytes in ``artifacts`` (a directory or s3:// URL)."""

    def __init__(
        self,
        db: str | os.PathLike[str] | MetadataStore,
        artifacts: str | os.PathLike[str] | ArtifactStore,
        *,
        cache: HotCache | None = None,
    ) -> None:
        self.meta = db if isinstance(db, MetadataStore) else MetadataStore(os.fspath(db))
        self.store: ArtifactStore = (
            open_artifact_store(artifacts)
            if isinstance(artifacts, str | os.PathLike)
            else artifacts
        )
        self.cache = cache

    def close(self) -> None:
        self.meta.close()

    # runs --------------------------------------------------------------------------------
    def create_run(self, project: str, **kw: Any) -> str:
        run_id = self.meta.create_run(project, **kw)
        if kw.get("git_commit"):
            self.meta.add_edges([(f"code:{kw['git_commit']}", f"run:{run_id}", "input")])
        return run_id

    def log_metrics(self, run_id: str, points: Sequence[MetricPoint]) -> int:
        return self.meta.log_metrics(run_id, points)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self.meta.set_tags(run_id, tags)

    def end_run(
        self, run_id: str, status: RunStatus | str, points: Sequence[MetricPoint] = ()
    ) -> None:
        """End the run; ``points`` (its last buffered metrics) are written in the same
        transaction."""
        self.meta.end_run(run_id, status, points)

    def get_run(self, run_id: str) -> RunInfo:
        return self.meta.get_run(run_id)

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float, float]]:
        return self.meta.metric_history(run_id, key)

    def search(
        self,
        project: str,
        query: str = "",
        *,
        order_by: str | None = None,
        limit: int | None = None,
        page_token: str | None = None,
    ) -> SearchPage:
        return search_runs(
            self.meta, project, query, order_by=order_by, limit=limit, page_token=page_token
        )

    # artifacts ---------------------------------------------------------------------------
    def log_artifact(
        self,
        run_id: str,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        kind: str = "file",
        promoted: bool = False,
        progress: Callable[[int], Any] | None = None,
    ) -> ArtifactRef:
        """Upload (or find) the bytes, then commit the reference (module docstring)."""
        name = check_artifact_name(name or Path(path).name)
        check_artifact_kind(kind)  # before the bytes are stored: a refused call stores nothing
        if not Path(path).is_file():
            raise ArtifactError(f"{path} is not a file; log_artifact takes one file")
        intent: list[int] = []
        sha, size, _new = self.store.put_file(
            path,
            before_commit=lambda sha: intent.append(self.meta.begin_upload(sha)),
            progress=progress,
        )
        ref = self.meta.add_artifact(
            run_id,
            name,
            sha256=sha,
            size=size,
            uri=self.store.uri(sha),
            kind=kind,
            promoted=promoted,
            upload_id=intent[0] if intent else None,
        )
        self.meta.add_edges([(f"run:{run_id}", f"artifact:{sha}", "output")])
        return ref

    def artifacts(self, run_id: str) -> list[ArtifactRef]:
        return self.meta.artifacts(run_id)

    def download_artifact(self, run_id: str, name: str, dest: str | os.PathLike[str]) -> Path:
        """Verified bytes of ``run_id``'s artifact ``name`` at ``dest`` (through the cache)."""
        ref = self.meta.artifact(run_id, check_artifact_name(name))
        dest = Path(dest)
        if self.cache is not None:
            self.cache.fetch(ref.sha256, ref.size, dest, self.store)
        else:
            self.store.get_to_file(ref.sha256, dest, ref.size)
        return dest

    # lineage -----------------------------------------------------------------------------
    def add_edges(self, edges: Iterable[tuple[str, str, str]]) -> None:
        self.meta.add_edges(edges)

    def lineage(
        self, node: str, direction: str = "backward", *, projects: Iterable[str] | None = None
    ) -> Graph:
        """The lineage graph; ``projects`` scopes it to what their members may see."""
        return lineage(
            self.meta,
            node,
            direction=direction,
            projects=None if projects is None else set(projects),
        )
