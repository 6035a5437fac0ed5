#!/usr/bin/env bash
# Activation recomputation side by side, in one run: forward+backward time
# and the process's peak resident memory for each model.recompute mode, at a
# shape where the attention's s² term matters (the tiny model at s = 512),
# beside what `tpsp memory` says each mode keeps.
#   scripts/bench_recompute.sh [section.key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tpsp ] || scripts/build.sh
shape=(train.seq_len=512 train.batch_size=4 model.max_seq_len=512 model.dropout=0.1 "$@")
build/tpsp memory configs/tiny.yaml "${shape[@]}" | tail -1
for mode in none selective none selective; do
  out=$( { /usr/bin/time -f "peak RSS %M KiB" build/tpsp bench configs/tiny.yaml "${shape[@]}" \
           model.recompute=$mode --steps 5; } 2>&1 )
  ms=$(echo "$out" | grep -o 'fwd+bwd [0-9.]* ms' | head -1)
  activations=$(echo "$out" | grep -o 'activations [0-9.]* MiB')
  rss=$(echo "$out" | grep -o 'peak RSS [0-9]* KiB')
  printf '%-10s %s | %s | %s\n' "$mode" "$ms" "$activations" "$rss"
done
