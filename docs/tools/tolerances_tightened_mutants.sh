#!/usr/bin/env bash
# The mutants of a tightened bound (docs/benchmarks/tolerances.md, "Bounds tightened"): the
# module the check tests, restricted to the function the check exercises (--function) and run
# against the site's own test (--tests FILE::TEST), twice: with the old bound put back in force
# ($HARNESS_TOLERANCE_OVERRIDES at the site) and with the new one (the source as committed),
# both under one $HARNESS_SEED so both passes see the same inputs and the same mutants.
#
#   docs/tools/tolerances_tightened_mutants.sh OUT [JOBS]
#
# Site: suites/unit/attention/test_attention_interpreter.py, test_reference_matches_torch_sdpa
# (the float64 reference vs torch SDPA): old bound float64's default rtol = atol = 1e-7, new
# 1e-12; module reference_impls/attention/kernel.py, function reference_attention.
set -u
O=$(realpath -m "$1")
JOBS=${2:-$(nproc)}
PY=${PY:-python3}
mkdir -p "$O"
A=suites/unit/attention/test_attention_interpreter.py
LINE=$(grep -n 'assert_close(reference_attention' "$A" | cut -d: -f1)
echo "{\"$A:$LINE\": {\"rtol\": 1e-7, \"atol\": 1e-7}}" >"$O/old-bound.json"
export HARNESS_SEED=${HARNESS_SEED:-29}
# CPU only: mutmut forks its workers after running the tests in its own process, and a CUDA
# context made there cannot be used in a forked worker (on the H200 box every mutant was
# then "killed", 112 of 112, the 24 that change nothing this test can see too).
export CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1
echo "site $A:$LINE, HARNESS_SEED=$HARNESS_SEED, $JOBS workers, start $(date -u +%T)"
for label in old new; do
    overrides=""
    [ "$label" = old ] && overrides="$O/old-bound.json"
    HARNESS_TOLERANCE_OVERRIDES=$overrides "$PY" -m harness.cli mutate \
        reference_impls/attention/kernel.py --function reference_attention \
        --tests "$A::test_reference_matches_torch_sdpa" --jobs "$JOBS" \
        --report-dir "$O/sdpa-$label" >"$O/sdpa-$label.log" 2>&1
    echo "$label bound: exit $? at $(date -u +%T)"
done
"$PY" - "$O" <<'EOF'
import json, sys
o = sys.argv[1]
runs = {}
for label in ("old", "new"):
    with open(f"{o}/sdpa-{label}/mutation.json") as fh:
        m = json.load(fh)["modules"][0]
    runs[label] = m
    print(f"{label} bound: {m['killed']} of {m['total']} killed")
alive = {label: {s["name"]: s for s in m["survivors"]} for label, m in runs.items()}
for name in sorted(set(alive["old"]) - set(alive["new"])):
    s = alive["old"][name]
    print(f"killed by the new bound alone: line {s['line']}: {s['before']} -> {s['after']}")
for name in sorted(set(alive["new"]) - set(alive["old"])):
    s = alive["new"][name]
    print(f"killed by the old bound alone: line {s['line']}: {s['before']} -> {s['after']}")
EOF
