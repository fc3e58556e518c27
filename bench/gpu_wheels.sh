#!/usr/bin/env bash
# Here, before a lent GPU machine's first call: downloads into .whl/ (ignored by git) the wheels of what lbc's services
# import that the machine's image lacks or holds at other versions, at constraints.txt's pins, for the image's Python
# (3.12.3 in 2026-11: /work/.library/device/KINDS.md; PYVER=3.11 for another). Nothing can be fetched there. The
# device tool's call then carries .whl and lbcproto and runs bench/gpu_device.sh, which installs them (README,
# the `make bench` paragraph: "On a lent machine").
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
# the image holds torch, numpy, matplotlib, scipy, safetensors and psutil, which these leave alone
NEEDED=(pyzmq ale-py gymnasium farama-notifications cloudpickle grpcio grpcio-health-checking protobuf pydantic
        pydantic-core pydantic-settings annotated-types typing-inspection typing-extensions python-dotenv
        prometheus-client)
pins=()
for name in "${NEEDED[@]}"; do
    pin=$(grep -i -m1 "^${name}==" constraints.txt) || { echo "no pin for $name in constraints.txt" >&2; exit 1; }
    pins+=("$pin")
done
rm -rf .whl
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}"
echo "$(ls .whl | wc -l) wheels for CPython $PYVER in .whl ($(du -sh .whl | cut -f1)); the tree that travels must stay" \
     "under 64 MiB: docs/results/runs ($(du -sh docs/results/runs | cut -f1)) is moved aside for the call"
