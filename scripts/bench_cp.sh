#!/usr/bin/env bash
# The context-parallel benchmark (docs/design.md §9): configs/long_context.yaml's model at one global
# sequence length, cp = 1, 2, 4 (t = 1, one rank per CP rank), 6 steps each, the figures the mean of
# steps 3-6. Per cp and cp_comm_type (a2a, p2p): the step without a link and on an emulated link,
# the CP transfers' time and how much of it was exposed (a2a's all of it: the all-to-alls block;
# p2p's ring runs under the blocks' compute, but for each layer's last dK/dV hop home), the share
# hidden, the bytes each rank sends per step (a2a: the all-to-alls' full tensors times (cp - 1)/cp;
# p2p: the K|V blocks and their gradients), and the activations one rank keeps (tpsp memory). The
# gradients' sum over the replica group (the cp ranks) crosses the same link after backward: its exposed
# time is printed too, so that the step on the link is accounted for (no link + CP exposed + DP exposed).
# Then Ulysses' claim: with s and cp grown together, a rank sends (cp - 1)/cp of tensors that stay
# the same size (s/cp positions): the bytes a rank sends stay the same up to that factor.
#   scripts/bench_cp.sh [SEQ_LEN] [GBPS] [LATENCY_US]   (default: 2048, 2 Gbit/s, 5 µs)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh
ready_to_measure
config=configs/long_context.yaml
seq=${1:-2048}
gbps=${2:-2}
latency=${3:-5}
out=runs/cp
mkdir -p $out
common="train.steps=6 train.val_every=0 checkpoint.dir= logging.every=100 train.warmup_steps=2"

measure() {  # CP SEQ_LEN flags... -> "step_ms cp_comm_ms cp_exposed_ms cp_all_to_all_bytes cp_ring_bytes dp_exposed_ms"
  local cp=$1 s=$2
  shift 2
  rm -f $out/m.jsonl
  mpirun --oversubscribe -np "$cp" build/tpsp train $config $common parallel.cp="$cp" train.seq_len="$s" \
    logging.metrics=$out/m.jsonl "$@" > /dev/null
  echo "$(mean $out/m.jsonl ms) $(mean $out/m.jsonl cp_comm_ms) $(mean $out/m.jsonl cp_exposed_comm_ms)" \
       "$(mean $out/m.jsonl cp_all_to_all_bytes) $(mean $out/m.jsonl cp_ring_bytes)" \
       "$(mean $out/m.jsonl dp_exposed_comm_ms)"
}
sent_mb() { awk -v b=$1 -v cp=$2 'BEGIN { printf "%.1f", b * (cp - 1) / cp / 1e6 }'; }
kept_mib() { build/tpsp memory $config parallel.cp=$1 train.seq_len=$2 | sed -n 's/^saved activations: .* = \(.*\) MiB$/\1/p'; }
hidden() { awk -v c=$1 -v e=$2 'BEGIN { if (c > 0) printf "%.0f %%", 100 * (c - e) / c; else printf "-" }'; }

echo "configs/long_context.yaml at s = $seq, b = 1; emulated link $gbps Gbit/s, $latency µs per message"
printf '%-4s %-4s %10s %10s %12s %12s %8s %14s %14s %14s\n' cp type "step ms" "on link" "CP comm ms" "exposed ms" \
  hidden "DP exposed ms" "sent MB/rank" "kept MiB/rank"
for cp in 1 2 4; do
  for type in a2a p2p; do
    [ "$cp" = 1 ] && [ "$type" = p2p ] && continue
    read -r none _ _ _ _ _ <<< "$(measure $cp $seq parallel.cp_comm_type=$type)"
    read -r linked comm exposed a2a ring dp_exposed <<< "$(measure $cp $seq parallel.cp_comm_type=$type \
      parallel.emulated_link.gbps=$gbps parallel.emulated_link.latency_us=$latency)"
    if [ "$type" = a2a ]; then sent=$(sent_mb $a2a $cp); else sent=$(awk -v b=$ring 'BEGIN { printf "%.1f", b / 1e6 }'); fi
    printf '%-4s %-4s %10s %10s %12s %12s %8s %14s %14s %14s\n' $cp $type $none $linked $comm $exposed \
      "$(hidden $comm $exposed)" $dp_exposed "$sent" "$(kept_mib $cp $seq)"
  done
done
echo "Ulysses: s grown with cp (no link)"
printf '%-4s %6s %14s\n' cp s "sent MB/rank"
for cp in 2 4; do
  s=$((seq / 4 * cp))
  read -r _ _ _ bytes _ _ <<< "$(measure $cp $s)"
  printf '%-4s %6s %14s\n' $cp $s "$(sent_mb $bytes $cp)"
done
