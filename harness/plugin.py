"""The ml-harness pytest plugin: tiers, seeds, determinism, goldens and the quarantine.

Registered through the ``pytest11`` entry point ``harness`` (disable with ``-p no:harness``).
Hooks here are thin: what they do lives in modules that know nothing of pytest
(:mod:`harness.tiers`, :mod:`harness.seeding`, :mod:`harness.goldens`,
:mod:`harness.quarantine`).

Options (``pytest --help``, group "ml-harness"):

``--tier unit,property``        run only these tiers (folders under ``suites/``)
``--harness-seed N|last``       the run's base seed (default ``$HARNESS_SEED``, else random)
``--harness-deterministic``     ``auto`` (on under ``$CI``), ``on`` or ``off``
``--harness-quarantine PATH``   the quarantine file (default ``quarantine.toml`` in the rootdir)
``--harness-update-goldens``    record golden values instead of comparing them
``--harness-json PATH``         write a JSON report of the run (``harness run`` uses it)
``--harness-record-errors[=F]`` record how close every numeric check comes to its bound
``--harness-repeat N``          run every test N times, each with its own seed

Over 500 lines on purpose: pytest finds hooks and fixtures in the module its ``pytest11`` entry
point names, so every hook, fixture and the per-run state they share live here; what they do
lives in the modules above.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from harness import goldens as _goldens
from harness import layout as _layout
from harness import quarantine as _quarantine
from harness import report as _report
from harness import seeding
from harness import tiers as _tiers
from harness import tolerances as _tolerances
from harness.tolerances_evidence import recording as _recording

SEED_CACHE_KEY = "harness/seed"
RECORD_ERRORS_DEFAULT = "reports/tolerance-errors.jsonl"


def is_ci() -> bool:
    """True when ``$CI`` is set to anything but an explicit false value (GitHub sets ``true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclasses.dataclass
class TestRecord:
    """What the run learned about one test, across its setup/call/teardown reports."""

    nodeid: str
    tier: str | None
    seed: int | None
    outcome: str = "passed"
    duration_s: float = 0.0
    call_s: float = 0.0
    """The call phase alone: what the tier's budget is checked against (set-up and tear-down
    include shared fixtures, whose cost lands on whichever test comes first or last)."""
    message: str | None = None
    longrepr: str | None = None
    quarantine: dict[str, str] | None = None


@dataclasses.dataclass
class HarnessState:
    rootpath: Path
    suites_dir: Path
    goldens_dir: Path
    tiers: dict[str, _tiers.Tier]
    selected: list[str]
    seed: int
    seed_source: str
    deterministic: bool
    ci: bool
    quarantine_path: Path
    quarantine: list[_quarantine.Entry]
    quarantine_problems: list[str]
    hypothesis_profile: str | None
    update_goldens: bool
    check_recorder: _recording.CheckRecorder | None = None
    hypothesis_forced: bool | None = None
    untiered_dirs: list[Path] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.time)
    determinism_applied: bool = False
    interrupted: bool = False
    """Set when the run was stopped by Ctrl-C (KeyboardInterrupt): its report says aborted."""
    tier_skips: dict[str, str | None] = dataclasses.field(default_factory=dict)
    records: dict[str, TestRecord] = dataclasses.field(default_factory=dict)
    golden_files: dict[Path, _goldens.GoldenFile] = dataclasses.field(default_factory=dict)
    golden_events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)


STATE = pytest.StashKey[HarnessState]()
TIER = pytest.StashKey[str | None]()
QUARANTINED = pytest.StashKey[_quarantine.Entry]()


# --------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    # Profiles must exist before hypothesis's own pytest_configure loads --hypothesis-profile,
    # and plugin configure order is not ours to choose: addoption runs before any configure.
    # With the package's hypothesis entry point installed, hypothesis registers them itself
    # when it is first imported (harness.seeding.on_hypothesis_import), so a run that never
    # uses hypothesis does not import it (over a second per pytest process).
    if "hypothesis" in sys.modules or not seeding.hypothesis_hook_installed():
        seeding.register_hypothesis_profiles()
    group = parser.getgroup("harness", "ml-harness: tiers, seeds, goldens, quarantine")
    group.addoption(
        "--tier",
        action="append",
        dest="harness_tiers",
        default=[],
        metavar="TIER[,TIER]",
        help="run only these tiers (folders under the suites dir); comma-separated or "
        "repeated. Default: every tier.",
    )
    group.addoption(
        "--harness-seed",
        dest="harness_seed",
        default=None,
        metavar="N|last|random",
        help="base seed of the run; 'last' replays the previous run's. "
        "Default: $HARNESS_SEED if set, else a new random seed (printed in the header).",
    )
    group.addoption(
        "--harness-deterministic",
        dest="harness_deterministic",
        choices=("auto", "on", "off"),
        default="auto",
        help="torch deterministic algorithms, cuDNN flags and CUBLAS_WORKSPACE_CONFIG. "
        "Default: auto (on when $CI is set).",
    )
    group.addoption(
        "--harness-quarantine",
        dest="harness_quarantine",
        default=None,
        metavar="PATH",
        help="the quarantine file. Default: quarantine.toml in the rootdir.",
    )
    group.addoption(
        "--harness-update-goldens",
        action="store_true",
        dest="harness_update_goldens",
        default=False,
        help="record the values of golden checks instead of comparing them; review the "
        "changed files under the goldens dir and commit them. Default: off.",
    )
    group.addoption(
        "--harness-json",
        dest="harness_json",
        default=None,
        metavar="PATH",
        help="write a JSON report of the run (tests, tiers, seed, quarantine, environment) "
        "to PATH. Default: none.",
    )
    group.addoption(
        "--harness-no-fingerprint",
        action="store_true",
        dest="harness_no_fingerprint",
        default=False,
        help="leave the environment fingerprint out of the JSON report (it imports torch to "
        "ask about CUDA, ~1-2 s; the flake hunter's many short runs skip it). Default: off.",
    )
    group.addoption(
        "--harness-record-errors",
        dest="harness_record_errors",
        nargs="?",
        const=RECORD_ERRORS_DEFAULT,
        default=None,
        metavar="FILE",
        help="append, per test and per assert_close/golden call site, the largest absolute and "
        "relative error and the share of the bound used to FILE (JSON lines; default "
        f"{RECORD_ERRORS_DEFAULT}); read by `harness tolerances propose`. Default: off.",
    )
    group.addoption(
        "--harness-repeat",
        dest="harness_repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every test N times, as N parametrizations [repeatK], each with its own "
        "seed (a seed sweep in one process, for `harness tolerances propose`). Default: 1.",
    )
    # The defaults live in harness.layout, which also reads [tool.harness] (a table pytest
    # never reads, so teammates without the plugin get no "Unknown config option" warning).
    parser.addini(
        "harness_suites_dir",
        "folder whose subfolders are the tiers, relative to the rootdir (default: "
        "[tool.harness] suites_dir, else suites)",
        default="",
    )
    parser.addini(
        "harness_untiered_dirs",
        "folders, relative to the rootdir, whose test files belong to no tier and run only when "
        "named (asv's and pytest-benchmark's); any other test file outside the tier folders "
        "is a collection error (default: <suites dir>/benchmarks)",
        type="linelist",
        default=[],
    )
    parser.addini(
        "harness_goldens_dir",
        "folder for golden files, relative to the rootdir (default: <suites dir>/goldens)",
        default="",
    )


# --------------------------------------------------------------------------- configure


def _resolve_seed(config: pytest.Config) -> tuple[int, str]:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "harness_seed" in workerinput:
        return int(workerinput["harness_seed"]), "controller"
    raw = config.getoption("harness_seed")
    source = "--harness-seed"
    if raw is None and os.environ.get("HARNESS_SEED"):
        raw, source = os.environ["HARNESS_SEED"], "$HARNESS_SEED"
    if raw is None or raw == "random":
        return seeding.new_base_seed(), "random"
    if raw == "last":
        cache = getattr(config, "cache", None)
        cached = cache.get(SEED_CACHE_KEY, None) if cache is not None else None
        if cached is None:
            raise pytest.UsageError(
                "--harness-seed=last: no previous seed is recorded in the pytest cache "
                "(.pytest_cache); pass the seed printed in the earlier run's header instead"
            )
        # The cache is a file anyone can edit or damage: check what it holds like any input.
        valid = isinstance(cached, int) and not isinstance(cached, bool)
        if not valid or not 0 <= cached < 2**seeding.SEED_BITS:
            raise pytest.UsageError(
                f"--harness-seed=last: the seed recorded in the pytest cache "
                f"(.pytest_cache/v/{SEED_CACHE_KEY}) is {cached!r}, not an integer in "
                "[0, 2**32); pass the seed printed in the earlier run's header, or clear the "
                "cache with --cache-clear"
            )
        return cached, "last run"
    try:
        return seeding.parse_seed(raw), source
    except ValueError as exc:
        raise pytest.UsageError(f"{source}: {exc}; or 'last', or 'random'") from None


def _selected_tiers(config: pytest.Config, tiers: dict[str, _tiers.Tier]) -> list[str]:
    names = []
    for opt in config.getoption("harness_tiers"):
        parts = [n.strip() for n in opt.split(",")]
        if not all(parts):
            # ',,,' must not mean "no tier named, so every tier": that runs what nobody chose.
            raise pytest.UsageError(
                f"--tier {opt!r} has an empty tier name; give names separated by commas, "
                f"e.g. --tier unit,property (known tiers: {', '.join(tiers)})"
            )
        names += parts
    unknown = [n for n in names if n not in tiers]
    if unknown:
        raise pytest.UsageError(
            f"--tier: unknown tier(s) {', '.join(unknown)}; known tiers: {', '.join(tiers)}"
        )
    return list(dict.fromkeys(names))


def _load_hypothesis_profile(config: pytest.Config, ci: bool, seed: int) -> str | None:
    """The hypothesis profile of the run (``harness.seeding.load_hypothesis_profile``); a bad
    ``$HYPOTHESIS_PROFILE`` is a usage error.

    When hypothesis is not imported yet and the profile is one of the harness's own (no
    ``--hypothesis-profile``, no ``$HYPOTHESIS_PROFILE``), loading it waits for hypothesis's
    first import (its entry-point hook runs before any test module builds settings), so the
    examples are the same as if it were loaded now; the name is returned either way."""
    given = config.getoption("hypothesis_profile", None)
    force_seed = config.getoption("hypothesis_seed", None) is None
    if (
        "hypothesis" not in sys.modules
        and given is None
        and not os.environ.get("HYPOTHESIS_PROFILE")
        and importlib.util.find_spec("hypothesis") is not None
        and seeding.hypothesis_hook_installed()
    ):
        seeding.defer_hypothesis_profile(
            lambda: seeding.load_hypothesis_profile(None, ci=ci, seed=seed, force_seed=force_seed)
        )
        return seeding.hypothesis_profile_name(None, ci=ci)
    if "hypothesis" not in sys.modules and importlib.util.find_spec("hypothesis") is not None:
        import hypothesis  # noqa: F401  # to check $HYPOTHESIS_PROFILE now; registers profiles
    try:
        return seeding.load_hypothesis_profile(given, ci=ci, seed=seed, force_seed=force_seed)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_unconfigure(config: pytest.Config) -> None:
    seeding.defer_hypothesis_profile(None)  # a later in-process run defers its own


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*needs): skip unless every need is met (harness.tiers)"
    )
    config.addinivalue_line("markers", "quarantined: set by the harness on quarantined tests")
    rootpath = config.rootpath
    try:
        ini = {f"harness_{k}": config.getini(f"harness_{k}") for k in _layout.KEYS}
        layout = _layout.read_at(rootpath, config.inipath, ini=ini)
        tiers = _tiers.project_tiers(rootpath, config.inipath)
    except (_layout.LayoutError, _tiers.TierConfigError) as exc:
        raise pytest.UsageError(str(exc)) from None
    for name, tier in tiers.items():
        config.addinivalue_line("markers", f"{name}: {tier.description} (set from the folder)")
    selected = _selected_tiers(config, tiers)
    ci = is_ci()
    seed, seed_source = _resolve_seed(config)
    if getattr(config, "cache", None) is not None and not hasattr(config, "workerinput"):
        config.cache.set(SEED_CACHE_KEY, seed)
    mode = config.getoption("harness_deterministic")
    qpath = config.getoption("harness_quarantine")
    quarantine_path = Path(qpath) if qpath else rootpath / "quarantine.toml"
    if qpath and not quarantine_path.exists():
        raise pytest.UsageError(f"--harness-quarantine: {quarantine_path} does not exist")
    try:
        entries = _quarantine.load(quarantine_path)
    except _quarantine.QuarantineError as exc:
        what = "bad" if quarantine_path.is_dir() else "malformed"
        raise pytest.UsageError(f"{what} quarantine file: {exc}") from None
    json_path = config.getoption("harness_json")
    if json_path and not hasattr(config, "workerinput"):
        _check_report_path(Path(json_path))
    config.stash[STATE] = HarnessState(
        rootpath=rootpath,
        suites_dir=rootpath / layout.suites_dir,
        goldens_dir=rootpath / layout.goldens_dir,
        tiers=tiers,
        selected=selected,
        seed=seed,
        seed_source=seed_source,
        deterministic=mode == "on" or (mode == "auto" and ci),
        ci=ci,
        quarantine_path=quarantine_path,
        quarantine=entries,
        quarantine_problems=_quarantine.problems(
            entries, rootpath, quarantine_path, dt.date.today()
        ),
        hypothesis_profile=_load_hypothesis_profile(config, ci, seed),
        update_goldens=config.getoption("harness_update_goldens"),
        untiered_dirs=[rootpath / p for p in layout.untiered_dirs],
    )
    if config.stash[STATE].deterministic:
        # Must be in the environment before CUDA initialises; the torch switches are applied
        # lazily at the first test that runs with torch imported (import costs over a second).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", seeding.CUBLAS_WORKSPACE_CONFIG)
    config.stash[STATE].check_recorder = _check_recorder(config, rootpath, seed)
    config.pluginmanager.register(Recorder(config.stash[STATE]), "harness-recorder")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "harness-xdist")


def _check_recorder(
    config: pytest.Config, rootpath: Path, seed: int
) -> _recording.CheckRecorder | None:
    """The observer of every numeric check, when errors are recorded or bounds overridden."""
    if config.getoption("harness_repeat") < 1:
        raise pytest.UsageError(
            f"--harness-repeat {config.getoption('harness_repeat')}: give a count >= 1"
        )
    record = config.getoption("harness_record_errors")
    overrides_path = os.environ.get(_recording.OVERRIDES_ENV)
    if record is None and not overrides_path:
        return None
    overrides = None
    if overrides_path:
        try:
            overrides = _recording.load_overrides(Path(overrides_path))
        except _recording.OverrideError as exc:
            raise pytest.UsageError(str(exc)) from None
    path = None
    if record is not None:
        path = Path(record) if Path(record).is_absolute() else rootpath / record
        if path.is_dir():
            raise pytest.UsageError(f"--harness-record-errors {record} is a directory")
    recorder = _recording.CheckRecorder(path, rootpath, seed, overrides)
    previous = _tolerances.set_observer(recorder)

    def restore() -> None:
        _tolerances.set_observer(previous)

    config.add_cleanup(restore)
    return recorder


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    count = metafunc.config.getoption("harness_repeat", 1)
    if count > 1:
        metafunc.fixturenames.append("_harness_repeat")
        metafunc.parametrize(
            "_harness_repeat", range(count), indirect=True, ids=lambda i: f"repeat{i}"
        )


@pytest.fixture
def _harness_repeat(request: pytest.FixtureRequest) -> int:
    """The index of this run under ``--harness-repeat`` (its node id carries ``repeatK``)."""
    return int(request.param)


def _check_report_path(path: Path) -> None:
    """Fail at start-up, not after the whole run, when the JSON report cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise pytest.UsageError(
            f"--harness-json {path}: cannot create its folder {path.parent} ({why}); "
            "give a path in a writable folder"
        ) from None
    if path.is_dir():
        raise pytest.UsageError(f"--harness-json {path} is a directory; give a file path")


class XdistHooks:
    """Registered only when pytest-xdist is present: every worker gets the controller's seed."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["harness_seed"] = node.config.stash[STATE].seed


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash[STATE]
    det = "on" if state.deterministic else "off"
    lines = [
        f"harness: seed {state.seed} ({state.seed_source}; "
        f"replay with --harness-seed={state.seed}),"
        f" deterministic mode {det}{' (CI)' if state.ci else ''}"
        + (f", hypothesis profile {state.hypothesis_profile}" if state.hypothesis_profile else ""),
        f"harness: tiers {', '.join(state.selected) if state.selected else 'all'}"
        f" (of {', '.join(state.tiers)}); quarantine {_rel(state.quarantine_path, state.rootpath)}"
        f" ({len(state.quarantine)} entries)",
    ]
    return lines


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- collection


def _tier_of(state: HarnessState, path: Path) -> str | None:
    """The folder named after a tier directly under the suites folder, else the tier whose
    ``paths`` match the file most specifically (harness.tiers.Tier.paths)."""
    try:
        first = path.relative_to(state.suites_dir).parts[0]
    except (ValueError, IndexError):
        first = None
    if first in state.tiers:
        return first
    return _tiers.tier_by_paths(state.tiers, _rel(path, state.rootpath))


def _untiered_problem(state: HarnessState, path: Path) -> str | None:
    """Why the test file ``path`` must not be collected, or None when it may be.

    In a project with tier folders, a test file outside them would be deselected by every
    ``--tier`` selection (``harness run`` and ``harness ci`` make one), so a failing test in a
    misspelled folder (``suites/unti/``) or directly under ``suites/`` would never run and
    the run would pass. Instead collecting it is an error that names the file. Folders listed
    in ``harness_untiered_dirs`` (asv and pytest-benchmark code) are exempt.
    """
    if not state.suites_dir.is_dir() or _tier_of(state, path) is not None:
        return None
    if any(path.is_relative_to(folder) for folder in state.untiered_dirs):
        return None
    suites = _rel(state.suites_dir, state.rootpath)
    folders = ", ".join(f"{suites}/{name}/" for name in state.tiers)
    return (
        f"{_rel(path, state.rootpath)} is not in a tier folder, so no --tier selection would "
        f"run its tests: move it into one of {folders}, or give a tier the paths that hold "
        "it without moving it ([tool.harness.tiers.NAME] paths = [...]; `harness init` "
        "writes one for an existing tests folder)"
    )


class UntieredModule(pytest.Module):
    """A test file outside every tier folder: collecting it fails, naming the file and the fix
    (the file is not even imported)."""

    harness_problem = ""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        raise self.CollectError(self.harness_problem)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> Any:
    state = parent.config.stash.get(STATE, None)
    problem = _untiered_problem(state, module_path) if state is not None else None
    if problem is None:
        return None
    module = UntieredModule.from_parent(parent, path=module_path)
    module.harness_problem = problem
    return module


def _tier_skip_reason(state: HarnessState, tier: str) -> str | None:
    if tier not in state.tier_skips:
        missing = _tiers.missing_needs(state.tiers[tier].needs)
        state.tier_skips[tier] = f"tier {tier} skipped: {'; '.join(missing)}" if missing else None
    return state.tier_skips[tier]


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    state = config.stash[STATE]
    keep, drop = [], []
    for item in items:
        tier = _tier_of(state, item.path)
        item.stash[TIER] = tier
        if state.selected and tier not in state.selected:
            drop.append(item)
            continue
        keep.append(item)
        if tier is not None:
            item.add_marker(tier)
            reason = _tier_skip_reason(state, tier)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
        for mark in item.iter_markers("needs"):
            missing = _tiers.missing_needs(mark.args)
            if missing:
                item.add_marker(pytest.mark.skip(reason="; ".join(missing)))
        entry = _quarantine.find(state.quarantine, item.nodeid)
        if entry is not None:
            item.stash[QUARANTINED] = entry
            item.add_marker(pytest.mark.quarantined)
        seeding.nightly_examples(getattr(item, "obj", None), state.hypothesis_profile)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --------------------------------------------------------------------------- running


def _test_seed(state: HarnessState, nodeid: str) -> int:
    return seeding.node_seed(state.seed, nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Seed before fixtures are set up, so fixtures that draw random numbers are seeded too."""
    state = item.config.stash[STATE]
    if state.deterministic and not state.determinism_applied and "torch" in sys.modules:
        seeding.enable_determinism()
        state.determinism_applied = True
    seed = _test_seed(state, item.nodeid)
    seeding.seed_everything(seed)
    if state.check_recorder is not None:
        state.check_recorder.start(item.nodeid, seed)
    if item.config.getoption("harness_repeat") > 1 and "hypothesis" in sys.modules:
        # hypothesis's forced seed is the run's base seed, the same for every repeat: a seed
        # sweep must give each repeat its own examples too.
        import hypothesis.core

        if state.hypothesis_forced is None:  # forced by us (not --hypothesis-seed)?
            state.hypothesis_forced = hypothesis.core.global_force_seed == state.seed
        if state.hypothesis_forced:
            hypothesis.core.global_force_seed = seed  # type: ignore[assignment]  # typed None
    # user_properties travel into JUnit XML (written from the teardown report).
    item.user_properties += [
        ("harness_tier", item.stash.get(TIER, None) or "-"),
        ("harness_seed", seed),
    ]


def repro_command(state: HarnessState, nodeid: str) -> str:
    """A copy-pasteable command that runs one test again with the run's seed and mode."""
    parts = ["pytest", shlex.quote(nodeid), f"--harness-seed={state.seed}"]
    if state.deterministic and not state.ci:
        parts.append("--harness-deterministic=on")
    return " ".join(parts)


def _crash_message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0] if crash.message else ""
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def _quarantine_info(entry: _quarantine.Entry) -> dict[str, Any]:
    """What a report carries about the entry (plain strings: it crosses xdist's wire)."""
    return {"reason": entry.reason, "issue": entry.issue, "expires": entry.expires.isoformat()}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # The harness_* attributes ride on the report's __dict__, which pytest-xdist serialises
    # from the workers; they are read back with getattr(report, "harness_...", None).
    report: pytest.TestReport = yield
    state = item.config.stash[STATE]
    extra = vars(report)
    extra["harness_tier"] = item.stash.get(TIER, None)
    extra["harness_seed"] = _test_seed(state, item.nodeid)
    entry = item.stash.get(QUARANTINED, None)
    if report.failed:
        report.sections.append(("harness: reproduce with", repro_command(state, item.nodeid)))
        if entry is not None:
            # Quarantine turns the failure into a reported, non-gating outcome. The failure
            # text is kept for the summary and the reports: quarantine hides nothing.
            message = _crash_message(report)
            extra["harness_quarantine"] = {
                **_quarantine_info(entry),
                "failure": message,
                "longrepr": str(report.longrepr),
            }
            report.outcome = "skipped"
            report.wasxfail = f"quarantined ({entry.issue}): {entry.reason}; failed: {message}"
            item.user_properties.append(("harness_quarantined", f"failed in {report.when}"))
    elif entry is not None and report.when == "call" and report.passed:
        extra["harness_quarantine"] = {**_quarantine_info(entry), "failure": None}
        item.user_properties.append(("harness_quarantined", "passed"))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    """Append the test's recorded check errors once its fixtures are torn down."""
    try:
        return (yield)
    finally:
        recorder = item.config.stash[STATE].check_recorder
        if recorder is not None:
            recorder.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    q = getattr(report, "harness_quarantine", None)
    if q and q.get("failure") is not None and report.skipped:
        return "quarantined", "Q", ("QUARANTINED", {"yellow": True})
    return None


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        reason = report.longrepr[2]
        return reason[len("Skipped: ") :] if reason.startswith("Skipped: ") else reason
    return str(report.longrepr or "")


class Recorder:
    """Collects per-test records from reports (registered per config in pytest_configure;
    ``pytest_runtest_logreport`` gets no config, so the state travels with this object).
    Under xdist it runs on the controller, which receives every worker's reports."""

    def __init__(self, state: HarnessState) -> None:
        self.state = state

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        # pytest also stops "interrupted" after collection errors and on pytest.exit(): those
        # runs finished what they could and fail as usual; only Ctrl-C aborts one.
        if isinstance(excinfo.value, KeyboardInterrupt) and not isinstance(
            excinfo.value, pytest.Session.Interrupted
        ):
            self.state.interrupted = True

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A file that failed to collect is a gating error in the reports too (JSON, summary),
        not only in pytest's terminal output."""
        if not report.failed:
            return
        longrepr = str(report.longrepr)
        lines = [line for line in longrepr.strip().splitlines() if line.strip()]
        self.state.records[report.nodeid] = TestRecord(
            nodeid=report.nodeid,
            tier=None,
            seed=None,
            outcome="error",
            message=lines[-1].strip() if lines else "collection failed",
            longrepr=longrepr,
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        records = self.state.records
        record = records.get(report.nodeid)
        if record is None:
            record = records[report.nodeid] = TestRecord(
                nodeid=report.nodeid,
                tier=getattr(report, "harness_tier", None),
                seed=getattr(report, "harness_seed", None),
            )
        record.duration_s += report.duration
        if report.when == "call":
            record.call_s = report.duration
        quarantine = getattr(report, "harness_quarantine", None)
        if quarantine is not None:
            record.quarantine = quarantine
        if record.outcome in ("failed", "error", "quarantined"):
            return  # the first bad outcome of a test is the one that counts
        if quarantine is not None and quarantine.get("failure") is not None:
            record.outcome = "quarantined"
            record.message = quarantine["failure"]
            record.longrepr = quarantine.get("longrepr")
        elif report.failed:
            record.outcome = "failed" if report.when == "call" else "error"
            record.message = _crash_message(report)
            record.longrepr = str(report.longrepr)
        elif report.skipped:
            if hasattr(report, "wasxfail"):
                record.outcome, record.message = "xfailed", report.wasxfail
            else:
                record.outcome, record.message = "skipped", _skip_reason(report)
        elif report.when == "call" and hasattr(report, "wasxfail"):
            record.outcome, record.message = "xpassed", report.wasxfail


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """This test's seed: derived from the run's base seed and the test's node id.

    ``random``, NumPy's global RNG and torch are already seeded with it before the test runs;
    use it to seed anything else (a ``torch.Generator``, a DataLoader, a subprocess).
    """
    return _test_seed(request.config.stash[STATE], request.node.nodeid)


@pytest.fixture
def rng(seed: int) -> Any:
    """A ``numpy.random.Generator`` seeded with this test's seed."""
    import numpy

    return numpy.random.default_rng(seed)


class Golden:
    """The ``golden`` fixture: ``golden.check(name, value, rtol=..., atol=...)``."""

    def __init__(self, state: HarnessState, file: _goldens.GoldenFile, nodeid: str, key: str):
        self._state, self._file, self._nodeid, self._key = state, file, nodeid, key

    @property
    def path(self) -> Path:
        return self._file.path

    def check(self, name: str, value: object, *, rtol: float, atol: float) -> None:
        """Compare ``value`` (a number or a list of numbers) with the recorded golden ``name``.

        Both ``rtol`` and ``atol`` are required: the band is part of the claim, so say next to
        the call why it is as wide as it is.
        """
        observer = _tolerances.get_observer()
        if observer is not None and not self._state.update_goldens:
            recorded = self._file.get(self._key, name)
            stored = recorded.get("value") if isinstance(recorded, dict) else None
            if _goldens._is_golden_value(stored):
                given = observer(
                    "golden",
                    _as_array(_goldens._as_floats(name, value)),
                    _as_array(stored),
                    float(rtol),
                    float(atol),
                    False,
                )
                if given is not None:
                    rtol, atol = given
        result = self._file.check(
            self._key,
            name,
            value,
            rtol=rtol,
            atol=atol,
            update=self._state.update_goldens,
            ci=self._state.ci,
        )
        if result.action != "matched":
            self._state.golden_events.append((self._nodeid, result.action, name))


def _as_array(value: float | list[float]) -> Any:
    import numpy

    return numpy.asarray(value, dtype=numpy.float64)


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    """Recorded reference numbers with a tolerance band (see :mod:`harness.goldens`)."""
    state = request.config.stash[STATE]
    path = Path(request.node.path)
    try:
        rel = path.relative_to(state.suites_dir)
    except ValueError:
        rel = (
            path.relative_to(state.rootpath)
            if path.is_relative_to(state.rootpath)
            else Path(path.name)
        )
    file_path = state.goldens_dir / rel.with_suffix(".json")
    file = state.golden_files.setdefault(file_path, _goldens.GoldenFile(file_path))
    # Under --harness-repeat every run of a test checks the one golden of the test.
    nodeid = _recording.base_test_id(request.node.nodeid)
    key = nodeid.split("::", 1)[1] if "::" in nodeid else request.node.name
    return Golden(state, file, request.node.nodeid, key)


# --------------------------------------------------------------------------- the end


def _over_budget(state: HarnessState) -> list[tuple[TestRecord, float]]:
    out = []
    for record in state.records.values():
        tier = state.tiers.get(record.tier or "")
        if tier and tier.budget_s is not None and record.call_s > tier.budget_s:
            out.append((record, tier.budget_s))
    return sorted(out, key=lambda rb: -rb[0].call_s)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or hasattr(config, "workerinput"):
        return
    tr = terminalreporter
    records = list(state.records.values())
    quarantined = [r for r in records if r.outcome == "quarantined"]
    q_passed = [
        r
        for r in records
        if r.quarantine and r.quarantine.get("failure") is None and r.outcome == "passed"
    ]
    failed = [r for r in records if r.outcome in ("failed", "error")]
    if quarantined:
        tr.write_sep(
            "=", f"harness: {len(quarantined)} quarantined failure(s) (not gating)", yellow=True
        )
        for r in quarantined:
            q = r.quarantine or {}
            tr.write_sep("_", r.nodeid, yellow=True)
            tr.write_line(
                f"quarantined until {q.get('expires')}: {q.get('reason')} ({q.get('issue')})"
            )
            if r.longrepr:
                tr.write_line(r.longrepr)
    if q_passed:
        tr.write_sep("=", "harness: quarantined tests that passed", green=True)
        for r in q_passed:
            tr.write_line(
                f"{r.nodeid}: passed while quarantined; remove its entry once it is fixed"
            )
    if state.quarantine_problems:
        tr.write_sep("=", "harness: quarantine problems (these fail the run)", red=True, bold=True)
        for problem in state.quarantine_problems:
            tr.write_line(problem, red=True)
    over = _over_budget(state)
    if over:
        tr.write_sep(
            "=", f"harness: {len(over)} test(s) over their tier's time budget", yellow=True
        )
        for record, budget in over:
            tr.write_line(f"{record.call_s:7.2f}s > {budget:g}s  {record.nodeid}")
    if state.golden_events:
        tr.write_sep("=", "harness: goldens written (review and commit)", yellow=True)
        for nodeid, action, name in state.golden_events:
            tr.write_line(f"{action} {name!r} for {nodeid}")
    if failed:
        tr.write_sep("=", f"harness: reproduce failures (seed {state.seed})", red=True)
        for r in failed:
            tr.write_line(repro_command(state, r.nodeid))
    tr.write_line(f"harness: seed {state.seed}; replay this run with --harness-seed={state.seed}")


HYPOTHESIS_PLUGIN = "hypothesispytest"
"""The name hypothesis's pytest plugin is registered under (its pytest11 entry point)."""


def _skip_unused_hypothesis_summary(config: pytest.Config) -> None:
    """Hypothesis's pytest plugin imports hypothesis in its terminal summary even when no
    test used it, over a second at the end of every pytest process (a flake hunt runs
    several). When hypothesis was never imported that summary has nothing to say (no
    statistics, no failing examples, no observations), so the plugin is dropped before it;
    with ``--hypothesis-show-statistics`` it stays, to print its (empty) section as asked."""
    if "hypothesis" in sys.modules:
        return
    plugin = config.pluginmanager.get_plugin(HYPOTHESIS_PLUGIN)
    if plugin is None or config.getoption("--hypothesis-show-statistics", False):
        return
    config.pluginmanager.unregister(plugin)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    _skip_unused_hypothesis_summary(config)
    state = config.stash.get(STATE, None)
    if state is None:
        return
    for file in state.golden_files.values():
        file.save()
    if hasattr(config, "workerinput"):
        return
    if state.quarantine_problems and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    path = config.getoption("harness_json")
    if path:
        _report.write_json_report(
            Path(path),
            state,
            int(session.exitstatus),
            over_budget={record.nodeid for record, _ in _over_budget(state)},
            repro=functools.partial(repro_command, state),
            fingerprint=not config.getoption("harness_no_fingerprint"),
        )
