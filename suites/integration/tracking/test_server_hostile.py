"""The REST server under hostile callers (uvicorn on loopback, a real SQLite store): content
shared across projects leaks no metadata on any read path, no server path reaches a client,
no token reaches the access log, and bad input is a 4xx naming it, never a 500.

One module-scoped server: project ``alpha`` and project ``beta`` store the same bytes (content
addressing keeps one object); every string beta gave (names, commit, dataset) contains
``SECRETB``, so a leak is one substring test on the raw response.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impls.tracking.access import Access
from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.query import _digest, parse
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
    # The fuzzing test writes into gamma only, so the tests above see alpha as built here.
    g = backend.create_run("gamma", name="gamma-run", params={"lr": 0.5})
    backend.log_artifact(g, tmp / "w.bin", "gamma-weights.bin")
    access.grant("viewer", "alpha", "viewer")
    access.grant("writer", "alpha", "writer")
    access.grant("viewer", "gamma", "writer")
    with ServerThread(create_app(backend)) as server:
        yield {
            "url": server.url,
            "tokens": tokens,
            "alpha": a,
            "beta": b,
            "gamma": g,
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


# ---------------------------------------------------------------- the bad input
@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"params": {"note": "a\udcffb"}}, "param note"),
        ({"tags": {"team": "a\udcffb"}}, "tag team"),
        ({"name": "a\udcffb"}, "run name"),
        ({"name": "a\x00b"}, "run name"),
        ({"params": {"k\udcff": 1}}, "param name"),
    ],
)
def test_text_no_database_stores_is_a_400_naming_the_field(world, body, named):
    before = world["backend"].meta.count_runs("gamma")
    resp = httpx.post(
        world["url"] + "/api/projects/gamma/runs",
        content=_json_text(body),
        headers={
            "Authorization": f"Bearer {world['tokens']['viewer']}",
            "Content-Type": "application/json",
        },
        timeout=60,
    )
    assert resp.status_code == 400 and named in resp.json()["detail"], resp.text
    assert world["backend"].meta.count_runs("gamma") == before


@pytest.mark.parametrize("status", ["bogus", "a\udcffb", ""])
def test_ending_a_run_with_an_unknown_status_is_a_400_naming_it(world, status):
    rid = world["backend"].create_run("gamma")
    resp = httpx.post(
        world["url"] + f"/api/runs/{rid}/end",
        content=_json_text({"status": status}),
        headers={
            "Authorization": f"Bearer {world['tokens']['viewer']}",
            "Content-Type": "application/json",
        },
        timeout=60,
    )
    assert resp.status_code == 400, resp.text
    assert "is not one of finished, failed, killed" in resp.json()["detail"]
    assert world["backend"].get_run(rid).status == "running"


def test_an_edited_page_token_is_a_400_naming_it(world):
    # (A lone surrogate cannot travel in a URL, which is UTF-8: filters with one are refused
    # by the store, tested in test_tracking_bad_input.py.)
    raw = json.dumps({"o": 10**30, "q": _digest(parse(""))}).encode()
    token = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    resp = _get(world, "viewer", "/api/projects/alpha/runs", params={"page_token": token})
    assert resp.status_code == 400, resp.text
    assert f"page token offset {10**30} is out of range" in resp.json()["detail"]


# ---------------------------------------------------------------- random requests
HUGE = "__a 5000-digit integer__"


def _json_text(value: Any) -> bytes:
    # ensure_ascii: lone surrogates and NUL travel as \udcff / \u0000 escapes (valid JSON).
    # HUGE becomes a 5000-digit integer literal (past the parser's 4300-digit limit).
    text = json.dumps(value, ensure_ascii=True)
    return text.replace(json.dumps(HUGE), "1" + "0" * 5000).encode()


TEXTS = st.sampled_from(
    ["", "x", "a\udcffb", "\ud800", "a\x00b", "é" * 3, "x" * 10_001, "'; drop table runs; --", "\n"]
)
# NaN and Infinity: not JSON, but Python's parser (the server's) accepts them.
NUMBERS = st.sampled_from(
    [0, -1, 1.5, 2**53 + 1, 2**63, 10**30, 1e308, -1e308, math.nan, math.inf, HUGE]
)
SCALARS = st.one_of(TEXTS, NUMBERS, st.booleans(), st.none())
KEYS = st.sampled_from(["lr", "opt", "a.b/c", "1bad", "", "k\x00", "k\udcff", "x" * 300])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=6,
)
BODIES = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "name": VALUES,
            "params": st.dictionaries(KEYS, VALUES, max_size=3),
            "tags": st.dictionaries(KEYS, VALUES, max_size=3),
            "git_commit": VALUES,
            "environment": VALUES,
            "created_at": VALUES,
            "status": st.sampled_from(["finished", "running", "bogus", "\udcff", ""]),
            "points": st.lists(st.lists(VALUES, max_size=5), max_size=3),
            "edges": st.lists(st.lists(VALUES, min_size=3, max_size=3), max_size=2),
            "extra": VALUES,
        },
    ),
    VALUES,
)
RUN_IDS = ["{alpha}", "{beta}", "{gamma}", "0" * 32, "nope", "%00", "..%2F..", "x" * 300]
PATHS = st.one_of(
    st.sampled_from(
        [
            "/api/projects",
            "/api/whoami",
            "/api/projects/{p}/runs",
            "/api/runs/{r}",
            "/api/runs/{r}/metrics",
            "/api/runs/{r}/metrics/{k}",
            "/api/runs/{r}/tags",
            "/api/runs/{r}/end",
            "/api/runs/{r}/artifacts",
            "/api/runs/{r}/artifacts/{n}",
            "/api/lineage",
            "/api/lineage/edges",
        ]
    ),
    st.sampled_from(["/", "/api", "/api/runs", "/%ff", "/api/runs/{r}/artifacts/a%00b"]),
)
QUERY = st.dictionaries(
    st.sampled_from(
        ["q", "order_by", "limit", "page_token", "node", "direction", "format", "kind", "promoted"]
    ),
    st.one_of(
        TEXTS.filter(lambda t: "\udcff" not in t and "\ud800" not in t),
        st.sampled_from(
            [
                "params.opt desc",
                "metrics.x > 1",
                "10000000000000000000000000000",
                "-1",
                "artifact:{sha}",
                "run:{beta}",
                "dataset:SECRETB-data@7",
                "dot",
                "forward",
                "eyJvIjogMTAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMCwgInEiOiAiIn0",
            ]
        ),
    ),
    max_size=3,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    path=PATHS,
    project=st.sampled_from(["alpha", "beta", "gamma", "nope", "a" * 300, "%00"]),
    run=st.sampled_from(RUN_IDS),
    key=st.sampled_from(["loss", "x" * 300, "a%00", "..", "%ff"]),
    name=st.sampled_from(["alpha-weights.bin", "gamma-weights.bin", "a/../b", "%2Fetc", "n.bin"]),
    query=QUERY,
    body=st.one_of(BODIES.map(_json_text), st.binary(max_size=40)),
    user=st.sampled_from(["viewer", "writer", None, "bogus"]),
    content_type=st.sampled_from(["application/json", "text/plain", None]),
)
def test_random_requests_never_500_never_leak_and_every_4xx_says_why(
    world, method, path, project, run, key, name, query, body, user, content_type
):
    ids = {"alpha": world["alpha"], "beta": world["beta"], "gamma": world["gamma"]}
    run_id = run.format(**ids)
    url = world["url"] + path.format(p=project, r=run_id, k=key, n=name)
    params = {k: v.format(sha=world["sha"], **ids) for k, v in query.items()}
    headers = {}
    if content_type:
        headers["Content-Type"] = content_type
    if user == "bogus":
        headers["Authorization"] = "Bearer trk_not_a_token"
    elif user is not None:
        headers["Authorization"] = f"Bearer {world['tokens'][user]}"
    resp = httpx.request(method, url, params=params, content=body, headers=headers, timeout=60)
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    # No caller here may see beta: none of its metadata, none of its own bytes.
    sent = url + json.dumps(params)  # a 4xx may echo what it was sent; that is no leak
    for secret in (SECRET, world["beta"]):
        if secret not in sent:
            assert secret.encode() not in resp.content, resp.text[:500]
    assert b"beta-only derived bytes" not in resp.content
    assert b"file://" not in resp.content and str(world["tmp"]).encode() not in resp.content
    if 400 <= resp.status_code < 500 and resp.status_code not in (404, 405):
        detail = resp.json()["detail"]
        if isinstance(detail, list):  # request validation: each error has its field's location
            assert detail and all(e.get("loc") for e in detail), detail
        else:
            assert isinstance(detail, str) and len(detail) > 10, detail


WRITES = [
    ("POST", "/api/projects/gamma/runs"),
    ("POST", "/api/runs/{g}/metrics"),
    ("POST", "/api/runs/{g}/tags"),
    ("POST", "/api/runs/{g}/end"),
    ("POST", "/api/lineage/edges"),
    ("PUT", "/api/runs/{g}/artifacts/fuzz.bin"),
    ("GET", "/api/projects/gamma/runs"),
    ("GET", "/api/lineage"),
]


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(WRITES), body=BODIES, query=QUERY, raw=st.booleans())
def test_random_writes_and_searches_by_a_permitted_caller_never_500(world, route, body, query, raw):
    # The same checks, on the routes that reach the store (the caller may write in gamma),
    # where a value passes HTTP validation and meets the database.
    method, path = route
    ids = {"alpha": world["alpha"], "beta": world["beta"], "gamma": world["gamma"]}
    params = {k: v.format(sha=world["sha"], **ids) for k, v in query.items()}
    if path == "/api/lineage/edges" and isinstance(body, dict) and raw:
        body = {"edges": [[f"run:{world['gamma']}", "artifact:" + "0" * 64, body.get("name")]]}
    resp = httpx.request(
        method,
        world["url"] + path.format(g=world["gamma"]),
        params=params,
        content=_json_text(body),
        headers={
            "Authorization": f"Bearer {world['tokens']['viewer']}",
            "Content-Type": "application/json",
        },
        timeout=60,
    )
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if SECRET not in json.dumps(params):  # a 4xx may echo what it was sent; that is no leak
        assert SECRET.encode() not in resp.content, resp.text[:500]
    if 400 <= resp.status_code < 500 and resp.status_code != 404:
        detail = resp.json()["detail"]
        assert detail and (isinstance(detail, list) or len(detail) > 10), detail
