#!/usr/bin/env bash
# The CPU benchmark, in one run: the sgemm rate of every kernel set this CPU
# supports (tpsp blas-peak, which also holds the best as MFU's denominator),
# tpsp's forward+backward of the tiny config and of GPT-2 124M at B=4, T=64,
# then Debian's PyTorch (python3-torch) on the same 124M shape as a user runs
# it (default environment), and the ratios. Beside it, the same tpsp step
# with the linears on OpenBLAS (a build with -DTPSP_ONEDNN=OFF in
# build-openblas/, made here if missing), to show what oneDNN brings.
# TPSP_BLAS_KERNELS=keep in the environment shows tpsp with OpenBLAS's own
# choice of kernels instead.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tpsp ] || scripts/build.sh
threads="${OMP_NUM_THREADS:-$(nproc)}"
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $threads threads, $(date -u +%F)"
kernel_sets=$(OMP_NUM_THREADS=$threads build/tpsp blas-peak)
echo "$kernel_sets"
peak=$(echo "$kernel_sets" | grep -o 'held for this machine: [0-9.]*' | awk '{print $5}')
OMP_NUM_THREADS=$threads build/tpsp bench configs/tiny.yaml --steps 10
gpt2_shape=(configs/gpt2_124m.yaml train.batch_size=4 train.seq_len=64 --steps 8)
gpt2=$(OMP_NUM_THREADS=$threads build/tpsp bench "${gpt2_shape[@]}")
echo "$gpt2"
if [ ! -x build-openblas/tpsp ]; then
  cmake -S . -B build-openblas -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPSP_ONEDNN=OFF -DTPSP_CUDA=OFF > /dev/null
  cmake --build build-openblas --target tpsp > /dev/null
fi
echo "-- the same with the linears on OpenBLAS (build-openblas: -DTPSP_ONEDNN=OFF):"
OMP_NUM_THREADS=$threads build-openblas/tpsp bench "${gpt2_shape[@]}"
tpsp_ms=$(echo "$gpt2" | grep -o 'fwd+bwd [0-9.]* ms' | head -1 | awk '{print $2}')
tpsp_gflops=$(echo "$gpt2" | grep -o '| [0-9.]* GFLOP/s | MFU' | awk '{print $2}')
if /usr/bin/python3 -c "import torch" 2> /dev/null; then
  torch=$(/usr/bin/python3 scripts/bench_torch_cpu.py 12 768 12 50257 4 64)  # 1 thread, then all cores (its default)
  echo "$torch"
  torch_default_ms=$(echo "$torch" | tail -1 | grep -o 'fwd+bwd [0-9.]* ms' | awk '{print $2}')
  torch_best_ms=$(echo "$torch" | grep -o 'fwd+bwd [0-9.]* ms' | awk '{print $2}' | sort -g | head -1)
  awk -v t="$tpsp_ms" -v d="$torch_default_ms" -v b="$torch_best_ms" -v g="$tpsp_gflops" -v peak="$peak" 'BEGIN {
    printf "GPT-2 124M B=4 T=64: tpsp %.1f ms; PyTorch %.1f ms as installed (%.2fx), %.1f ms at its best thread count (%.2fx)\n",
           t, d, d / t, b, b / t
    printf "tpsp runs its GEMM-bound step at %.1f%% of the best sgemm rate of this machine (%.1f GFLOP/s)\n",
           100 * g / peak, peak }'
else
  echo "(python3-torch is not installed: apt-get install python3-torch for the PyTorch comparison)"
fi
