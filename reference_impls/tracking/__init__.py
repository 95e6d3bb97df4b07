"""Experiment tracking: metadata in SQL, artifacts by sha256, typed search, lineage, a hot
cache, retention and access control through a REST server.

Modules (each docstring says why it is built the way it is):

``schema``/``db``/``migrations``  tables, engines (SQLite WAL or PostgreSQL), Alembic
``metadata``   the metadata store (projects, runs, typed params, metric batches, tags, ...)
``artifacts``  content-addressed stores: local filesystem and S3
``backend``    the embedded backend (metadata + artifacts + cache); ``remote`` the same over HTTP
``client``     ``Tracker``/``Run``: buffered logging flushed off the training thread
``query``      the filter language -> parameterized SQL
``lineage``    forward/backward lineage (recursive CTEs), JSON and Graphviz DOT
``cache``      the byte-bounded LRU hot cache with pinning
``retention``  tiered retention plans, soft delete, collection
``server``     FastAPI server: users, tokens, project roles, the web page
``callback``   the adapter for the training loop
``reports``    storing a ``harness run`` report directory as a run
"""

from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.cache import HotCache
from reference_impls.tracking.client import Run, Tracker
from reference_impls.tracking.errors import (
    ArtifactError,
    FilterError,
    IntegrityError,
    NotFoundError,
    PermissionDeniedError,
    TrackingError,
)
from reference_impls.tracking.metadata import MetadataStore, RunStatus
from reference_impls.tracking.query import parse, search_runs, to_text
from reference_impls.tracking.retention import RetentionPolicy, collect, plan_retention

__all__ = [
    "ArtifactError",
    "EmbeddedBackend",
    "FilterError",
    "HotCache",
    "IntegrityError",
    "MetadataStore",
    "NotFoundError",
    "PermissionDeniedError",
    "RetentionPolicy",
    "Run",
    "RunStatus",
    "Tracker",
    "TrackingError",
    "collect",
    "parse",
    "plan_retention",
    "search_runs",
    "to_text",
]
