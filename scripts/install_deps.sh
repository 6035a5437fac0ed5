#!/usr/bin/env bash
# Installs, with apt, the Debian packages that tpsp builds and runs with.
# Does nothing when they are all present already.
set -euo pipefail
packages=(build-essential cmake ninja-build libopenblas-openmp-dev libyaml-cpp-dev libgtest-dev
          libopenmpi-dev openmpi-bin bible-kjv time)
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
