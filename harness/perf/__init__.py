"""Performance: asv runs, the regression gate, the offline dashboard and the ``harness ci`` step.

Library code, no click: ``harness.cli.perf`` is its command line. docs/perf.md is the user
guide (baseline policy, exit codes, the factor); the asv pitfalls this package works around are
recorded in docs/platform.md ("asv (0.6.6) and pytest-benchmark"):

- Benchmarks always run in the current interpreter (``-E existing:PY``) and ``PY`` is always
  spelled ``os.path.abspath(sys.executable)``: asv derives the environment name from that literal
  path, and results recorded under two spellings never line up.
- ``asv run -E existing`` saves nothing without ``--set-commit-hash``; ``asv continuous``
  refuses existing environments; ``asv compare`` exits 0 whatever it finds. So :func:`gate`
  reads the result files itself and applies asv's own statistical test
  (``asv.commands.compare._is_result_better``: Mann-Whitney U at p < 0.002 on the recorded
  samples, confidence intervals otherwise, then the factor) and turns "nothing comparable"
  into exit code 2 instead of a silent pass.
- The published page loads its JavaScript from CDNs; :func:`publish` fetches the same
  libraries at pinned versions with ``npm pack`` and points the page at local copies.

Its modules (their public names are all importable from ``harness.perf`` itself):

- ``harness.perf._common``: :class:`Project`, :class:`PerfError`, the interpreter and git
  helpers the others share.
- ``harness.perf.runs``: ``asv run`` of one commit (:func:`run_benchmarks`) or of several in
  alternation (:func:`run_interleaved`).
- ``harness.perf.gating``: the regression gate (:func:`gate`), baselines and the
  ``harness ci`` step (:func:`ci_step`).
- ``harness.perf.dashboard``: the offline dashboard (:func:`publish`,
  :func:`dashboard_server`).
"""

from __future__ import annotations

from harness.perf._common import (
    DEFAULT_MACHINE,
    MACHINE_ENV_VAR,
    VENDOR_DIR_ENV_VAR,
    Echo,
    PerfError,
    Project,
    default_machine,
    env_name,
    env_spec,
    python_path,
    resolve_commit,
)

# Private, re-exported for suites/integration/harness/test_dashboard.py (perf._RESOURCE_TAG, ...).
from harness.perf.dashboard import _EXTERNAL_ATTR as _EXTERNAL_ATTR
from harness.perf.dashboard import _RESOURCE_TAG as _RESOURCE_TAG
from harness.perf.dashboard import (
    CDN_ASSETS,
    NPM_PACKAGES,
    NpmPackage,
    dashboard_server,
    fetch_npm_packages,
    make_offline,
    publish,
)
from harness.perf.gating import (
    BASELINE_SEARCH_DEPTH,
    DEFAULT_FACTOR,
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    INFORMATIONAL,
    STATUS_MARK,
    GateReport,
    PerfStepResult,
    Row,
    ci_step,
    default_branch_refs,
    find_baseline,
    gate,
    has_results,
    merge_base,
)
from harness.perf.runs import (
    GROUPS,
    QUICK_MIN_SAMPLES,
    RunOutcome,
    bench_regex,
    ensure_machine,
    quick_attributes,
    run_benchmarks,
    run_interleaved,
)

__all__ = [
    # errors, project, interpreter and git (_common)
    "DEFAULT_MACHINE",
    "MACHINE_ENV_VAR",
    "VENDOR_DIR_ENV_VAR",
    "Echo",
    "PerfError",
    "Project",
    "default_machine",
    "env_name",
    "env_spec",
    "python_path",
    "resolve_commit",
    # running benchmarks (runs)
    "GROUPS",
    "QUICK_MIN_SAMPLES",
    "RunOutcome",
    "bench_regex",
    "ensure_machine",
    "quick_attributes",
    "run_benchmarks",
    "run_interleaved",
    # the gate, baselines, the `harness ci` step (gating)
    "BASELINE_SEARCH_DEPTH",
    "DEFAULT_FACTOR",
    "EXIT_NOT_COMPARABLE",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "INFORMATIONAL",
    "STATUS_MARK",
    "GateReport",
    "PerfStepResult",
    "Row",
    "ci_step",
    "default_branch_refs",
    "find_baseline",
    "gate",
    "has_results",
    "merge_base",
    # the offline dashboard (dashboard)
    "CDN_ASSETS",
    "NPM_PACKAGES",
    "NpmPackage",
    "dashboard_server",
    "fetch_npm_packages",
    "make_offline",
    "publish",
]
