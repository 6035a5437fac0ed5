#!/usr/bin/env bash
# The overlap benchmark: step time, communication time and exposed
# communication per mode, at t = 2 (and t = 4, though 4 ranks on 2 cores
# share them, so only t = 2 is judged), with and without an emulated link
# slow enough that the collectives take about as long as the GEMMs they are
# paired with. configs/overlap_bench.yaml, 8 steps each, the figures the
# mean of steps 3–8. Also writes runs/overlap/trace_{off,on}.json and, where
# Debian's python3-matplotlib is installed, runs/overlap/trace.png.
#   scripts/bench_overlap.sh [GBPS] [LATENCY_US]   (default: calibrated, 5 µs)
# Without GBPS the link is calibrated to this machine: the block GEMMs' share
# of a step (tpsp bench --breakdown) times the compute of a t = 2 step gives
# the GEMM time the transfers pair with; a run at 1 Gbit/s gives the
# transfers' time; the link is set so that the two are about equal.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh
ready_to_measure
latency=${2:-5}
out=runs/overlap
mkdir -p $out

measure() {  # t, flags... -> "step_ms comm_ms exposed_ms"
  local t=$1; shift
  rm -f $out/m.jsonl  # each measurement is a new run
  mpirun --oversubscribe -np $t build/tpsp train configs/overlap_bench.yaml parallel.tp=$t \
    logging.metrics=$out/m.jsonl "$@" > /dev/null
  echo "$(mean $out/m.jsonl ms) $(mean $out/m.jsonl comm_ms) $(mean $out/m.jsonl exposed_comm_ms)"
}

pair() {  # t, label, flags...: the mode without and with the emulated link
  local t=$1 label=$2; shift 2
  read -r plain_ms plain_comm plain_exposed <<< "$(measure $t "$@")"
  read -r link_ms link_comm link_exposed <<< "$(measure $t "$@" $link)"
  awk -v t=$t -v label="$label" -v pm=$plain_ms -v pc=$plain_comm -v pe=$plain_exposed \
      -v lm=$link_ms -v lc=$link_comm -v le=$link_exposed 'BEGIN {
    printf "| %d | %s | %.0f | %.0f / %.0f | %.0f | %.0f / %.0f (%.0f %%) | %.2f× |\n",
           t, label, pm, pc, pe, lm, lc, le, (lc > 0 ? 100 * le / lc : 0), lm / pm }'
}

if [ $# -ge 1 ]; then
  gbps=$1
  echo "emulated link: $gbps Gbit/s, $latency µs per message (given)"
else
  gemms='^(qkv|attention proj|fc1 [+] gelu|fc2|fc2 [+] gelu backward|fc1 backward|attention proj backward|qkv backward)$'
  share=$(breakdown_share configs/overlap_bench.yaml "$gemms")
  read -r none_ms none_comm _ <<< "$(measure 2 parallel.tp_comm_overlap=false)"
  read -r _ ref_comm _ <<< "$(measure 2 parallel.tp_comm_overlap=false parallel.emulated_link.gbps=1 \
                                parallel.emulated_link.latency_us=$latency)"
  paired=$(awk -v f=$share -v s=$none_ms -v c=$none_comm 'BEGIN { printf "%.1f", f * (s - c) }')
  gbps=$(calibrated_gbps 1 $ref_comm $none_comm $paired)
  echo "emulated link: $gbps Gbit/s, $latency µs per message, calibrated: the block GEMMs are $share of a step's" \
       "compute, $paired ms of a t = 2 step; at 1 Gbit/s its transfers took $ref_comm ms (no link: $none_comm ms)"
fi
link="parallel.emulated_link.gbps=$gbps parallel.emulated_link.latency_us=$latency"
echo
echo "| t | mode | step ms | comm / exposed ms | step ms, emulated link | comm / exposed ms, emulated link | link / no link |"
echo "|---|---|---|---|---|---|---|"
for t in 2 4; do
  pair $t "overlap off" parallel.tp_comm_overlap=false
  pair $t "overlap on (defaults: ag, rs ring, bulk dgrad + wgrad)" parallel.tp_comm_overlap=true
  pair $t "every switch on (ag, rs ring, rs_dgrad)" parallel.tp_comm_overlap=true parallel.tp_comm_overlap_rs_dgrad=true
  pair $t "every switch on (ag, rs pipeline, rs_dgrad)" parallel.tp_comm_overlap=true \
    parallel.tp_comm_overlap_rs_dgrad=true parallel.tp_comm_rs_method=pipeline
done

# traces of one step at t = 2 on the emulated link, overlap off and every switch on
for mode in off on; do
  flag=$([ $mode = on ] && echo true || echo false)
  mpirun --oversubscribe -np 2 build/tpsp train configs/overlap_bench.yaml parallel.tp=2 train.steps=3 $link \
    parallel.tp_comm_overlap=$flag parallel.tp_comm_overlap_rs_dgrad=true \
    logging.trace=$out/trace_$mode.json logging.trace_steps=3 > /dev/null
done
if /usr/bin/python3 -c "import matplotlib" 2> /dev/null; then
  /usr/bin/python3 scripts/plot_trace.py $out/trace_off.json $out/trace_on.json -o $out/trace.png \
    --labels "overlap off, emulated link" "every switch on, emulated link"
fi
