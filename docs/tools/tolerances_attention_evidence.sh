#!/usr/bin/env bash
# Fresh held-out evidence for the attention-interpreter sites (issue #29), after b8f8431 (a
# fitted GPD shape below 0 is extrapolated as exponential): the four attention groups of
# docs/tools/tolerances_heldout.sh (same tests, run counts and --per-process) under seeds no
# earlier sweep used (31-34; the earlier ones were 11-14), the groups in parallel, --jobs
# spread over the machine's cores; then the mutants of reference_impls/attention/kernel.py
# under the current and the proposed bounds.
#
#   docs/tools/tolerances_attention_evidence.sh OUT [DIV] [LIMIT_S] [MUTANTS_LIMIT_S] [HARNESS_SEED]
#
# DIV divides every run count (a rehearsal: DIV=100). LIMIT_S stops each group's sweep
# (`timeout`); every recording is kept in OUT, and each group is re-judged from its recordings
# afterwards (`propose --records X-fit.jsonl --holdout-records X-held.jsonl`), so a sweep
# stopped at LIMIT_S is still judged, on the samples it has. MUTANTS_LIMIT_S stops each
# mutants pass's `mutmut run`; the statuses of the mutants checked by then are kept.
# MUTANTS_FUNCTIONS (space-separated, optional) restricts the mutants to those functions of the
# module (as `harness mutate --function`; for a rehearsal).
#
# The mutants are split out of `propose --mutants`: that option runs the whole test FILE of
# the records (test_attention_interpreter.py, 63 tests, ~16 s a run under the interpreter)
# against each of the module's 1,145 mutants, ~12,000 worker-seconds a pass at worst, and it
# offers no --tests or --function to narrow it; `harness mutate` would then `mutmut show`
# each of the hundreds of mutants not killed, one after another (~0.9 s each). Here the two
# passes run harness.mutation's own steps against the six swept tests alone (FILE::TEST),
# with the current bounds (HARNESS_TOLERANCE_OVERRIDES empty) and with the four groups'
# proposals in force (their --overrides-out, merged), both under one $HARNESS_SEED, as
# `propose --mutants` does; mutants.json is written in `propose --mutants --json`'s shape for
# docs/tools/tolerances_table.py, the changes shown only for mutants whose fate differs.
#
# CPU only (CUDA hidden, the Triton interpreter): mutmut forks its workers from a process that
# has run the tests, and neither a CUDA context nor an OpenMP pool survives that fork
# (docs/tools/tolerances_tightened_mutants.sh).
set -u
O=$(realpath -m "$1")
DIV=${2:-1}
LIMIT=${3:-240}
MLIMIT=${4:-170}
MSEED=${5:-29}
PY=${PY:-python3}
JOBS=${JOBS:-$(nproc)}
MWORK=${MWORK:-/tmp/tolerances-attention-mwork}
mkdir -p "$O"
A=suites/unit/attention/test_attention_interpreter.py
export CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1

n() { echo $((($1 + DIV - 1) / DIV)); }

# Copies OUT's contents into $SNAPSHOT/NAME.tgz where SNAPSHOT is set (the device machine
# brings back at most 8 files).
snap() { [ -n "${SNAPSHOT:-}" ] && tar czf "$SNAPSHOT/$1.tgz" -C "$O" . ; }

sweep() { # name fit_runs heldout_runs per_process jobs seed NODEID...
    local name=$1 runs hold per=$4 jobs=$5 seed=$6
    runs=$(n "$2")
    hold=$(n "$3")
    shift 6
    timeout "$LIMIT" "$PY" -m harness.cli tolerances propose "$@" \
        --runs "$runs" --holdout-runs "$hold" --per-process "$per" --jobs "$jobs" \
        --seed "$seed" --records "$O/$name-fit.jsonl" --holdout-records "$O/$name-held.jsonl" \
        --json "$O/$name.json" >"$O/$name.log" 2>&1
    echo "$name: exit $? at $(date -u +%T)"
}

echo "start $(date -u +%T), $(nproc) cores, DIV=$DIV LIMIT=$LIMIT MLIMIT=$MLIMIT"
# samples per run: scale 3 (:55); ragged 8 + no-key 1 (:60, :64); one-token 3 (:111, :118),
# 2 (:120); bottom-right 1 (:90), sdpa 1 (:201). Jobs: 2 + 6 + 2 + 6 = 16 processes.
GROUPS_SEEDS="scale:31 ragged:32 single:33 onetoken:34"
sweep scale 60 340 60 2 31 "$A::test_explicit_softmax_scale" &
sweep ragged 32 116 8 6 32 "$A::test_ragged_lengths_need_no_multiple_of_a_block" \
    "$A::test_causal_queries_that_see_no_key_get_zero_output_and_zero_gradient" &
sweep single 100 1000 100 2 33 \
    "$A::test_causal_with_fewer_queries_than_keys_is_aligned_bottom_right" \
    "$A::test_reference_matches_torch_sdpa" &
sweep onetoken 72 504 18 6 34 "$A::test_one_token_sequences" &
wait
echo "sweeps done $(date -u +%T)"

# Each group judged again from its recordings (also those of a sweep stopped at LIMIT_S), with
# its own --seed (the bootstrap's), writing its proposals as an overrides file.
for gs in $GROUPS_SEEDS; do
    g=${gs%%:*}
    s=${gs##*:}
    "$PY" -m harness.cli tolerances propose --records "$O/$g-fit.jsonl" \
        --holdout-records "$O/$g-held.jsonl" --seed "$s" --json "$O/$g-rejudged.json" \
        --overrides-out "$O/$g-overrides.json" >"$O/$g-rejudged.log" 2>&1
    echo "$g re-judged: exit $?"
done
wc -l "$O"/*-fit.jsonl "$O"/*-held.jsonl
cat "$O"/*-fit.jsonl >"$O/fit-all.jsonl"
"$PY" - "$O" <<'EOF'
import json, pathlib, sys
o = pathlib.Path(sys.argv[1])
merged = {}
for g in ("scale", "ragged", "single", "onetoken"):
    p = o / f"{g}-overrides.json"
    if p.exists():
        merged.update(json.loads(p.read_text()))
    else:
        print(f"no overrides from {g}")
(o / "proposed-overrides.json").write_text(json.dumps(merged, indent=2) + "\n")
print(f"proposed overrides: {len(merged)} sites")
for site, v in sorted(merged.items()):
    print(f"  {site}: {v}")
EOF
snap sweeps

export HARNESS_SEED=$MSEED
TESTS=()
for t in test_explicit_softmax_scale test_ragged_lengths_need_no_multiple_of_a_block \
    test_causal_queries_that_see_no_key_get_zero_output_and_zero_gradient \
    test_causal_with_fewer_queries_than_keys_is_aligned_bottom_right \
    test_reference_matches_torch_sdpa test_one_token_sequences; do
    TESTS+=("$A::$t")
done
echo "mutants: HARNESS_SEED=$HARNESS_SEED, $JOBS workers, functions: ${MUTANTS_FUNCTIONS:-all}, start $(date -u +%T)"
# One pass: harness.mutation's own steps (_prepare: the same mutmut configuration as `harness
# mutate --tests`; mutmut run; mutmut results), without `harness mutate`'s `mutmut show` of
# every mutant not killed (0.9 s each, one after another: hundreds here, minutes a pass); a
# pass stopped at MUTANTS_LIMIT_S keeps the statuses of the mutants checked by then.
for label in current proposed; do
    ov=""
    [ "$label" = proposed ] && ov="$O/proposed-overrides.json"
    HARNESS_TOLERANCE_OVERRIDES=$ov timeout $((MLIMIT + 40)) "$PY" - "$O" "$label" \
        "$MWORK-$label" "$MLIMIT" "$JOBS" "${MUTANTS_FUNCTIONS:-}" "${TESTS[@]}" \
        >"$O/mutants-$label.log" 2>&1 <<'PYPASS'
import collections, json, pathlib, sys, time
from harness import mutation as M
o, label, work, limit, jobs, functions = sys.argv[1:7]
tests, root, path = sys.argv[7:], pathlib.Path.cwd(), "reference_impls/attention/kernel.py"
work, started = pathlib.Path(work), time.monotonic()
selection = M.function_patterns(root, path, functions.split()) if functions else []
M._prepare(root, path, tests, work)
error = None
try:
    M._mutmut(work, "run", "--max-children", jobs, *selection, stream=True, timeout=float(limit))
except M.MutationError as exc:  # RunStopped (the limit) too
    error = " ".join(str(exc).split())
statuses = M._selected(M._parse_results(M._mutmut(work, "results", "--all", "true")), selection)
counts = collections.Counter(str(s) for s in statuses.values())
killed = sum(n for s, n in counts.items() if M.Status(s) in M._COUNTS_AS_KILLED)
total = sum(n for s, n in counts.items() if s != "skipped")
unfinished = sum(counts.get(str(s), 0) for s in M._UNFINISHED)
result = {"label": label, "seconds": round(time.monotonic() - started, 1), "error": error,
          "complete": unfinished == 0 and bool(statuses), "killed": killed, "total": total,
          "counts": dict(counts), "statuses": {k: str(v) for k, v in statuses.items()}}
pathlib.Path(o, f"mutants-{label}.json").write_text(json.dumps(result, indent=1) + "\n")
print(f"\n{label} bounds: {killed} of {total} killed, {unfinished} not checked, {dict(counts)}, "
      f"{result['seconds']} s, error: {error}")
PYPASS
    echo "mutants, $label bounds: exit $? at $(date -u +%T)"
    tail -1 "$O/mutants-$label.log"
done
# mutants.json in the shape of `propose --mutants --json` (tolerances_table.py reads it), with
# per-function counts and the change of every mutant whose fate differs between the passes.
"$PY" - "$O" "$A" "$HARNESS_SEED" "$MWORK" "${TESTS[@]}" <<'PYMERGE'
import collections, json, pathlib, re, sys
from harness import mutation as M
o, test_file, seed, mwork = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
path = "reference_impls/attention/kernel.py"
out = {"module": path, "tests": [test_file], "nodeids": sys.argv[5:], "harness_seed": seed,
       "via": "harness.mutation steps against the six swept tests, split out of propose --mutants"}
dead = {str(s) for s in M._COUNTS_AS_KILLED}
runs = {}
for label in ("current", "proposed"):
    p = o / f"mutants-{label}.json"
    if not p.exists():
        print(f"{label}: no result (the pass failed: see mutants-{label}.log)")
        continue
    runs[label] = r = json.loads(p.read_text())
    out[label] = {k: r[k] for k in ("killed", "total", "counts", "complete", "error", "seconds")}
    print(f"{label} bounds: {r['killed']} of {r['total']} killed (complete: {r['complete']})")


def fn(name):
    short = re.sub(r"__mutmut_\d+$", "", name.rsplit(".", 1)[-1])  # x_f, xǁClassǁmethod
    return short.removeprefix("x_") if short.startswith("x_") else short[1:].replace("ǁ", ".").lstrip(".")


if len(runs) == 2:
    sc, sp = runs["current"]["statuses"], runs["proposed"]["statuses"]
    both = [k for k in sc if sc[k] != "not checked" and sp.get(k, "not checked") != "not checked"]
    per = collections.defaultdict(lambda: [0, 0, 0, 0])  # mutants, checked, killed cur, pro
    for k in sc:
        f = per[fn(k)]
        f[0] += 1
        if k in both:
            f[1] += 1
            f[2] += sc[k] in dead
            f[3] += sp[k] in dead
    keys = ("mutants", "checked_by_both", "killed_current", "killed_proposed")
    out["per_function"] = {f: dict(zip(keys, v)) for f, v in sorted(per.items())}
    out["checked_by_both"] = len(both)
    diff = {"only_current_kills": [k for k in both if sc[k] in dead and sp[k] not in dead],
            "only_proposed_kills": [k for k in both if sp[k] in dead and sc[k] not in dead]}
    work = pathlib.Path(f"{mwork}-current")
    source = (work / path).read_text()
    for which, names in diff.items():
        out[which] = []
        for name in names:
            rel, before, after = M._parse_show(M._mutmut(work, "show", name))
            line = M._file_line(source, name, M._module_name(path), rel, before)
            change = f"{before.strip()} -> {after.strip()}"
            out[which].append({"name": name, "status": [sc[name], sp[name]],
                               "where": f"{path}:{line}", "change": change})
            print(f"{which}: {path}:{line}: {change} ({sc[name]} / {sp[name]})")
    print(f"checked by both passes: {len(both)}")
    for f, v in out["per_function"].items():
        print(f"  {f}: {v}")
(o / "mutants.json").write_text(json.dumps({"mutants": out}, indent=2) + "\n")
PYMERGE
snap all
echo "done $(date -u +%T)"
