#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/: clang's libFuzzer, ASan and UBSan on the
# whole library) into build-fuzz/ and runs each on its seed corpus for
# SECONDS (default 20), through `ctest -L fuzz`. What a target finds new goes
# to build-fuzz/fuzz/found/NAME; a crash leaves its input as
# build-fuzz/crash-* and fails the run.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPSP_FUZZ=ON \
  -DTPSP_MPI=OFF -DTPSP_CUDA=OFF -DTPSP_ONEDNN=OFF -DTPSP_FUZZ_SECONDS="$seconds" > /dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_config fuzz_token_shard fuzz_checkpoint fuzz_run_directory \
  fuzz_llmc_tokenizer fuzz_gpt2_tokenizer fuzz_safetensors fuzz_hellaswag
cd build-fuzz && ctest -L fuzz --output-on-failure -j"$(nproc)"
