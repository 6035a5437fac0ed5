// How much scratch the CUDA attention kernels take, visible without CUDA so
// that `tpsp memory` can report a GPU run's workspace on any machine.
// Layout (cuda_kernels.cu): q, k, v, o and dq, dk, dv, each [B, NH, T, hs]
// head-major (7·B·T·C), then the score gradient [B, NH, T, T].
#pragma once
#include <cstdint>

namespace tpsp {

inline int64_t cuda_attention_scratch_elements(int64_t B, int64_t T, int64_t C, int64_t NH) {
    return 7 * B * T * C + B * NH * T * T;
}

}  // namespace tpsp
