# What the communication benchmarks share (sourced by bench_overlap.sh and
# bench_dp.sh): the mean of a metrics field, and the emulated link calibrated
# to this machine.

# the build, the corpus, and mpirun's settings (root, one thread a rank)
ready_to_measure() {
  [ -x build/tpsp ] || scripts/build.sh
  scripts/prepare_corpus.sh > /dev/null
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
}

# mean of a metrics field over steps 3.. (the first two warm up)
# (METRICS FIELD [DECIMALS]: 1 unless given)
mean() { awk -v key="\"$2\":" -v format="%.${3:-1}f" '{ i = index($0, key); if (i && ++n > 2) { s += substr($0, i + length(key)) + 0; m++ } }
                                 END { printf format, m ? s / m : 0 }' "$1"; }

# The share of one rank's forward+backward spent in the spans whose names
# match REGEX, from `tpsp bench --breakdown` at t = 1: CONFIG, REGEX, overrides...
breakdown_share() {
  local config=$1 regex=$2; shift 2
  build/tpsp bench "$config" parallel.tp=1 "$@" --steps 1 --breakdown |
    awk -v re="$regex" '/^breakdown of one/ { total = $5 + 0 }
                        /^  / && $(NF - 1) == "ms" { name = $0; sub(/ +[0-9.]+ ms .*$/, "", name); sub(/^ +/, "", name)
                                                     if (name ~ re) s += $(NF - 2) }
                        END { printf "%.4f", (total > 0 ? s / total : 0) }'
}

# The link's bandwidth at which the transfers take as long as the compute
# they pair with: at REF_GBPS they took COMM_MS (above NO_LINK_MS without the
# link), and the compute is PAIRED_MS; the bandwidth part scales inversely.
calibrated_gbps() {  # REF_GBPS COMM_MS NO_LINK_MS PAIRED_MS
  awk -v ref=$1 -v comm=$2 -v none=$3 -v paired=$4 'BEGIN {
    added = comm - none; printf "%.3f", (added > 0 && paired > 0) ? ref * added / paired : ref }'
}
