#!/usr/bin/env bash
# The held-out sweeps of docs/benchmarks/tolerances.md: per group of tests a fit sweep and a
# held-out sweep (`harness tolerances propose --holdout-runs --holdout-records`), the groups in
# parallel (--jobs pytest processes each: 16 in all on a 16-core machine), sized so that every
# call site gets >= 1,000 held-out samples (a sample: one run of one parametrization); then
# the ring simulation's mutants under the current and the proposed Higham bound, judged from
# the ring group's recording. Every recording is kept in OUT, so a sweep stopped at LIMIT_S is
# still judged afterwards (`propose --records X-fit.jsonl --holdout-records X-held.jsonl`).
#
#   docs/tools/tolerances_heldout.sh OUT [DIV] [LIMIT_S] [MUTANTS_LIMIT_S]
#
# DIV divides every run count (a rehearsal: DIV=100). The attention tests run under the
# Triton interpreter on the CPU (CUDA hidden); the gpu tier's on the GPU when there is one.
set -u
O=$1
DIV=${2:-1}
LIMIT=${3:-330}
MLIMIT=${4:-200}
PY=${PY:-python3}
mkdir -p "$O"
A=suites/unit/attention/test_attention_interpreter.py
R=suites/property/collectives/test_ring_properties.py::test_every_worker_gets_numpys_reduction_and_the_same_bits
G=suites/gpu/attention/test_attention_gpu.py

n() { echo $((($1 + DIV - 1) / DIV)); }

sweep() { # where name fit_runs heldout_runs per_process jobs seed NODEID...
    local where=$1 name=$2 runs hold per=$5 jobs=$6 seed=$7
    runs=$(n "$3")
    hold=$(n "$4")
    shift 7
    local env=(env)
    [ "$where" = cpu ] && env=(env CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1)
    "${env[@]}" timeout "$LIMIT" "$PY" -m harness.cli tolerances propose "$@" \
        --runs "$runs" --holdout-runs "$hold" --per-process "$per" --jobs "$jobs" \
        --seed "$seed" --records "$O/$name-fit.jsonl" --holdout-records "$O/$name-held.jsonl" \
        --json "$O/$name.json" >"$O/$name.log" 2>&1
    echo "$name: exit $? at $(date -u +%T)"
}

echo "start $(date -u +%T), $(nproc) cores"
# samples per run: scale 3 (:55); ragged 8 + no-key 1 (:60, :64); one-token 3 (:111, :118),
# 2 (:120); bottom-right 1 (:90), sdpa 1 (:200), ring 1 (:78, :94); gpu 14 + 8 per run.
sweep cpu scale 60 340 60 1 11 "$A::test_explicit_softmax_scale" &
sweep cpu ragged 32 116 8 4 12 "$A::test_ragged_lengths_need_no_multiple_of_a_block" \
    "$A::test_causal_queries_that_see_no_key_get_zero_output_and_zero_gradient" &
sweep cpu single 100 1000 100 1 13 \
    "$A::test_causal_with_fewer_queries_than_keys_is_aligned_bottom_right" \
    "$A::test_reference_matches_torch_sdpa" &
sweep cpu onetoken 72 504 18 4 14 "$A::test_one_token_sequences" &
sweep cpu ring 102 1020 17 6 15 "$R" &
sweep gpu gpu 40 200 100 2 16 "$G::test_output_and_gradients_match_sdpa_math_in_fp32" \
    "$G::test_two_pass_backward_matches_sdpa_math_in_fp32" &
wait
echo "sweeps done $(date -u +%T)"
timeout "$MLIMIT" "$PY" -m harness.cli tolerances propose --records "$O/ring-fit.jsonl" \
    --mutants --module reference_impls/collectives/simulation.py --jobs "$(nproc)" \
    --json "$O/mutants.json" >"$O/mutants.log" 2>&1
echo "mutants: exit $? at $(date -u +%T)"
