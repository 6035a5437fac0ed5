#!/usr/bin/env bash
# Peak resident memory per rank against the activation formula, for t = 1, 2, 4,
# TP+SP and TP only, on a config whose activations dominate (the tiny model at
# b = 32, s = 256: about 0.6 GB of activations on one rank). Two training steps
# each, under mpirun, measured by /usr/bin/time -v (GNU time).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tpsp ] || scripts/build.sh
scripts/prepare_corpus.sh > /dev/null
[ -x /usr/bin/time ] || { echo "bench_memory: needs GNU time (apt-get install time)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
shape="train.batch_size=32 train.seq_len=256 train.steps=2 train.val_every=0 checkpoint.dir= logging.metrics="
out=$(mktemp -d)
printf "| t | mode | activations per rank (formula = table) | peak RSS per rank (max over ranks) |\n|---|---|---|---|\n"
for t in 1 2 4; do
  for sp in true false; do
    [ "$t" = 1 ] && [ "$sp" = false ] && continue
    mode=$([ "$t" = 1 ] && echo "one rank" || ([ "$sp" = true ] && echo "TP+SP" || echo "TP only"))
    acts=$(build/tpsp memory configs/tiny.yaml $shape parallel.tp=$t parallel.sequence_parallel=$sp |
           sed -n 's/^saved activations: .* = \(.*\)$/\1/p')
    # each rank writes its own GNU time report, named by its rank
    mpirun --oversubscribe -np $t bash -c '/usr/bin/time -v -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$out/rank" \
      build/tpsp train configs/tiny.yaml $shape parallel.tp=$t parallel.sequence_parallel=$sp > /dev/null 2>&1 || true
    peak=0
    for f in "$out"/rank.*; do
      kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$f")
      [ "$kb" -gt "$peak" ] && peak=$kb
    done
    rm -f "$out"/rank.*
    printf "| %d | %s | %s | %s MiB |\n" "$t" "$mode" "$acts" "$(awk -v kb="$peak" 'BEGIN { printf "%.1f", kb / 1024 }')"
  done
done
rm -rf "$out"
