// The GPU's activation element, bf16 (e = 2), for the rooms that hold GPU
// tensors: the CUDA kernels (model/kernels/) and the NCCL communicator (parallel/).
#pragma once
#include <cuda_bf16.h>

namespace tpsp {

using bf16 = __nv_bfloat16;

}  // namespace tpsp
