#!/usr/bin/env bash
# The pipeline benchmark: configs/tiny.yaml with 8 blocks, b = 4, s = 128,
# one thread per rank, 8 steps each, the figures the mean of steps 3–8 over
# two rounds. One rank (pp = 1) beside pp = 2 under 1F1B and interleaved
# (vpp = 2), at m = 4 and 8 micro-batches: the step, the first stage's
# measured bubble (the share of the schedule it waited) beside the theory's
# (p − 1)/(m·vpp + p − 1), and the boundary receives' time and how much of it
# was exposed. On an emulated link of GBPS Gbit/s (default 2) and 5 µs.
#   scripts/bench_pp.sh [GBPS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh
ready_to_measure
gbps=${1:-2}
out=runs/pp
mkdir -p $out
base="model.layers=8 train.batch_size=4 train.seq_len=128 train.steps=8 train.val_every=0 checkpoint.dir=
      logging.sample_every=0 train.threads=1 parallel.emulated_link.gbps=$gbps parallel.emulated_link.latency_us=5"

measure() {  # RANKS flags... -> "step_ms bubble theory pp_comm_ms pp_exposed_ms"
  local ranks=$1; shift
  rm -f $out/m.jsonl  # each measurement is a new run
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np "$ranks" build/tpsp train configs/tiny.yaml $base logging.metrics=$out/m.jsonl "$@" \
    > /dev/null
  echo "$(mean $out/m.jsonl ms) $(mean $out/m.jsonl pp_bubble 4) $(mean $out/m.jsonl pp_bubble_theory 4)" \
       "$(mean $out/m.jsonl pp_comm_ms) $(mean $out/m.jsonl pp_exposed_comm_ms)"
}

echo "emulated link: $gbps Gbit/s, 5 µs per message; $(getconf _NPROCESSORS_ONLN) cores, one thread per rank"
runs=("1|1F1B m=4, pp=1 (one rank)|train.grad_accum=4"
      "2|1F1B m=4, pp=2|train.grad_accum=4 parallel.pp=2"
      "2|interleaved m=4, pp=2 vpp=2|train.grad_accum=4 parallel.pp=2 parallel.vpp=2"
      "1|1F1B m=8, pp=1 (one rank)|train.grad_accum=8"
      "2|1F1B m=8, pp=2|train.grad_accum=8 parallel.pp=2"
      "2|interleaved m=8, pp=2 vpp=2|train.grad_accum=8 parallel.pp=2 parallel.vpp=2")
declare -A sum
for round in 1 2; do
  for i in "${!runs[@]}"; do
    IFS='|' read -r ranks _ flags <<< "${runs[$i]}"
    read -r -a args <<< "$flags"
    read -r a b c d e <<< "$(measure "$ranks" "${args[@]}")"
    sum[$i]=$(awk -v s="${sum[$i]:-0 0 0 0 0}" -v add="$a $b $c $d $e" 'BEGIN {
      n = split(s, x, " "); split(add, y, " "); for (k = 1; k <= 5; k++) printf "%s%.4f", (k > 1 ? " " : ""), x[k] + y[k] / 2 }')
  done
done

echo
printf '%-30s %9s %9s %9s %12s %12s\n' "schedule" "step ms" "bubble" "theory" "p2p ms" "exposed ms"
for i in "${!runs[@]}"; do
  IFS='|' read -r _ name _ <<< "${runs[$i]}"
  read -r a b c d e <<< "${sum[$i]}"
  if [ "${name#*pp=1}" != "$name" ]; then
    printf '%-30s %9.1f %9s %9s %12s %12s\n' "$name" "$a" "-" "-" "-" "-"
  else
    printf '%-30s %9.1f %8.1f%% %8.1f%% %12.1f %12.1f\n' "$name" "$a" "$(awk -v x=$b 'BEGIN{print 100*x}')" \
      "$(awk -v x=$c 'BEGIN{print 100*x}')" "$d" "$e"
  fi
done
