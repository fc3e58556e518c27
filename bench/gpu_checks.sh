#!/usr/bin/env bash
# What a lent GPU machine is for (issue 11, docs/speed.md), in one run of under 10 minutes, figures printed:
#   1. the tests that need a GPU (pinned batches, stacks rebuilt from single frames, the copy stream, the recurrence as CUDA graphs and compiled,
#      a step's one wait for the device, the fused AdamW), the compiled ones last (a fresh machine compiles);
#   2. the whole system as the preset with 12, 14 and 16 actors (the CPU by service for 16), each line saying which side of replay's rate
#      limiter waits on the other: on the H100 of session 27 the learner ran at half its rate alone while 13
#      of 16 cores were busy, and CUDA graphs and MPS changed nothing end to end (docs/speed.md);
#   3. 16 actors again with the services' threads spinning while they wait for the GPU (learner.gpu_wait and
#      actor.gpu_wait = spin, CUDA's default before decision 62): what sleeping gives end to end, and the cores
#      each service keeps busy either way;
#   4. lbc-bm's stages alone with every lever on the learner, CUDA graphs and the compiled recurrence among them
#      (measured in session 27; last, in what time is left).
# Run from the repository root: bash bench/gpu_checks.sh (PY names the interpreter, default python3).
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
# one place for compiled kernels (without it, each service keeps its own under its run folder)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/lbc-compile-cache}

echo "== GPU tests"
timeout 140 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or gpu or pinned or compiled or graphs" \
    tests/unit/test_devices.py tests/unit/test_stacked_frames.py tests/unit/test_prepare_ahead.py \
    tests/unit/test_lstm_bptt.py tests/unit/test_training.py tests/unit/test_nets.py

echo "== lbc-bm end to end, 12, 14 and 16 actors (about 55 s each after the stages)"
timeout 240 "$PY" -m bench.throughput --preset lbc-bm --game breakout --actors 16 --actor-scaling 12,14 \
    --set actor.device=cuda --stage-seconds 1 --seconds 15 --warmup 30

echo "== lbc-bm end to end, 16 actors, threads spinning while they wait for the GPU"
timeout 120 "$PY" -m bench.throughput --preset lbc-bm --game breakout --actors 16 --set actor.device=cuda \
    --set learner.gpu_wait=spin --set actor.gpu_wait=spin --stage-seconds 1 --seconds 15 --warmup 30

echo "== lbc-bm stages alone, with the levers"
timeout 80 "$PY" -m bench.throughput --preset lbc-bm --game breakout --set actor.device=cuda \
    --stages-only --levers --stage-seconds 3
