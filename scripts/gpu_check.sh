#!/usr/bin/env bash
# The GPU check, in one command, on a bare GPU box (nvcc, CMake, ninja, Python with PyTorch; no package
# manager, no MPI), within a budget of 8 minutes (TPSP_GPU_CHECK_BUDGET seconds) on one H200:
#   1. unpacks .gpu_deps/*.deb (from scripts/fetch_gpu_check_deps.sh) into /tmp/tpsp_deps; finds NCCL and
#      cuDNN in the CUDA toolkit, else in PyTorch's NVIDIA wheels
#   2. builds tpsp and tpsp_gpu_tests with CUDA for sm_90 and without MPI into build-gpu/
#   3. `tpsp versions`: the driver, CUDA runtime, cuBLASLt, cuDNN and NCCL that loaded, each with its file,
#      which must be the files CMake linked
#   4. the GPU tests (every kernel against its CPU twin, the model against the CPU model); a skipped test
#      fails the step (on this box a skip means the tests saw no GPU)
#   5. trains configs/tiny.yaml for 200 steps on the GPU, explicit attention then cuDNN's, each loss curve
#      against the CPU reference tests/reference/gpu_check_tiny_cpu.json (scripts/loss_curve.py)
#   6. benchmarks GPT-2 124M at b = 16, s = 1024, explicit and cuDNN attention (tokens/s, MFU against the
#      bf16 peak, the time of each part), the bf16 memory table, and the three recompute modes
#   7. PyTorch's GPT-2 124M on the same shape (scripts/bench_torch_gpu.py): the baseline beside tpsp's
# Every step runs under `timeout -k` (SIGTERM, then SIGKILL 10 s later: the trainer defers SIGTERM to the
# end of its step, so a hung step is still killed) with its own limit, cut to what is left of the budget;
# a step that finds the budget spent is skipped and counts as failed. The dependencies and the build stop
# the check at once. The log goes to stdout and to $OUT/gpu_check.log (OUT: the device tool's folder;
# /tmp otherwise); it ends with one table of every step and the figures. Exits 1 if any step failed.
#
#   scripts/gpu_check.sh --rehearse   the steps that need no GPU (1-3), as the box would run them; see
#                                     scripts/gpu_check_rehearsal.sh for running it without this machine's
#                                     -dev packages
set -uo pipefail
cd "$(dirname "$0")/.."
rehearse=0
[ "${1:-}" = "--rehearse" ] && rehearse=1
out="${OUT:-/tmp}"
mkdir -p "$out"
log="$out/gpu_check.log"
: > "$log"
budget="${TPSP_GPU_CHECK_BUDGET:-480}"
jobs="$(nproc)"
deps=/tmp/tpsp_deps
steps=()   # "name|verdict|seconds", in order
figures=() # lines for the table's second part

say() { echo "$*" | tee -a "$log"; }

# run_step NAME LIMIT COMMAND...: runs COMMAND under timeout -k 10, its limit cut to the budget left;
# its output to stdout and the log. Returns COMMAND's status (non-zero: timed out, failed or skipped).
run_step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 20 ]; then
    say "== $name: skipped, the check's budget of ${budget} s is spent"
    steps+=("$name|SKIPPED (budget spent)|0")
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  say ""
  say "== $name (limit ${limit} s, $(date +%T), ${SECONDS} s into the check)"
  local started=$SECONDS
  # (through bash, so that COMMAND may be one of this script's functions, exported below)
  timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@" 2>&1 | tee -a "$log"
  local status=${PIPESTATUS[0]}
  local took=$((SECONDS - started))
  local verdict=ok
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    verdict="FAILED (timed out after ${limit} s)"
  elif [ "$status" -ne 0 ]; then
    verdict="FAILED (exit $status)"
  fi
  [ "$verdict" = ok ] || say "$name $verdict"
  steps+=("$name|$verdict|$took")
  return "$status"
}

summary() {
  say ""
  say "== summary ($(date +%T), ${SECONDS} s of a budget of ${budget} s)"
  local failed=0 row name verdict took
  for row in "${steps[@]}"; do
    IFS='|' read -r name verdict took <<< "$row"
    printf '%-44s %-32s %5s s\n' "$name" "$verdict" "$took" | tee -a "$log"
    [ "$verdict" = ok ] || failed=$((failed + 1))
  done
  if [ ${#figures[@]} -gt 0 ]; then
    say ""
    for row in "${figures[@]}"; do say "$row"; done
  fi
  say ""
  if [ "$failed" -gt 0 ]; then
    say "gpu_check: $failed step(s) failed"
    exit 1
  fi
  say "gpu_check: every step passed"
  exit 0
}

# --- 1. dependencies --------------------------------------------------------------------------------
# the carried packages, and where NCCL and cuDNN come from: the toolkit's where it has them (CMake looks
# there first), else the directory of PyTorch's NVIDIA wheels that holds the library and its header
# (every package of the list fetch_gpu_check_deps.sh wrote must have come: one line names a missing one)
unpack() {
  local fetch="run scripts/fetch_gpu_check_deps.sh where apt works, and carry .gpu_deps and data/kjv"
  [ -f .gpu_deps/packages.txt ] || { echo "gpu_check: no .gpu_deps/packages.txt: $fetch"; return 1; }
  local package deb
  for package in $(cat .gpu_deps/packages.txt); do
    deb=$(ls .gpu_deps/"${package}"_*.deb 2> /dev/null | head -1)
    [ -n "$deb" ] || { echo "gpu_check: .gpu_deps lacks the package $package: $fetch"; return 1; }
    dpkg -x "$deb" "$deps" || { echo "gpu_check: dpkg -x $deb failed"; return 1; }
  done
  [ -f data/kjv/train_000000.bin ] || { echo "gpu_check: no data/kjv/train_000000.bin: $fetch"; return 1; }
}
# wheel_root LIBRARY HEADER: the folder of the wheels holding lib/LIBRARY and include/HEADER
wheel_root() {
  local nvidia lib
  nvidia=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2> /dev/null) || return 0
  for lib in $(find "$nvidia" -name "$1" 2> /dev/null); do
    local root
    root=$(dirname "$(dirname "$lib")")
    if [ -f "$root/include/$2" ]; then
      echo "$root"
      return 0
    fi
  done
}
toolkit=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
in_toolkit() { ls "$toolkit"/lib*/"$1" "$toolkit"/targets/*/lib/"$1" > /dev/null 2>&1; }
export deps jobs
export -f unpack
mkdir -p "$deps"
run_step "dependencies (.gpu_deps, data/kjv)" 60 unpack || summary
nccl_root=""
cudnn_root=""
in_toolkit libnccl.so.2 || nccl_root=$(wheel_root 'libnccl.so*' nccl.h)
in_toolkit libcudnn.so.9 || cudnn_root=$(wheel_root 'libcudnn.so*' cudnn.h)
say "NCCL from ${nccl_root:-the toolkit ($toolkit)}; cuDNN from ${cudnn_root:-the toolkit ($toolkit)}"
nvidia-smi -L 2>&1 | tee -a "$log"
nvcc --version 2>&1 | tail -1 | tee -a "$log"

# --- 2. build -----------------------------------------------------------------------------------------
build() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPSP_CUDA=ON -DTPSP_MPI=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps/usr" ${nccl_root:+-DNCCL_ROOT="$nccl_root"} \
    ${cudnn_root:+-DCUDNN_ROOT="$cudnn_root"} > /dev/null &&
    cmake --build build-gpu -j"$jobs" --target tpsp tpsp_gpu_tests
}
# the carried libraries are needed during the build too: gtest_discover_tests runs the test binary
carried_libs="$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib/x86_64-linux-gnu/openblas-openmp"
outer_libs="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$carried_libs${outer_libs:+:$outer_libs}"
export nccl_root cudnn_root
export -f build
run_step "build (CUDA, sm_90, no MPI)" 300 build || summary

# The libraries at run time: first the folders of what CMake linked (LD_LIBRARY_PATH outranks the
# binary's RUNPATH, so nothing may come before them), then the carried packages, then the wheels'
# shared folder (cuDNN from a wheel loads NVRTC and cuBLAS of its CUDA version from there).
cached() { sed -n "s/^$1:[A-Z]*=//p" build-gpu/CMakeCache.txt; }
linked_nccl=$(cached NCCL_LIBRARY)
linked_cudnn=$(cached CUDNN_LIBRARY)
libs=""
for f in "$linked_nccl" "$linked_cudnn"; do
  [ -n "$f" ] && [ "${f%-NOTFOUND}" = "$f" ] && libs="$libs:$(dirname "$(readlink -f "$f")")"
done
libs="$libs:$carried_libs"
shared_wheels=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" \
  2> /dev/null || true)
[ -n "$shared_wheels" ] && [ -d "$shared_wheels" ] && libs="$libs:$shared_wheels"
export LD_LIBRARY_PATH="${libs#:}${outer_libs:+:$outer_libs}"

# --- 3. the libraries that load --------------------------------------------------------------------------
# tpsp versions names each library with the file it came from; NCCL's and cuDNN's must be CMake's
versions() {
  local printed
  printed=$(build-gpu/tpsp versions) || return 1
  echo "$printed"
  local name file loaded
  for pair in "NCCL|$linked_nccl" "cuDNN|$linked_cudnn"; do
    IFS='|' read -r name file <<< "$pair"
    [ -z "$file" ] || [ "${file%-NOTFOUND}" != "$file" ] && continue
    loaded=$(echo "$printed" | sed -n "s/^$name: [^(]*(\([^)]*\)).*/\1/p")
    if [ -z "$loaded" ] || [ "$(readlink -f "$loaded")" != "$(readlink -f "$file")" ]; then
      echo "gpu_check: the $name that loaded (${loaded:-no file}) is not the one CMake linked ($file)"
      return 1
    fi
  done
}
export linked_nccl linked_cudnn
export -f versions
run_step "versions (what loaded, from the binary)" 30 versions
# step 4, defined here: the rehearsal shows that without a GPU it fails (every test skips)
gpu_tests_matching() {  # gpu_tests_matching REGEX
  local result
  result=$(mktemp)
  ctest --test-dir build-gpu -R "$1" --no-tests=error --output-on-failure --timeout 60 -j1 | tee "$result"
  local status=${PIPESTATUS[0]}
  if grep -q '(Skipped)\|Not Run' "$result"; then
    echo "gpu_check: GPU tests skipped: they saw no GPU"
    status=1
  fi
  rm -f "$result"
  return "$status"
}
gpu_tests() { gpu_tests_matching 'CudaKernels|CudaModel|CudaNccl'; }
export -f gpu_tests_matching gpu_tests
expect_failure() { ! "$@"; }
export -f expect_failure
# the training of step 5, and for the rehearsal the same on the CPU (the script, the data, the curve check)
reference=tests/reference/gpu_check_tiny_cpu.json
train_tiny() {  # train_tiny DEVICE METRICS [overrides...]
  local device=$1 metrics=$2
  shift 2
  rm -f "$metrics"
  build-gpu/tpsp train configs/tiny.yaml train.device="$device" train.steps=200 train.val_every=100 checkpoint.dir= \
    logging.every=20 logging.metrics="$metrics" "$@" &&
    python3 scripts/loss_curve.py compare "$reference" "$metrics"
}
export reference
export -f train_tiny
# step 5b: 40 steps of tiny on DEVICE saving at 20 and 40, sampling at 40; the save at 20 resumed on DEVICE
# and on the CPU against the run never interrupted (the next loss and the mean of steps 21-40: the same
# bits on the device itself, whose backward is deterministic; 2e-2 on the CPU, fp32 against bf16 as in the
# curve check); the sample drawn in training from the weights on DEVICE against `tpsp sample` on the
# CPU from the model file of step 40, same seed: the same 64 bytes
resume_check() {  # resume_check DEVICE
  local device=$1 d=/tmp/tpsp_resume
  local tiny="configs/tiny.yaml train.steps=40 train.val_every=0 logging.every=10 train.seed=1337"
  rm -rf "$d" && mkdir -p "$d" || return 1
  build-gpu/tpsp train $tiny train.device="$device" checkpoint.dir="$d/whole" checkpoint.every=20 \
    logging.metrics="$d/whole.jsonl" logging.sample_every=40 logging.sample_tokens=64 > "$d/whole.out" ||
    { cat "$d/whole.out"; return 1; }
  tail -3 "$d/whole.out"
  local resumed_on
  for resumed_on in "$device" cpu; do
    rm -rf "$d/$resumed_on" && cp -r "$d/whole" "$d/$resumed_on" && echo 20 > "$d/$resumed_on/latest" || return 1
    build-gpu/tpsp train $tiny train.device="$resumed_on" checkpoint.dir="$d/$resumed_on" \
      checkpoint.resume="$d/$resumed_on" logging.metrics="$d/$resumed_on.jsonl" > "$d/$resumed_on.out" ||
      { cat "$d/$resumed_on.out"; return 1; }
    tail -1 "$d/$resumed_on.out"
  done
  local same=0
  echo "resumed on $device:" && python3 scripts/loss_curve.py resumed "$d/whole.jsonl" "$d/$device.jsonl" \
    --from 20 --tolerance $same || return 1
  echo "resumed on the CPU:" && python3 scripts/loss_curve.py resumed "$d/whole.jsonl" "$d/cpu.jsonl" \
    --from 20 --tolerance 2e-2 || return 1
  build-gpu/tpsp sample "$d/whole/model_00000040.bin" --tokens 64 --temperature 1 --seed $((1337 + 40)) \
    > "$d/sample.out" || return 1
  python3 - "$d/whole.out" "$d/sample.out" << 'PYTHON'
import sys
trained = open(sys.argv[1], "rb").read()
at = trained.rfind(b"sample at step 40: ")
in_training = trained[at + len(b"sample at step 40: "):][:64] if at >= 0 else b""
from_file = open(sys.argv[2], "rb").read()[:64]
print("in training:", repr(in_training))
print("from file:  ", repr(from_file))
if len(in_training) < 64 or in_training != from_file:
    sys.exit("gpu_check: the sample drawn in training is not the one tpsp sample draws from the saved model")
PYTHON
}
export -f resume_check
if [ "$rehearse" -eq 1 ]; then
  run_step "tiny, 200 steps on the CPU vs CPU curve" 120 train_tiny cpu /tmp/tpsp_tiny_cpu.jsonl
  run_step "save, resume and sample on the CPU" 60 resume_check cpu
  run_step "GPU tests fail where they see no GPU" 120 expect_failure gpu_tests
  say "gpu_check --rehearse: the steps that need a GPU are left out"
  summary
fi

# --- 4. GPU tests ---------------------------------------------------------------------------------------
run_step "GPU tests (ctest, one process each)" 150 gpu_tests
# TP+SP on the GPU: the one-GPU stand-in (t rank threads) at t = 2 and 4, SP and TP-only, every overlap
# switch and both reduce-scatter methods, and context parallelism at cp = 2 and 4 (a2a, cuDNN under a2a, and
# ring attention), against t = 1; data
# parallelism at dp = 2 (× t = 2) in every mode to plain DP's bits, and against one rank
# (tests/test_cuda_tensor_parallel.cpp)
tp_sweep() { gpu_tests_matching CudaTensorParallel; }
export -f tp_sweep
run_step "TP+SP, CP and DP on one GPU (stand-in)" 90 tp_sweep

# --- 5. training against the CPU's loss curve -----------------------------------------------------------
run_step "tiny, 200 steps, explicit attention vs CPU curve" 90 train_tiny cuda /tmp/tpsp_tiny_explicit.jsonl
run_step "tiny, 200 steps, cuDNN attention vs CPU curve" 90 train_tiny cuda /tmp/tpsp_tiny_cudnn.jsonl \
  model.attention=cudnn
run_step "save on the GPU, resume on the GPU and the CPU, sample" 60 resume_check cuda

# --- 6. tpsp's benchmarks at GPT-2 124M ---------------------------------------------------------------------
gpt2="configs/gpt2_124m.yaml train.device=cuda train.batch_size=16 train.seq_len=1024"  # words, no spaces
bench() {  # bench FIGURE_NAME [overrides and options...]
  local name=$1 text
  shift
  text=$(build-gpu/tpsp bench $gpt2 "$@") || { echo "$text"; return 1; }
  echo "$text"
  echo "$text" | grep -m1 "tok/s" |
    sed -E "s/.*fwd\+bwd ([0-9.]+ ms).*\| ([0-9]+ tok\/s) \|.*MFU ([0-9.]+%).*/$name: fwd+bwd \1 | \2 | MFU \3/" \
      >> /tmp/tpsp_figures
}
: > /tmp/tpsp_figures
export gpt2
export -f bench
run_step "bench GPT-2 124M, explicit attention" 60 bench "tpsp explicit" model.dropout=0 --steps 10 --breakdown
run_step "memory table GPT-2 124M (bf16)" 30 build-gpu/tpsp memory $gpt2
run_step "bench GPT-2 124M, cuDNN attention" 60 bench "tpsp cuDNN" model.dropout=0 model.attention=cudnn \
  --steps 10 --breakdown
for mode in none selective full; do
  run_step "bench GPT-2 124M, dropout 0.1, recompute $mode" 45 bench "tpsp recompute=$mode" model.dropout=0.1 \
    model.recompute=$mode --steps 5
done

# --- 7. the PyTorch baseline ------------------------------------------------------------------------------
torch_bench() {
  local text
  text=$(PYTHONUNBUFFERED=1 python3 scripts/bench_torch_gpu.py --batch 16 --seq 1024 --steps 10) ||
    { echo "$text"; return 1; }
  echo "$text"
  echo "$text" | grep "tok/s" >> /tmp/tpsp_figures
}
export -f torch_bench
run_step "PyTorch GPT-2 124M (bf16 autocast, SDPA, fused AdamW)" 90 torch_bench

while IFS= read -r line; do figures+=("$line"); done < /tmp/tpsp_figures
summary
