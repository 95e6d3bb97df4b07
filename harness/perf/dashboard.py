"""The asv dashboard, offline: ``asv publish``, then local copies of its CDN libraries.

asv's page loads its JavaScript and CSS from CDNs; :func:`publish` fetches the same libraries
at pinned versions with ``npm pack`` (:data:`NPM_PACKAGES`, checked against the registry's
integrity) into .asv/vendor and points the page at local copies (:data:`CDN_ASSETS`).
:func:`dashboard_server` serves the result on loopback.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.perf._common import Echo, PerfError, Project, _asv_environ, _echo_stderr, _stream

# --------------------------------------------------------------------------------------------
# The dashboard, offline


@dataclasses.dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    integrity: str  # the registry's dist.integrity of that exact tarball


# The libraries asv 0.6.6's index.html loads from CDNs, at the versions it asks for. The npm
# registry has no stupidtable 1.0.1 (cdnjs' name for it); stupid-table-plugin 1.1.3 is the only
# published version and keeps the same $.fn.stupidtable API.
NPM_PACKAGES = {
    "jquery": NpmPackage(
        "jquery",
        "3.3.1",
        "sha512-Ubldcmxp5np52/ENotGxlLe6aGMvmF4R8S6tZjsP6Knsaxd/xp3Zrh50cG93lR6nPXyUFwzN3ZSOQI0wRJNdGg==",
    ),  # noqa: E501
    "flot": NpmPackage(
        "flot",
        "0.8.3",
        "sha512-xg2otcTJDvS+ERK+my4wxG/ASq90QURXtoM4LhacCq0jQW2jbyjdttbRNqU2cPykrpMvJ6b2uSp6SAgYAzj9tQ==",
    ),  # noqa: E501
    "flot-orderbars": NpmPackage(
        "flot-orderbars",
        "1.0.0",
        "sha512-Jv51fvzevUjNXEeozpwEKfPjhiZhfiJddv0WHjduUTCmSF+7T5K7C9c9Y1wIVmUhDBv5fLMjgbwKecT0GIKPZA==",
    ),  # noqa: E501
    "stupid-table-plugin": NpmPackage(
        "stupid-table-plugin",
        "1.1.3",
        "sha512-2Vk7XouQPxUQPRe9w0Fu7ZZ8kHLK7rDoLMsCgtKxRNJ7f4dSOGvW9CkHsq5wD6QsaEnWoyLBYH3xOEsrK3yWBg==",
    ),  # noqa: E501,
    "blueimp-md5": NpmPackage(
        "blueimp-md5",
        "2.19.0",
        "sha512-DRQrD6gJyy8FbiE4s+bDoXS9hiW3Vbx5uCdwvcCf3zLHL+Iv7LtGHLpr+GZV8rHG8tK766FGYBwRbu8pELTt+w==",
    ),  # noqa: E501
    "bootstrap": NpmPackage(
        "bootstrap",
        "3.1.1",
        "sha512-TAzqS8E/ISpVHP29gYhy+1NSV+FJwApDVQhDfgLYsIuUDJiqJzH2DfORN5tiu+Ie2iBLrzEG34t4Rf465cigqg==",
    ),  # noqa: E501
}

# CDN URL in asv's index.html -> (npm package, file inside the package). A URL not listed here
# makes publish fail rather than ship a page that needs the network.
CDN_ASSETS = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": (
        "flot",
        "jquery.flot.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": (
        "flot",
        "jquery.flot.time.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": (
        "flot",
        "jquery.flot.selection.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": (
        "flot",
        "jquery.flot.categories.js",
    ),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": (
        "flot-orderbars",
        "js/jquery.flot.orderBars.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": (
        "stupid-table-plugin",
        "stupidtable.min.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": (
        "blueimp-md5",
        "js/md5.min.js",
    ),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": (
        "bootstrap",
        "dist/js/bootstrap.min.js",
    ),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": (
        "bootstrap",
        "dist/css/bootstrap.min.css",
    ),
}
# Files a vendored file refers to by relative path (bootstrap's css loads ../fonts/*).
_COMPANIONS = {"bootstrap": ["dist/fonts"]}

_RESOURCE_TAG = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
_EXTERNAL_ATTR = re.compile(r"""\b(src|href)\s*=\s*(["'])(https?:)?//[^"']*\2""", re.IGNORECASE)
_SRI_ATTRS = re.compile(
    r"""\s+(integrity|crossorigin|referrerpolicy)\s*=\s*(["'])[^"']*\2""", re.IGNORECASE
)


def _package_dir(project: Project, pkg: NpmPackage) -> Path:
    return project.vendor_dir / f"{pkg.name}-{pkg.version}" / "package"


def fetch_npm_packages(root: Path | str, *, echo: Echo | None = _echo_stderr) -> dict[str, Path]:
    """Fetch each pinned package once with ``npm pack`` into .asv/vendor (never committed)."""
    project = Project.load(root)
    dirs = {}
    for key, pkg in NPM_PACKAGES.items():
        target = _package_dir(project, pkg)
        if not (target / "package.json").is_file():
            _npm_pack(project, pkg, target, echo)
        meta = json.loads((target / "package.json").read_text())
        if meta.get("version") != pkg.version:
            raise PerfError(
                f"{target} holds {pkg.name} {meta.get('version')}, expected "
                f"{pkg.version}: delete {target.parent} and publish again"
            )
        dirs[key] = target
    return dirs


def _npm_pack(project: Project, pkg: NpmPackage, target: Path, echo: Echo | None) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise PerfError(
            "npm not found: the dashboard fetches its JavaScript libraries with "
            "`npm pack` at build time; install Node.js (apt-get install -y npm)"
        )
    spec = f"{pkg.name}@{pkg.version}"
    if echo:
        echo(f"harness perf: npm pack {spec}")
    with tempfile.TemporaryDirectory(prefix="harness-npm-") as tmp:
        env = dict(
            os.environ,
            npm_config_cache=str(project.vendor_dir / "npm-cache"),
            npm_config_update_notifier="false",
            npm_config_fund="false",
        )
        proc = subprocess.run(
            [npm, "pack", spec, "--json", "--pack-destination", tmp],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise PerfError(
                f"npm pack {spec} failed (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}"
            )
        info = json.loads(proc.stdout)[0]
        if pkg.integrity and info.get("integrity") != pkg.integrity:
            raise PerfError(
                f"npm pack {spec}: integrity {info.get('integrity')} differs from "
                f"the pinned {pkg.integrity}; refusing to vendor it"
            )
        with tarfile.open(Path(tmp) / info["filename"]) as tar:
            staging = Path(tmp) / "x"
            tar.extractall(staging, filter="data")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(staging / "package"), str(target))


def make_offline(html_dir: Path, packages: dict[str, Path]) -> list[str]:
    """Copy the vendored files into html_dir/vendor and point index.html at them.

    Drops the SRI integrity (and crossorigin, referrerpolicy) attributes: the local copies
    are npm's files, not byte-identical to the CDN's minified builds. Returns the local paths.
    Raises PerfError when a script or stylesheet would still load from the network.
    """
    index = html_dir / "index.html"
    text = index.read_text()
    used = []

    def rewrite(match: re.Match[str]) -> str:
        tag = match.group(0)
        ext = _EXTERNAL_ATTR.search(tag)
        if not ext:
            return tag
        if tag.lower().startswith("<link") and "stylesheet" not in tag.lower():
            return tag  # e.g. a feed link: not loaded by the page
        url = ext.group(0).split("=", 1)[1].strip().strip("\"'")
        if url not in CDN_ASSETS:
            raise PerfError(
                f"{index} loads {url} from the network and no local copy is known: "
                "add it to harness.perf.CDN_ASSETS"
            )
        key, path = CDN_ASSETS[url]
        pkg = NPM_PACKAGES[key]
        local = f"vendor/{pkg.name}-{pkg.version}/{path}"
        for rel in [path, *_COMPANIONS.get(key, [])]:
            src, dst = packages[key] / rel, html_dir / "vendor" / f"{pkg.name}-{pkg.version}" / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        used.append(local)
        tag = tag.replace(ext.group(0), f'{ext.group(1)}="{local}"')
        return _SRI_ATTRS.sub("", tag)

    text = _RESOURCE_TAG.sub(rewrite, text)
    index.write_text(text)
    return used


def publish(root: Path | str, *, echo: Echo | None = _echo_stderr) -> Path:
    """``asv publish`` into the html dir (which asv deletes first), then make it offline."""
    project = Project.load(root)
    packages = fetch_npm_packages(project.root, echo=echo)  # before asv deletes anything
    if not any(project.results_dir.glob("*/machine.json")):
        raise PerfError(f"no results in {project.results_dir}: run `harness perf run` first")
    log: list[str] = []
    rc = _stream(
        [sys.executable, "-m", "asv", "publish", "--config", str(project.config_path)],
        cwd=project.root,
        env=_asv_environ(project),
        echo=echo,
        log=log,
    )
    if rc != 0:
        raise PerfError(f"asv publish exited {rc}:\n" + "\n".join(log[-30:]))
    used = make_offline(project.html_dir, packages)
    if echo:
        echo(
            f"harness perf: dashboard in {project.html_dir} (offline: {len(used)} local "
            "scripts and stylesheets)"
        )
    return project.html_dir


class _Handler(http.server.SimpleHTTPRequestHandler):
    on_request: Callable[[str], None] | None = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.on_request is not None:
            self.on_request(self.path)


def dashboard_server(
    html_dir: Path | str,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    on_request: Callable[[str], None] | None = None,
) -> http.server.ThreadingHTTPServer:
    """An HTTP server for the published dashboard, bound to loopback (unlike `asv preview`,
    which listens on 0.0.0.0). The page needs HTTP: it loads its JSON by XHR. on_request is
    called with the path of every request served (tests use it to see what the page loaded)."""
    html_dir = Path(html_dir)
    if not (html_dir / "index.html").is_file():
        raise PerfError(f"{html_dir}/index.html not found: run `harness perf publish` first")
    handler_class = type(
        "Handler", (_Handler,), {"on_request": staticmethod(on_request)} if on_request else {}
    )
    handler = functools.partial(handler_class, directory=str(html_dir))
    return http.server.ThreadingHTTPServer((host, port), handler)
