#include "train/benchmark.h"

namespace tpsp {

template void run_benchmark<CpuBackend>(const GPTConfig& config, const RunShape& shape, const BenchOptions& options,
                                        const char* label);

}  // namespace tpsp
