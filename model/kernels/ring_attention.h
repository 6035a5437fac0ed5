// Ring attention's layout (context parallelism's cp_comm_type p2p,
// docs/design.md §9), shared by the CPU kernels and their CUDA twins.
#pragma once
#include <cstdint>

#include "model/kernels/philox.h"

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

// Which part of a (query chunk, key chunk) pair causal attention computes.
enum class ChunkPair { none, causal, whole };
inline ChunkPair chunk_pair(int query_chunk, int key_chunk) {
    return key_chunk > query_chunk ? ChunkPair::none : key_chunk == query_chunk ? ChunkPair::causal : ChunkPair::whole;
}

// Where S' of sequence b, query half qh, head h starts: [chunk, S]
inline int64_t ring_scores_at(const RingAttention& ra, int b, int qh, int h) {
    return ((int64_t(b) * 2 + qh) * ra.NH + h) * ra.chunk * ra.S;
}

// the global index of dropout element (b, h, query gq, key gk)
TPSP_HOST_DEVICE inline int64_t ring_probs_index(const RingAttention& ra, int b, int h, int gq, int gk) {
    return ((((ra.batch_offset + b) * ra.heads_total + ra.first_head + h) * ra.S) + gq) * ra.S + gk;
}

}  // namespace tpsp
