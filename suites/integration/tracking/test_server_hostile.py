"""The REST server under hostile callers (uvicorn on loopback, a real SQLite store): content
shared across projects leaks no metadata on any read path, no server path reaches a client,
no token reaches the access log, and bad input is a 4xx naming it, never a 500.

One module-scoped server: project ``alpha`` and project ``beta`` store the same bytes (content
addressing keeps one object); every string beta gave (names, commit, dataset) contains
``SECRETB``, so a leak is one substring test on the raw response.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reference_impls.tracking.access import Access
from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.server import ServerThread, create_app

SECRET = "SECRETB"
SHARED = b"weights both projects trained to the same bytes"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("hostile")
    backend = EmbeddedBackend(tmp / "t.db", tmp / "artifacts")
    access = Access(backend.meta)
    tokens = {}
    access.create_user("admin", admin=True)
    tokens["admin"] = access.create_token("admin")
    for user in ("viewer", "writer"):
        access.create_user(user)
        tokens[user] = access.create_token(user)
    (tmp / "w.bin").write_bytes(SHARED)
    a = backend.create_run("alpha", name="alpha-run", params={"lr": 0.1, "opt": "adam"})
    backend.add_edges([("dataset:alpha-data@1", f"run:{a}", "input")])
    alpha_ref = backend.log_artifact(a, tmp / "w.bin", "alpha-weights.bin", kind="model")
    b = backend.create_run(
        "beta",
        name=f"{SECRET}-run",
        params={"note": f"{SECRET} param"},
        git_commit=f"{SECRET}c0ffee",
    )
    backend.add_edges([(f"dataset:{SECRET}-data@7", f"run:{b}", "input")])
    beta_ref = backend.log_artifact(b, tmp / "w.bin", f"{SECRET}-weights.bin", kind="model")
    assert beta_ref.sha256 == alpha_ref.sha256  # one object, two projects' metadata
    # A beta run that consumed the shared bytes and produced something of its own.
    c = backend.create_run("beta", name=f"{SECRET}-finetune")
    backend.add_edges([(f"artifact:{alpha_ref.sha256}", f"run:{c}", "input")])
    (tmp / "d.bin").write_bytes(b"beta-only derived bytes")
    derived = backend.log_artifact(c, tmp / "d.bin", f"{SECRET}-derived.bin")
    access.grant("viewer", "alpha", "viewer")
    access.grant("writer", "alpha", "writer")
    with ServerThread(create_app(backend)) as server:
        yield {
            "url": server.url,
            "tokens": tokens,
            "alpha": a,
            "beta": b,
            "sha": alpha_ref.sha256,
            "derived": derived.sha256,
            "backend": backend,
            "tmp": tmp,
        }
    backend.close()


def _get(world: dict[str, Any], user: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {world['tokens'][user]}"}
    return httpx.get(world["url"] + path, headers=headers, timeout=60, **kw)


# ---------------------------------------------------------------- metadata across projects
@pytest.mark.parametrize("direction", ["backward", "forward"])
@pytest.mark.parametrize("fmt", ["json", "dot"])
def test_lineage_of_shared_bytes_shows_no_other_projects_metadata(world, direction, fmt):
    sha = world["sha"]
    resp = _get(
        world,
        "viewer",
        "/api/lineage",
        params={"node": f"artifact:{sha}", "direction": direction, "format": fmt},
    )
    assert resp.status_code == 200, resp.text
    assert SECRET not in resp.text
    assert f"run:{world['beta']}" not in resp.text
    assert "alpha-weights.bin" in resp.text  # labelled with alpha's own name
    if direction == "backward":
        assert f"run:{world['alpha']}" in resp.text and "alpha-data@1" in resp.text
    else:  # beta's consumer and what it produced stay hidden
        assert world["derived"] not in resp.text
    # The admin sees both projects (the filter is the caller's, not a global one).
    admin = _get(
        world, "admin", "/api/lineage", params={"node": f"artifact:{sha}", "direction": direction}
    )
    assert SECRET in admin.text


def test_lineage_from_a_visible_run_does_not_walk_into_another_project(world):
    resp = _get(
        world,
        "viewer",
        "/api/lineage",
        params={"node": f"run:{world['alpha']}", "direction": "forward"},
    )
    assert resp.status_code == 200 and SECRET not in resp.text
    assert world["derived"] not in resp.text


@pytest.mark.parametrize(
    "node",
    [f"dataset:{SECRET}-data@7", f"code:{SECRET}c0ffee", "artifact:{derived}", "run:{beta}"],
)
def test_another_projects_nodes_look_like_nothing_stored(world, node):
    node = node.format(derived=world["derived"], beta=world["beta"])
    for direction in ("backward", "forward"):
        resp = _get(world, "viewer", "/api/lineage", params={"node": node, "direction": direction})
        assert resp.status_code == 404 and "names nothing stored" in resp.json()["detail"]


def test_search_and_listings_show_only_the_callers_metadata(world):
    search = _get(world, "viewer", "/api/projects/alpha/runs", params={"q": "params.opt = 'adam'"})
    listing = _get(world, "viewer", f"/api/runs/{world['alpha']}/artifacts")
    run = _get(world, "viewer", f"/api/runs/{world['alpha']}")
    page = httpx.get(world["url"] + "/", timeout=60)
    for resp in (search, listing, run, page):
        assert resp.status_code == 200 and SECRET not in resp.text
    assert [r["id"] for r in search.json()["runs"]] == [world["alpha"]]
    assert _get(world, "viewer", "/api/projects/beta/runs").status_code == 404


def test_no_server_filesystem_path_reaches_a_client(world):
    tmp = str(world["tmp"])
    listing = _get(world, "viewer", f"/api/runs/{world['alpha']}/artifacts").json()["artifacts"]
    run = _get(world, "viewer", f"/api/runs/{world['alpha']}").json()["artifacts"]
    for ref in listing + run:
        assert not ref["uri"].startswith("file:") and tmp not in json.dumps(ref)
        assert ref["uri"] == f"/api/runs/{world['alpha']}/artifacts/alpha-weights.bin"
    (world["tmp"] / "up.bin").write_bytes(b"uploaded")
    put = httpx.put(
        world["url"] + f"/api/runs/{world['alpha']}/artifacts/up/load.bin",
        content=b"uploaded",
        headers={"Authorization": f"Bearer {world['tokens']['writer']}"},
        timeout=60,
    )
    assert put.status_code == 200 and tmp not in put.text
    assert put.json()["uri"] == f"/api/runs/{world['alpha']}/artifacts/up/load.bin"


def test_a_token_in_the_query_string_is_refused_and_not_logged(world):
    token = world["tokens"]["viewer"]
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    # An access-logging server, as `python -m reference_impls.tracking server` runs one (its
    # config resets the logger's handlers, so ours is added after it).
    server = ServerThread(create_app(world["backend"]), log_level="info")
    handler = Keep()
    access_log = logging.getLogger("uvicorn.access")
    access_log.addHandler(handler)
    try:
        with server:
            resp = httpx.get(f"{server.url}/api/projects?token={token}&x=1", timeout=60)
            assert resp.status_code == 401
    finally:
        access_log.removeHandler(handler)
    assert any("/api/projects?token=" in line for line in lines), lines  # it was logged...
    assert not any(token in line for line in lines), lines  # ...without the secret
