#!/usr/bin/env bash
# What a lent GPU machine is for (issue 11, docs/speed.md), in one run of at most 10 minutes, figures printed:
#   1. the tests that need a GPU (pinned batches, the copy stream, the recurrence as CUDA graphs and compiled);
#   2. lbc-bm's stages alone with every lever on the learner, CUDA graphs and the compiled recurrence among them;
#   3. the whole system with 12 actors, the recurrence as CUDA graphs, then the preset as it is on the same
#      machine (the baseline: cards and machines differ from session to session).
# Run from the repository root: bash bench/gpu_checks.sh (PY names the interpreter, default python3).
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
# one place for compiled kernels (without it, each service keeps its own under its run folder)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/lbc-compile-cache}

echo "== GPU tests"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or gpu or pinned or compiled or graphs" \
    tests/unit/test_lstm_bptt.py tests/unit/test_nets.py tests/unit/test_prepare_ahead.py \
    tests/unit/test_devices.py tests/unit/test_training.py

echo "== lbc-bm stages alone, with the levers"
timeout 190 "$PY" -m bench.throughput --preset lbc-bm --game breakout --set actor.device=cuda \
    --stages-only --levers --stage-seconds 3

for extra in "--set learner.cuda_graphs=true" ""; do
    echo "== lbc-bm end to end, 12 actors ${extra:-(the preset)}"
    # shellcheck disable=SC2086
    timeout 120 "$PY" -m bench.throughput --preset lbc-bm --game breakout --actors 12 --set actor.device=cuda \
        $extra --stage-seconds 2 --seconds 25 --warmup 40
done
