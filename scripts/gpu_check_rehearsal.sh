#!/usr/bin/env bash
# scripts/gpu_check.sh --rehearse on a machine made like the GPU box, here: a minimal Debian chroot
# (debootstrap) holding only what the box has of its own — the compiler, CMake, ninja, Python, dpkg —
# and none of this machine's -dev packages, the CUDA toolkit bind-mounted in, the working tree with the
# carried .gpu_deps and data/kjv copied in, and no network (unshare -n). Every library the build needs
# must then come from .gpu_deps, as on the box; it exits non-zero when anything the box lacks is needed.
#
#   scripts/gpu_check_rehearsal.sh [--drop PACKAGE]   (run as root, after scripts/fetch_gpu_check_deps.sh)
#
# --drop PACKAGE leaves that package's .deb out of the copy, to show that a broken carry fails in one line.
# The chroot stays in $TPSP_BOX (default /tmp/tpsp_box) for the next rehearsal; the first one downloads
# about 100 MB from the Debian archive.
set -euo pipefail
cd "$(dirname "$0")/.."
drop=""
[ "${1:-}" = "--drop" ] && drop="${2:?--drop needs a package name}"
box="${TPSP_BOX:-/tmp/tpsp_box}"
cuda="$(readlink -f /usr/local/cuda)"
[ -d .gpu_deps ] && [ -d data/kjv ] || { echo "rehearsal: run scripts/fetch_gpu_check_deps.sh first" >&2; exit 1; }

if [ ! -x "$box/usr/bin/cmake" ]; then
  command -v debootstrap > /dev/null || apt-get install -y -qq debootstrap > /dev/null
  echo "rehearsal: making the box in $box (debootstrap, minbase + g++ cmake ninja-build python3)"
  debootstrap --variant=minbase --include=g++,cmake,ninja-build,python3 bookworm "$box" \
    http://deb.debian.org/debian > "$box.log" 2>&1 || { echo "rehearsal: debootstrap failed: $box.log" >&2; exit 1; }
fi

# the working tree as the device tool sends it: tracked and untracked-not-ignored files, and the carried paths
rm -rf "$box/work" "$box/out"
mkdir -p "$box/work" "$box/out" "$box$cuda"
{ git ls-files -co --exclude-standard; find .gpu_deps data/kjv -type f; } | grep -v "^$" |
  { if [ -n "$drop" ]; then grep -v "^.gpu_deps/${drop}_"; else cat; fi } |
  tar -cf - -T - | tar -C "$box/work" -xf -
[ -z "$drop" ] || echo "rehearsal: left $drop out of .gpu_deps"

mounted=()
cleanup() { for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" 2> /dev/null || true; done; }
trap cleanup EXIT
mount --bind "$cuda" "$box$cuda" && mount -o remount,bind,ro "$box$cuda" && mounted+=("$box$cuda")
ln -sfn "$cuda" "$box/usr/local/cuda"
mount -t proc proc "$box/proc" && mounted+=("$box/proc")

started=$SECONDS
status=0
unshare -n chroot "$box" /usr/bin/env -i PATH=/usr/local/cuda/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  OUT=/out /bin/bash -c 'cd /work && scripts/gpu_check.sh --rehearse' || status=$?
echo "rehearsal: scripts/gpu_check.sh --rehearse in the box exited $status after $((SECONDS - started)) s" \
  "(log: $box/out/gpu_check.log)"
exit "$status"
