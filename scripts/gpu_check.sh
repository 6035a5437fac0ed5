#!/usr/bin/env bash
# The GPU check, in one command, on a bare GPU box (nvcc, CMake, ninja; no
# package manager, no MPI), at most ~8 minutes on one H200:
#   1. unpacks .gpu_deps/*.deb (from scripts/fetch_gpu_check_deps.sh) into /tmp/tpsp_deps
#   2. builds with CUDA for sm_90 and without MPI (the one-process stand-in) into build-gpu/
#   3. runs the GPU tests: every kernel against its CPU twin, the model against the CPU model
#   4. trains configs/tiny.yaml for 200 steps on the GPU (data/kjv, carried), then 100 with cuDNN's attention
#   5. benchmarks GPT-2 124M at B = 16, T = 1024, explicit and cuDNN attention: tokens/s, MFU against the
#      bf16 peak, activation bytes, and the time of each part of a step (--breakdown)
#   6. the same benchmark with dropout 0.1 under each model.recompute mode: time and the arenas' bytes
# The log goes to stdout and to $OUT/gpu_check.log (OUT: the device tool's folder; /tmp otherwise).
# Every step has its own time limit, so that one that hangs leaves time for the rest.
# A step that fails is named and the rest still run; the script then exits 1 and names every
# failed step last. The dependencies and the build stop it at once: nothing after them could run.
set -euo pipefail
cd "$(dirname "$0")/.."
log="${OUT:-/tmp}/gpu_check.log"
exec > >(tee "$log") 2>&1
step() { echo; echo "== $* ($(date +%T))"; }
failures=()
failed() {
  echo "$1 FAILED"
  failures+=("$1")
}

step "dependencies"
deps=/tmp/tpsp_deps
mkdir -p "$deps"
for f in .gpu_deps/*.deb; do dpkg -x "$f" "$deps"; done
# NCCL and cuDNN: the toolkit's where it has them (CMake looks there first), else PyTorch's wheels;
# a wheel's cuDNN loads NVRTC and cuBLAS of its own CUDA version, from their wheels
wheel() { python3 -c "import nvidia.$1 as m; print(list(m.__path__)[0])" 2> /dev/null || true; }
nccl_root=$(wheel nccl)
cudnn_root=$(wheel cudnn)
libs="$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib/x86_64-linux-gnu/openblas-openmp"
for w in nccl cudnn cuda_nvrtc cublas; do
  root=$(wheel $w)
  if [ -n "$root" ]; then libs="$libs:$root/lib"; fi
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "NCCL from ${nccl_root:-the toolkit}, cuDNN from ${cudnn_root:-the toolkit}"
nvidia-smi -L || true
nvcc --version | tail -1

step "build (CUDA, sm_90, no MPI)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPSP_CUDA=ON -DTPSP_MPI=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps/usr" ${nccl_root:+-DNCCL_ROOT="$nccl_root"} \
  ${cudnn_root:+-DCUDNN_ROOT="$cudnn_root"} > /dev/null
cmake --build build-gpu -j"$(nproc)" --target tpsp tpsp_gpu_tests

step "GPU tests (one process each: a kernel that faults cannot take the others down)"
ctest --test-dir build-gpu -R 'CudaKernels|CudaModel|FusedAttention' --output-on-failure --timeout 90 ||
  failed "GPU TESTS"

step "tiny config, 200 steps on the GPU"
timeout 120 build-gpu/tpsp train configs/tiny.yaml train.device=cuda train.steps=200 train.val_every=100 \
  checkpoint.dir= logging.metrics= logging.every=20 || failed "TRAINING"

step "tiny config, 100 steps with cuDNN's fused attention"
timeout 120 build-gpu/tpsp train configs/tiny.yaml train.device=cuda model.attention=cudnn train.steps=100 \
  train.val_every=100 checkpoint.dir= logging.metrics= logging.every=20 || failed "CUDNN TRAINING"

step "benchmark: GPT-2 124M, B = 16, T = 1024"
timeout 120 build-gpu/tpsp bench configs/gpt2_124m.yaml train.device=cuda train.batch_size=16 train.seq_len=1024 \
  model.dropout=0 --steps 10 --breakdown || failed "BENCHMARK"
build-gpu/tpsp memory configs/gpt2_124m.yaml train.device=cuda train.batch_size=16 train.seq_len=1024 |
  grep -E "^model:|formula per block|table per block|saved activations:" || failed "MEMORY TABLE"

step "benchmark: the same with cuDNN's fused attention"
timeout 120 build-gpu/tpsp bench configs/gpt2_124m.yaml train.device=cuda train.batch_size=16 \
  train.seq_len=1024 model.dropout=0 model.attention=cudnn --steps 10 --breakdown || failed "CUDNN BENCHMARK"
build-gpu/tpsp memory configs/gpt2_124m.yaml train.device=cuda train.batch_size=16 train.seq_len=1024 \
  model.attention=cudnn | grep -E "formula per block|table per block|saved activations:" || failed "CUDNN MEMORY TABLE"

step "recomputation: GPT-2 124M, B = 16, T = 1024, dropout 0.1, none / selective / full"
for mode in none selective full; do
  timeout 120 build-gpu/tpsp bench configs/gpt2_124m.yaml train.device=cuda train.batch_size=16 \
    train.seq_len=1024 model.dropout=0.1 model.recompute=$mode --steps 5 || failed "RECOMPUTE $mode BENCHMARK"
done

step "done"
if [ ${#failures[@]} -gt 0 ]; then
  printf 'failed steps: %s\n' "${failures[*]}"
  exit 1
fi
