#!/usr/bin/env bash
# The CPU benchmark: forward+backward ms, tokens/s and MFU of tpsp for the
# tiny config and for GPT-2 124M at B=4, T=64, each against the sgemm FLOP/s
# that OpenBLAS reaches in the same run; then, where Debian's python3-torch
# is installed, PyTorch on the same 124M shape for contrast.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tpsp ] || scripts/build.sh
build/tpsp bench configs/tiny.yaml --steps 10
build/tpsp bench configs/gpt2_124m.yaml train.batch_size=4 train.seq_len=64 --steps 5
if /usr/bin/python3 -c "import torch" 2> /dev/null; then
  /usr/bin/python3 scripts/bench_torch_cpu.py 12 768 12 50257 4 64
else
  echo "(python3-torch not installed: no PyTorch comparison)"
fi
