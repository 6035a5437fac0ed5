#!/usr/bin/env bash
# Configures and builds tpsp (Release, -O3 -march=native) into build/, with the CUDA backend
# where nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)"
