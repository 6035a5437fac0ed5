#!/usr/bin/env bash
# Activation recomputation side by side, in one run: forward+backward time
# and the process's peak resident memory for each model.recompute mode, at a
# shape where the attention's s² term matters (the tiny model at s = 512),
# beside what `tpsp memory` says each mode keeps and the extra compute each
# mode costs by the FLOP count (Korthikanti et al.: selective recomputes the
# attention core, 4·b·s²·h per block; full recomputes each block's forward,
# 24·b·s·h² + 4·b·s²·h; a step is three forwards of 24·b·s·h² + 4·b·s²·h per
# block plus the LM head's 6·b·s·h·V).
#   scripts/bench_recompute.sh [section.key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tpsp ] || scripts/build.sh
shape=(train.seq_len=512 train.batch_size=4 model.max_seq_len=512 model.dropout=0.1 "$@")
memory=$(build/tpsp memory configs/tiny.yaml "${shape[@]}")
echo "$memory" | tail -1
# the FLOP count's prediction, from the model line of `tpsp memory`
echo "$memory" | head -1 | awk '{
  for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  L = v["L"]; h = v["h"]; V = v["Vp"]; b = v["b"]; s = v["s"]
  block = 24 * b * s * h * h + 4 * b * s * s * h
  step = 3 * L * block + 6 * b * s * h * V
  printf "extra compute by the FLOP count: selective +%.1f%%, full +%.1f%% (the paper: a few %% and about one forward, +33%% at large h)\n",
         100 * L * 4 * b * s * s * h / step, 100 * L * block / step }'
for mode in none selective full none selective full; do
  out=$( { /usr/bin/time -f "peak RSS %M KiB" build/tpsp bench configs/tiny.yaml "${shape[@]}" \
           model.recompute=$mode --steps 5; } 2>&1 )
  ms=$(echo "$out" | grep -o 'fwd+bwd [0-9.]* ms' | head -1)
  arenas=$(echo "$out" | grep -o 'activations [0-9.]* MiB, workspace [0-9.]* MiB')
  rss=$(echo "$out" | grep -o 'peak RSS [0-9]* KiB')
  printf '%-10s %s | %s | %s\n' "$mode" "$ms" "$arenas" "$rss"
done
