"""The REST client backend: the same methods as EmbeddedBackend, over HTTP (httpx).

Errors come back as the tracker's exceptions with the server's message: 400 TrackingError
(FilterError for a search), 401/403 PermissionDeniedError, 404 NotFoundError, 409
IntegrityError. Downloads are verified here too (sha256 and size from the response headers,
written to ``dest.part`` and renamed only when they match).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from reference_impls.tracking.artifacts import _verify_stream
from reference_impls.tracking.backend import check_artifact_name
from reference_impls.tracking.errors import (
    FilterError,
    IntegrityError,
    NotFoundError,
    PermissionDeniedError,
    TrackingError,
)
from reference_impls.tracking.lineage import Graph
from reference_impls.tracking.metadata import ArtifactRef, MetricPoint, RunInfo, RunStatus
from reference_impls.tracking.query import SearchPage

__all__ = ["RemoteBackend"]


def _run_info(d: dict[str, Any]) -> RunInfo:
    keys = RunInfo.__dataclass_fields__
    return RunInfo(**{k: v for k, v in d.items() if k in keys})


class RemoteBackend:
    def __init__(self, url: str, token: str, *, timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self.client.close()

    def _check(self, resp: httpx.Response, *, search: bool = False) -> Any:
        if resp.status_code < 400:
            return resp
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        if not isinstance(detail, str):
            detail = str(detail)
        cls: type[TrackingError] = {
            401: PermissionDeniedError,
            403: PermissionDeniedError,
            404: NotFoundError,
            409: IntegrityError,
        }.get(resp.status_code, FilterError if search else TrackingError)
        raise cls(f"{detail} (HTTP {resp.status_code} from {self.url})")

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        search = kw.pop("_search", False)
        return self._check(self.client.request(method, path, **kw), search=search).json()

    # runs ----------------------------------------------------------------------------
    def create_run(self, project: str, **kw: Any) -> str:
        body = {k: v for k, v in kw.items() if v is not None}
        return str(
            self._json("POST", f"/api/projects/{quote(project, safe='')}/runs", json=body)["id"]
        )

    def log_metrics(self, run_id: str, points: Sequence[MetricPoint]) -> int:
        body = {"points": [(p.key, p.step, p.value, p.ts) for p in points]}
        return int(self._json("POST", f"/api/runs/{run_id}/metrics", json=body)["written"])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._json("POST", f"/api/runs/{run_id}/tags", json={"tags": dict(tags)})

    def end_run(
        self, run_id: str, status: RunStatus | str, points: Sequence[MetricPoint] = ()
    ) -> None:
        body = {"status": str(status), "points": [(p.key, p.step, p.value, p.ts) for p in points]}
        self._json("POST", f"/api/runs/{run_id}/end", json=body)

    def get_run(self, run_id: str) -> RunInfo:
        return _run_info(self._json("GET", f"/api/runs/{run_id}"))

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float, float]]:
        pts = self._json("GET", f"/api/runs/{run_id}/metrics/{quote(key, safe='')}")["points"]
        return [tuple(p) for p in pts]

    def search(
        self,
        project: str,
        query: str = "",
        *,
        order_by: str | None = None,
        limit: int | None = None,
        page_token: str | None = None,
    ) -> SearchPage:
        params = {"q": query, "order_by": order_by, "limit": limit, "page_token": page_token}
        data = self._json(
            "GET",
            f"/api/projects/{quote(project, safe='')}/runs",
            params={k: v for k, v in params.items() if v is not None},
            _search=True,
        )
        return SearchPage(
            runs=[_run_info(r) for r in data["runs"]],
            next_page_token=data["next_page_token"],
            query=data["query"],
        )

    # artifacts -----------------------------------------------------------------------
    def log_artifact(
        self,
        run_id: str,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        kind: str = "file",
        promoted: bool = False,
    ) -> ArtifactRef:
        name = check_artifact_name(name or Path(path).name)
        with open(path, "rb") as f:
            data = self._json(
                "PUT",
                f"/api/runs/{run_id}/artifacts/{quote(name)}",
                params={"kind": kind, "promoted": str(promoted).lower()},
                content=f,
            )
        return ArtifactRef(**data)

    def artifacts(self, run_id: str) -> list[ArtifactRef]:
        return [
            ArtifactRef(**a)
            for a in self._json("GET", f"/api/runs/{run_id}/artifacts")["artifacts"]
        ]

    def download_artifact(self, run_id: str, name: str, dest: str | os.PathLike[str]) -> Path:
        check_artifact_name(name)
        with self.client.stream("GET", f"/api/runs/{run_id}/artifacts/{quote(name)}") as resp:
            if resp.status_code >= 400:
                resp.read()
                self._check(resp)
            sha = resp.headers["X-Artifact-SHA256"]
            size = int(resp.headers["X-Artifact-Size"])
            _verify_stream(
                resp.iter_bytes(1 << 20), Path(dest), sha, size, f"download of {run_id}/{name}"
            )
        return Path(dest)

    # lineage -------------------------------------------------------------------------
    def add_edges(self, edges: Iterable[tuple[str, str, str]]) -> None:
        self._json("POST", "/api/lineage/edges", json={"edges": [list(e) for e in edges]})

    def lineage(self, node: str, direction: str = "backward") -> Graph:
        d = self._json("GET", "/api/lineage", params={"node": node, "direction": direction})
        g = Graph(d["root"], d["direction"])
        g.nodes = {n.pop("id"): n for n in d["nodes"]}
        g.edges = [(e["src"], e["dst"], e["relation"]) for e in d["edges"]]
        return g
