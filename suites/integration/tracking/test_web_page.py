"""The server's web page rendered by Debian's headless Chromium with no network beyond
loopback: the runs table with a filter, the metric chart (inline SVG) and a run's lineage.
The checks read the DOM after the page's scripts ran, not the HTML the server sent."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from reference_impls.tracking.access import Access
from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.metadata import MetricPoint
from reference_impls.tracking.server import ServerThread, create_app

CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed: apt-get install -y chromium (.ci/run installs it)",
)


def chromium_dom(url: str, tmp_path: Path) -> str:
    assert CHROMIUM is not None
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        # Offline but for loopback: other names do not resolve, other hosts hit a dead proxy.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
        "--proxy-server=http://127.0.0.1:9",
        "--virtual-time-budget=10000",
        "--dump-dom",
        url,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture
def site(tmp_path: Path) -> Iterator[dict[str, Any]]:
    backend = EmbeddedBackend(tmp_path / "t.db", tmp_path / "artifacts")
    access = Access(backend.meta)
    access.create_user("ann")
    token = access.create_token("ann")
    access.grant("ann", "vision", "viewer")
    runs = {}
    for i, lr in enumerate((1e-4, 3e-4, 1e-3, 3e-3)):
        rid = backend.create_run("vision", name=f"sweep-{i}", params={"lr": lr})
        backend.log_metrics(
            rid, [MetricPoint("loss", s, 1.0 / (s + 1 + i), 0.0) for s in range(40)]
        )
        runs[lr] = rid
    backend.add_edges([("dataset:imagenet@3", f"run:{runs[1e-3]}", "input")])
    backend.create_run("secret", name="hidden-run")  # ann has no role there
    with ServerThread(create_app(backend)) as server:
        yield {"url": server.url, "token": token, "runs": runs}
    backend.close()


def test_the_page_filters_runs_draws_the_metric_and_shows_lineage(site, tmp_path):
    run = site["runs"][1e-3]
    q = quote("params.lr >= 3e-4 order by params.lr asc")
    dom = chromium_dom(
        f"{site['url']}/#token={site['token']}&project=vision&q={q}&run={run}", tmp_path
    )
    names = re.findall(r'<tr class="run" data-id="[0-9a-f]{32}"><td>([^<]+)</td>', dom)
    assert names == ["sweep-1", "sweep-2", "sweep-3"]
    assert "hidden-run" not in dom and "secret" not in dom
    chart = re.search(r'<svg[^>]*id="metric-chart"[^>]*>.*?</svg>', dom, re.S)
    assert chart is not None, dom[-2000:]
    assert 'data-key="loss"' in chart.group() and 'data-points="40"' in chart.group()
    points = re.search(r'<polyline[^>]*points="([^"]+)"', chart.group())
    assert points is not None
    xy = [tuple(map(float, p.split(","))) for p in points.group(1).split()]
    assert len(xy) == 40
    # loss falls with the step: the line goes down (SVG y grows downwards), left to right.
    assert xy[0][0] < xy[-1][0] and xy[0][1] < xy[-1][1]
    assert "dataset:imagenet@3 -[input]-&gt; run sweep-2 (running)" in dom


def test_a_bad_filter_and_a_wrong_token_show_their_errors(site, tmp_path):
    dom = chromium_dom(
        f"{site['url']}/#token={site['token']}&project=vision&q={quote('bogus > 1')}", tmp_path
    )
    assert re.search(r'<div id="error">[^<]*unknown field \'bogus\'', dom), dom[-1500:]
    dom = chromium_dom(f"{site['url']}/#token=trk_wrong&project=vision", tmp_path)
    assert re.search(r'<div id="error">[^<]*unknown or revoked token', dom), dom[-1500:]
