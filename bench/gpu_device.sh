#!/usr/bin/env bash
# There, on a lent GPU machine (the device tool's command, carrying .whl and lbcproto): installs the wheels that
# bench/gpu_wheels.sh downloaded, checks that lbc imports and sees the GPU, then runs bench/gpu_checks.sh with these
# arguments (e.g. `bash bench/gpu_device.sh 1`), its whole log in $OUT/log and each check's record in $OUT.
set -uo pipefail
ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl/: run bash bench/gpu_wheels.sh here and carry .whl" >&2; exit 1; }
[ -d lbcproto ] || { echo "no lbcproto/: make install here, and carry lbcproto" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 -c "import ale_py, grpc, lbcproto.lbc_pb2, pydantic, torch, zmq
from ale_py.vector_env import AtariVectorEnv
from bench.throughput import describe_machine
print('lbc imports; torch', torch.__version__, '-', describe_machine())
assert torch.cuda.is_available(), 'no GPU visible'" || exit 1
bash bench/gpu_checks.sh "$@" 2>&1 | tee "${OUT:-/tmp}/log"
