#!/usr/bin/env bash
# Run here, on a machine with apt, before scripts/gpu_check.sh runs on a bare
# GPU box: downloads the Debian packages that box lacks into .gpu_deps/
# (ignored by git; the device call carries it) and prepares the tiny corpus
# into data/kjv (carried too).
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libyaml-cpp0.7 libyaml-cpp-dev libgtest-dev
  nlohmann-json3-dev libpcre2-8-0 libpcre2-dev libcli11-dev)
mkdir -p .gpu_deps
(cd .gpu_deps && apt-get download "${packages[@]}" 2> /dev/null)
printf '%s\n' "${packages[@]}" > .gpu_deps/packages.txt  # what gpu_check.sh checks it has
[ -x build/tpsp ] || scripts/build.sh
scripts/prepare_corpus.sh
du -sh .gpu_deps data/kjv
