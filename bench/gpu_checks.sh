#!/usr/bin/env bash
# What a lent GPU machine is for (issue 11, docs/speed.md), in two parts of under 10 minutes each, figures printed.
# Session 34's H100 found the paper's preset learner-bound at 42,147-44,964 frames/s with 12-16 actors: replay
# held the actors back 65-90% of the time, the learner made 4.3 steps/s in the system against 6.2-6.8 alone,
# the GPU was half idle and the learner's process used 0.6 of a core. Session 38's H100 ran checks 1-2b, 4, 7
# and 9 with 15 s windows: the learner made 1.19-4.38 steps/s (50,000 frames/s needs 4.88), the preset twice
# 3.45 and 2.46, and the preset's window counted 1.36x the frames its learner's steps kept up with (docs/speed.md).
# So each run now has a 40 s window after 40 s of warm-up (about 105 s a run; bench.throughput
# --end-to-end-only), at 16 actors, each printing the frames/s the learner's steps keep up with, the learner's
# step in the system by part (lbc_learner_step_seconds_total: device_wait is its wait for the GPU) and an
# actor's loop by part (its inference includes its wait for the GPU):
#   1-3. the preset; central inference (actor.inference=remote: one inference service batches all 16 actors'
#        games on the GPU in one CUDA context, the actors keep to their games on the CPU; docs/decisions.md 68;
#        2b: twice the actors of half the games each, whose games step while others wait for their answers);
#        the learner's and the actors' threads spinning while they wait for the GPU (learner.gpu_wait,
#        actor.gpu_wait; gave 4.67 learner steps/s against 4.26-4.27 in session 34);
#   4-6. under NVIDIA's MPS, which lets the processes' kernels share the GPU instead of time-slicing, where
#        the machine has nvidia-cuda-mps-control: the preset (4.38 learner steps/s in session 38's one run);
#        both spinning; two learner replicas of 32 sequences each sharing the GPU (learner.group_backend=gloo;
#        the group's step is still 64 sequences), whose kernels can fill the half of the GPU one learner leaves
#        idle (session 38: its learner had not answered by the end of a 30 s warm-up);
#   7. half the contexts: 8 actors of 64 games, each stepping its games on two ALE threads (session 38: 4.32
#      and 2.59 learner steps/s);
#   8. the preset again, with py-spy after the window: where each service's threads wait;
#   9. the tests that need a GPU (22 passed on session 38's H100, central inference's pass among them).
# Two parts of 7-8 minutes, each one device call of 10 minutes at most: part 1 runs 1, 4, 7 and 6, part 2
# runs 1 again (the machine's drift), 5, 2 and 9. Run from the repository root: bash bench/gpu_checks.sh
# [1|2|all], or a chosen few in order: bash bench/gpu_checks.sh runs 1 4 6 9 (default all; PY names the
# interpreter, default python3).
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
# one place for compiled kernels (without it, each service keeps its own under its run folder)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/lbc-compile-cache}
SPIN=(--set learner.gpu_wait=spin --set actor.gpu_wait=spin)

RUN=0
system() {   # system LABEL [bench.throughput arguments...]: one end-to-end run at 16 actors unless told; its
    # figures also in $OUT/<order>-<the label's number>.json where OUT names a folder (the device tool's, which
    # returns at most 8 files: bench.record draws the pictures from the records afterwards)
    echo "== $1"
    RUN=$((RUN + 1))
    local n=$RUN-${1%%.*} out=()
    [ -n "${OUT:-}" ] && out=(--out "/tmp/gpu_checks/$n")
    shift
    # a window of 40 s: session 38's of 15 s after 30 s of warm-up counted frames that filled the rate limiter's
    # slack and the queues to replay (1.36x what the learner's steps kept up with in the preset's run); about
    # 105 s a run
    timeout 150 "$PY" -m bench.throughput --preset lbc-bm --game breakout --actors 16 --set actor.device=cuda \
        --end-to-end-only --warmup 40 --seconds 40 "${out[@]}" "$@"
    [ -n "${OUT:-}" ] && cp "/tmp/gpu_checks/$n/bench.json" "$OUT/$n.json" 2>/dev/null
    return 0
}

mps_on() {   # start NVIDIA's MPS daemon once; false where the machine has none
    if ! command -v nvidia-cuda-mps-control >/dev/null; then
        echo "== no MPS on this machine (nvidia-cuda-mps-control not found)"
        return 1
    fi
    [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && return 0
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/lbc-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/lbc-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || { unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; return 1; }
}

mps_off() {
    [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && return 0
    echo quit | nvidia-cuda-mps-control
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

check() {   # check NUMBER: one of the numbered checks above
    case "$1" in
        1) mps_off; system "1. preset" ;;
        2) mps_off; system "2. central inference on the GPU" --set actor.inference=remote ;;
        # an actor waits for each answer: twice the actors of half the games keep the cores stepping games meanwhile
        2b) mps_off; system "2b. central inference, 32 actors of 16 games" --set actor.inference=remote --actors 32 \
                --set env.num_envs=16 ;;
        3) mps_off; system "3. learner and actors spinning" "${SPIN[@]}" ;;
        4) mps_on && system "4. preset under MPS" ;;
        5) mps_on && system "5. spinning under MPS" "${SPIN[@]}" ;;
        6) mps_on && system "6. two learner replicas of 32 sequences sharing the GPU, under MPS" \
                --set learner.replicas=2 --set learner.batch_size=32 --set learner.group_backend=gloo ;;
        7) mps_off; system "7. 8 actors of 64 games on two ALE threads each" --actors 8 --set env.num_envs=64 \
                --set env.num_threads=2 ;;
        8) mps_off; system "8. preset again, with py-spy after the window" --profile ;;
        9) mps_off
           echo "== 9. GPU tests"
           timeout 160 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or gpu or pinned or compiled or graphs" \
               tests/unit/test_devices.py tests/unit/test_stacked_frames.py tests/unit/test_prepare_ahead.py \
               tests/unit/test_lstm_bptt.py tests/unit/test_training.py tests/unit/test_nets.py \
               tests/unit/test_replicas.py tests/unit/test_remote_inference.py ;;
        *) echo "no check $1" >&2; return 2 ;;
    esac
}

case "${1:-all}" in
    1) set -- 1 4 7 6 ;;
    2) set -- 1 5 2 9 ;;
    all) set -- 1 4 7 6 1 5 2 9 2b 3 8 ;;
    runs) shift ;;
    *) echo "usage: bash bench/gpu_checks.sh [1|2|all|runs NUMBER...]" >&2; exit 2 ;;
esac
for n in "$@"; do check "$n"; done
mps_off
