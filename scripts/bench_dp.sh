#!/usr/bin/env bash
# The data-parallel benchmark: 2 ranks (dp = 2, t = 1), configs/dp_bench.yaml,
# 8 steps each, the figures the mean of steps 3–8 over two rounds. Per mode
# (plain DP, the distributed optimizer, each with and without
# parallel.overlap_grad_reduce, and the distributed optimizer with
# parallel.overlap_param_gather too): the step without a link and on an emulated
# link, the DP communication and how much of it was exposed. The rounds
# alternate the modes and the link, so that a change in the machine's speed
# touches them alike.
#   scripts/bench_dp.sh [GBPS] [LATENCY_US]   (default: calibrated, 5 µs)
# Without GBPS the link is calibrated to this machine: backward's share of a
# step (tpsp bench --breakdown) times the compute of a dp = 2 step gives the
# backward the gradients' reduction pairs with; a run at 1 Gbit/s gives the
# DP transfers' time; the link is set so that the two are about equal.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh
ready_to_measure
config=configs/dp_bench.yaml
latency=${2:-5}
out=runs/dp
mkdir -p $out

measure() {  # flags... -> "step_ms dp_comm_ms dp_exposed_ms"
  rm -f $out/m.jsonl  # each measurement is a new run
  mpirun --oversubscribe -np 2 build/tpsp train $config logging.metrics=$out/m.jsonl "$@" > /dev/null
  echo "$(mean $out/m.jsonl ms) $(mean $out/m.jsonl dp_comm_ms) $(mean $out/m.jsonl dp_exposed_comm_ms)"
}

if [ $# -ge 1 ]; then
  gbps=$1
  echo "emulated link: $gbps Gbit/s, $latency µs per message (given)"
else
  share=$(breakdown_share $config 'backward$')
  read -r none_ms none_comm _ <<< "$(measure)"
  read -r _ ref_comm _ <<< "$(measure parallel.emulated_link.gbps=1 parallel.emulated_link.latency_us=$latency)"
  paired=$(awk -v f=$share -v s=$none_ms -v c=$none_comm 'BEGIN { printf "%.1f", f * (s - c) }')
  gbps=$(calibrated_gbps 1 $ref_comm $none_comm $paired)
  echo "emulated link: $gbps Gbit/s, $latency µs per message, calibrated: backward is $share of a step's" \
       "compute, $paired ms of a dp = 2 step; at 1 Gbit/s the DP transfers took $ref_comm ms (no link: $none_comm ms)"
fi
link="parallel.emulated_link.gbps=$gbps parallel.emulated_link.latency_us=$latency"

modes=("plain DP|parallel.distributed_optimizer=false parallel.overlap_grad_reduce=false"
       "plain DP, overlap_grad_reduce|parallel.distributed_optimizer=false parallel.overlap_grad_reduce=true"
       "distributed optimizer|parallel.distributed_optimizer=true parallel.overlap_grad_reduce=false"
       "distributed optimizer, overlap_grad_reduce|parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true"
       "distributed optimizer, both overlaps|parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.overlap_param_gather=true")
declare -A sum
for round in 1 2; do
  for i in "${!modes[@]}"; do
    read -r -a flags <<< "${modes[$i]#*|}"
    read -r a b c <<< "$(measure "${flags[@]}")"
    read -r d e f <<< "$(measure "${flags[@]}" $link)"
    sum[$i]=$(awk -v s="${sum[$i]:-0 0 0 0 0 0}" -v add="$a $b $c $d $e $f" 'BEGIN {
      n = split(s, x, " "); split(add, y, " "); for (k = 1; k <= 6; k++) printf "%s%.3f", (k > 1 ? " " : ""), x[k] + y[k] / 2 }')
  done
done

echo
echo "| mode | step ms | DP comm / exposed ms | step ms, emulated link | DP comm / exposed ms, emulated link | hidden | link / no link |"
echo "|---|---|---|---|---|---|---|"
for i in "${!modes[@]}"; do
  awk -v label="${modes[$i]%%|*}" -v s="${sum[$i]}" 'BEGIN { split(s, x, " ")
    printf "| %s | %.0f | %.0f / %.0f | %.0f | %.0f / %.0f | %.0f %% | %.2f× |\n", label, x[1], x[2], x[3], x[4], x[5], x[6],
           (x[5] > 0 ? 100 * (1 - x[6] / x[5]) : 0), x[4] / x[1] }'
done
