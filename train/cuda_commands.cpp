// `tpsp train` and `tpsp bench` on the CUDA backend: trainer_impl.h and
// benchmark.h instantiated on CudaBackend.
#include "model/cuda_backend.h"
#include "train/benchmark.h"
#include "train/trainer_impl.h"

namespace tpsp {

template class Trainer<CudaBackend>;
template void run_benchmark<CudaBackend>(const GPTConfig& config, const RunShape& shape, const BenchOptions& options,
                                         const char* label);

}  // namespace tpsp
