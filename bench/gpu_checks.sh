#!/usr/bin/env bash
# What a lent GPU machine is for (issue 11, docs/speed.md), in one run of at most 10 minutes, figures printed:
#   1. the tests that need a GPU (pinned batches, the copy stream, the recurrence as CUDA graphs and compiled,
#      a step's one wait for the device, the fused AdamW);
#   2. the whole system with 12 actors, the recurrence as CUDA graphs, then the preset as it is on the same
#      machine (the baseline: cards and machines differ from session to session);
#   3. the same with CUDA graphs under NVIDIA's MPS, where the machine has it: without it the GPU time-slices
#      between the learner's and the 12 actors' contexts, and kernels of two processes never overlap;
#   4. lbc-bm's stages alone with every lever on the learner, CUDA graphs and the compiled recurrence among them.
# Run from the repository root: bash bench/gpu_checks.sh (PY names the interpreter, default python3).
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
# one place for compiled kernels (without it, each service keeps its own under its run folder)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/lbc-compile-cache}
E2E=(--preset lbc-bm --game breakout --actors 12 --set actor.device=cuda --stage-seconds 2 --seconds 20 --warmup 35)

echo "== GPU tests"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or gpu or pinned or compiled or graphs" \
    tests/unit/test_lstm_bptt.py tests/unit/test_nets.py tests/unit/test_prepare_ahead.py \
    tests/unit/test_devices.py tests/unit/test_training.py

for extra in "--set learner.cuda_graphs=true" ""; do
    echo "== lbc-bm end to end, 12 actors ${extra:-(the preset)}"
    # shellcheck disable=SC2086
    timeout 110 "$PY" -m bench.throughput "${E2E[@]}" $extra
done

if command -v nvidia-cuda-mps-control >/dev/null; then
    echo "== lbc-bm end to end, 12 actors, CUDA graphs, under MPS"
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/lbc-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/lbc-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        timeout 110 "$PY" -m bench.throughput "${E2E[@]}" --set learner.cuda_graphs=true
        echo quit | nvidia-cuda-mps-control
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
    echo "== no MPS on this machine (nvidia-cuda-mps-control not found)"
fi

echo "== lbc-bm stages alone, with the levers"
timeout 150 "$PY" -m bench.throughput --preset lbc-bm --game breakout --set actor.device=cuda \
    --stages-only --levers --stage-seconds 3
