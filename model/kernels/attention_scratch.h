// How much scratch the CUDA attention kernels take, visible without CUDA so
// that `tpsp memory` can report a GPU run's workspace on any machine.
#pragma once
#include <cstdint>

namespace tpsp {

// The explicit kernels (cuda_kernels.cu): q, k, v, o and dq, dk, dv, each
// [B, NH, T, hs] head-major (7·B·T·C), then the score gradient [B, NH, T, T].
inline int64_t cuda_attention_scratch_elements(int64_t B, int64_t T, int64_t C, int64_t NH) {
    return 7 * B * T * C + B * NH * T * T;
}

// Ring attention's (cp_comm_type p2p), T = s/cp this rank's positions, in
// bf16 elements (cuda_kernels.cu, RingScratch): the fp32 running sums
// [B, NH, T, hs] (the output in forward, dQ in backward: 2·B·T·C), one
// sequence's fp32 dK|dV [2, NH, T, hs] (4·T·C), its Q, K, V and dO head-major
// (4·T·C), four [NH, c, c] of one pair of chunks, c = T/2 (NH·T²; the
// mask's bytes use half of the fourth), and 128 to align the start to 256 bytes.
inline int64_t cuda_ring_attention_scratch_elements(int64_t B, int64_t T, int64_t C, int64_t NH) {
    return 2 * B * T * C + 8 * T * C + NH * T * T + 128;
}

}  // namespace tpsp
