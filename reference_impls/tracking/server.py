"""The REST server (FastAPI + uvicorn): the embedded backend behind users, tokens and roles.

Every ``/api`` request carries ``Authorization: Bearer <token>``. The permission each route
needs is named in its decorator's ``summary`` and checked against the project of the run it
touches (access.py: see < download < write < manage). A run in a project the caller may not
see answers 404, as if it did not exist; an artifact download without the download
permission answers 403. Bad input answers 400 with a message that names the value and the
fix; a missing or wrong token 401.

``GET /`` is the web page (web/index.html, no external resources: it works offline): a runs
table with a filter box, a metric chart drawn as inline SVG, and the lineage of one run.

    app = create_app(EmbeddedBackend("runs.db", "artifacts/"))
    serve(app, host="127.0.0.1", port=0)   # or: python -m reference_impls.tracking server
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from reference_impls.tracking.access import Access, Permission, UserInfo
from reference_impls.tracking.backend import EmbeddedBackend, check_artifact_name
from reference_impls.tracking.errors import (
    IntegrityError,
    NotFoundError,
    PermissionDeniedError,
    TrackingError,
)
from reference_impls.tracking.metadata import ArtifactRef, MetricPoint

__all__ = ["ServerThread", "create_app", "serve"]

WEB = Path(__file__).with_name("web") / "index.html"
MAX_BATCH = 100_000  # metric points per request
UPLOAD_CHUNK = 1 << 20


class RunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    git_commit: str | None = None
    environment: dict[str, Any] | None = None
    created_at: float | None = None


class MetricsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    points: list[tuple[str, int, float, float]]  # (key, step, value, ts)


class TagsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tags: dict[str, str]


class EndIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: str
    points: list[tuple[str, int, float, float]] = []  # the run's last points, same transaction


class EdgesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    edges: list[tuple[str, str, str]]


def _public(ref: ArtifactRef) -> dict[str, Any]:
    """An artifact reference as clients see it: ``uri`` is where the server serves the bytes,
    not where it stores them (a ``file://`` path or bucket key is the server's layout)."""
    out = ref.to_dict()
    out["uri"] = f"/api/runs/{ref.run_id}/artifacts/{quote(ref.name)}"
    return out


def _printable(value: Any) -> Any:
    """``value``, or its ASCII escape when it is text that UTF-8 cannot encode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return ascii(value)[1:-1]
    return value


class _Unauthorized(Exception):
    pass


def _current_user(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> UserInfo:
    token = None
    if authorization and authorization.lower().startswith("bearer "):
        token = authorization[7:].strip()
    try:
        return request.app.state.access.authenticate(token)
    except PermissionDeniedError as exc:
        raise _Unauthorized(str(exc)) from None


CurrentUser = Annotated[UserInfo, Depends(_current_user)]


def create_app(backend: EmbeddedBackend) -> FastAPI:
    app = FastAPI(title="tracking", docs_url="/api/docs", openapi_url="/api/openapi.json")
    access = Access(backend.meta)
    app.state.access = access
    meta = backend.meta

    @app.exception_handler(TrackingError)
    def _tracking_error(_request: Request, exc: TrackingError) -> JSONResponse:
        code = 400
        if isinstance(exc, NotFoundError):
            code = 404
        elif isinstance(exc, PermissionDeniedError):
            code = 403
        elif isinstance(exc, IntegrityError):
            code = 409
        return JSONResponse({"detail": str(exc)}, status_code=code)

    @app.exception_handler(RequestValidationError)
    def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad input back; a lone surrogate in it (valid in
        # JSON as "\\udcff") cannot be encoded as UTF-8, and the 422 became a 500. The field's
        # location and the reason are what the caller needs; both are made printable.
        detail = [
            {
                "loc": [_printable(p) for p in e.get("loc", ())],
                "msg": _printable(e.get("msg", "")),
                "type": _printable(e.get("type", "")),
            }
            for e in exc.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(_Unauthorized)
    def _unauthorized(_request: Request, exc: _Unauthorized) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )

    def run_project(u: UserInfo, run_id: str, perm: Permission) -> str:
        try:
            project = meta.run_project(run_id)
        except NotFoundError:
            raise NotFoundError(f"no run with id {run_id!r}") from None
        if not access.allowed(u, project, Permission.SEE):
            raise NotFoundError(f"no run with id {run_id!r}")  # existence is not revealed
        access.require(u, project, perm)
        return project

    def project_exists(u: UserInfo, project: str, perm: Permission) -> None:
        if project not in meta.projects():
            if u.is_admin and perm is Permission.WRITE:
                return  # an admin's first run creates the project
            raise NotFoundError(f"no project named {project!r}")
        if not access.allowed(u, project, Permission.SEE):
            raise NotFoundError(f"no project named {project!r}")
        access.require(u, project, perm)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(WEB.read_text(encoding="utf-8"))

    @app.get("/api/whoami", summary="any valid token")
    def whoami(u: CurrentUser) -> dict[str, Any]:
        return {"name": u.name, "admin": u.is_admin, "projects": access.visible_projects(u)}

    @app.get("/api/projects", summary="see")
    def projects(u: CurrentUser) -> dict[str, Any]:
        return {"projects": access.visible_projects(u)}

    @app.get("/api/projects/{project}/runs", summary="see")
    def search(
        project: str,
        u: CurrentUser,
        q: str = "",
        order_by: str | None = None,
        limit: int | None = None,
        page_token: str | None = None,
    ) -> dict[str, Any]:
        project_exists(u, project, Permission.SEE)
        page = backend.search(project, q, order_by=order_by, limit=limit, page_token=page_token)
        return page.to_dict()

    @app.post("/api/projects/{project}/runs", summary="write")
    def create_run(project: str, body: RunIn, u: CurrentUser) -> dict[str, Any]:
        project_exists(u, project, Permission.WRITE)
        tags = dict(body.tags)
        tags.setdefault("created_by", u.name)
        run_id = backend.create_run(
            project,
            name=body.name,
            params=body.params,
            tags=tags,
            git_commit=body.git_commit,
            environment=body.environment,
            created_at=body.created_at,
        )
        return {"id": run_id}

    @app.get("/api/runs/{run_id}", summary="see")
    def get_run(run_id: str, u: CurrentUser) -> dict[str, Any]:
        run_project(u, run_id, Permission.SEE)
        info = backend.get_run(run_id).to_dict()
        info["metric_keys"] = meta.metric_keys(run_id)
        info["artifacts"] = [_public(a) for a in backend.artifacts(run_id)]
        return info

    @app.post("/api/runs/{run_id}/metrics", summary="write")
    def log_metrics(run_id: str, body: MetricsIn, u: CurrentUser) -> dict[str, Any]:
        run_project(u, run_id, Permission.WRITE)
        if len(body.points) > MAX_BATCH:
            raise TrackingError(
                f"{len(body.points)} points in one request; the limit is {MAX_BATCH}"
            )
        pts = [MetricPoint(k, s, v, t) for k, s, v, t in body.points]
        return {"written": backend.log_metrics(run_id, pts)}

    @app.get("/api/runs/{run_id}/metrics/{key}", summary="see")
    def metric(run_id: str, key: str, u: CurrentUser) -> dict[str, Any]:
        run_project(u, run_id, Permission.SEE)
        return {"key": key, "points": backend.metric_history(run_id, key)}

    @app.post("/api/runs/{run_id}/tags", summary="write")
    def set_tags(run_id: str, body: TagsIn, u: CurrentUser) -> dict[str, Any]:
        run_project(u, run_id, Permission.WRITE)
        backend.set_tags(run_id, body.tags)
        return {"ok": True}

    @app.post("/api/runs/{run_id}/end", summary="write")
    def end_run(run_id: str, body: EndIn, u: CurrentUser) -> dict[str, Any]:
        run_project(u, run_id, Permission.WRITE)
        if len(body.points) > MAX_BATCH:
            raise TrackingError(
                f"{len(body.points)} points in one request; the limit is {MAX_BATCH}"
            )
        backend.end_run(
            run_id, body.status, [MetricPoint(k, s, v, t) for k, s, v, t in body.points]
        )
        return {"ok": True}

    @app.get("/api/runs/{run_id}/artifacts", summary="see")
    def list_artifacts(run_id: str, u: CurrentUser) -> dict[str, Any]:
        run_project(u, run_id, Permission.SEE)
        return {"artifacts": [_public(a) for a in backend.artifacts(run_id)]}

    @app.put("/api/runs/{run_id}/artifacts/{name:path}", summary="write")
    async def put_artifact(
        run_id: str,
        name: str,
        request: Request,
        u: CurrentUser,
        kind: str = "file",
        promoted: bool = False,
    ) -> dict[str, Any]:
        from starlette.concurrency import run_in_threadpool

        check_artifact_name(name)
        await run_in_threadpool(run_project, u, run_id, Permission.WRITE)
        fd, tmp = tempfile.mkstemp(prefix="upload-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in request.stream():
                    out.write(chunk)
            ref = await run_in_threadpool(
                backend.log_artifact, run_id, tmp, name, kind=kind, promoted=promoted
            )
        finally:
            os.unlink(tmp)
        return _public(ref)

    @app.get("/api/runs/{run_id}/artifacts/{name:path}", summary="download")
    def get_artifact(run_id: str, name: str, u: CurrentUser) -> FileResponse:
        check_artifact_name(name)
        run_project(u, run_id, Permission.DOWNLOAD)
        ref = meta.artifact(run_id, name)
        fd, tmp = tempfile.mkstemp(prefix="download-")
        os.close(fd)
        try:
            backend.download_artifact(run_id, name, tmp)
        except BaseException:
            os.unlink(tmp)
            raise
        return FileResponse(
            tmp,
            media_type="application/octet-stream",
            filename=name.rsplit("/", 1)[-1],
            headers={"X-Artifact-SHA256": ref.sha256, "X-Artifact-Size": str(ref.size)},
            background=BackgroundTask(os.unlink, tmp),
        )

    @app.post("/api/lineage/edges", summary="write")
    def add_edges(body: EdgesIn, u: CurrentUser) -> dict[str, Any]:
        for src, dst, _rel in body.edges:
            runs = [n[4:] for n in (src, dst) if n.startswith("run:")]
            if not runs:
                raise TrackingError(
                    f"edge {src} -> {dst}: every edge sent to the server must touch a run the "
                    "caller may write"
                )
            for r in runs:
                run_project(u, r, Permission.WRITE)
        backend.add_edges(body.edges)
        return {"added": len(body.edges)}

    @app.get("/api/lineage", summary="see")
    def get_lineage(
        node: str, u: CurrentUser, direction: str = "backward", format: str = "json"
    ) -> Any:
        if format not in ("json", "dot"):
            raise TrackingError(f"format must be json or dot, got {format!r}")
        scope = None if u.is_admin else access.visible_projects(u)
        graph = backend.lineage(node, direction, projects=scope)
        if format == "dot":
            return PlainTextResponse(graph.to_dot(), media_type="text/vnd.graphviz")
        return graph.to_dict()

    return app


_SECRET_QUERY = re.compile(r"(?i)((?:^|[?&;])(?:access_)?token=)[^&;#\s]*")


class _RedactTokens(logging.Filter):
    """Blanks ``token=`` values in uvicorn's access log lines. The server refuses tokens in
    the URL, but a refused request is still logged, and a log file outlives the token's
    secrecy (it is copied, shipped and read by people without access)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _SECRET_QUERY.sub(r"\1[redacted]", a) if isinstance(a, str) else a
                for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _SECRET_QUERY.sub(r"\1[redacted]", record.msg)
        return True


def redact_access_log() -> None:
    """Install the filter on uvicorn's access logger (once; call after uvicorn configured
    logging, which it does when a ``uvicorn.Config`` is made)."""
    log = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _RedactTokens) for f in log.filters):
        log.addFilter(_RedactTokens())


def serve(app: FastAPI, host: str, port: int, *, log_level: str = "info") -> None:
    """Serve ``app`` in this thread until interrupted, with tokens kept out of the log."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level)
    redact_access_log()
    uvicorn.Server(config).run()


class ServerThread:
    """uvicorn serving ``app`` on a socket bound here (port 0 = a free port), in a thread."""

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level=log_level, lifespan="off")
        redact_access_log()
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        import time

        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise TrackingError(f"the tracking server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serving(backend: EmbeddedBackend, port: int = 0) -> Iterator[ServerThread]:
    with ServerThread(create_app(backend), port=port) as server:
        yield server
