#!/usr/bin/env bash
# Installs what is missing, builds (warnings are errors), and runs the whole test suite with ctest:
# the unit tests first, then the rest. Then the sanitized build (ASan+UBSan, CPU only) runs the unit
# and the mpi tests. Then builds the one-rank variant without MPI (what scripts/gpu_check.sh builds on
# a GPU box; here also without cuDNN, so that the CUDA backend's build without it is compiled too) and
# trains 3 steps with it. The fuzz targets run briefly on their seed corpora.
# Prints the time of each phase at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

phases=()
phase_name=""
phase_start=$SECONDS
phase() {  # ends the phase under way (if any) and starts the next one
  if [ -n "$phase_name" ]; then phases+=("$(printf '%5ds  %s' $((SECONDS - phase_start)) "$phase_name")"); fi
  phase_name="$1"
  phase_start=$SECONDS
  [ -z "$phase_name" ] || echo "== $phase_name"
}
# a build whose log has a warning fails, even one that -Werror does not turn into an error
# (the linker's, ptxas')
build() {
  local log
  log=$(mktemp)
  cmake --build "$@" 2>&1 | tee "$log"
  if grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | grep -qi 'warning'; then
    echo "test.sh: the build of $1 printed warnings" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

phase "dependencies"
scripts/install_deps.sh

phase "format (scripts/format.sh --check: clang-format 14, .clang-format)"
scripts/format.sh --check

phase "build (Release, CUDA where nvcc is found, -DTPSP_WERROR=ON)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPSP_WERROR=ON > /dev/null
build build -j"$jobs"

phase "unit tests (ctest -L unit)"
ctest --test-dir build -L unit --output-on-failure -j"$jobs"

phase "the other tests (ctest -LE unit: e2e, faults, mpi, network, gpu)"
ctest --test-dir build -LE unit --output-on-failure -j"$jobs"

phase "sanitized build (ASan+UBSan, RelWithDebInfo, CPU only)"
# (-g1: line tables for the sanitizers' reports, no variables: the e2e tests' file compiles in 64 s, not 115)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DTPSP_SANITIZE=ON -DTPSP_CUDA=OFF > /dev/null
build build-asan -j"$jobs"

phase "sanitized unit tests (ctest -L unit)"
ctest --test-dir build-asan -L unit --output-on-failure -j"$jobs"

# the tests that call MPI_Init run with LeakSanitizer's suppressions of Open MPI's own allocations
# (tests/sanitizer/lsan_suppressions.txt, set by tests/CMakeLists.txt)
# (but not TensorParallelTraining.EveryOverlapSwitchLeavesTheLossesUnchanged: 4+ minutes under
# ASan, while tensor_parallel_equals_one_rank runs every switch in-process under ASan, and the
# plain build runs that end-to-end test above; nor the end-to-end ContextParallelTraining runs,
# whose model and mappings tensor_parallel_equals_one_rank runs in-process under ASan too; nor
# DataParallelTraining.EveryDataParallelModeTrainsTheBitsOfPlainDataParallelism: 4 minutes under
# ASan, while the distributed optimizer's resume test and the fault tests with both DP overlap
# switches run the same code paths under ASan here, and the plain build runs the bits test above;
# nor Faults.AStalledPeerInACollectiveEndsTheJobAfterParallelTimeout: 18 s of four stalled peers, whose
# deadline wait the stopped-rank fault runs under ASan here; nor the pipeline's bits and resume tests,
# sixteen runs that would take minutes more of the 30 CI allows, while its trace test and the stopped-stage
# fault run a pipeline's forwards, backwards, boundaries and tied wte under ASan here; nor
# TensorParallelTraining.LossesOfTwoAndFourRanksEqualOneRank, whose model tensor_parallel_equals_one_rank
# runs in-process at t = 1, 2, 4 under ASan and whose trainer the resume and fault runs here do; nor
# HellaSwagTraining, whose reader and scorer the unit tests run under ASan; nor
# Faults.ARankThatNeverStartsEndsTheJobFromMpiInit, 26 s of waiting for a rank before MPI_Init)
phase "sanitized mpi tests (ctest -L mpi, less the long end-to-end runs named above)"
ctest --test-dir build-asan -L mpi \
  -E 'EveryOverlapSwitchLeavesTheLossesUnchanged|EveryDataParallelModeTrainsTheBitsOfPlainDataParallelism|ContextParallelTraining|PipelineParallelTraining.(EveryScheduleTrains|ACheckpointSaved)|AStalledPeerInACollective|LossesOfTwoAndFourRanksEqualOneRank|HellaSwagTraining|ARankThatNeverStarts' \
  --output-on-failure -j"$jobs"

phase "fuzz targets (scripts/fuzz.sh 6: clang, libFuzzer, ASan+UBSan; 6 s each on its seed corpus)"
scripts/fuzz.sh 6

phase "build without MPI and without cuDNN (-DTPSP_MPI=OFF -DTPSP_CUDNN=OFF, -DTPSP_WERROR=ON), 3 steps"
cmake -S . -B build-nompi -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPSP_MPI=OFF -DTPSP_CUDNN=OFF -DTPSP_WERROR=ON \
  > /dev/null
build build-nompi -j"$jobs" --target tpsp tpsp_gpu_tests
build-nompi/tpsp train configs/tiny.yaml train.steps=3 train.val_every=0 checkpoint.dir= logging.metrics= \
  data.train='build/corpus/train_*.bin' data.val= | tail -1

phase ""
echo "== time of each phase"
printf '%s\n' "${phases[@]}"
printf '%5ds  total\n' "$SECONDS"
