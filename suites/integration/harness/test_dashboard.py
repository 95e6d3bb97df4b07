"""The published asv dashboard, rendered by Debian's headless Chromium with no network.

A tiny asv project in a temporary git repository is benchmarked at three commits, published
with `harness.perf.publish` and served from 127.0.0.1. Chromium runs with every host name but
localhost unresolvable and every non-loopback connection sent to a dead proxy, so a page that
still needed a CDN would fail; a control page published by plain asv shows that it does.
The checks look at what Chromium rendered (the DOM after scripts ran, a screenshot's pixels),
not at the HTML we wrote.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from screenshots import count_pixels
from tiny_asv_project import bench_source, commit, make_repo

from harness import perf

# Debian's chromium here (.ci/run installs it); GitHub's ubuntu runners ship Google Chrome,
# which takes the same headless flags.
CHROMIUM = next(
    filter(
        None,
        map(
            shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
        ),
    ),
    None,
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed: apt-get install -y chromium (.ci/run installs it)",
)

REPO_ROOT = Path(__file__).resolve().parents[3]
MACHINE = "dashboard-test"
BENCHMARK = "bench_tiny.Loop.time_work"
SERIES_RGB = (0x24, 0x7A, 0xAD)  # $.asv.colors[0] in asv 0.6.6's asv.js: the first series

# A second, parametrized benchmark: the dashboard must list its parameter values too.
SIZES = """

class Sizes:
    params = [1_000, 10_000]
    param_names = ["n"]

    def time_sum(self, n):
        sum(range(n))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A published dashboard with results for 3 commits, served on 127.0.0.1; yields
    (html dir, base URL, the list of paths the server was asked for)."""
    # npm packages are cached once per checkout (.asv/vendor, git-ignored), not per test run.
    vendor = REPO_ROOT / ".asv" / "vendor"
    if shutil.which("npm") is None and not vendor.is_dir():
        pytest.skip(
            "npm is not installed and no vendored packages are cached: the dashboard "
            "fetches its JavaScript libraries with npm pack"
        )
    repo, first = make_repo(
        tmp_path_factory.mktemp("dashboard"), bench=bench_source(extra=SIZES), message="N = 20000"
    )
    commits = [first] + [commit(repo, f"N = {n}", n=n) for n in (30_000, 40_000)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(perf.VENDOR_DIR_ENV_VAR, str(vendor))
        for outcome in perf.run_interleaved(
            repo, commits, passes=1, quick=True, machine=MACHINE, echo=None
        ):
            assert outcome.exit_code == 0, "\n".join(outcome.log[-40:])
        html = perf.publish(repo, echo=None)
    requests: list[str] = []
    server = perf.dashboard_server(html, port=0, on_request=requests.append)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield html, f"http://127.0.0.1:{server.server_address[1]}/", requests
    server.shutdown()
    server.server_close()


def chromium(url: str, tmp_path: Path, *args: str) -> str:
    """Load url in headless Chromium, offline but for loopback; return stdout."""
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
        # No network beyond localhost: names other than localhost do not resolve, and any
        # connection that is not to loopback goes to a proxy port where nothing listens.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
        "--proxy-server=http://127.0.0.1:9",  # loopback is never proxied
        "--virtual-time-budget=10000",
        "--window-size=1280,900",
        *args,
        url,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_benchmark_graph_renders_with_its_data_points_offline(site, tmp_path):
    html, url, requests = site
    dom = chromium(url + "#" + BENCHMARK, tmp_path, "--dump-dom")
    assert "Can not determine continental origin of swallow" not in dom  # asv's error.html
    graph = dom[dom.index('id="graph-display"') :]
    assert 'class="flot-base"' in graph, "no flot canvas in the graph display"
    # flot derived a y axis from the timings (asv scales them to a time unit, so the values
    # depend on the machine's speed; that there is a scale at all does not).
    ticks = [float(t) for t in re.findall(r"flot-tick-label[^>]*>\s*([-+0-9.e]+)\s*<", graph)]
    assert len(ticks) >= 3 and max(ticks) > 0, f"y-axis ticks {ticks}"
    # The data line itself: the first series colour, drawn by the plot, in the screenshot.
    shot = tmp_path / "graph.png"
    chromium(url + "#" + BENCHMARK, tmp_path, f"--screenshot={shot}")
    assert count_pixels(shot, SERIES_RGB) > 100, "the series line is missing from the graph"
    # Every library came from the local server.
    vendored = {p.split("?")[0] for p in requests if p.startswith("/vendor/")}
    assert len(vendored) >= 10, sorted(vendored)


def test_the_grid_shows_a_plot_for_every_benchmark(site, tmp_path):
    html, url, _ = site
    dom = chromium(url, tmp_path, "--dump-dom")
    for name in (BENCHMARK, "bench_tiny.Sizes.time_sum"):
        start = dom.index(f'id="summarygrid-{name}"')
        assert 'class="flot-base"' in dom[start : start + 600], f"no plot for {name}"
    shot = tmp_path / "grid.png"
    chromium(url, tmp_path, f"--screenshot={shot}")
    assert count_pixels(shot, SERIES_RGB) > 200, "the grid's sparklines are empty"


def test_the_page_references_no_network_resource_and_no_integrity_hash(site):
    html, _, _ = site
    text = (html / "index.html").read_text()
    tags = [m.group(0) for m in perf._RESOURCE_TAG.finditer(text)]
    external = [
        t
        for t in tags
        if perf._EXTERNAL_ATTR.search(t)
        and (t.lower().startswith("<script") or "stylesheet" in t.lower())
    ]
    assert external == []
    assert "integrity=" not in text
    assert (html / "vendor" / "bootstrap-3.1.1" / "dist" / "fonts").is_dir()


def test_plain_asv_output_fails_under_the_same_offline_browser(site, tmp_path):
    """The control: without the local copies, the page needs the network and shows asv's
    error page, so the checks above would catch a page that still used a CDN."""
    html, _, _ = site
    repo = html.parents[1]
    raw = tmp_path / "raw-html"
    proc = subprocess.run(
        [sys.executable, "-m", "asv", "publish", "--html-dir", str(raw)],
        cwd=repo,
        env=dict(os.environ, HOME=str(repo / ".asv" / "home")),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    server = perf.dashboard_server(raw, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dom = chromium(
            f"http://127.0.0.1:{server.server_address[1]}/#{BENCHMARK}", tmp_path, "--dump-dom"
        )
    finally:
        server.shutdown()
        server.server_close()
    assert "Can not determine continental origin of swallow" in dom
