// Which random bits a dropout mask element gets, shared by the CPU and the
// CUDA kernels so that both draw bit-identical masks (docs/design.md §3).
#pragma once
#include <cstdint>

#include "model/kernels/philox.h"

namespace tpsp {

// Where a dropout mask element lives in the global (un-sharded) tensor, so
// that its random bits do not depend on which rank holds it (docs/design.md §3).
// The local tensor is [n0, n1, n2], contiguous; its element (i0, i1, i2) has
// the global index (o0 + i0)·stride0 + (o1 + i1)·stride1 + i2. A sequence
// shard [s/t, b, h] of an activation whose global index runs over [B, S, h]
// is {s/t, b, h, stride0 = h, stride1 = S·h, o0 = first position, o1 = first sequence}.
struct DropoutBox {
    int64_t n0, n1, n2;        // local extent
    int64_t stride0, stride1;  // global index step of i0 and of i1 (i2 steps by 1)
    int64_t o0 = 0, o1 = 0;    // offset of the box along dimensions 0 and 1

    // the global index of the first element of local row r = i0·n1 + i1
    TPSP_HOST_DEVICE uint64_t row_start(int64_t r) const {
        return uint64_t((o0 + r / n1) * stride0 + (o1 + r % n1) * stride1);
    }
};

// Which draw this is: one stream per (seed, step, layer, site).
enum class DropoutSite : uint32_t { embedding = 0, attention_probs = 1, attention_proj = 2, mlp_fc2 = 3 };
struct DropoutKey {
    uint64_t seed;
    uint32_t step;
    uint32_t layer;
    DropoutSite site;
};

// The random bits of global element g are lane g % 4 of one Philox block
// whose counter is (g / 4, step, layer·16 + site), keyed on the seed.
TPSP_HOST_DEVICE inline PhiloxCounter dropout_block(const DropoutKey& key, uint64_t group) {
    PhiloxCounter ctr = {uint32_t(group), uint32_t(group >> 32), key.step, (key.layer << 4) | uint32_t(key.site)};
    return philox4x32_10(ctr, {uint32_t(key.seed), uint32_t(key.seed >> 32)});
}

// The uniform in [0, 1) of one global element; the element is kept when it is ≥ p.
TPSP_HOST_DEVICE inline float dropout_uniform(const DropoutKey& key, uint64_t global_index) {
    return uniform_from_bits(dropout_block(key, global_index / 4)[int(global_index % 4)]);
}

}  // namespace tpsp
