#!/usr/bin/env bash
# GPT-2 tokenization speed on one core: tpsp prepare --tokenizer gpt2 on the
# bundled corpus (4.1 MB), three times; prints the MB/s of each run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tpsp ] || scripts/build.sh
scripts/prepare_corpus.sh > /dev/null
scripts/fetch_gpt2_tokenizer.sh > /dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for run in 1 2 3; do
  OMP_NUM_THREADS=1 build/tpsp prepare --tokenizer gpt2 --replace data/kjv/kjv.txt "$out/shards" 2> "$out/progress" > /dev/null
  rate=$(tr '\r' '\n' < "$out/progress" | grep -o '[0-9.]* MB/s' | tail -1)
  echo "run $run: $rate (GPT-2 BPE of data/kjv/kjv.txt, one core)"
done
