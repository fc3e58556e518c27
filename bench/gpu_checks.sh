#!/usr/bin/env bash
# What a lent GPU machine is for (issue 11, docs/speed.md), in two parts of under 10 minutes each, figures printed.
# Session 34's H100 found the paper's preset learner-bound at 42,147-44,964 frames/s with 12-16 actors: replay
# held the actors back 65-90% of the time, the learner made 4.3 steps/s in the system against 6.2-6.8 alone,
# the GPU was half idle and the learner's process used 0.6 of a core. The likeliest reading, not yet measured:
# its thread waits for a GPU that time-slices between 17 processes' contexts. So, each run the whole system alone (no stages first:
# bench.throughput --end-to-end-only, about 60-70 s each), at 16 actors, each printing
# the learner's step in the system by part (lbc_learner_step_seconds_total: device_wait is its wait for the GPU)
# and an actor's loop by part (its inference includes its wait for the GPU):
#   1-3. the preset; central inference (actor.inference=remote: one inference service batches all 16 actors'
#        games on the GPU in one CUDA context, the actors keep to their games on the CPU; docs/decisions.md 68;
#        2b: twice the actors of half the games each, whose games step while others wait for their answers);
#        the learner's and the actors' threads spinning while they wait for the GPU (learner.gpu_wait,
#        actor.gpu_wait; gave 4.67 learner steps/s against 4.26-4.27 in session 34);
#   4-6. under NVIDIA's MPS, which lets the processes' kernels share the GPU instead of time-slicing, where
#        the machine has nvidia-cuda-mps-control: the preset; both spinning; two learner replicas of 32
#        sequences each sharing the GPU (learner.group_backend=gloo; the group's step is still 64 sequences),
#        whose kernels can fill the half of the GPU one learner leaves idle;
#   7. half the contexts: 8 actors of 64 games, each stepping its games on two ALE threads;
#   8. the preset again (the machine's drift), with py-spy: where each service's threads wait;
#   9. the tests that need a GPU (all 20 passed on session 34's H100; now 21 with central inference's pass).
# Two parts of 5.5-7 minutes each, so that each fits one device call of 10 minutes: part 1 runs 1-3, 7 and 8,
# part 2 runs 4-6 (under MPS) and 9. Run from the repository root: bash bench/gpu_checks.sh [1|2|all]
# (default all; PY names the interpreter, default python3).
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
# one place for compiled kernels (without it, each service keeps its own under its run folder)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/lbc-compile-cache}
SPIN=(--set learner.gpu_wait=spin --set actor.gpu_wait=spin)

system() {   # system LABEL [bench.throughput arguments...]: one end-to-end run at 16 actors unless told; its figures
    # also in $OUT/<the label's number>/bench.json and bench.png where OUT names a folder (the device tool's)
    echo "== $1"
    local out=()
    [ -n "${OUT:-}" ] && out=(--out "$OUT/${1%%.*}")
    shift
    timeout 100 "$PY" -m bench.throughput --preset lbc-bm --game breakout --actors 16 --set actor.device=cuda \
        --end-to-end-only --warmup 30 --seconds 15 "${out[@]}" "$@"
}

part1() {
    system "1. preset"
    system "2. central inference on the GPU" --set actor.inference=remote
    # an actor waits for each answer: twice the actors of half the games keep the cores stepping games meanwhile
    system "2b. central inference, 32 actors of 16 games" --set actor.inference=remote --actors 32 --set env.num_envs=16
    system "3. learner and actors spinning" "${SPIN[@]}"
    system "7. 8 actors of 64 games on two ALE threads each" --actors 8 --set env.num_envs=64 --set env.num_threads=2
    system "8. preset again, with py-spy after the window" --profile
}

part2() {
    if command -v nvidia-cuda-mps-control >/dev/null; then
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/lbc-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/lbc-mps/log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        if nvidia-cuda-mps-control -d; then
            system "4. preset under MPS"
            system "5. spinning under MPS" "${SPIN[@]}"
            system "6. two learner replicas of 32 sequences sharing the GPU, under MPS" --set learner.replicas=2 \
                --set learner.batch_size=32 --set learner.group_backend=gloo
            echo quit | nvidia-cuda-mps-control
        fi
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    else
        echo "== 4-6. no MPS on this machine (nvidia-cuda-mps-control not found)"
    fi

    echo "== 9. GPU tests"
    timeout 160 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or gpu or pinned or compiled or graphs" \
        tests/unit/test_devices.py tests/unit/test_stacked_frames.py tests/unit/test_prepare_ahead.py \
        tests/unit/test_lstm_bptt.py tests/unit/test_training.py tests/unit/test_nets.py tests/unit/test_replicas.py \
        tests/unit/test_remote_inference.py
}

case "${1:-all}" in
    1) part1 ;;
    2) part2 ;;
    all) part1; part2 ;;
    *) echo "usage: bash bench/gpu_checks.sh [1|2|all]" >&2; exit 2 ;;
esac
