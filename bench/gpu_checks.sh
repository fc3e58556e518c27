#!/usr/bin/env bash
# What a lent GPU machine is for (issue 11, docs/speed.md), in one run of about 9 minutes, figures printed:
#   1. the tests that need a GPU (pinned batches, the copy stream, the compiled recurrence's Triton kernels);
#   2. lbc-bm's stages alone with every lever on the learner, the compiled recurrence among them (its
#      kernels are compiled here, in the lever's warm-up step, and kept on disk for step 3);
#   3. the whole system with 12 actors and the recurrence compiled, against the figures in docs/speed.md.
# Run from the repository root: bash bench/gpu_checks.sh (PY names the interpreter, default python3).
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
# one place for the compiled kernels, so that the learner service of step 3 finds those step 2 compiled
# (without it, each service keeps its own under its run folder: learner_svc keep_compiled_kernels)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/lbc-compile-cache}

echo "== GPU tests"
timeout 180 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or gpu or pinned or compiled" \
    tests/unit/test_nets.py tests/unit/test_prepare_ahead.py tests/unit/test_devices.py tests/unit/test_training.py

echo "== lbc-bm stages alone, with the levers"
timeout 240 "$PY" -m bench.throughput --preset lbc-bm --game breakout --set actor.device=cuda \
    --stages-only --levers --stage-seconds 4

echo "== lbc-bm end to end, 12 actors, learner.compile=true"
timeout 220 "$PY" -m bench.throughput --preset lbc-bm --game breakout --actors 12 --set actor.device=cuda \
    --set learner.compile=true --stage-seconds 3 --seconds 30 --warmup 90
