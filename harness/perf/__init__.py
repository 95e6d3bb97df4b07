"""Performance: asv runs, the regression gate, the offline dashboard and the ``harness ci`` step.

Library code, no click: ``harness.cli.perf`` is its command line. docs/perf.md is the user
guide (baseline policy, exit codes, the factor); the asv pitfalls this package works around are
recorded in docs/platform.md ("asv (0.6.6) and pytest-benchmark"):

- Validation first: a machine name (also from $HARNESS_PERF_MACHINE) is one plain path
  component, refs never start with "-", regexes compile, the factor can fail; every value
  reaches asv as ``--option=value``.
- Benchmarks always run in the current interpreter (``-E existing:PY``) and ``PY`` is always
  spelled ``os.path.abspath(sys.executable)``: asv derives the environment name from that literal
  path, and results recorded under two spellings never line up.
- ``asv run -E existing`` saves nothing without ``--set-commit-hash``; ``asv continuous``
  refuses existing environments; ``asv compare`` exits 0 whatever it finds. So :func:`gate`
  reads the result files itself, judges each timing benchmark from the confidence interval
  of its ratio (the interval of asv's own Mann-Whitney test at p < 0.002, decision.py) into
  regressed, unchanged, improved or undecided, and turns "undecided" and "nothing
  comparable" into exit code 2 instead of a silent pass.
- The published page loads its JavaScript from CDNs; :func:`publish` fetches the same
  libraries at pinned versions with ``npm pack`` and points the page at local copies.

Its modules (their public names are all importable from ``harness.perf`` itself):

- ``harness.perf._common``: :class:`Project`, :class:`PerfError`, the interpreter and git
  helpers the others share.
- ``harness.perf.runs``: ``asv run`` of one commit (:func:`run_benchmarks`) or of several in
  alternation (:func:`run_interleaved`).
- ``harness.perf.results``: asv's result files, and the pass records that pair base and head
  samples measured in the same alternating pass.
- ``harness.perf.stats``: the gate's statistics (median of per-pass ratios, a stratified
  Mann-Whitney test, the fewest samples that can show a regression).
- ``harness.perf.decision``: the verdict on one timing benchmark (:class:`Verdict`:
  regressed, unchanged, improved, undecided) from the confidence interval of its ratio.
- ``harness.perf.sequential``: more A/B pairs while the verdict is undecided, within a budget.
- ``harness.perf.calibrate``: A/A runs and injected slowdowns (:func:`calibrate`), the record
  the gate reads to refuse a factor a benchmark cannot support.
- ``harness.perf.gating``: the regression gate (:func:`gate`).
- ``harness.perf.gate_report``: what it returns (:class:`GateReport`, :class:`Row`,
  :class:`RowStatus`), as markdown and JSON.
- ``harness.perf.ab``: interleaved A/B timing of base and head, sample by sample
  (:func:`measure_ab`), which decides timing benchmarks when the base is measured in the run.
- ``harness.perf.gpu_ab``: the GPU group's A/B timing (base and head kernels in one process,
  CUDA events, L2 flushed before every call) and Nsight Compute counters per call.
- ``harness.perf.counts``: instruction counts per benchmark call under Valgrind's callgrind
  (:func:`measure_counts`, :func:`judge_counts`): the deterministic tier, confirmed by A/B pairs.
- ``harness.perf.baselines``: which commit is the baseline; the baseline a first run records.
- ``harness.perf.step``: the ``harness ci`` step (:func:`ci_step`, :class:`PerfStepConfig`).
- ``harness.perf.dashboard``: the offline dashboard (:func:`publish`,
  :func:`dashboard_server`).
"""

from __future__ import annotations

from harness.perf._common import (
    DEFAULT_MACHINE,
    MACHINE_ENV_VAR,
    MAX_FACTOR,
    VENDOR_DIR_ENV_VAR,
    Echo,
    PerfError,
    Project,
    check_factor,
    check_machine,
    check_ref,
    check_regex,
    default_machine,
    env_name,
    env_spec,
    python_path,
    resolve_commit,
    resolve_machine,
)
from harness.perf.ab import (
    AB_STARTS,
    DEFAULT_PAIRS,
    DEFAULT_START,
    MAX_AB_PAIRS,
    MAX_SECONDS_PER_BENCHMARK,
    ABResult,
    list_timing_benchmarks,
    measure_ab,
)
from harness.perf.baselines import (
    BASELINE_SEARCH_DEPTH,
    StoredBaseline,
    default_branch_refs,
    find_baseline,
    merge_base,
    other_baselines,
    others_note,
    record_baseline,
    stored_baseline,
)
from harness.perf.calibrate import (
    DEFAULT_SLOWDOWNS,
    DEFAULT_TRIALS,
    BenchmarkCalibration,
    calibrate,
    calibration_path,
    check_factor_supported,
    check_slowdowns,
)
from harness.perf.calibrate import save as calibration_save
from harness.perf.calibrate import shard as calibration_shard
from harness.perf.counts import (
    DEFAULT_COUNT_THRESHOLD,
    CountComparison,
    CountResult,
    CountVerdict,
    check_counts_tools,
    check_threshold,
    judge_counts,
    measure_counts,
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
from harness.perf.decision import Comparison, Verdict, compare
from harness.perf.gate_report import (
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_UNDECIDED,
    STATUS_MARK,
    TOO_FEW_SAMPLES,
    GateReport,
    Row,
    RowStatus,
)
from harness.perf.gating import (
    DEFAULT_FACTOR,
    INFORMATIONAL,
    ab_candidates,
    apply_ab,
    apply_counts,
    gate,
    has_results,
)
from harness.perf.runs import (
    GROUPS,
    MAX_PASSES,
    QUICK_MIN_SAMPLES,
    QUICK_SAMPLES_PER_PASS,
    RunOutcome,
    bench_regex,
    ensure_machine,
    quick_attributes,
    run_benchmarks,
    run_interleaved,
)
from harness.perf.sequential import (
    Sampled,
    SamplerError,
    SamplingPlan,
    ab_strata,
    sample_until_decided,
)
from harness.perf.step import (
    MEASURE_BASE,
    MeasureBase,
    PerfStepConfig,
    PerfStepResult,
    ci_step,
    counts_tier,
)

__all__ = [
    # instruction counts (counts)
    "DEFAULT_COUNT_THRESHOLD",
    "CountComparison",
    "CountResult",
    "CountVerdict",
    "apply_counts",
    "check_counts_tools",
    "check_threshold",
    "counts_tier",
    "judge_counts",
    "measure_counts",
    # errors, project, interpreter and git (_common)
    "DEFAULT_MACHINE",
    "MACHINE_ENV_VAR",
    "VENDOR_DIR_ENV_VAR",
    "Echo",
    "MAX_FACTOR",
    "PerfError",
    "Project",
    "check_factor",
    "check_machine",
    "check_ref",
    "check_regex",
    "default_machine",
    "resolve_machine",
    "env_name",
    "env_spec",
    "python_path",
    "resolve_commit",
    # running benchmarks (runs)
    "GROUPS",
    "MAX_PASSES",
    "QUICK_MIN_SAMPLES",
    "QUICK_SAMPLES_PER_PASS",
    "RunOutcome",
    "bench_regex",
    "ensure_machine",
    "quick_attributes",
    "run_benchmarks",
    "run_interleaved",
    # the gate (gating), baselines (baselines), the `harness ci` step (step)
    "BASELINE_SEARCH_DEPTH",
    "MEASURE_BASE",
    "MeasureBase",
    "PerfStepConfig",
    "RowStatus",
    "StoredBaseline",
    "TOO_FEW_SAMPLES",
    "other_baselines",
    "others_note",
    "record_baseline",
    "stored_baseline",
    "ab_candidates",
    "apply_ab",
    # interleaved A/B timing (ab)
    "AB_STARTS",
    "DEFAULT_PAIRS",
    "DEFAULT_START",
    "MAX_AB_PAIRS",
    "MAX_SECONDS_PER_BENCHMARK",
    "ABResult",
    "measure_ab",
    # the verdict (decision) and sequential sampling (sequential)
    "Comparison",
    "Verdict",
    "compare",
    "Sampled",
    "SamplerError",
    "SamplingPlan",
    "ab_strata",
    "sample_until_decided",
    "EXIT_UNDECIDED",
    "list_timing_benchmarks",
    # the gate measures itself (calibrate)
    "DEFAULT_SLOWDOWNS",
    "DEFAULT_TRIALS",
    "BenchmarkCalibration",
    "calibrate",
    "calibration_path",
    "calibration_save",
    "calibration_shard",
    "check_factor_supported",
    "check_slowdowns",
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
