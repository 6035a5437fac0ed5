#!/usr/bin/env bash
# Configures and builds tpsp (Release, -O3 -march=native) into build/, with the CUDA backend
# where nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
# the CUDA toolkit, where it is installed but not on PATH (a non-login shell): CMake builds
# the CUDA backend wherever it finds nvcc
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)"
