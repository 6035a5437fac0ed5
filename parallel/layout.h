// How a rank takes part in tensor parallelism: the group's size and this
// rank's place in it, whether sequence parallelism is on, and which
// communication hides behind which GEMM (docs/design.md §3, §4). Plain
// values: no MPI, no kernels, so that the config and the memory report can
// describe a layout without launching one.
#pragma once
#include <algorithm>

namespace tpsp {

// The tp_comm_* switches resolved: the master switch and rs_dgrad already applied.
struct OverlapSettings {
    bool ag = false;           // tp_comm_overlap_ag
    bool rs = false;           // tp_comm_overlap_rs
    bool rs_pipeline = false;  // tp_comm_rs_method: pipeline (else ring)
    bool bulk_dgrad = false;   // tp_comm_bulk_dgrad
    bool bulk_wgrad = false;   // tp_comm_bulk_wgrad
    bool rs_dgrad = false;     // tp_comm_overlap_rs_dgrad
    int num_splits = 4;        // tp_comm_num_splits
    bool any() const { return ag || rs || bulk_dgrad || bulk_wgrad || rs_dgrad; }
};

struct TensorParallelism {
    int size = 1;  // t
    int rank = 0;
    bool sequence_parallel = true;  // SP; false: Megatron's TP-only f / f̄
    OverlapSettings overlap;        // which communication hides behind which GEMM

    // SP shards anything only in a group of more than one rank: then
    // LayerNorm, dropout and the residual run on a sequence shard, g / ḡ
    // all-gather and reduce-scatter, and the replicated parameters'
    // gradients are partial per rank.
    bool sequence_parallel_active() const { return sequence_parallel && size > 1; }
    // Rows of the sequence this rank holds outside the TP region: s/t under SP, s without.
    int local_seq(int seq_len) const { return sequence_parallel ? seq_len / size : seq_len; }
    // The first of them.
    int seq_start(int seq_len) const { return sequence_parallel ? rank * local_seq(seq_len) : 0; }
};

// How a rank takes part in context parallelism (Megatron's load-balanced
// layout for causal attention): each sequence of s tokens is cut into 2·cp
// chunks of s/(2·cp), and CP rank r holds chunks r and 2·cp − 1 − r, in that
// order, as its s/cp "local" positions. Under causal attention a chunk's cost
// grows with its index, so every rank gets one cheap and one dear chunk:
//
//   cp = 2, s = 8:   global  0 1 | 2 3 | 4 5 | 6 7      chunks 0 1 2 3
//                    rank 0  0 1         6 7           (chunks 0 and 3)
//                    rank 1        2 3 4 5             (chunks 1 and 2)
struct ContextParallelism {
    int size = 1;  // cp
    int rank = 0;
    // cp_comm_type p2p (ring attention): each rank keeps every head of its
    // own positions and the K/V blocks travel the ring; a2a without
    bool ring = false;

    int local_seq(int seq_len) const { return seq_len / size; }
    int chunk_len(int seq_len) const { return seq_len / (2 * size); }
    // the global chunk that half h (0 or 1) of CP rank r's positions is
    int chunk_of(int r, int half) const { return half == 0 ? r : 2 * size - 1 - r; }
    // the global position of this rank's local position i ∈ [0, s/cp)
    int global_position(int i, int seq_len) const {
        const int chunk = chunk_len(seq_len);
        return chunk_of(rank, i / chunk) * chunk + i % chunk;
    }

    // Local positions [first, first + count) as runs of consecutive global
    // positions: one, or two where they cross from the rank's first chunk to
    // its second (an SP shard of the rank's positions may).
    struct PositionRun {
        int offset;        // from `first`
        int count;         // positions
        int global_start;  // the global position of the first
    };
    struct PositionRuns {
        PositionRun run[2];
        int count;
    };
    PositionRuns runs(int first, int count, int seq_len) const {
        const int chunk = chunk_len(seq_len);
        const int in_first_chunk = size == 1 ? count : std::max(0, std::min(count, chunk - first));
        if (in_first_chunk == count || in_first_chunk == 0)
            return {{{0, count, size == 1 ? first : global_position(first, seq_len)}, {}}, 1};
        return {{{0, in_first_chunk, global_position(first, seq_len)},
                 {in_first_chunk, count - in_first_chunk, global_position(first + in_first_chunk, seq_len)}},
                2};
    }
};

}  // namespace tpsp
