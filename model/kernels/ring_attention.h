// Ring attention's layout (context parallelism's cp_comm_type p2p,
// docs/design.md §9), shared by the CPU kernels and their CUDA twins.
#pragma once
#include <cstdint>

namespace tpsp {

// This rank's T = s/cp queries are two chunks of `chunk` = s/(2cp) global
// positions (query_chunks), of NH heads; K|V blocks [T, B, 2C] (K | V, head
// h at columns h*hs of each half) arrive one after another, each being two
// chunks of keys too (kv_chunks). A pair of chunks is computed whole where
// the key chunk comes before the query chunk, causally where they are the
// same chunk, and not at all where it comes after (nothing above the
// diagonal). S' [B, 2, NH, chunk, S] holds each query row against all S keys,
// by global key position; `stats` [2, B, NH, T] the rows' running max and
// sum in forward, Σ dO·O in backward. Dropout draws the bits of the global
// (batch, head, query, key) element, as attention_forward's box does.
struct RingAttention {
    int B, T, S, C, NH, chunk;
    int query_chunks[2];
    int heads_total, first_head;  // a, and this rank's first head's global index
    int64_t batch_offset;         // the global index of this micro-batch's first sequence
};

}  // namespace tpsp
