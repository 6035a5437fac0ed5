// Philox-4x32-10, the counter-based generator of Salmon et al. (SC'11,
// "Parallel random numbers: as easy as 1, 2, 3"), bit-for-bit the same as
// Random123 and cuRAND. A counter-based generator has no state: the random
// bits of element i are a pure function of (key, counter(i)), so any rank can
// draw any element's bits without drawing the ones before it.
//
// The same code runs on the CPU and inside CUDA kernels (nvcc sees the
// __host__ __device__ qualifiers), which is what makes a GPU run draw the
// same dropout masks as a CPU run.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define TPSP_HOST_DEVICE __host__ __device__
#else
#define TPSP_HOST_DEVICE
#endif

namespace tpsp {

// Four 32-bit lanes: the counter going in, the random bits coming out.
struct PhiloxCounter {
    uint32_t lane[4];
    TPSP_HOST_DEVICE uint32_t operator[](int i) const { return lane[i]; }
    bool operator==(const PhiloxCounter&) const = default;
};
struct PhiloxKey {
    uint32_t lane[2];
};

TPSP_HOST_DEVICE inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;  // multipliers
    constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;  // Weyl key increments
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = uint64_t(M0) * ctr.lane[0];
        uint64_t p1 = uint64_t(M1) * ctr.lane[2];
        ctr = {uint32_t(p1 >> 32) ^ ctr.lane[1] ^ key.lane[0], uint32_t(p1),
               uint32_t(p0 >> 32) ^ ctr.lane[3] ^ key.lane[1], uint32_t(p0)};
        key.lane[0] += W0;
        key.lane[1] += W1;
    }
    return ctr;
}

// 24 random bits -> a float uniform in [0, 1), exact in float.
TPSP_HOST_DEVICE inline float uniform_from_bits(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }

}  // namespace tpsp
