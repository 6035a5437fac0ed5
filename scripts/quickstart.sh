#!/usr/bin/env bash
# One command from a fresh Debian machine to a trained model: installs what is
# missing, builds, prepares the Bible corpus and trains configs/tiny.yaml.
# Run again, it starts runs/tiny over (checkpoint.overwrite=true): to go on
# from its last checkpoint instead, run
#   build/tpsp train configs/tiny.yaml checkpoint.resume=runs/tiny
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/prepare_corpus.sh
build/tpsp blas-peak  # the machine's best sgemm rate, held as the denominator of MFU
build/tpsp train configs/tiny.yaml checkpoint.overwrite=true "$@"
