// Philox-4x32-10, the counter-based generator of Salmon et al. (SC'11,
// "Parallel random numbers: as easy as 1, 2, 3"), bit-for-bit the same as
// Random123 and cuRAND. A counter-based generator has no state: the random
// bits of element i are a pure function of (key, counter(i)), so any rank can
// draw any element's bits without drawing the ones before it.
#pragma once
#include <array>
#include <cstdint>

namespace tpsp {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;  // multipliers
    constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;  // Weyl key increments
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = uint64_t(M0) * ctr[0];
        uint64_t p1 = uint64_t(M1) * ctr[2];
        ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1),
               uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
        key[0] += W0;
        key[1] += W1;
    }
    return ctr;
}

// 24 random bits -> a float uniform in [0, 1), exact in float.
inline float uniform_from_bits(uint32_t bits) {
    return float(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace tpsp
