#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest; then builds the
# one-rank variant without MPI (what scripts/gpu_check.sh builds on a GPU box) and trains 3 steps with it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"

echo "== the build without MPI (-DTPSP_MPI=OFF)"
cmake -S . -B build-nompi -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPSP_MPI=OFF > /dev/null
cmake --build build-nompi -j"$(nproc)" --target tpsp
build-nompi/tpsp train configs/tiny.yaml train.steps=3 train.val_every=0 checkpoint.dir= logging.metrics= \
  data.train='build/corpus/train_*.bin' data.val= | tail -1
