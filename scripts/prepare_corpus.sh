#!/usr/bin/env bash
# The embedded default corpus: the King James Bible from Debian's bible-kjv
# package, one verse per line without its reference, as byte-token shards.
#   scripts/prepare_corpus.sh [OUT_DIR] [TPSP]    (default data/kjv, build/tpsp)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/data/kjv}"
tpsp="${2:-$root/build/tpsp}"
if [ -f "$out/train_000000.bin" ] && [ -f "$out/val_000000.bin" ]; then exit 0; fi
command -v bible > /dev/null || { echo "prepare_corpus: 'bible' not found: apt-get install bible-kjv" >&2; exit 1; }
mkdir -p "$out"
# -f turns pretty-printing off: one verse per line, "Ge1:1 In the beginning ..."
bible -f "Genesis1:1-Revelation22:21" | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$out/kjv.txt"
"$tpsp" prepare --tokenizer byte --replace "$out/kjv.txt" "$out"
