#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest; then builds the
# one-rank variant without MPI (what scripts/gpu_check.sh builds on a GPU box; here also without cuDNN,
# so that the CUDA backend's build without it is compiled too) and trains 3 steps with it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"

echo "== the build without MPI and without cuDNN (-DTPSP_MPI=OFF -DTPSP_CUDNN=OFF)"
cmake -S . -B build-nompi -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPSP_MPI=OFF -DTPSP_CUDNN=OFF > /dev/null
cmake --build build-nompi -j"$(nproc)" --target tpsp tpsp_gpu_tests
build-nompi/tpsp train configs/tiny.yaml train.steps=3 train.val_every=0 checkpoint.dir= logging.metrics= \
  data.train='build/corpus/train_*.bin' data.val= | tail -1
