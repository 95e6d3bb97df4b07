"""The GitHub workflows (.github/workflows) checked offline, and the sharded jobs run for real.

Static checks: GitHub's workflow schema (check-jsonschema), act's strict schema, actionlint and
zizmor, all offline. Consistency: every remote action is pinned to a commit SHA, and every one
that needs the network is mapped in .actrc to a committed no-op stub and skipped under act.
Dynamic: act in host mode (no Docker) runs a throwaway workflow to prove that a failing step is
seen as a failed job, then runs ci.yml's sharded unit+property jobs and their merge exactly as
.actrc configures them, on a tiny project of eight tests, and requires ``jobResult ==
"success"`` (act exits 0 for skipped jobs too, so the exit code is not enough).

The tools come with requirements/cpu.lock; docs/ci.md gives the same commands to run by hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

# act runs ci.yml's shard jobs, whose steps run `harness` and so pytest with the plugin: the
# pull-request selection cannot see that through an import (harness/selection.py).
RUNS_PYTEST = True
ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = ROOT / ".github" / "workflows"
# The reusable workflows other repositories call (on: workflow_call), checked like this
# repository's own.
REUSABLE_FILES = (
    WORKFLOWS / "harness-tiers.yml",
    WORKFLOWS / "harness-perf.yml",
    WORKFLOWS / "harness-nightly.yml",
)
WORKFLOW_FILES = (WORKFLOWS / "ci.yml", WORKFLOWS / "nightly.yml", *REUSABLE_FILES)
ADOPTING = ROOT / "docs" / "adopting.md"
STUBS = ROOT / ".github" / "act-stubs"
ACTRC = ROOT / ".actrc"

CI_JOBS = {
    "lint",
    "unit-property",
    "unit-property-merge",
    "pr-fast",
    "integration",
    "distributed",
    "gpu",
    "report",
}
NIGHTLY_JOBS = {"flake-hunt", "property-nightly", "mutation", "perf-calibrate", "perf-group-aa"}
REUSABLE_JOBS = {
    "harness-tiers.yml": {"tiers-plan", "tiers-shard", "tiers-merge", "tiers-gpu"},
    "harness-perf.yml": {"perf-gate"},
    "harness-nightly.yml": {"nightly-flake-hunt"},
}

# act copies the tiny project per job and links the venv, then each shard job starts `harness
# env check` and pytest (a few seconds each on an idle machine, both at once); the merge job
# follows. 10 minutes is ~20x that, room for a runner at load 7, and still well under the jobs'
# own timeout-minutes (30 and 20), which a hang would otherwise run into.
SHARDED_JOBS_TIMEOUT_S = 10 * 60

# act launched from inside act (ACT=true) would run this very test again, without end.
under_act = pytest.mark.skipif(
    bool(os.environ.get("ACT")), reason="running under act (ACT is set): act must not launch itself"
)


def tool(name: str) -> str:
    """The executable from this interpreter's venv (requirements/cpu.lock), else from PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} is not in {candidate.parent} nor on PATH: requirements/cpu.lock "
            "installs it (make venv)"
        )
    return found


def run(
    args: list[str], *, cwd: Path = ROOT, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # stdin is closed so that act, missing an option, dies at its prompt instead of hanging.
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def output_of(proc: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}"
    )


def load_workflow(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def remote_steps(path: Path) -> list[tuple[str, dict]]:
    """(job id, step) for every step of the workflow that uses a remote action."""
    steps = []
    for job_id, job in load_workflow(path)["jobs"].items():
        for step in job.get("steps", []):
            uses = step.get("uses", "")
            if uses and not uses.startswith(("./", "docker://")):
                steps.append((job_id, step))
    return steps


def actrc_local_repositories() -> dict[str, Path]:
    """``owner/name@ref`` -> folder, from the --local-repository lines of .actrc."""
    mappings = {}
    for line in ACTRC.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"--local-repository\s+(\S+?)=(\S+)", line.strip())
        if match:
            mappings[match.group(1)] = ROOT / match.group(2)
    return mappings


def act_env() -> dict[str, str]:
    """The environment for act: this process's, minus what would leak into the job.

    In host mode every step inherits act's environment. A job must see what a fresh runner
    sees, not this pytest run: no activated venv on PATH, no pytest or harness settings, no
    GitHub variables of an enclosing workflow run (act sets its own).
    """
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTEST_", "HARNESS_", "HYPOTHESIS_", "GITHUB_", "RUNNER_"))
        and key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "ACT")
    }
    env["PATH"] = os.pathsep.join(
        part for part in env.get("PATH", "").split(os.pathsep) if part and part != venv_bin
    )
    return env


def act_events(stdout: str) -> list[dict]:
    """The JSON log lines of ``act --json`` (other lines are skipped)."""
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def job_results(events: list[dict]) -> dict[str, str]:
    """job id -> jobResult ("success", "failure", ...) for every job act finished."""
    return {event["jobID"]: event["jobResult"] for event in events if "jobResult" in event}


def job_log(events: list[dict], job_id: str, tail: int = 60) -> str:
    """The failed steps and the last lines they printed, for a failure message."""
    failed = [
        event.get("step", "?")
        for event in events
        if event.get("jobID") == job_id and event.get("stepResult") == "failure"
    ]
    lines = [
        event.get("msg", "").rstrip("\n")
        for event in events
        if event.get("jobID") == job_id
        and (event.get("step") in failed or not failed)
        and (event.get("raw_output") or event.get("level") == "error")
    ]
    return f"failed steps: {failed}\n--- their last {tail} lines\n" + "\n".join(lines[-tail:])


def act_list(event: str | None = None) -> dict[str, str]:
    """job id -> workflow file, from ``act -l [EVENT]``."""
    proc = run([tool("act"), "-l", *([event] if event else [])])
    assert proc.returncode == 0, output_of(proc)
    rows = [re.split(r"\s{2,}", line.strip()) for line in proc.stdout.splitlines()]
    header = next((row for row in rows if row[:2] == ["Stage", "Job ID"]), None)
    assert header is not None, f"no job table in act -l output\n{output_of(proc)}"
    at_id, at_file = header.index("Job ID"), header.index("Workflow file")
    body = rows[rows.index(header) + 1 :]
    return {row[at_id]: row[at_file] for row in body if len(row) == len(header)}


# --------------------------------------------------------------------------- static checks


def test_workflows_match_githubs_workflow_schema() -> None:
    proc = run(
        [
            tool("check-jsonschema"),
            "--builtin-schema",
            "vendor.github-workflows",
            *map(str, WORKFLOW_FILES),
        ]
    )
    assert proc.returncode == 0, output_of(proc)


def test_act_accepts_the_workflows_under_its_strict_schema() -> None:
    proc = run([tool("act"), "--validate", "--strict"])
    assert proc.returncode == 0, output_of(proc)


def test_actionlint_finds_no_problem_in_the_workflows() -> None:
    # It reads .github/actionlint.yaml, which declares the GPU runner's `gpu` label.
    proc = run([tool("actionlint"), "-color=false", *map(str, WORKFLOW_FILES)])
    assert proc.returncode == 0, output_of(proc)


def test_zizmor_finds_no_problem_offline() -> None:
    # --strict-collection: a file zizmor cannot parse (an act stub, say) fails instead of
    # being skipped with a warning. Its config is .github/zizmor.yml (hash pins everywhere).
    proc = run([tool("zizmor"), "--offline", "--strict-collection", "--no-progress", "."])
    assert proc.returncode == 0, output_of(proc)


def test_act_lists_every_ci_and_nightly_job() -> None:
    listed = act_list()
    missing = (CI_JOBS | NIGHTLY_JOBS) - set(listed)
    assert not missing, f"act -l does not list {sorted(missing)}"
    assert {job for job in CI_JOBS if listed[job] == "ci.yml"} == CI_JOBS
    assert {job for job in NIGHTLY_JOBS if listed[job] == "nightly.yml"} == NIGHTLY_JOBS


def test_pushes_trigger_the_ci_jobs_and_schedules_the_nightly_ones() -> None:
    on_push, on_schedule = set(act_list("push")), set(act_list("schedule"))
    assert on_push >= CI_JOBS and not NIGHTLY_JOBS & on_push, sorted(on_push)
    assert on_schedule >= NIGHTLY_JOBS and not CI_JOBS & on_schedule, sorted(on_schedule)


def test_act_lists_the_reusable_jobs_and_no_event_of_this_repository_starts_them() -> None:
    listed = act_list()
    reusable = set().union(*REUSABLE_JOBS.values())
    assert {job: listed.get(job) for job in reusable} == {
        job: name for name, jobs in REUSABLE_JOBS.items() for job in jobs
    }
    started = reusable & (set(act_list("push")) | set(act_list("schedule")))
    assert not started, f"only a caller's workflow may start {sorted(started)}"


def test_every_remote_action_is_pinned_to_a_commit_sha() -> None:
    unpinned = [
        f"{path.name}:{job_id}: {step['uses']}"
        for path in WORKFLOW_FILES
        for job_id, step in remote_steps(path)
        if not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"])
    ]
    assert not unpinned, f"pin these to a full commit SHA (docs/ci.md): {unpinned}"


def test_every_networked_action_is_skipped_under_act_and_mapped_to_a_stub() -> None:
    mappings = actrc_local_repositories()
    problems, used = [], set()
    for path in WORKFLOW_FILES:
        for job_id, step in remote_steps(path):
            uses = step["uses"]
            if uses.split("@")[0] == "actions/checkout":
                continue  # act copies the working tree itself and skips checkout
            # owner/name/sub/path@ref (actions/cache/save@...) is the sub-action sub/path of
            # the repository owner/name@ref: act clones (or maps) the repository, then reads
            # sub/path/action.yml in it.
            action, ref = uses.split("@", 1)
            owner, name, *sub = action.split("/")
            repo_ref = f"{owner}/{name}@{ref}"
            used.add(repo_ref)
            where = f"{path.name}:{job_id}: {uses}"
            if "!env.ACT" not in str(step.get("if", "")).replace(" ", ""):
                problems.append(f"{where}: step lacks `if: ${{{{ !env.ACT }}}}`")
            stub = mappings.get(repo_ref)
            manifest = stub.joinpath(*sub, "action.yml") if stub is not None else None
            if stub is None or manifest is None:
                problems.append(f"{where}: no --local-repository {repo_ref}=... line in .actrc")
            elif not manifest.is_file():
                problems.append(f"{where}: .actrc maps it to {stub}, which has no {manifest}")
            elif yaml.safe_load(manifest.read_text())["runs"]["using"] != "composite":
                problems.append(f"{where}: the stub {manifest} is not a composite action")
    stale = sorted(set(mappings) - used)
    assert not problems and not stale, f"problems: {problems}; .actrc maps unused refs: {stale}"


def test_every_job_has_a_timeout_and_checkout_keeps_no_credentials() -> None:
    problems = []
    for path in WORKFLOW_FILES:
        workflow = load_workflow(path)
        if workflow.get("permissions") != {"contents": "read"}:
            problems.append(f"{path.name}: top-level permissions must be exactly contents: read")
        for job_id, job in workflow["jobs"].items():
            if "timeout-minutes" not in job:
                problems.append(f"{path.name}:{job_id}: no timeout-minutes")
            for step in job.get("steps", []):
                if step.get("uses", "").startswith("actions/checkout@") and (
                    step.get("with", {}).get("persist-credentials") is not False
                ):
                    problems.append(
                        f"{path.name}:{job_id}: checkout without persist-credentials: false"
                    )
    assert not problems, problems


# --------------------------------------------------------------------------- reusable workflows


def triggers(workflow: dict) -> dict:
    # PyYAML reads the key `on` as the boolean True (YAML 1.1).
    return workflow.get("on", workflow.get(True)) or {}


def test_reusable_workflows_are_only_called_and_every_input_is_typed_and_described() -> None:
    problems = []
    for path in REUSABLE_FILES:
        on = triggers(load_workflow(path))
        if set(on) != {"workflow_call"}:
            problems.append(f"{path.name}: triggers {sorted(on)}, not workflow_call alone")
            continue
        inputs = on["workflow_call"].get("inputs", {})
        if inputs.get("install", {}).get("required") is not True:
            problems.append(f"{path.name}: no required `install` input (the project's command)")
        for name, spec in inputs.items():
            if spec.get("type") not in ("string", "number", "boolean"):
                problems.append(f"{path.name}: input {name} has no type")
            if not spec.get("description"):
                problems.append(f"{path.name}: input {name} has no description")
    assert not problems, problems


def test_no_workflow_names_a_branch_and_no_reusable_one_runs_this_repositorys_make() -> None:
    """Other teams' default branch is `master` as often as `main`: it is read from
    github.event.repository.default_branch. And their repositories have no Makefile of ours."""
    problems = []
    for path in WORKFLOW_FILES:
        text = path.read_text(encoding="utf-8")
        for line_no, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"refs/heads/(main|master)\b|'(main|master)'", code):
                problems.append(f"{path.name}:{line_no}: a hard-coded branch: {line.strip()}")
    for path in REUSABLE_FILES:
        for job_id, job in load_workflow(path)["jobs"].items():
            for step in job.get("steps", []):
                if re.search(r"(^|[\s;&|(])make\b", step.get("run", "")):
                    problems.append(f"{path.name}:{job_id}: runs make: {step['run']!r}")
    perf_record = load_workflow(WORKFLOWS / "ci.yml")["jobs"]["perf-record"]["if"]
    if "github.event.repository.default_branch" not in perf_record:
        problems.append(f"ci.yml:perf-record runs on {perf_record!r}, not the default branch")
    assert not problems, problems


def test_the_gpu_job_exists_only_when_the_caller_names_a_gpu_runner_label() -> None:
    """With the default (empty) label the job's `if` is false before any runner is asked for,
    so a repository without a GPU runner never has a job queued for one forever."""
    workflow = load_workflow(WORKFLOWS / "harness-tiers.yml")
    label = triggers(workflow)["workflow_call"]["inputs"]["gpu-runner-label"]
    assert label["default"] == "" and label["required"] is False
    gpu_jobs = {
        job_id: job
        for job_id, job in workflow["jobs"].items()
        if "gpu-runner-label" in str(job.get("runs-on"))
    }
    assert list(gpu_jobs) == ["tiers-gpu"], sorted(gpu_jobs)
    condition = gpu_jobs["tiers-gpu"]["if"].replace(" ", "")
    assert condition.startswith("${{inputs.gpu-runner-label!=''&&"), condition
    # Nothing waits on it: a job that needs the GPU job would wait with it.
    needing = [j for j, job in workflow["jobs"].items() if "tiers-gpu" in job.get("needs", [])]
    assert not needing, needing


def adopting_caller() -> str:
    """The caller workflow docs/adopting.md tells a team to copy (the yaml block after its
    `<!-- caller workflow -->` marker)."""
    text = ADOPTING.read_text(encoding="utf-8")
    match = re.search(r"<!-- caller workflow -->\s*```yaml\n(.*?)```", text, re.S)
    assert match, f"{ADOPTING}: no ```yaml block after <!-- caller workflow -->"
    return match.group(1)


def check_caller(caller_text: str, tmp_path: Path) -> None:
    """A caller workflow passes GitHub's schema and actionlint, and every job of it calls one
    of the reusable workflows with inputs it declares, the required ones given."""
    caller = tmp_path / ".github" / "workflows" / "tests.yml"
    caller.parent.mkdir(parents=True, exist_ok=True)
    caller.write_text(caller_text, encoding="utf-8")
    for args in (
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(caller)],
        [tool("actionlint"), "-color=false", str(caller)],
    ):
        proc = run(args, cwd=tmp_path)
        assert proc.returncode == 0, output_of(proc)
    calls = yaml.safe_load(caller_text)["jobs"]
    assert calls
    for job_id, job in calls.items():
        match = re.fullmatch(r"[\w-]+/[\w.-]+/\.github/workflows/([\w-]+\.yml)@\S+", job["uses"])
        assert match, f"{job_id}: {job['uses']}"
        declared = triggers(load_workflow(WORKFLOWS / match.group(1)))["workflow_call"]["inputs"]
        given = set(job.get("with", {}))
        required = {name for name, spec in declared.items() if spec.get("required")}
        assert given <= set(declared), f"{job_id}: unknown inputs {sorted(given - set(declared))}"
        assert required <= given, f"{job_id}: missing inputs {sorted(required - given)}"


def test_the_caller_workflow_in_the_adopting_guide_is_valid_and_short(tmp_path: Path) -> None:
    caller_text = adopting_caller()
    assert len(caller_text.splitlines()) <= 15, caller_text
    check_caller(caller_text, tmp_path)


def test_the_caller_workflow_harness_init_writes_is_valid(tmp_path: Path) -> None:
    from harness import adopt

    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_u.py").write_text("def test_ok():\n    pass\n")
    plan = adopt.plan(tmp_path)
    check_caller(adopt.caller_workflow(plan, "acme/ml-harness@0123abcd"), tmp_path)


# --------------------------------------------------------------------------- act, host mode


@under_act
def test_act_sees_a_failing_step_as_a_failed_job(tmp_path: Path) -> None:
    """The mechanics the sharded-jobs test relies on, in a second: .actrc's host-mode platforms and
    stubs work offline, and jobResult tells a passing job from a failing one."""
    repo = tmp_path / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ACTRC, repo / ".actrc")
    shutil.copytree(STUBS, repo / ".github" / "act-stubs")
    upload = next(
        uses for uses in actrc_local_repositories() if uses.startswith("actions/upload-artifact@")
    )
    (repo / ".github" / "workflows" / "probe.yml").write_text(
        "name: probe\n"
        "on: push\n"
        "jobs:\n"
        "  passes:\n"
        "    runs-on: ubuntu-latest\n"
        "    steps:\n"
        "      - run: echo fine\n"
        "      - if: ${{ !env.ACT }}\n"
        f"        uses: {upload}\n"
        "  fails:\n"
        "    runs-on: ubuntu-latest\n"
        "    steps:\n"
        "      - run: exit 3\n",
        encoding="utf-8",
    )
    git = ["git", "-c", "user.name=probe", "-c", "user.email=probe@example.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "probe"]):
        proc = run([*git, *args], cwd=repo)
        assert proc.returncode == 0, output_of(proc)
    proc = run(
        [tool("act"), "push", "--json", "--action-cache-path", str(tmp_path / "act")],
        cwd=repo,
        env=act_env(),
    )
    assert proc.returncode != 0, "act must exit non-zero when a job fails\n" + output_of(proc)
    results = job_results(act_events(proc.stdout))
    assert results == {"passes": "success", "fails": "failure"}, output_of(proc)


SHARDED_JOBS = ("unit-property", "unit-property-merge")

# The tiny project the sharded jobs run on: a few unit and property tests whose node ids the
# shards must split between them, with no test in both and none in neither.
TINY_TESTS = {
    "suites/unit/test_tiny.py": """
        import pytest


        @pytest.mark.parametrize("n", range(6))
        def test_a_number_is_its_own_square_root_squared(n):
            assert round((n**0.5) ** 2) == n
    """,
    "suites/property/test_tiny_properties.py": """
        from hypothesis import given, strategies as st


        @given(st.lists(st.integers()))
        def test_sorting_twice_changes_nothing(xs):
            assert sorted(sorted(xs)) == sorted(xs)


        @given(st.text())
        def test_utf8_round_trips(s):
            assert s.encode().decode() == s
    """,
}


def sharded_jobs_project(repo: Path) -> None:
    """A git repository with ci.yml's sharded jobs, verbatim, over a handful of tests.

    The jobs' steps are the real ones (taken from .github/workflows/ci.yml, with the
    workflow's env and defaults), and so are .actrc, the act stubs, the lock `harness env
    check` compares with, and the harness itself. Only what the steps act on is small: the
    tests, and `make venv`, which links this run's venv (built from the same lock) instead of
    building a 1.7 GB copy per job."""
    workflow = load_workflow(WORKFLOWS / "ci.yml")
    jobs = {name: workflow["jobs"][name] for name in SHARDED_JOBS}
    top = {key: workflow[key] for key in ("permissions", "env", "defaults") if key in workflow}
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(
        "name: ci\non: push\n" + yaml.safe_dump({**top, "jobs": jobs}, sort_keys=False),
        encoding="utf-8",
    )
    shutil.copy(ACTRC, repo / ".actrc")
    shutil.copytree(STUBS, repo / ".github" / "act-stubs")
    (repo / "requirements").mkdir()
    shutil.copy(ROOT / "requirements" / "cpu.lock", repo / "requirements" / "cpu.lock")
    (repo / "Makefile").write_text(f"venv:\n\tln -sfn {sys.prefix} .venv\n", encoding="utf-8")
    (repo / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["suites"]\n', encoding="utf-8"
    )
    (repo / ".gitignore").write_text(".venv\nreports/\n__pycache__/\n", encoding="utf-8")
    for rel, src in TINY_TESTS.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(textwrap.dedent(src).lstrip(), encoding="utf-8")
    git = ["git", "-c", "user.name=probe", "-c", "user.email=probe@example.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tiny"]):
        proc = run([*git, *args], cwd=repo)
        assert proc.returncode == 0, output_of(proc)


@under_act
def test_the_sharded_unit_and_property_jobs_and_their_merge_pass_under_act(
    tmp_path: Path,
) -> None:
    """ci.yml's two unit+property shards and their merge, run by act as .actrc configures it,
    on a tiny project (sharded_jobs_project): each shard job in its own copy of the working
    tree, checking the venv against the lock and running its part of the two tiers through
    `harness run --shard`; the merge job then merges both shards' reports, handed over through
    ACT_SHARDS_DIR (act has no artifact store offline), and gates on them. The split and the
    merge do not depend on how many tests there are: the unit and property tiers themselves
    run in the tier jobs and in `make test`, so running them again here proved nothing more."""
    repo = tmp_path / "repo"
    sharded_jobs_project(repo)
    # act keeps a failed job's workspace: under tmp_path, removed with it.
    cache = tmp_path / "act"
    shards_dir = tmp_path / "artifacts"
    proc = run(
        [
            tool("act"),
            "push",
            "-j",
            "unit-property-merge",
            "--json",
            "--action-cache-path",
            str(cache),
            "--env",
            f"ACT_SHARDS_DIR={shards_dir}",
        ],
        cwd=repo,
        env=act_env(),
        timeout=SHARDED_JOBS_TIMEOUT_S,
    )
    events = act_events(proc.stdout)
    finished = [(event["jobID"], event["jobResult"]) for event in events if "jobResult" in event]
    assert sorted(finished) == [
        ("unit-property", "success"),
        ("unit-property", "success"),
        ("unit-property-merge", "success"),
    ], job_log(events, "unit-property") + "\n" + job_log(events, "unit-property-merge")
    assert proc.returncode == 0, output_of(proc)
    reports = [
        json.loads((shards_dir / f"shard-unit-property-{k}" / "report.json").read_text())
        for k in (1, 2)
    ]
    assert [(r["shard"]["index"], r["shard"]["total"]) for r in reports] == [(1, 2), (2, 2)]
    ran = [{t["nodeid"] for t in r["tests"]} for r in reports]
    assert ran[0] and ran[1] and not ran[0] & ran[1]
    assert ran[0] | ran[1] == set(reports[0]["shard"]["collected"])
    assert len(ran[0] | ran[1]) == 8  # the tiny project's tests, every one in some shard
    assert {r["seed"] for r in reports} == {reports[0]["seed"]}
    # The merge appended the merged run to the job's history database, and the tests page
    # was written from it: every one of the eight tests, over that one run.
    page_step = "Write the tests page (test history)"
    page = [
        e for e in events if e.get("jobID") == "unit-property-merge" and e.get("step") == page_step
    ]
    assert [e["stepResult"] for e in page if "stepResult" in e] == ["success"], job_log(
        events, "unit-property-merge"
    )
    printed = "".join(e.get("msg", "") for e in page if e.get("raw_output"))
    assert "reports/unit-property/tests.html: 8 test(s) over the last 1 run(s)" in printed, printed


def reusable_tiers_project(repo: Path, gpu_runner_label: str) -> None:
    """A git repository whose own workflow calls harness-tiers.yml, verbatim, over the tiny
    project's tests, as docs/adopting.md tells a team to: its install command links this
    run's venv (which has ml-harness with the ci and history extras), so the called jobs find
    `harness` only through the workflow's own PATH handling of an in-project .venv."""
    (repo / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(WORKFLOWS / "harness-tiers.yml", repo / ".github" / "workflows")
    with_inputs = {"install": f"ln -sfn {sys.prefix} .venv", "tiers": "unit,property"}
    if gpu_runner_label:
        # The host stands in for the GPU runner (.actrc maps self-hosted to the host); it runs
        # the unit tier, since the tiny project has no GPU tests.
        with_inputs |= {"gpu-runner-label": gpu_runner_label, "gpu-tier": "unit"}
    caller = {
        "name": "tests",
        "on": "push",
        "permissions": {"contents": "read"},
        "jobs": {"tests": {"uses": "./.github/workflows/harness-tiers.yml", "with": with_inputs}},
    }
    (repo / ".github" / "workflows" / "tests.yml").write_text(
        yaml.safe_dump(caller, sort_keys=False), encoding="utf-8"
    )
    shutil.copy(ACTRC, repo / ".actrc")
    shutil.copytree(STUBS, repo / ".github" / "act-stubs")
    (repo / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["suites"]\n', encoding="utf-8"
    )
    (repo / ".gitignore").write_text(".venv\nreports/\n__pycache__/\n", encoding="utf-8")
    for rel, src in TINY_TESTS.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(textwrap.dedent(src).lstrip(), encoding="utf-8")
    git = ["git", "-c", "user.name=probe", "-c", "user.email=probe@example.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tiny"]):
        proc = run([*git, *args], cwd=repo)
        assert proc.returncode == 0, output_of(proc)


@under_act
@pytest.mark.parametrize("gpu_runner_label", ["", "gpu"], ids=["no-gpu-label", "gpu-label"])
def test_the_reusable_tiers_workflow_runs_from_a_caller_with_a_gpu_job_only_on_request(
    tmp_path: Path, gpu_runner_label: str
) -> None:
    """harness-tiers.yml called from another repository's workflow, run by act: the plan, two
    shards, the merge (shards handed over through ACT_SHARDS_DIR) and the tests page pass;
    the GPU job is not created at all with the default empty label, and runs with one."""
    repo = tmp_path / "repo"
    reusable_tiers_project(repo, gpu_runner_label)
    proc = run(
        [
            tool("act"),
            "push",
            "--json",
            "--action-cache-path",
            str(tmp_path / "act"),
            "--env",
            f"ACT_SHARDS_DIR={tmp_path / 'artifacts'}",
        ],
        cwd=repo,
        env=act_env(),
        timeout=SHARDED_JOBS_TIMEOUT_S,
    )
    events = act_events(proc.stdout)
    finished = sorted((e["jobID"], e["jobResult"]) for e in events if "jobResult" in e)
    expected = [
        ("tiers-merge", "success"),
        ("tiers-plan", "success"),
        ("tiers-shard", "success"),
        ("tiers-shard", "success"),
    ]
    if gpu_runner_label:
        expected.insert(0, ("tiers-gpu", "success"))
    logs = "\n".join(job_log(events, job) for job in ("tiers-shard", "tiers-merge", "tiers-gpu"))
    assert finished == expected, logs
    assert proc.returncode == 0, output_of(proc)
    page = "".join(
        e.get("msg", "")
        for e in events
        if e.get("jobID") == "tiers-merge"
        and e.get("step") == "Write the tests page (test history)"
        and e.get("raw_output")
    )
    assert "reports/tests/tests.html: 8 test(s) over the last 1 run(s)" in page, logs
