"""Command line: ``python -m reference_impls.tracking COMMAND ...`` (``--help`` on each).

    server         serve the REST API and the web page
    search         search a project's runs with the filter language
    lineage        forward/backward lineage of a node, as JSON or Graphviz DOT
    gc             retention (tiered policy) then collection of unreferenced bytes; --dry-run
    import-report  store a `harness run`/`harness ci` report directory as a run
    migrate        bring a database to the newest schema
    user-add, token-create, grant   access control for the server

The database and artifact store default to $TRACKING_DB / $TRACKING_ARTIFACTS, else
``tracking.db`` and ``artifacts/`` in the current directory. ``--url``/``--token`` (or
$TRACKING_URL/$TRACKING_TOKEN) make search, lineage and import-report go through a server.
Exit status: 0 success, 1 a tracking error (the message says what and how to fix it),
2 bad command line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from reference_impls.tracking.errors import TrackingError

DAY = 86_400.0


def _non_negative(text: str) -> float:
    """A finite number >= 0 (a duration or grace): a bad one is a usage error, exit 2."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        default=os.environ.get("TRACKING_DB", "tracking.db"),
        help="database: a SQLite file path or postgresql://USER@HOST:PORT/DB "
        "(default: $TRACKING_DB or tracking.db)",
    )
    p.add_argument(
        "--artifacts",
        default=os.environ.get("TRACKING_ARTIFACTS", "artifacts"),
        help="artifact store: a directory or s3://BUCKET/PREFIX?endpoint_url=URL "
        "(default: $TRACKING_ARTIFACTS or artifacts/)",
    )


def _remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("TRACKING_URL"),
        help="server URL (default: $TRACKING_URL; none = embedded)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("TRACKING_TOKEN"),
        help="token for --url (default: $TRACKING_TOKEN)",
    )


def _tracker(args: argparse.Namespace) -> Any:
    from reference_impls.tracking.client import Tracker

    if getattr(args, "url", None):
        if not args.token:
            raise TrackingError("--url needs --token (or $TRACKING_TOKEN)")
        return Tracker.remote(args.url, args.token)
    return Tracker(args.db, args.artifacts)


def _backend(args: argparse.Namespace) -> Any:
    from reference_impls.tracking.backend import EmbeddedBackend
    from reference_impls.tracking.cache import HotCache

    cache = None
    if getattr(args, "cache_dir", None):
        cache = HotCache(args.cache_dir, args.cache_bytes)
    return EmbeddedBackend(args.db, args.artifacts, cache=cache)


def cmd_server(args: argparse.Namespace) -> int:
    from reference_impls.tracking.server import create_app, serve

    backend = _backend(args)
    print(
        f"tracking server on http://{args.host}:{args.port}/ "
        f"(db {args.db}, artifacts {args.artifacts})",
        file=sys.stderr,
    )
    serve(create_app(backend), args.host, args.port, log_level="info")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    tracker = _tracker(args)
    page = tracker.search(
        args.project,
        args.query,
        order_by=args.order_by,
        limit=args.limit,
        page_token=args.page_token,
    )
    if args.json:
        print(json.dumps(page.to_dict(), indent=2))
        return 0
    print(f"# {page.query or '(all runs)'}: {len(page.runs)} runs")
    for r in page.runs:
        metrics = ", ".join(f"{k}={v:.6g}" for k, v in sorted(r.metrics.items()))
        params = ", ".join(f"{k}={v}" for k, v in sorted(r.params.items()))
        print(f"{r.id}  {r.name:<20} {r.status:<9} {params}  |  {metrics}")
    if page.next_page_token:
        print(f"# more: --page-token {page.next_page_token}")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    graph = _tracker(args).lineage(args.node, args.direction)
    print(graph.to_dot() if args.format == "dot" else graph.to_json())
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from reference_impls.tracking.retention import (
        RetentionPolicy,
        apply_plan,
        collect,
        plan_for_store,
    )

    backend = _backend(args)
    policy = RetentionPolicy(
        keep_all_days=args.keep_all_days,
        keep_last_runs=args.keep_last_runs,
        delete_after_days=args.delete_after_days,
    )
    plan = plan_for_store(backend.meta, policy, project=args.project)
    verb = "would" if args.dry_run else "will"
    print(
        f"retention: {plan.tiers.get('keep', 0)} runs kept whole, "
        f"{plan.tiers.get('final_checkpoint', 0)} thinned to their final checkpoint, "
        f"{plan.tiers.get('delete', 0)} past {args.delete_after_days:g} days; "
        f"{verb} soft-delete {len(plan.runs)} runs and {len(plan.artifacts)} artifacts, "
        f"freeing {plan.bytes_freed:,} bytes in {plan.objects_freed} objects once collected",
        file=sys.stderr,
    )
    if not args.dry_run:
        apply_plan(backend.meta, plan)
    report = collect(
        backend.meta,
        backend.store,
        soft_delete_grace_s=args.soft_delete_grace_days * DAY,
        upload_grace_s=args.upload_grace_s,
        dry_run=args.dry_run,
    )
    print(
        f"collection: {verb} purge {report.rows_purged} artifact rows and {report.runs_purged} "
        f"runs, delete {len(report.orphans)} unreferenced objects ({report.bytes_freed:,} bytes)",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps({"retention": plan.to_dict(), "collection": report.to_dict()}, indent=2))
    return 0


def cmd_import_report(args: argparse.Namespace) -> int:
    from reference_impls.tracking.reports import import_report

    run_id = import_report(_tracker(args), args.directory, project=args.project)
    print(run_id)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from reference_impls.tracking.db import current_revision, head_revision, open_engine

    engine = open_engine(args.db)
    print(f"{args.db}: schema at revision {current_revision(engine)} (newest {head_revision()})")
    return 0


def cmd_user_add(args: argparse.Namespace) -> int:
    from reference_impls.tracking.access import Access
    from reference_impls.tracking.metadata import MetadataStore

    access = Access(MetadataStore(args.db))
    access.create_user(args.name, admin=args.admin)
    print(access.create_token(args.name))
    print(f"user {args.name} created; the line above is its token (shown once)", file=sys.stderr)
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from reference_impls.tracking.access import Access
    from reference_impls.tracking.metadata import MetadataStore

    print(Access(MetadataStore(args.db)).create_token(args.name))
    return 0


def cmd_grant(args: argparse.Namespace) -> int:
    from reference_impls.tracking.access import Access
    from reference_impls.tracking.metadata import MetadataStore

    Access(MetadataStore(args.db)).grant(args.user, args.project, args.role)
    print(f"{args.user} is {args.role} in {args.project}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impls.tracking",
        description="Experiment tracking: runs, metrics, artifacts, search, lineage, retention.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("server", help="serve the REST API and the web page")
    _store_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free)")
    p.add_argument("--cache-dir", help="hot cache directory for downloads (default: no cache)")
    p.add_argument(
        "--cache-bytes",
        type=int,
        default=10 << 30,
        help="hot cache bound in bytes (default 10 GiB)",
    )
    p.set_defaults(func=cmd_server)

    p = sub.add_parser(
        "search", help='search runs, e.g. "metrics.acc > 0.9 order by metrics.acc desc"'
    )
    _store_args(p)
    _remote_args(p)
    p.add_argument("project")
    p.add_argument("query", nargs="?", default="", help="filter (see the query module's grammar)")
    p.add_argument("--order-by", help="e.g. 'metrics.acc desc, created asc'")
    p.add_argument("--limit", type=int, help="runs per page (default 100)")
    p.add_argument("--page-token", help="the token a previous page printed")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser(
        "lineage", help="lineage of run:ID, artifact:SHA256, dataset:NAME@VERSION, code:COMMIT"
    )
    _store_args(p)
    _remote_args(p)
    p.add_argument("node")
    p.add_argument("--direction", choices=("backward", "forward"), default="backward")
    p.add_argument("--format", choices=("json", "dot"), default="json")
    p.set_defaults(func=cmd_lineage)

    p = sub.add_parser("gc", help="retention then collection of unreferenced bytes")
    _store_args(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="report what would go and the bytes freed; change nothing",
    )
    p.add_argument("--project", help="apply the policy to one project (collection is store-wide)")
    p.add_argument(
        "--keep-all-days",
        type=_non_negative,
        default=30.0,
        help="runs younger keep everything (default 30)",
    )
    p.add_argument(
        "--keep-last-runs",
        type=int,
        default=20,
        help="newest runs per project kept whole (default 20)",
    )
    p.add_argument(
        "--delete-after-days",
        type=_non_negative,
        default=365.0,
        help="older runs are deleted (default 365)",
    )
    p.add_argument(
        "--soft-delete-grace-days",
        type=_non_negative,
        default=7.0,
        help="soft-deleted rows purged after (default 7)",
    )
    p.add_argument(
        "--upload-grace-s",
        type=_non_negative,
        default=3600.0,
        help="unreferenced bytes younger than this are kept (default 3600)",
    )
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("import-report", help="store a harness report directory as a run")
    _store_args(p)
    _remote_args(p)
    p.add_argument("directory", help="directory with report.json, junit.xml, summary.md")
    p.add_argument("--project", default="harness", help="project (default harness)")
    p.set_defaults(func=cmd_import_report)

    p = sub.add_parser("migrate", help="bring a database to the newest schema")
    _store_args(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("user-add", help="create a user and print its first token")
    _store_args(p)
    p.add_argument("name")
    p.add_argument("--admin", action="store_true", help="may do anything in every project")
    p.set_defaults(func=cmd_user_add)

    p = sub.add_parser("token-create", help="print a new token for a user")
    _store_args(p)
    p.add_argument("name")
    p.set_defaults(func=cmd_token_create)

    p = sub.add_parser("grant", help="give a user a role in a project")
    _store_args(p)
    p.add_argument("user")
    p.add_argument("project")
    p.add_argument("role", choices=("viewer", "reader", "writer", "owner"))
    p.set_defaults(func=cmd_grant)
    return parser


def _check_store_paths(args: argparse.Namespace) -> None:
    """--db and --artifacts checked before any command opens (or creates) them: a bad path is
    a bad command line (exit 2), not a traceback from the driver or from mkdir."""
    from reference_impls.tracking.artifacts import check_local_root
    from reference_impls.tracking.db import check_sqlite_path

    db = getattr(args, "db", None)
    if db and "://" not in db:
        check_sqlite_path(db)
    elif db and db.startswith("sqlite:///"):
        check_sqlite_path(db.removeprefix("sqlite:///"))
    store = getattr(args, "artifacts", None)
    if store and "://" not in store:
        check_local_root(store)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "url", None):  # through a server, the local paths are not used
        try:
            _check_store_paths(args)
        except TrackingError as exc:
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return 2
    try:
        return int(args.func(args))
    except (TrackingError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
