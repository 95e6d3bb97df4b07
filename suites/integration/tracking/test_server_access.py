"""The REST server over real HTTP (uvicorn on loopback): tokens, project roles, seeing vs
downloading, path traversal, cross-project reads, and the client using it instead of the
embedded store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reference_impls.tracking.access import Access
from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.client import Tracker
from reference_impls.tracking.errors import FilterError, NotFoundError, PermissionDeniedError
from reference_impls.tracking.server import ServerThread, create_app


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A server with projects 'vision' and 'nlp', one run each with a weights artifact, and
    users: admin; viewer, reader, writer in vision; outsider (a writer in nlp only)."""
    backend = EmbeddedBackend(tmp_path / "t.db", tmp_path / "artifacts")
    access = Access(backend.meta)
    tokens = {}
    access.create_user("admin", admin=True)
    tokens["admin"] = access.create_token("admin")
    for user in ("viewer", "reader", "writer", "outsider"):
        access.create_user(user)
        tokens[user] = access.create_token(user)
    runs = {}
    for project in ("vision", "nlp"):
        rid = backend.create_run(project, name=f"{project}-run", params={"lr": 0.1})
        (tmp_path / "w.bin").write_bytes(f"{project} weights".encode())
        backend.log_artifact(rid, tmp_path / "w.bin", "weights/model.bin", kind="model")
        runs[project] = rid
    for user in ("viewer", "reader", "writer"):
        access.grant(user, "vision", user)
    access.grant("outsider", "nlp", "writer")
    with ServerThread(create_app(backend)) as server:
        yield {
            "url": server.url,
            "tokens": tokens,
            "runs": runs,
            "access": access,
            "backend": backend,
        }
    backend.close()


def _get(world, user: str | None, path: str, token: str | None = None) -> httpx.Response:
    headers = {}
    if user is not None or token is not None:
        headers["Authorization"] = f"Bearer {token or world['tokens'][user]}"
    return httpx.get(world["url"] + path, headers=headers, timeout=30)


def test_missing_wrong_and_revoked_tokens_get_401(world):
    assert _get(world, None, "/api/projects").status_code == 401
    assert _get(world, None, "/api/projects", token="trk_wrong").status_code == 401
    resp = httpx.get(
        world["url"] + "/api/projects", headers={"Authorization": "Basic abc"}, timeout=30
    )
    assert resp.status_code == 401 and "Bearer" in resp.json()["detail"]
    world["access"].revoke_token(world["tokens"]["viewer"])
    resp = _get(world, "viewer", "/api/projects")
    assert resp.status_code == 401 and "revoked" in resp.json()["detail"]


def test_a_viewer_sees_runs_and_metrics_but_cannot_download_weights(world):
    vision = world["runs"]["vision"]
    assert _get(world, "viewer", f"/api/runs/{vision}").json()["name"] == "vision-run"
    listing = _get(world, "viewer", f"/api/runs/{vision}/artifacts").json()["artifacts"]
    assert [a["name"] for a in listing] == ["weights/model.bin"]
    resp = _get(world, "viewer", f"/api/runs/{vision}/artifacts/weights/model.bin")
    assert resp.status_code == 403
    assert "may not download" in resp.json()["detail"] and "reader" in resp.json()["detail"]
    resp = _get(world, "reader", f"/api/runs/{vision}/artifacts/weights/model.bin")
    assert resp.status_code == 200 and resp.content == b"vision weights"


def test_cross_project_reads_look_like_missing_runs(world):
    nlp = world["runs"]["nlp"]
    for path in (
        f"/api/runs/{nlp}",
        f"/api/runs/{nlp}/artifacts",
        f"/api/runs/{nlp}/artifacts/weights/model.bin",
        f"/api/runs/{nlp}/metrics/loss",
        "/api/projects/nlp/runs",
    ):
        resp = _get(world, "reader", path)
        assert resp.status_code == 404, (path, resp.text)
    assert _get(world, "reader", "/api/projects").json() == {"projects": ["vision"]}
    # Lineage hides runs of projects the caller cannot see.
    resp = _get(world, "reader", f"/api/lineage?node=run:{nlp}")
    assert resp.status_code == 404
    assert _get(world, "outsider", f"/api/lineage?node=run:{nlp}").status_code == 200


def test_path_traversal_in_artifact_names_is_refused(world):
    vision = world["runs"]["vision"]
    for name in (
        "..%2F..%2Fetc%2Fpasswd",
        "weights/..%2F..%2Ft.db",
        "%2Fetc%2Fpasswd",
        "a%5C..%5Cb",
    ):
        resp = _get(world, "admin", f"/api/runs/{vision}/artifacts/{name}")
        assert resp.status_code in (400, 404), (name, resp.status_code)
        assert b"root:" not in resp.content
    resp = _get(world, "admin", f"/api/runs/{vision}/artifacts/..%2F..%2Fetc%2Fpasswd")
    assert resp.status_code == 400 and "relative path" in resp.json()["detail"]
    resp = httpx.put(
        world["url"] + f"/api/runs/{vision}/artifacts/..%2Fevil.bin",
        content=b"x",
        headers={"Authorization": f"Bearer {world['tokens']['writer']}"},
        timeout=30,
    )
    assert resp.status_code == 400


def test_only_writers_write_and_only_in_their_projects(world):
    vision = world["runs"]["vision"]
    body = {"points": [["loss", 1, 0.5, 0.0]]}
    for user, code in (("viewer", 403), ("reader", 403), ("writer", 200), ("outsider", 404)):
        resp = httpx.post(
            world["url"] + f"/api/runs/{vision}/metrics",
            json=body,
            headers={"Authorization": f"Bearer {world['tokens'][user]}"},
            timeout=30,
        )
        assert resp.status_code == code, (user, resp.text)
    # A new project can only be created by an admin.
    resp = httpx.post(
        world["url"] + "/api/projects/newproj/runs",
        json={"params": {}},
        headers={"Authorization": f"Bearer {world['tokens']['writer']}"},
        timeout=30,
    )
    assert resp.status_code == 404


def test_the_client_works_through_the_server_with_verified_downloads(world, tmp_path):
    writer = Tracker.remote(world["url"], world["tokens"]["writer"], flush_interval_s=0.2)
    with writer.start_run(
        "vision", params={"lr": 3e-4, "opt": "adam"}, inputs=["dataset:imagenet@3"]
    ) as run:
        for step in range(50):
            run.log_metrics({"loss": 1.0 / (step + 1), "acc": step / 50}, step=step)
        (tmp_path / "ckpt.pt").write_bytes(b"checkpoint bytes" * 1000)
        run.log_artifact(tmp_path / "ckpt.pt", "ckpt/final.pt", kind="checkpoint")
    info = writer.get_run(run.id)
    assert info.status == "finished" and info.metrics["acc"] == 49 / 50
    assert info.tags["created_by"] == "writer"
    page = writer.search("vision", "metrics.acc > 0.5 and params.lr < 1e-3")
    assert [r.id for r in page.runs] == [run.id]
    with pytest.raises(FilterError, match="unknown field"):
        writer.search("vision", "bogus > 1")
    got = writer.download_artifact(run.id, "ckpt/final.pt", tmp_path / "got.pt")
    assert got.read_bytes() == (tmp_path / "ckpt.pt").read_bytes()
    graph = writer.lineage(f"run:{run.id}")
    assert "dataset:imagenet@3" in graph.nodes
    viewer = Tracker.remote(world["url"], world["tokens"]["viewer"])
    assert len(viewer.backend.metric_history(run.id, "loss")) == 50
    with pytest.raises(PermissionDeniedError, match="may not download"):
        viewer.download_artifact(run.id, "ckpt/final.pt", tmp_path / "nope.pt")
    assert not (tmp_path / "nope.pt").exists()
    with pytest.raises(PermissionDeniedError, match="may not write"):
        viewer.start_run("vision")
    outsider = Tracker.remote(world["url"], world["tokens"]["outsider"])
    with pytest.raises(NotFoundError):
        outsider.get_run(run.id)
    dot = httpx.get(
        world["url"] + f"/api/lineage?node=run:{run.id}&format=dot",
        headers={"Authorization": f"Bearer {world['tokens']['viewer']}"},
        timeout=30,
    )
    assert dot.status_code == 200 and '"dataset:imagenet@3" -> "run:' in dot.text
